"""One name, one label, within a text: the rule on hand-made entities, and the engine applying it
to a CoNLL-03 dev document read by the shipped English model."""

from __future__ import annotations

from pathlib import Path

from corpora import read_conll_documents
from ner_service.engine import NEREngine
from ner_service.engine.document_consistency import consistent_entities
from ner_service.engine.spans import Entity

TEXT = "Nice beat Lyon .\nNice coach Emon spoke .\nLyon fans left Nice ."


def _at(text: str, name: str, nth: int = 0) -> int:
    start = -1
    for _ in range(nth + 1):
        start = text.index(name, start + 1)
    return start


def _entity(text: str, name: str, label: str, score: float, nth: int = 0) -> Entity:
    start = _at(text, name, nth)
    return Entity(start, start + len(name), name, label, score)


def test_a_name_takes_the_label_it_was_given_most_often_at_every_place() -> None:
    found = [_entity(TEXT, "Nice", "ORG", 0.9), _entity(TEXT, "Nice", "PER", 0.6, 1), _entity(TEXT, "Nice", "ORG", 0.8, 2)]
    kept = consistent_entities(TEXT, found)
    assert [(e.start, e.label) for e in kept] == [(_at(TEXT, "Nice", n), "ORG") for n in range(3)]
    assert kept[1].score == 0.9  # the relabelled place carries the probability its new label was given with


def test_a_tie_keeps_each_places_own_label() -> None:
    found = [_entity(TEXT, "Lyon", "ORG", 0.7), _entity(TEXT, "Lyon", "LOC", 0.9, 1)]
    assert consistent_entities(TEXT, found) == found


def test_a_found_names_uncovered_occurrences_are_tagged_with_its_label() -> None:
    found = [_entity(TEXT, "Nice", "ORG", 0.9), _entity(TEXT, "Lyon", "ORG", 0.8), _entity(TEXT, "Nice", "LOC", 0.7, 2)]
    kept = consistent_entities(TEXT, found)
    # "Nice" was given ORG and LOC once each: its second place takes the label given first
    assert {(e.start, e.end, e.text, e.label, e.score) for e in kept} == {
        (_at(TEXT, "Nice"), _at(TEXT, "Nice") + 4, "Nice", "ORG", 0.9),
        (_at(TEXT, "Nice", 1), _at(TEXT, "Nice", 1) + 4, "Nice", "ORG", 0.9),
        (_at(TEXT, "Nice", 2), _at(TEXT, "Nice", 2) + 4, "Nice", "LOC", 0.7),
        (_at(TEXT, "Lyon"), _at(TEXT, "Lyon") + 4, "Lyon", "ORG", 0.8),
        (_at(TEXT, "Lyon", 1), _at(TEXT, "Lyon", 1) + 4, "Lyon", "ORG", 0.8),
    }
    assert [e.start for e in kept] == sorted(e.start for e in kept)


def test_an_occurrence_inside_a_word_or_another_entity_is_left_alone() -> None:
    text = "Paris Saint-Germain fans left Paris for Parisian cafes in Paris ."
    found = [Entity(0, 19, "Paris Saint-Germain", "ORG", 0.9), _entity(text, "Paris", "LOC", 0.8, 1)]
    kept = consistent_entities(text, found)
    assert [(e.text, e.start, e.label) for e in kept] == [
        ("Paris Saint-Germain", 0, "ORG"), ("Paris", _at(text, "Paris", 1), "LOC"), ("Paris", _at(text, "Paris", 3), "LOC")]


def test_a_single_character_is_not_tagged_where_it_recurs() -> None:
    text = "A spokesman for Z said A deal with Z is near ."
    found = [_entity(text, "Z", "ORG", 0.9), _entity(text, "A", "PER", 0.6)]
    assert consistent_entities(text, found) == sorted(found, key=lambda e: e.start)


def test_names_found_once_are_left_as_they_are() -> None:
    text = "Angela Merkel met Emmanuel Macron in Paris ."
    found = [_entity(text, "Angela Merkel", "PER", 0.9), _entity(text, "Emmanuel Macron", "PER", 0.8), _entity(text, "Paris", "LOC", 0.7)]
    assert consistent_entities(text, found) == found


def test_the_engine_keeps_a_documents_names_consistent_where_the_model_says_so(en_engine: NEREngine, data_dir: Path) -> None:
    assert en_engine.document_consistency  # the English model's ner_model.json
    # a soccer report where the model, reading window by window, misses one "Rotor" of the club it tags elsewhere
    document = next(d for d in read_conll_documents(data_dir / "conll2003" / "dev.txt") if "ROTOR FANS LOCKED OUT" in d.text)
    (window_by_window,) = NEREngine(en_engine.ner_model, document_consistency=False).extract([document.text])
    (consistent,) = en_engine.extract([document.text])
    assert consistent.entities == consistent_entities(document.text, window_by_window.entities)
    before = {(e.start, e.end, e.label) for e in window_by_window.entities}
    added = {(e.text, e.label) for e in consistent.entities if (e.start, e.end, e.label) not in before}
    assert ("Rotor", "ORG") in added, "the document no longer exercises the rule"
    assert any(e.text == "Rotor" and e.label == "ORG" for e in window_by_window.entities)  # the label it was given elsewhere
    gold = {(s.start, s.end, s.label) for s in document.spans}
    found = {(e.start, e.end, e.label) for e in consistent.entities}
    assert len(found & gold) > len(before & gold)
