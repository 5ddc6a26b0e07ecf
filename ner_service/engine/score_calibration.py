"""A strategy's mention scores mapped to probabilities that the mention is right (Platt scaling).

A raw score is the probability the model gave its answer; how often such a mention is right
differs by model and strategy (a small model is sure of too much). The map
``sigmoid(slope * logit(score) + intercept)`` is fitted on the half of dev where settings are
chosen (``padellm-ner calibrate-scores``) and kept in the model's ``ner_model.json`` per
strategy; it keeps the order of scores, so a threshold of 0 keeps what it kept and the entities
are the same, but a threshold of 0.7 now keeps mentions right about 7 times in 10.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

#: Raw scores are clipped this far from 0 and 1 before their logit (a score of exactly 1 is common).
EPSILON = 1e-6


def logit(score: float) -> float:
    """The log-odds of a raw score, clipped by :data:`EPSILON`."""
    clipped = min(max(score, EPSILON), 1.0 - EPSILON)
    return math.log(clipped / (1.0 - clipped))


def sigmoid(z: float) -> float:
    """The inverse of :func:`logit`, without overflow for any ``z``."""
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


@dataclass(frozen=True)
class ScoreCalibration:
    """``calibrated = sigmoid(slope * logit(score) + intercept)``; slope 1 and intercept 0 change nothing."""

    slope: float = 1.0
    intercept: float = 0.0

    def probability(self, score: float) -> float:
        """The calibrated probability of a raw ``score`` in [0, 1]."""
        return sigmoid(self.slope * logit(score) + self.intercept)

    @property
    def is_identity(self) -> bool:
        return self.slope == 1.0 and self.intercept == 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def of(cls, setting: Mapping[str, float] | None) -> "ScoreCalibration":
        """The calibration ``ner_model.json`` holds for one strategy (None: the raw scores)."""
        if not setting:
            return cls()
        unknown = set(setting) - {"slope", "intercept"}
        if unknown:
            raise ValueError(f"score_calibration has unknown fields {sorted(unknown)}: it takes slope and intercept")
        return cls(float(setting.get("slope", 1.0)), float(setting.get("intercept", 0.0)))
