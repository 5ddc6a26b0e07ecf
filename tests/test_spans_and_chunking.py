"""Offset alignment, label conflicts and windowing of long texts."""

from __future__ import annotations

from ner_service.engine.chunking import chunk_spans
from ner_service.engine.spans import Entity, Mention, align_mentions, resolve_label_conflicts


def test_kth_mention_goes_to_next_untaken_occurrence() -> None:
    text = "Paris and Paris , then Paris"
    mentions = [Mention("LOC", "Paris", -0.1), Mention("LOC", "Paris", -0.2)]
    entities, missing = align_mentions(text, mentions)
    assert [(e.start, e.end) for e in entities] == [(0, 5), (10, 15)]
    assert missing == 0


def test_word_boundaries_are_preferred_and_missing_mentions_counted() -> None:
    text = "USA beat US"
    entities, missing = align_mentions(text, [Mention("LOC", "US", 0.0), Mention("PER", "Bob", 0.0)])
    assert [(e.start, e.end, e.text) for e in entities] == [(9, 11, "US")]
    assert missing == 1


def test_occurrence_not_reused_for_the_same_label_but_shared_across_labels() -> None:
    text = "Jordan met Jordan"
    entities, missing = align_mentions(
        text, [Mention("PER", "Jordan", -1.0), Mention("PER", "Jordan", -1.0), Mention("PER", "Jordan", -1.0), Mention("LOC", "Jordan", -0.5)]
    )
    assert missing == 1
    assert sorted((e.start, e.label) for e in entities) == [(0, "LOC"), (0, "PER"), (11, "PER")]


def test_span_under_two_labels_keeps_the_more_probable() -> None:
    kept = resolve_label_conflicts([Entity(0, 6, "Jordan", "PER", 0.4), Entity(0, 6, "Jordan", "LOC", 0.9), Entity(11, 17, "Jordan", "PER", 0.8)])
    assert [(e.start, e.label) for e in kept] == [(0, "LOC"), (11, "PER")]


def test_chunks_respect_the_budget_and_keep_offsets() -> None:
    text = "First sentence here. Second one is longer than that! Third.\nAnd a fourth line"
    count = lambda s: len(s.split())  # noqa: E731
    chunks = chunk_spans(text, count, 6)
    assert all(count(text[s:e]) <= 6 for s, e in chunks)
    assert " ".join(text[s:e] for s, e in chunks).split() == text.split()
    unspaced = "中" * 50
    pieces = chunk_spans(unspaced, len, 8)
    assert "".join(unspaced[s:e] for s, e in pieces) == unspaced and all(e - s <= 8 for s, e in pieces)
