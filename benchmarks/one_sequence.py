"""PaDeLLM's branches in one sequence (tree attention, prefix cached once) against the batched
engine (one row per query, each row with its copy of the prefix), at batch 1, in one run.

Sentences are bucketed by their gold entity count (1, 5, 20+; CoNLL-03 dev first, then train
for buckets dev cannot fill). Per bucket: latency of both layouts (interleaved, same texts),
the peak KV-cache bytes held while decoding, and whether the entities are identical.

Usage: python benchmarks/one_sequence.py [--limit N] [--json PATH] [--model NAME] [--data FILE ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.reporting import bar_plots, print_table, write_json  # noqa: E402
from ner_service.engine import NEREngine  # noqa: E402
from corpora import Example, read_corpus  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONLL = REPO.parent / "shared" / "data" / "conll2003"
BUCKETS = {"1": (1, 1), "5": (5, 5), "20+": (20, 10_000)}
LAYOUTS = {"batched": "greedy", "one_sequence": "one_sequence"}


def bucketed(paths: list[str], limit: int) -> dict[str, list[Example]]:
    """Up to ``limit`` sentences per bucket, taken from ``paths`` in order."""
    chosen: dict[str, list[Example]] = {name: [] for name in BUCKETS}
    for path in paths:
        for example in read_corpus(path):
            for name, (low, high) in BUCKETS.items():
                if low <= len(example.spans) <= high and len(chosen[name]) < limit:
                    chosen[name].append(example)
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=10, help="sentences per bucket (default %(default)s)")
    parser.add_argument("--json", default="benchmarks/results/one_sequence.json")
    parser.add_argument("--model", default="en-conll03")
    parser.add_argument("--data", nargs="+", default=[str(CONLL / "dev.txt"), str(CONLL / "train.txt")])
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per text and layout (median kept)")
    args = parser.parse_args()

    engine = NEREngine.load(args.model)
    buckets = bucketed(args.data, args.limit)
    results = []
    for bucket, examples in buckets.items():
        if not examples:
            print(f"bucket {bucket}: no sentence found, skipped")
            continue
        latency = {layout: [] for layout in LAYOUTS}
        kv_bytes = {layout: [] for layout in LAYOUTS}
        forwards = {layout: [] for layout in LAYOUTS}
        identical = True
        for example in tqdm(examples, desc=f"{bucket} entities", unit="text"):
            spans = {}
            for backend in LAYOUTS.values():
                engine.extract([example.text], decoder=backend)  # warm-up for this shape
            for layout, backend in LAYOUTS.items():
                times = []
                for _ in range(args.repeats):
                    began = time.perf_counter()
                    out = engine.extract([example.text], decoder=backend)[0]
                    times.append(time.perf_counter() - began)
                latency[layout].append(1000 * statistics.median(times))
                kv_bytes[layout].append(out.stats.kv_cache_bytes)
                forwards[layout].append(out.stats.forward_passes)
                spans[layout] = [(e.start, e.end, e.label) for e in out.entities]
            identical &= spans["batched"] == spans["one_sequence"]
        row = {
            "entities_bucket": bucket,
            "n_texts": len(examples),
            "batched_ms": statistics.fmean(latency["batched"]),
            "one_sequence_ms": statistics.fmean(latency["one_sequence"]),
            "latency_ratio": sum(latency["one_sequence"]) / sum(latency["batched"]),
            "batched_kv_mb": statistics.fmean(kv_bytes["batched"]) / 2**20,
            "one_sequence_kv_mb": statistics.fmean(kv_bytes["one_sequence"]) / 2**20,
            "kv_bytes_ratio": sum(kv_bytes["one_sequence"]) / max(sum(kv_bytes["batched"]), 1),
            "forward_passes": statistics.fmean(forwards["one_sequence"]),
            "identical": identical,
        }
        results.append(row)
    print(f"\n{args.model}, batch 1, float32, {torch.get_num_threads()} threads, {args.repeats} timed runs per text")
    print_table(results, ["entities_bucket", "n_texts", "batched_ms", "one_sequence_ms", "latency_ratio",
                          "batched_kv_mb", "one_sequence_kv_mb", "kv_bytes_ratio", "forward_passes", "identical"])
    path = write_json(args.json, {"benchmark": "one_sequence", "model": args.model, "results": results})
    png = bar_plots(path.with_suffix(".png"), [r["entities_bucket"] for r in results], {
        "latency, one sequence / batched": [r["latency_ratio"] for r in results],
        "KV bytes, one sequence / batched": [r["kv_bytes_ratio"] for r in results],
    }, f"PaDeLLM branches in one sequence vs batched rows, {args.model}")
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
