"""A model's figures, read from the one place they are kept: the ``metrics`` of its
``ner_model.json``. ``padellm-ner models``, ``GET /v1/models``, the README's table and the model
cards show these numbers (``tests/test_model_figures.py`` holds the README and the cards to them).
"""

from __future__ import annotations

from typing import Any

#: The strategies whose dev F1 is a model's headline, in order: the first one evaluated.
HEADLINE_STRATEGIES = ("padellm", "fast_dllm", "ar")


def dev_scores(metrics: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The headline strategy and its dev scores (``micro_f1``, ``precision``, ``recall``, ...):
    the final ``dev`` evaluation, else the one written during training (a model a user trained)."""
    for key in ("dev", "dev_during_training"):
        evaluated = metrics.get(key) or {}
        for strategy in HEADLINE_STRATEGIES:
            scores = evaluated.get(strategy) or {}
            if isinstance(scores.get("micro_f1"), (int, float)):
                return strategy, scores
    return None


def dev_f1(metrics: dict[str, Any]) -> float | None:
    """The headline dev micro-F1 (:func:`dev_scores`), rounded to 2 digits as every page shows it."""
    found = dev_scores(metrics)
    return round(float(found[1]["micro_f1"]), 2) if found else None


def ms_per_text(metrics: dict[str, Any]) -> float | None:
    """Milliseconds a text at batch 1 on the machine of ``metrics["speed"]`` (None: not measured)."""
    value = (metrics.get("speed") or {}).get("ms_per_text")
    return float(value) if isinstance(value, (int, float)) else None
