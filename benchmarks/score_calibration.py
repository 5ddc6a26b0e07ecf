"""Can a user threshold a mention's score? Precision and recall at thresholds 0, 0.3, 0.5 and 0.7,
a reliability table and the expected calibration error, per strategy, on a dev file
(:mod:`training.score_calibration`).

Usage: python benchmarks/score_calibration.py [--model NAME] [--data FILE] [--limit N]
       [--strategies padellm,ar] [--decoder NAME] [--json PATH]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.reporting import bar_plots, benchmark_parser, print_table, require_model, write_json  # noqa: E402


def main() -> None:
    parser = benchmark_parser(__doc__, "score_calibration", 300)
    parser.add_argument("--strategies", default="padellm,ar", help="comma-separated (default %(default)s)")
    parser.add_argument("--decoder", default=None, help="the token decoder (default: the engine's)")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    require_model("score_calibration.py", args.model, args.model)

    from corpora import read_corpus
    from ner_service.engine import NEREngine
    from training.score_calibration import CARD_THRESHOLDS, at_thresholds, reliability, scored_mentions

    examples = read_corpus(args.data)[: args.limit]
    engine = NEREngine.load(args.model)
    report = {"model": engine.name, "data": str(args.data), "n_texts": len(examples), "strategies": {}}
    for strategy in [s.strip() for s in args.strategies.split(",") if s.strip()]:
        began = time.perf_counter()
        options = engine.options(None, strategy, args.decoder)
        mentions, gold = scored_mentions(engine, examples, options, args.batch_size)
        thresholds = at_thresholds(mentions, gold, CARD_THRESHOLDS)
        bins, ece = reliability(mentions)
        report["strategies"][strategy] = {"decoder": options.decoder, "gold": gold, "mentions": len(mentions), "ece": ece,
                                          "thresholds": thresholds, "reliability": bins,
                                          "seconds": time.perf_counter() - began}
        print(f"{engine.name} {strategy}/{options.decoder}: {len(examples)} texts, {len(mentions)} mentions, "
              f"{gold} gold, ECE {ece:.4f}")
        print_table(thresholds, ["threshold", "precision", "recall", "f1", "kept"])
        print_table(bins, ["from", "to", "mentions", "mean_score", "right"])
    path = write_json(args.json, report)
    names = list(report["strategies"])
    bar_plots(path.with_suffix(".png"), names, {
        "ECE": [report["strategies"][s]["ece"] for s in names],
        "precision at 0.5": [next(r["precision"] for r in report["strategies"][s]["thresholds"] if r["threshold"] == 0.5) for s in names],
    }, f"{engine.name}: scores against correctness ({len(examples)} dev texts)")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
