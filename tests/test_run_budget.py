"""``--max-minutes`` bounds a whole training run: the plan keeps dev scoring's seconds from the
training minutes and cuts a dev set too big for its share, and scoring stops at the deadline."""

from __future__ import annotations

import time

import pytest

from corpora import Example, Span
from training.evaluate import evaluate_engine
from training.run_budget import CALIBRATION_PASSES, DEV_SHARE, plan_dev


def test_dev_scoring_that_fits_its_share_is_kept_whole_and_kept_from_the_training_minutes() -> None:
    # 10 minutes, 60 s already spent loading; 200 dev texts at 0.1 s, scored twice: 40 s of 150 allowed
    plan = plan_dev(10, started=1000.0, seconds_per_text=0.1, dev_texts=200, evaluations=2, now=1060.0)
    assert plan.dev_texts == 200 and plan.calibration_texts == 0
    assert plan.dev_seconds == pytest.approx(40.0)
    assert plan.training_minutes == pytest.approx((600 - 60 - 40) / 60)
    assert plan.deadline == 1600.0
    assert plan.note(200, 0) is None


def test_a_dev_set_too_big_for_its_share_is_cut_to_what_fits_and_the_run_says_so() -> None:
    # 2 minutes: dev scoring may take 30 s; 3,250 texts at 0.2 s once, and the calibration on them, would take 1,950 s
    plan = plan_dev(2, started=0.0, seconds_per_text=0.2, dev_texts=3250, evaluations=1, calibration_texts=3250, now=5.0)
    assert plan.dev_seconds <= DEV_SHARE * 120 + 1e-9
    assert 0 < plan.dev_texts < 3250 and 0 < plan.calibration_texts < 3250
    assert plan.dev_seconds == pytest.approx(0.2 * (plan.dev_texts + CALIBRATION_PASSES * plan.calibration_texts))
    assert plan.training_minutes == pytest.approx((120 - 5 - plan.dev_seconds) / 60)
    note = plan.note(3250, 3250)
    assert f"scores {plan.dev_texts} of 3250 dev texts" in note and "count bias" in note


def test_a_run_out_of_minutes_before_training_trains_none_and_still_scores_one_text() -> None:
    plan = plan_dev(1, started=0.0, seconds_per_text=5.0, dev_texts=10, evaluations=3, now=70.0)
    assert plan.training_minutes == 0.0
    assert plan.dev_texts == 1


def test_scoring_starts_no_batch_after_the_deadline_but_the_first(tiny_engine) -> None:
    texts = [f"Peter flew to Paris on day {i} ." for i in range(12)]
    examples = [Example(t, [Span(0, 5, "PER"), Span(14, 19, "LOC")]) for t in texts]
    late = evaluate_engine(tiny_engine, examples, batch_size=4, progress=False, deadline=time.perf_counter() - 1)
    assert late["n_sentences"] == 4  # the first batch only: scores of what was scored, not of 12 texts
    whole = evaluate_engine(tiny_engine, examples, batch_size=4, progress=False, deadline=time.perf_counter() + 3600)
    assert whole["n_sentences"] == 12
