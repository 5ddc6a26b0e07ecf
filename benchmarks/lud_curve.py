"""The curve of a lexical-unit training run: what each snapshot of the placeholder adapter
gives, against the CPU minutes it had trained.

``padellm-ner train --recipe en-conll03-lud`` writes a loadable snapshot at every timed
checkpoint (``runs/en-conll03-lud/snapshots/minute-N``, N counting the frozen pass too). Each
snapshot and the run's final model decode the same dev sentences with ``lud`` (verified: token
for token greedy) and with the paper's unverified acceptance (``--threshold``), interleaved
batch by batch with its own greedy decoding (the baseline, measured in the same run: a
placeholder adapter applies at placeholder columns only, so greedy decodes as the model the run
fine-tuned): decoded tokens per decoding forward, speed-up over greedy and micro-F1, as a
table, JSON and a PNG curve.

Usage: python benchmarks/lud_curve.py [--run FOLDER] [--limit N] [--json PATH] [--data FILE]
       [--strategy ar|padellm] [--batch-size B] [--threshold T]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.lud import RECIPE, measure  # noqa: E402
from benchmarks.reporting import benchmark_parser, fail, print_table, save_figure, write_json  # noqa: E402
from corpora import read_corpus  # noqa: E402
from general_decoding import get_decoder  # noqa: E402
from ner_service.engine import NEREngine  # noqa: E402
from training.evaluate import span_f1  # noqa: E402


def snapshots(run: Path) -> list[tuple[float | None, Path]]:
    """``(minutes, folder)`` of every snapshot in time order, then the final model (minutes None)."""
    found = []
    for folder in (run / "snapshots").glob("minute-*"):
        if (match := re.fullmatch(r"minute-(\d+)", folder.name)) and (folder / "ner_model.json").is_file():
            found.append((float(match.group(1)), folder))
    final = [(None, run)] if (run / "ner_model.json").is_file() else []
    return sorted(found) + final


def plot(path: Path, rows: list[dict], title: str) -> Path:
    """Tokens per forward and micro-F1 against CPU minutes, one line per decoder."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    baseline = next(r for r in rows if r["decoder"] == "greedy")
    for axis, key in zip(axes, ("tokens_per_forward", "micro_f1")):
        axis.axhline(baseline[key], color="grey", linestyle="--", linewidth=1, label="greedy (the baseline)")
    for decoder in dict.fromkeys(r["decoder"] for r in rows if r["decoder"] != "greedy"):
        points = [r for r in rows if r["decoder"] == decoder and r["minutes"] is not None]
        for axis, key in zip(axes, ("tokens_per_forward", "micro_f1")):
            axis.plot([r["minutes"] for r in points], [r[key] for r in points], marker="o", label=decoder)
    for axis, name in zip(axes, ("decoded tokens per forward", "micro-F1")):
        axis.set_xlabel("CPU minutes of the run (frozen pass included)")
        axis.set_title(name, fontsize=10)
        axis.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    return save_figure(figure, path)


def main() -> None:
    parser = benchmark_parser(__doc__, "lud_curve", limit=100, limit_help="dev sentences")
    parser.add_argument("--run", default=f"runs/{RECIPE}", help="the folder of a LUD training run (its snapshots/)")
    parser.add_argument("--strategy", default="ar", choices=("ar", "padellm"))
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--threshold", type=float, default=0.9, help="placeholder confidence of the unverified acceptance")
    args = parser.parse_args()
    points = snapshots(Path(args.run))
    if not points:
        fail("lud_curve", f"no LUD run with snapshots in {args.run}: `padellm-ner train --recipe {RECIPE}` writes one to runs/{RECIPE}")

    examples = [e for e in read_corpus(args.data) if e.text.strip()][: args.limit]
    texts = [e.text for e in examples]
    gold = [[(s.start, s.end, s.label) for s in e.spans] for e in examples]
    rows = []
    for minutes, folder in points:
        lud = NEREngine.load(folder)
        unit_size = lud.ner_model.config.lud_unit_size or 4
        decoders = {"lud": get_decoder("lud", unit_size=unit_size),
                    f"lud ({args.threshold})": get_decoder("lud", unit_size=unit_size, threshold=args.threshold)}
        runs = measure(lud, decoders, texts, args.strategy, args.batch_size, references=("greedy",))
        for name, run in runs.items():
            if name == "greedy" and rows:
                continue  # the baseline's F1 and tokens per forward are the same at every point
            rows.append({"minutes": minutes, "snapshot": folder.name if minutes is not None else "final", "decoder": name,
                         "tokens_per_forward": run.tokens / max(run.forwards, 1),
                         "speedup_vs_greedy": runs["greedy"].seconds / run.seconds,
                         "micro_f1": span_f1(gold, run.predicted)["micro_f1"]})
    print(f"\n{args.run}: {len(points)} models, {args.strategy} at batch {args.batch_size}, {len(texts)} sentences, "
          f"{torch.get_num_threads()} threads; baseline: each model's own greedy decoding")
    print_table(rows, ["snapshot", "minutes", "decoder", "tokens_per_forward", "speedup_vs_greedy", "micro_f1"])
    path = write_json(args.json, {"benchmark": "lud_curve", "run": args.run, "reference": "greedy",
                                  "strategy": args.strategy, "batch_size": args.batch_size, "threshold": args.threshold,
                                  "n_sentences": len(texts), "results": rows})
    png = plot(path.with_suffix(".png"), rows, f"{args.run}: lexical units against CPU minutes ({args.strategy}, batch {args.batch_size})")
    print(f"wrote {path} and {png}")


if __name__ == "__main__":
    main()
