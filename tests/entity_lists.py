"""Entities from two paths compared as the engine promises them: the same spans under the same
labels, and scores equal up to the order of float sums (a batch's padded matrices add in another
order than one text's, which moves a probability by about 1e-7)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from ner_service.engine.spans import Entity


def spans_of(texts_entities: Sequence[Sequence[Entity]]) -> list[list[tuple[int, int, str, str]]]:
    """Each text's entities without their scores."""
    return [[(e.start, e.end, e.text, e.label) for e in entities] for entities in texts_entities]


def assert_same_entities(got: Sequence[Sequence[Entity]], expected: Sequence[Sequence[Entity]], at_least: int = 1,
                         score_rel: float = 1e-5) -> None:
    """``got`` holds ``expected``'s spans and labels, its scores within ``score_rel``, and at least
    ``at_least`` entities in all: a comparison of empty lists proves nothing."""
    assert spans_of(got) == spans_of(expected)
    scores = [e.score for entities in expected for e in entities]
    assert [e.score for entities in got for e in entities] == pytest.approx(scores, rel=score_rel, abs=1e-6)
    assert sum(len(entities) for entities in expected) >= at_least, "the comparison must hold entities, not empty lists"


def as_entities(answered: Sequence[dict]) -> list[Entity]:
    """The entities of an API answer (scores rounded to 6 decimals) as the engine's."""
    return [Entity(**entity) for entity in answered]
