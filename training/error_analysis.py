"""Where PaDeLLM's errors come from: counts too low or too high, mentions that name another
entity, boundaries and labels, per label, so that the next training step knows where to push.

The engine runs as usual, with its strategy wrapped to record each window's answers before
alignment: under PaDeLLM every (label, k) query answers one mention, so a label's answers in a
window are its count. Each (text, label) is then scored against the gold spans:

* a gold entity missed is put down first to the **count** (a count below the gold number
  loses that many), then to a **boundary** (a prediction of the same label overlaps it), a
  **label** (the same span came out under another label), else to a **mention** (its k-th
  query named another entity, a duplicate, or nothing in the text);
* a false entity is put down first to the **count** (a count above the gold number), then to a
  boundary, a **label** (the span is an entity of another label), else to a **mention** (a span
  that is no entity).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from tqdm import tqdm

from corpora import Example, Span
from general_decoding import Decoder
from ner_service.engine import ExtractOptions, NEREngine
from ner_service.engine.chunking import Window
from ner_service.engine.results import ExtractionStats
from ner_service.engine.spans import Entity, Mention
from ner_service.engine.strategies.base import Strategy

#: The causes, in the order a miss or a false entity is put down to them.
CAUSES = ("count", "boundary", "label", "mention")


class RecordingStrategy(Strategy):
    """Another strategy, asked as usual, counting each text's answers per label as they were
    answered (before alignment: under PaDeLLM, a label's count)."""

    def __init__(self, inner: Strategy) -> None:
        super().__init__(inner.ner_model, inner.options)
        self.inner = inner
        self.answers: Counter[tuple[int, str]] = Counter()  # (text index in the batch, label) -> answers

    def mentions(self, windows: list[Window], labels: list[str], decoder: Decoder, stats: ExtractionStats) -> list[list[Mention]]:
        found = self.inner.mentions(windows, labels, decoder, stats)
        for window, mentions in zip(windows, found):
            self.answers.update((window.text_index, mention.label) for mention in mentions)
        return found


@dataclass
class ErrorBreakdown:
    """Missed and false entities by cause and label, with how often the count was right."""

    missed: Counter[tuple[str, str]] = field(default_factory=Counter)  # (cause, label) -> entities
    false: Counter[tuple[str, str]] = field(default_factory=Counter)
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)  # (low | right | high, label) -> (text, label) pairs
    gold: Counter[str] = field(default_factory=Counter)

    def add(self, label: str, gold: set[Span], predicted: set[Span], other_predicted: set[Span], other_gold: set[Span],
            count: int) -> None:
        """Score one (text, label): its gold and predicted spans, the predicted and gold spans of
        the other labels, and the label's count."""
        self.gold[label] += len(gold)
        self.counts["low" if count < len(gold) else "high" if count > len(gold) else "right", label] += 1
        for errors, wrong, budget, overlapping, elsewhere in (
                (self.missed, gold - predicted, len(gold) - count, predicted, other_predicted),
                (self.false, predicted - gold, count - len(gold), gold, other_gold)):
            for span in sorted(wrong, key=lambda s: (s.start, s.end)):
                if budget > 0:
                    cause, budget = "count", budget - 1
                elif any(o.start < span.end and span.start < o.end for o in overlapping):
                    cause = "boundary"
                elif any((o.start, o.end) == (span.start, span.end) for o in elsewhere):
                    cause = "label"
                else:
                    cause = "mention"
                errors[cause, label] += 1

    def to_dict(self) -> dict[str, object]:
        labels = sorted(self.gold)
        table = {kind: {cause: {label: errors[cause, label] for label in labels} for cause in CAUSES}
                 for kind, errors in (("missed", self.missed), ("false", self.false))}
        counts = {verdict: {label: self.counts[verdict, label] for label in labels} for verdict in ("low", "right", "high")}
        return {"gold": dict(self.gold), **table, "counts": counts}

    def table(self) -> str:
        """A Markdown table: per cause, entities missed and false, all labels and per label."""
        labels = sorted(self.gold)
        lines = ["| cause | missed | false | " + " | ".join(f"{label} missed / false" for label in labels) + " |",
                 "| --- | --- | --- | " + " | ".join("---" for _ in labels) + " |"]
        for cause in CAUSES:
            missed = sum(self.missed[cause, label] for label in labels)
            false = sum(self.false[cause, label] for label in labels)
            cells = " | ".join(f"{self.missed[cause, label]} / {self.false[cause, label]}" for label in labels)
            lines.append(f"| {cause} | {missed} | {false} | {cells} |")
        pairs = sum(self.counts.values())
        right = sum(n for (verdict, _), n in self.counts.items() if verdict == "right")
        low = sum(n for (verdict, _), n in self.counts.items() if verdict == "low")
        lines.append(f"\ncounts right for {right} of {pairs} (text, label) pairs; too low {low}, too high {pairs - right - low}; "
                     f"gold entities {sum(self.gold.values())}")
        return "\n".join(lines)


def _spans(entities: Sequence[Entity | Span], label: str) -> set[Span]:
    return {Span(e.start, e.end, e.label) for e in entities if e.label == label}


def padellm_errors(engine: NEREngine, examples: Sequence[Example], options: ExtractOptions, batch_size: int = 16,
                   progress: bool = True) -> ErrorBreakdown:
    """Run ``engine`` with ``options`` (a strategy that asks one query per mention, PaDeLLM) over
    ``examples`` and put each missed and false entity down to its cause."""
    breakdown = ErrorBreakdown()
    labels = list(options.labels or engine.labels)
    batch_size = min(batch_size, engine.max_batch_texts)  # one engine batch per call: window.text_index counts within it
    for start in tqdm(range(0, len(examples), batch_size), desc="error analysis", unit="batch", disable=not progress):
        batch = examples[start:start + batch_size]
        recorder = RecordingStrategy(engine.strategy(options.strategy or "padellm"))
        results = engine.extract_with(options, [e.text for e in batch], strategy=recorder)
        for index, (example, result) in enumerate(zip(batch, results)):
            for label in labels:
                other_predicted = {Span(e.start, e.end, e.label) for e in result.entities if e.label != label}
                other_gold = {s for s in example.spans if s.label != label}
                breakdown.add(label, _spans(example.spans, label), _spans(result.entities, label), other_predicted, other_gold,
                              recorder.answers[index, label])
    return breakdown
