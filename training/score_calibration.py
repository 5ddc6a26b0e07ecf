"""How far a mention's score can be trusted as the probability that it is right, measured on a
dev set: precision and recall at thresholds, a reliability table and the expected calibration
error (ECE).

A score is the probability the model gave its answer (PaDeLLM: the mention's path, its label's
count included; AR: its line's); a mention is right when its exact ``(start, end, label)`` is
gold. A threshold drops the mentions scored below it (``Extraction.above``), so the table below
says what a user who sets it keeps and loses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from corpora import Example
from ner_service.engine import ExtractOptions, NEREngine

#: The thresholds every card reports.
CARD_THRESHOLDS = (0.0, 0.3, 0.5, 0.7)


@dataclass(frozen=True)
class ScoredMention:
    score: float
    right: bool


def scored_mentions(engine: NEREngine, examples: Sequence[Example], options: ExtractOptions,
                    batch_size: int = 16) -> tuple[list[ScoredMention], int]:
    """Every predicted mention of ``examples`` with its score and whether it is gold, and how many
    gold mentions of the asked labels there are."""
    labels = set(options.labels or ())
    mentions: list[ScoredMention] = []
    gold_total = 0
    for start in range(0, len(examples), batch_size):
        batch = examples[start:start + batch_size]
        for example, result in zip(batch, engine.extract_with(options, [e.text for e in batch])):
            gold = {(s.start, s.end, s.label) for s in example.spans if s.label in labels}
            gold_total += len(gold)
            mentions.extend(ScoredMention(e.score, (e.start, e.end, e.label) in gold) for e in result.entities)
    return mentions, gold_total


def at_thresholds(mentions: Sequence[ScoredMention], gold_total: int,
                  thresholds: Iterable[float] = CARD_THRESHOLDS) -> list[dict[str, float]]:
    """Precision, recall and F1 (in %) of the mentions scored at least each threshold."""
    rows = []
    for threshold in thresholds:
        kept = [m for m in mentions if m.score >= threshold]
        right = sum(m.right for m in kept)
        precision = 100 * right / len(kept) if kept else 0.0
        recall = 100 * right / gold_total if gold_total else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        rows.append({"threshold": threshold, "precision": precision, "recall": recall, "f1": f1, "kept": len(kept)})
    return rows


def reliability(mentions: Sequence[ScoredMention], bins: Sequence[float] = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0)
                ) -> tuple[list[dict[str, float]], float]:
    """The mentions binned by score (``bins`` are the edges; a bin holds ``lo <= score < hi``, the
    last one ``score == 1`` too): per bin how many, their mean score and how many are right; and
    the expected calibration error, the mean over mentions of |mean score - share right| of their
    bin (0: a score of 0.8 is right 8 times in 10)."""
    rows, weighted_gap = [], 0.0
    for number, (lo, hi) in enumerate(zip(bins, bins[1:])):
        last = number == len(bins) - 2
        inside = [m for m in mentions if lo <= m.score < hi or (last and m.score == hi)]
        if not inside:
            continue
        mean_score = sum(m.score for m in inside) / len(inside)
        accuracy = sum(m.right for m in inside) / len(inside)
        rows.append({"from": lo, "to": hi, "mentions": len(inside), "mean_score": mean_score, "right": accuracy})
        weighted_gap += len(inside) * abs(mean_score - accuracy)
    return rows, (weighted_gap / len(mentions) if mentions else 0.0)
