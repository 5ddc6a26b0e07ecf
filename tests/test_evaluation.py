"""Span micro-F1 on hand-built cases."""

from __future__ import annotations

import pytest

from training.evaluate import span_f1


def test_perfect_and_empty() -> None:
    assert span_f1([[(0, 2, "PER")]], [[(0, 2, "PER")]])["micro_f1"] == 100.0
    assert span_f1([[]], [[]])["micro_f1"] == 0.0


def test_exact_boundaries_and_label_are_required() -> None:
    gold = [[(0, 5, "PER"), (10, 15, "LOC")], [(3, 4, "ORG")]]
    predicted = [[(0, 5, "PER"), (10, 14, "LOC"), (20, 25, "MISC")], [(3, 4, "LOC")]]
    scores = span_f1(gold, predicted)
    # 1 true positive; 3 false positives; 2 false negatives
    assert scores["precision"] == pytest.approx(25.0)
    assert scores["recall"] == pytest.approx(100 / 3)
    assert scores["micro_f1"] == pytest.approx(2 * 0.25 * (1 / 3) / (0.25 + 1 / 3) * 100)
    assert scores["per_label"]["PER"]["f1"] == 100.0
    assert scores["per_label"]["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "tp": 0, "fp": 2, "fn": 1}
    assert scores["per_label"]["ORG"]["fn"] == 1


def test_lengths_must_match() -> None:
    with pytest.raises(ValueError):
        span_f1([[]], [[], []])
