"""Does the API's estimate of a request's work follow the engine's time as labels are added? The
estimate admission uses (a text's tokens and its labels' queries in each window it is read in,
:mod:`ner_service.api.core.work`) against the text-only one (a text's tokens and 8 a text, the
estimate before labels were counted), on the same engine calls, in one run.

Admission multiplies work by one measured rate, so an estimate is as good as the engine's
milliseconds per token of work stay the same whatever labels are asked: the figure is their
spread across label sets, the largest over the smallest. Each label set (``--label-counts`` names, and ``--described``
names each with a long description) is asked of dev sentences in batches of 16, as the API
batches them, and of the pieces the API cuts a long text into, one at a time; the label sets
take turns batch by batch, so that machine noise hits them alike. An open model is asked
CoNLL-03's four types by name, then the types of ``padellm_vs_ar.FILLER_LABELS``; a closed
model its own labels only.

Usage: python benchmarks/work_estimate.py [--model NAME] [--data FILE] [--limit N]
       [--label-counts 1,4,16,48] [--described 8] [--json PATH]
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.padellm_vs_ar import FILLER_LABELS  # noqa: E402
from benchmarks.reporting import bar_plots, benchmark_parser, dtype_name, fail, print_table, require_model, write_json  # noqa: E402

#: The text-only estimate's charge for a text's queries, whatever its labels (the baseline).
TEXT_ONLY_QUERY_TOKENS = 8
#: The first labels an open model is asked: CoNLL-03's types by name.
NAMES = ("person", "location", "organization", "miscellaneous") + FILLER_LABELS + (
    "city", "country", "building", "company", "political party", "sports team", "band", "song", "album", "book", "film",
    "television show", "newspaper", "university", "ship", "river", "mountain", "festival", "brand", "website")
#: A long description (MAX_DESCRIPTION_CHARS is 300; a request's labels may hold MAX_REQUEST_LABEL_CHARS in all).
DESCRIPTION = ("a thing of this kind as the annotation guidelines of a detailed corpus define it, with its examples, "
               "its exceptions and its edge cases, and notes on nesting and on what is not one at all")
BATCH_TEXTS = 16  # NER_BATCH_MAX_TEXTS
PIECE_TOKENS, LONG_TEXT_TOKENS = 64, 160  # NER_PIECE_TOKENS, NER_LONG_TEXT_TOKENS


@dataclass
class Arm:
    """One label set asked of one kind of text: the engine's seconds and both estimates' work."""

    texts: str
    labels: str
    options: object
    seconds: float = 0.0
    text_only: int = 0
    with_queries: int = 0

    def row(self) -> dict[str, object]:
        return {"texts": self.texts, "labels": self.labels, "seconds": self.seconds, "text_only_tokens": self.text_only,
                "work_tokens": self.with_queries, "ms_per_text_only_token": 1000 * self.seconds / max(1, self.text_only),
                "ms_per_work_token": 1000 * self.seconds / max(1, self.with_queries)}


def label_sets(engine, counts: list[int], described: int) -> dict[str, list[object]]:
    """The label sets to ask, by name: the model's own for a closed model."""
    if not engine.ner_model.config.open_labels:
        return {f"{len(engine.labels)} own": list(engine.labels)}
    sets: dict[str, list[object]] = {str(n): list(NAMES[:n]) for n in counts if n <= len(NAMES)}
    if described:
        sets[f"{described} described"] = [{"name": name, "description": DESCRIPTION} for name in NAMES[:described]]
    return sets


def spreads(rows: list[dict[str, object]], key: str) -> dict[str, float]:
    """Per kind of text, the largest ``key`` over the smallest across label sets: how far one rate
    misjudges a request by its labels (the kinds differ in batch size, which no label changes)."""
    kinds: dict[str, list[float]] = {}
    for row in rows:
        kinds.setdefault(str(row["texts"]), []).append(float(row[key]))  # type: ignore[arg-type]
    return {kind: max(values) / min(values) for kind, values in kinds.items()}


def main() -> None:
    parser = benchmark_parser(__doc__, "work_estimate", 32, model="open", dtype=True)
    parser.add_argument("--label-counts", default="1,4,16,48", help="numbers of label names to ask an open model (default %(default)s)")
    parser.add_argument("--described", type=int, default=8,
                        help="also ask this many names with long descriptions (0: not; a request may hold 2,000 characters of labels)")
    args = parser.parse_args()
    require_model("work_estimate.py", args.model, args.model)

    from corpora import read_corpus
    from ner_service.api.core.work import Reading, estimated_tokens, pieces_of
    from ner_service.engine import NEREngine

    sentences = [example.text for example in read_corpus(args.data)[: args.limit] if example.text.strip()]
    if not sentences:
        fail("work_estimate.py", f"no texts in {args.data}")
    pieces = [piece.text for piece in pieces_of([" ".join(sentences)], PIECE_TOKENS, LONG_TEXT_TOKENS)]
    engine = NEREngine.load(args.model, dtype=args.dtype)
    sets = label_sets(engine, [int(n) for n in args.label_counts.split(",") if n.strip()], args.described)
    batches = {"sentences, 16 a call": [sentences[i:i + BATCH_TEXTS] for i in range(0, len(sentences), BATCH_TEXTS)],
               "pieces of one long text": [[piece] for piece in pieces]}
    arms = [Arm(kind, name, engine.options(labels)) for kind in batches for name, labels in sets.items()]
    engine.extract_with(arms[0].options, sentences[:2])  # warm-up, untimed
    for kind, calls in batches.items():
        for index, texts in enumerate(calls):
            for arm in (a for a in arms if a.texts == kind):
                reading = Reading.of(arm.options, engine.ner_model.config)
                began = time.perf_counter()
                engine.extract_with(arm.options, texts)
                arm.seconds += time.perf_counter() - began
                arm.text_only += sum(estimated_tokens(t) + TEXT_ONLY_QUERY_TOKENS for t in texts if t.strip())
                arm.with_queries += sum(reading.work(t) for t in texts)
            print(f"{kind}: call {index + 1} of {len(calls)} done", file=sys.stderr, flush=True)
    rows = [arm.row() for arm in arms]
    spread = {estimate: max(spreads(rows, key).values())
              for estimate, key in (("text only", "ms_per_text_only_token"), ("with queries", "ms_per_work_token"))}
    print(f"{engine.name}, {dtype_name(engine)}, {len(sentences)} sentences and {len(pieces)} pieces of {args.data}")
    print_table(rows, ["texts", "labels", "seconds", "text_only_tokens", "work_tokens", "ms_per_text_only_token", "ms_per_work_token"])
    print(f"spread of ms a token of work across label sets (largest over smallest, the worse kind of text): text only {spread['text only']:.1f}x, "
          f"with queries {spread['with queries']:.1f}x")
    path = write_json(args.json, {"benchmark": "work_estimate", "model": engine.name, "dtype": dtype_name(engine),
                                  "n_sentences": len(sentences), "n_pieces": len(pieces), "results": rows, "spread": spread})
    names = [f"{r['labels']}\n{'sentences' if r['texts'].startswith('sentences') else 'pieces'}" for r in rows]
    bar_plots(path.with_suffix(".png"), names, {"ms a text-only token (the baseline)": [r["ms_per_text_only_token"] for r in rows],
                                                "ms a token of work (texts and queries)": [r["ms_per_work_token"] for r in rows]},
              f"{engine.name}: engine time per estimated token of work")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
