"""``torch.compile`` against eager PyTorch on the engine's path, the same texts, in one run.

Two engines of the same model: ``eager`` (the default path) and ``compiled``, whose decoder
layers (``--scope layers``) or their MLP blocks only (``--scope mlp``) go through TorchInductor
with dynamic shapes (the engine's forwards change width with every batch, prefix and branch
tree). Batches alternate between the arms so that machine noise hits both alike; the first batch
of each size is untimed and its compile time reported. Per arm and batch size: ms a text,
micro-F1, and how many texts got the same entities as eager.

    python benchmarks/torch_compile.py --limit 32 --batch-sizes 1,16 [--scope layers|mlp]

The JSON's top level holds ``speedup_batch1`` and ``speedup_batch16`` (eager time over
compiled, where those batch sizes ran).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.reporting import bar_plots, benchmark_parser, dtype_name, print_table, write_json  # noqa: E402
from corpora import read_corpus  # noqa: E402
from ner_service.engine import NEREngine  # noqa: E402
from training.evaluate import span_f1  # noqa: E402

Spans = list[tuple[int, int, str]]


def compiled_engine(model: str, dtype: str, scope: str) -> NEREngine:
    """An engine of ``model`` whose decoder layers (or their MLP blocks) are compiled, dynamic shapes."""
    engine = NEREngine.load(model, dtype=dtype)
    engine.ner_model.model.requires_grad_(False)  # one guard for every layer's weights
    for layer in engine.ner_model.model.get_decoder().layers:
        (layer.mlp if scope == "mlp" else layer).compile(dynamic=True)
    return engine


def spans_of(engine: NEREngine, texts: list[str]) -> list[Spans]:
    return [[(e.start, e.end, e.label) for e in result.entities] for result in engine.extract(texts)]


def main() -> None:
    parser = benchmark_parser(__doc__, "torch_compile", limit=32, dtype=True)
    parser.add_argument("--batch-sizes", default="1,16", help="comma-separated (default %(default)s)")
    parser.add_argument("--scope", default="layers", choices=["layers", "mlp"], help="what is compiled (default %(default)s)")
    args = parser.parse_args()

    examples = [e for e in read_corpus(args.data) if e.text.strip()][: args.limit]
    texts = [e.text for e in examples]
    gold = [[(s.start, s.end, s.label) for s in e.spans] for e in examples]
    arms = {"eager": NEREngine.load(args.model, dtype=args.dtype), "compiled": compiled_engine(args.model, args.dtype, args.scope)}
    rows = []
    for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
        began = time.perf_counter()
        spans_of(arms["compiled"], texts[:batch_size])
        compile_seconds = time.perf_counter() - began
        spans_of(arms["eager"], texts[:batch_size])
        seconds = dict.fromkeys(arms, 0.0)
        found: dict[str, list[Spans]] = {name: [] for name in arms}
        for number, start in enumerate(range(0, len(texts), batch_size)):
            batch = texts[start:start + batch_size]
            for name in (list(arms) if number % 2 == 0 else list(arms)[::-1]):
                began = time.perf_counter()
                found[name] += spans_of(arms[name], batch)
                seconds[name] += time.perf_counter() - began
        for name in arms:
            rows.append({"batch": batch_size, "arm": name, "ms_per_text": 1000 * seconds[name] / len(texts),
                         "speedup": seconds["eager"] / seconds[name], "f1": span_f1(gold, found[name])["micro_f1"],
                         "same_entities": sum(a == b for a, b in zip(found[name], found["eager"])), "texts": len(texts),
                         "first_batch_s": compile_seconds if name == "compiled" else None})
    dtype = dtype_name(arms["eager"])
    print(f"\n{args.model}, {len(texts)} sentences, {dtype}, {torch.get_num_threads()} threads, compiled: {args.scope}")
    print_table(rows, ["batch", "arm", "ms_per_text", "speedup", "f1", "same_entities", "texts", "first_batch_s"])
    speedups = {f"speedup_batch{r['batch']}": r["speedup"] for r in rows if r["arm"] == "compiled"}
    path = write_json(args.json, {"benchmark": "torch_compile", "model": args.model, "dtype": dtype, "scope": args.scope,
                                  "n_sentences": len(texts), "threads": torch.get_num_threads(), **speedups, "results": rows})
    compiled = [r for r in rows if r["arm"] == "compiled"]
    png = bar_plots(path.with_suffix(".png"), [f"batch {r['batch']}" for r in compiled], {
        "speed-up of torch.compile over eager": [r["speedup"] for r in compiled],
        "texts with eager's entities (share)": [r["same_entities"] / r["texts"] for r in compiled],
    }, f"torch.compile ({args.scope}) on {args.model}, {dtype}")
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
