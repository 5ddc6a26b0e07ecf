"""``--max-minutes`` as the budget of a whole run, dev scoring and count calibration included.

Before training, the model is scored on a few dev texts and the seconds a text takes decide the
plan: the dev scoring of the run (every evaluation, and the count calibration when there is one)
is kept from the training minutes, and a dev set whose scoring would take more than
:data:`DEV_SHARE` of the minutes is cut to the texts that fit (the run says so). What is
estimated can still run late on a machine that slows down meanwhile, so every scoring after
training also stops at the run's deadline (``training.evaluate.predict``)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

#: The most of a run's minutes its dev scoring may take.
DEV_SHARE = 0.25
#: Dev texts scored before training to measure a text's seconds.
PROBE_TEXTS = 4
#: A dev set of at most this many texts is scored whole, unmeasured (a probe would cost as much).
SMALL_DEV_TEXTS = 2 * PROBE_TEXTS
#: Engine passes over its texts that choosing the count bias takes (the counts once, then the
#: mentions of the count signatures the candidate biases give: about one more pass).
CALIBRATION_PASSES = 2.0


@dataclass(frozen=True)
class DevPlan:
    """How a run with a budget spends it: dev texts scored at each evaluation and by the count
    calibration, the seconds all that is expected to take, and the minutes left to training."""

    dev_texts: int
    calibration_texts: int
    dev_seconds: float
    training_minutes: float
    deadline: float  # time.perf_counter() at which the whole run must be done

    def note(self, dev_available: int, calibration_available: int) -> str | None:
        """What the plan cut, for the run's log (None: nothing)."""
        cut = []
        if self.dev_texts < dev_available:
            cut.append(f"scores {self.dev_texts} of {dev_available} dev texts")
        if self.calibration_texts < calibration_available:
            cut.append(f"chooses the count bias on {self.calibration_texts} of {calibration_available}")
        if not cut:
            return None
        return (f"to fit --max-minutes the run {' and '.join(cut)} (about {self.dev_seconds:.0f} s of scoring, at most "
                f"{DEV_SHARE:.0%} of the minutes); give it more minutes to score all of dev")


def plan_dev(max_minutes: float, started: float, seconds_per_text: float, dev_texts: int, evaluations: int,
             calibration_texts: int = 0, now: float | None = None) -> DevPlan:
    """The plan of a run of ``max_minutes`` that began at ``started`` (``time.perf_counter()``): it
    scores ``dev_texts`` dev texts at each of ``evaluations`` evaluations and chooses the count bias
    on ``calibration_texts`` (0: none), at ``seconds_per_text`` a text (all of its strategies)."""
    now = time.perf_counter() if now is None else now
    budget = 60 * max_minutes
    share = DEV_SHARE * budget
    per_evaluation = max(seconds_per_text, 1e-9)
    wanted = per_evaluation * (dev_texts * evaluations + CALIBRATION_PASSES * calibration_texts)
    scale = min(1.0, share / wanted) if wanted > 0 else 1.0
    dev = min(dev_texts, max(1, math.floor(dev_texts * scale))) if dev_texts else 0
    calibration = min(calibration_texts, max(1, math.floor(calibration_texts * scale))) if calibration_texts else 0
    dev_seconds = per_evaluation * (dev * evaluations + CALIBRATION_PASSES * calibration)
    training_seconds = max(0.0, budget - (now - started) - dev_seconds)
    return DevPlan(dev, calibration, dev_seconds, training_seconds / 60, started + budget)
