"""Lexical-unit decoding against greedy and the lossless decoders, for AR and PaDeLLM, in one run.

The LUD model (``padellm-ner train --recipe en-conll03-lud``) decodes with ``lud`` (its units
verified: token for token greedy), with narrower verification forwards (a unit one token
shorter: one placeholder fewer; or drafts cut before a placeholder prediction less than
``--min-probability`` probable), and with the paper's unverified acceptance of placeholders at
least ``--threshold`` probable; its adapter applies at placeholder columns only (a forward
without placeholders does not touch it), so the same loaded model decodes the references as the
model it was fine-tuned from does: ``greedy``, and the lossless drafters ``copy`` and ``anpd``
(token for token greedy). Per strategy and batch size, every decoder runs over the same sentences, interleaved
batch by batch so that noise hits them alike: wall-clock speed-up over greedy, decoded tokens
per decoding forward, micro-F1, and answers that ran to their token limit (unfinished).

Usage: python benchmarks/lud.py [--limit N] [--json PATH] [--model LUD_MODEL] [--data FILE]
       [--threshold T] [--min-probability P] [--batch-sizes 1,16] [--strategies ar,padellm]
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.reporting import bar_plots, benchmark_parser, dtype_name, print_table, require_model, write_json  # noqa: E402
from corpora import read_corpus  # noqa: E402
from general_decoding import Decoder, get_decoder  # noqa: E402
from ner_service.engine import NEREngine  # noqa: E402
from training.evaluate import span_f1  # noqa: E402

RECIPE = "en-conll03-lud"
REFERENCES = ("greedy", "copy", "anpd")


@dataclass
class Run:
    """One decoder on one engine, and what it measured."""

    engine: NEREngine
    decoder: str | Decoder
    seconds: float = 0.0
    tokens: int = 0
    forwards: int = 0
    unfinished: int = 0
    predicted: list = field(default_factory=list)


def measure(lud: NEREngine, lud_decoders: dict[str, Decoder], texts: list[str], strategy: str,
            batch_size: int, references: tuple[str, ...] = REFERENCES) -> dict[str, Run]:
    """Every decoder over ``texts`` in batches, interleaved batch by batch: the ``references``
    and the ``lud_decoders``, all on the LUD model."""
    runs = {name: Run(lud, name) for name in references} | {name: Run(lud, d) for name, d in lud_decoders.items()}
    for run in runs.values():  # warm-up
        run.engine.extract(texts[:batch_size], strategy=strategy, decoder=run.decoder)
    for start in tqdm(range(0, len(texts), batch_size), desc=f"{strategy} batch {batch_size}", unit="batch"):
        batch = texts[start:start + batch_size]
        for run in runs.values():
            began = time.perf_counter()
            results = run.engine.extract(batch, strategy=strategy, decoder=run.decoder)
            run.seconds += time.perf_counter() - began
            stats = results[0].stats  # the batch's, shared by its texts
            run.tokens += stats.generated_tokens
            run.forwards += stats.forward_passes - (1 if strategy == "padellm" else 0)  # the count step is not decoding
            run.unfinished += stats.unfinished_answers
            run.predicted += [[(e.start, e.end, e.label) for e in result.entities] for result in results]
    return runs


def main() -> None:
    parser = benchmark_parser(__doc__, "lud", limit=100, limit_help="dev sentences", model=RECIPE,
                              model_help=f"the LUD model (name or folder; padellm-ner train --recipe {RECIPE} writes runs/{RECIPE})", dtype=True)
    parser.add_argument("--threshold", type=float, default=0.9, help="placeholder confidence that extends a unit")
    parser.add_argument("--min-probability", type=float, default=0.5,
                        help="the narrower verified arm: a draft stops before a placeholder prediction less probable than this")
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--strategies", default="ar,padellm", help="comma-separated: ar, padellm")
    args = parser.parse_args()
    require_model("lud", args.model, RECIPE)

    lud = NEREngine.load(args.model, dtype=args.dtype)
    unit_size = lud.ner_model.config.lud_unit_size or 4
    decoders = {"lud": get_decoder("lud", unit_size=unit_size),
                f"lud, units of {unit_size - 1}": get_decoder("lud", unit_size=unit_size - 1),
                f"lud, drafts >= {args.min_probability}": get_decoder("lud", unit_size=unit_size, min_probability=args.min_probability),
                f"lud ({args.threshold})": get_decoder("lud", unit_size=unit_size, threshold=args.threshold)}
    examples = [e for e in read_corpus(args.data) if e.text.strip()][: args.limit]
    texts = [e.text for e in examples]
    gold = [[(s.start, s.end, s.label) for s in e.spans] for e in examples]
    rows = []
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        for strategy in args.strategies.split(","):
            runs = measure(lud, decoders, texts, strategy, batch_size)
            for name, run in runs.items():
                rows.append({
                    "strategy": strategy, "batch": batch_size, "decoder": name,
                    "speedup_vs_greedy": runs["greedy"].seconds / run.seconds,
                    "ms_per_text": 1000 * run.seconds / len(texts),
                    "tokens_per_forward": run.tokens / max(run.forwards, 1),
                    "micro_f1": span_f1(gold, run.predicted)["micro_f1"],
                    "unfinished_answers": run.unfinished,
                })
    print(f"\n{args.model} (lud, threshold {args.threshold}) against its own {', '.join(REFERENCES)}, "
          f"{len(texts)} sentences, {torch.get_num_threads()} threads")
    print_table(rows, ["strategy", "batch", "decoder", "speedup_vs_greedy", "ms_per_text", "tokens_per_forward", "micro_f1", "unfinished_answers"])
    path = write_json(args.json, {"benchmark": "lud", "model": args.model, "dtype": dtype_name(lud),
                                  "references": list(REFERENCES),
                                  "threshold": args.threshold, "n_sentences": len(texts), "results": rows})
    png = bar_plots(path.with_suffix(".png"), [f"{r['strategy']} b{r['batch']} {r['decoder']}" for r in rows], {
        "speed-up over greedy": [r["speedup_vs_greedy"] for r in rows],
        "tokens per forward": [r["tokens_per_forward"] for r in rows],
        "micro-F1": [r["micro_f1"] for r in rows],
    }, f"Lexical-unit decoding, {args.model}")
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
