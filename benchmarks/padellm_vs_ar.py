"""PaDeLLM-NER against the autoregressive baseline, at batch 1, in one run.

Three variants of the same model on the same CoNLL-03 dev sentences, interleaved sentence
by sentence so that machine noise hits them alike:

* ``ar``: every label's mentions generated in one sequence (the baseline);
* ``padellm``: prefix encoded once, count and mention queries batched over its KV cache;
* ``padellm_reencode``: PaDeLLM re-encoding the text for every query (the reference
  implementation's way: :mod:`benchmarks.reencoding`).

``--backend`` is the token decoder of PaDeLLM's mention answers, ``--ar-backend`` that of the
baseline (greedy unless asked: the baseline as the paper runs it).

Usage: python benchmarks/padellm_vs_ar.py [--limit N] [--json PATH] [--model NAME] [--data FILE] [--backend NAME] [--ar-backend NAME]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.reporting import bar_plots, benchmark_parser, print_table, write_json  # noqa: E402
from benchmarks.reencoding import reencoding_padellm  # noqa: E402
from ner_service.engine import NEREngine  # noqa: E402
from training.data import read_corpus  # noqa: E402
from training.evaluate import span_f1  # noqa: E402

VARIANTS = ("ar", "padellm", "padellm_reencode")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = benchmark_parser(__doc__, "padellm_vs_ar", limit=100)
    parser.add_argument("--backend", default="greedy", help="token decoder of PaDeLLM's mention answers (default %(default)s)")
    parser.add_argument("--ar-backend", default="greedy", help="token decoder of the AR baseline (default %(default)s)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()

    examples = [e for e in read_corpus(args.data) if e.text.strip()][: args.limit]
    shared = NEREngine.load(args.model, dtype=getattr(torch, args.dtype), device=args.device)
    engines = {
        "ar": (shared, "ar", args.ar_backend),
        "padellm": (shared, "padellm", args.backend),
        "padellm_reencode": (shared, reencoding_padellm(shared), args.backend),
    }
    shared.extract([examples[0].text], strategy="padellm")  # warm-up
    latency: dict[str, list[float]] = {v: [] for v in VARIANTS}
    forwards: dict[str, list[int]] = {v: [] for v in VARIANTS}
    predicted: dict[str, list[list[tuple[int, int, str]]]] = {v: [] for v in VARIANTS}
    for example in tqdm(examples, desc="sentences", unit="text"):
        for variant, (engine, decoder, backend) in engines.items():
            (result,) = engine.extract([example.text], strategy=decoder, decoder=backend)
            latency[variant].append(result.stats.latency_ms)
            forwards[variant].append(result.stats.forward_passes)
            predicted[variant].append([(e.start, e.end, e.label) for e in result.entities])
    gold = [[(s.start, s.end, s.label) for s in e.spans] for e in examples]
    ar_mean = statistics.fmean(latency["ar"])
    rows = []
    for variant in VARIANTS:
        mean = statistics.fmean(latency[variant])
        rows.append({
            "variant": variant,
            "f1": span_f1(gold, predicted[variant])["micro_f1"],
            "latency_ms_mean": mean,
            "latency_ms_p50": percentile(latency[variant], 0.5),
            "latency_ms_p90": percentile(latency[variant], 0.9),
            "speedup_vs_ar": ar_mean / mean,
            "forward_passes_mean": statistics.fmean(forwards[variant]),
        })
    print(f"\n{args.model} on {len(examples)} sentences of {args.data}, batch 1, backend {args.backend} (AR: {args.ar_backend}), {args.dtype}, {args.device}"
          + ("" if args.device != "cpu" else f", {torch.get_num_threads()} threads"))
    print_table(rows, ["variant", "f1", "latency_ms_mean", "latency_ms_p50", "latency_ms_p90", "speedup_vs_ar", "forward_passes_mean"])
    path = write_json(args.json, {"benchmark": "padellm_vs_ar", "model": args.model, "n_sentences": len(examples),
                                  "backend": args.backend, "ar_backend": args.ar_backend, "dtype": args.dtype, "device": args.device, "results": rows})
    png = bar_plots(path.with_suffix(".png"), list(VARIANTS), {
        "mean latency (ms)": [r["latency_ms_mean"] for r in rows],
        "speed-up over AR": [r["speedup_vs_ar"] for r in rows],
        "micro-F1": [r["f1"] for r in rows],
    }, f"PaDeLLM vs AR, {args.model}, batch 1, {len(examples)} CoNLL-03 dev sentences")
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
