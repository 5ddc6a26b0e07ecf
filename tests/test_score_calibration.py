"""Precision and recall at thresholds and the calibration error, on mentions whose rightness is known."""

from __future__ import annotations

import pytest

from training.score_calibration import ScoredMention, at_thresholds, reliability


def test_a_threshold_keeps_the_mentions_scored_at_least_it() -> None:
    mentions = [ScoredMention(0.95, True), ScoredMention(0.9, True), ScoredMention(0.6, False), ScoredMention(0.2, True),
                ScoredMention(0.1, False)]
    rows = {r["threshold"]: r for r in at_thresholds(mentions, gold_total=4, thresholds=(0.0, 0.5, 0.92))}
    assert (rows[0.0]["kept"], rows[0.0]["precision"], rows[0.0]["recall"]) == (5, 60.0, 75.0)
    assert (rows[0.5]["kept"], rows[0.5]["precision"], rows[0.5]["recall"]) == (3, pytest.approx(200 / 3), 50.0)
    assert (rows[0.92]["kept"], rows[0.92]["precision"], rows[0.92]["recall"]) == (1, 100.0, 25.0)


def test_calibration_error_is_the_gap_between_a_bins_score_and_its_share_right() -> None:
    calibrated = [ScoredMention(0.8, True)] * 8 + [ScoredMention(0.8, False)] * 2
    bins, ece = reliability(calibrated)
    assert [(b["mentions"], b["right"]) for b in bins] == [(10, 0.8)] and ece == pytest.approx(0.0)
    overconfident = [ScoredMention(1.0, True), ScoredMention(1.0, False)]
    bins, ece = reliability(overconfident)
    assert bins[-1]["to"] == 1.0 and bins[-1]["mentions"] == 2 and ece == pytest.approx(0.5)
