"""Lexical-unit decoding against greedy decoding, for the AR baseline and for PaDeLLM, in one run.

The LUD model (``padellm-ner train-lud`` on top of the shipped model) decodes with
``--decoder lud``; the reference is the model it was fine-tuned from, decoding greedily.
Per strategy: wall-clock speed-up (same sentences, batch 1, interleaved), decoded tokens
per decoding forward, and dev micro-F1 before (greedy) and after (LUD).

Usage: python benchmarks/lud.py [--limit N] [--json PATH] [--model LUD_MODEL] [--data FILE] [--threshold T]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.reporting import bar_plots, benchmark_parser, print_table, require_model, write_json  # noqa: E402
from general_decoding import get_decoder  # noqa: E402
from ner_service.engine import NEREngine  # noqa: E402
from corpora import read_corpus  # noqa: E402
from training.evaluate import span_f1  # noqa: E402

RECIPE = "en-conll03-lud"


def main() -> None:
    parser = benchmark_parser(__doc__, "lud", limit=100, limit_help="dev sentences", model=f"runs/{RECIPE}",
                              model_help=f"the LUD model, from padellm-ner train --recipe {RECIPE} or train-lud (name or folder)")
    parser.add_argument("--threshold", type=float, default=0.9, help="placeholder confidence that extends a unit")
    args = parser.parse_args()
    require_model("lud", args.model, RECIPE)

    lud = NEREngine.load(args.model)
    reference = NEREngine.load(lud.ner_model.config.base)
    decoder = get_decoder("lud", unit_size=lud.ner_model.config.lud_unit_size or 4, threshold=args.threshold)
    runs = {"greedy": (reference, "greedy"), "lud": (lud, decoder)}
    examples = [e for e in read_corpus(args.data) if e.text.strip()][: args.limit]
    gold = [[(s.start, s.end, s.label) for s in e.spans] for e in examples]
    results = []
    for strategy in ("ar", "padellm"):
        seconds = {name: 0.0 for name in runs}
        tokens = {name: 0 for name in runs}
        forwards = {name: 0 for name in runs}
        predicted: dict[str, list] = {name: [] for name in runs}
        for example in tqdm(examples, desc=strategy, unit="text"):
            for name, (engine, backend) in runs.items():  # interleaved: noise hits both alike
                began = time.perf_counter()
                out = engine.extract([example.text], strategy=strategy, decoder=backend)[0]
                seconds[name] += time.perf_counter() - began
                tokens[name] += out.stats.generated_tokens
                forwards[name] += out.stats.forward_passes - (1 if strategy == "padellm" else 0)  # the count step is not decoding
                predicted[name].append([(e.start, e.end, e.label) for e in out.entities])
        results.append({
            "model": strategy,
            "speedup": seconds["greedy"] / seconds["lud"],
            "tokens_per_forward": tokens["lud"] / max(forwards["lud"], 1),
            "tokens_per_forward_greedy": tokens["greedy"] / max(forwards["greedy"], 1),
            "f1_greedy": span_f1(gold, predicted["greedy"])["micro_f1"],
            "f1_lud": span_f1(gold, predicted["lud"])["micro_f1"],
            "ms_greedy": 1000 * seconds["greedy"] / len(examples),
            "ms_lud": 1000 * seconds["lud"] / len(examples),
        })
    print(f"\n{args.model} (threshold {args.threshold}) vs {lud.ner_model.config.base} greedy, {len(examples)} sentences, "
          f"batch 1, {torch.get_num_threads()} threads")
    print_table(results, ["model", "speedup", "tokens_per_forward", "tokens_per_forward_greedy", "f1_greedy", "f1_lud", "ms_greedy", "ms_lud"])
    path = write_json(args.json, {"benchmark": "lud", "model": args.model, "threshold": args.threshold,
                                  "n_sentences": len(examples), "results": results})
    png = bar_plots(path.with_suffix(".png"), [r["model"] for r in results], {
        "speed-up over greedy": [r["speedup"] for r in results],
        "tokens per forward": [r["tokens_per_forward"] for r in results],
        "F1 greedy / LUD": [r["f1_lud"] - r["f1_greedy"] for r in results],
    }, f"Lexical-unit decoding, {args.model}")
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
