"""One name, one label, within a text.

A model reads a document window by window (:mod:`.chunking`) and answers each window alone: a
name can come out ORG in one sentence and LOC in the next, or be found in one and missed in
another. Taggers that read a document whole keep its names consistent; so does this step, applied
to each text's entities once its windows are put together:

* a name (its exact surface form) given different labels takes, at every place, the label it was
  given most often; a tie keeps each place's own;
* every other whole-word occurrence of a found name that no entity covers gets that label, unless
  the name is a single character (an initial, or "A" at the start of a sentence, is too often no
  name at all).

A model says whether its engine applies it (``document_consistency`` in ``ner_model.json``,
chosen on dev: the English model's card has what it changes there). In text without spaces
between words (Chinese) a name's characters can be part of another word, which whole-word
matching cannot tell.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace

from ner_service.engine.spans import Entity, whole_word_occurrences

#: The shortest name whose other occurrences are tagged.
MIN_TAGGED_NAME = 2


@dataclass
class NameVotes:
    """The labels one name was given in a text: how often each, and each one's highest score."""

    counts: Counter[str] = field(default_factory=Counter)
    scores: dict[str, float] = field(default_factory=dict)

    def add(self, entity: Entity) -> None:
        self.counts[entity.label] += 1
        self.scores[entity.label] = max(entity.score, self.scores.get(entity.label, 0.0))

    @property
    def label(self) -> str:
        """The label given most often; of a tie, the one given first."""
        return self.counts.most_common(1)[0][0]

    def label_instead_of(self, own: str) -> str:
        """The label a place given ``own`` takes: :attr:`label`, unless ``own`` was given as often."""
        return own if self.counts[own] == self.counts[self.label] else self.label


def consistent_entities(text: str, entities: list[Entity]) -> list[Entity]:
    """``entities`` (non-overlapping, as :func:`.spans.resolve_overlaps` leaves them) with each
    name's label made one and its uncovered whole-word occurrences added; sorted by offset."""
    votes: dict[str, NameVotes] = defaultdict(NameVotes)
    for entity in sorted(entities, key=lambda e: e.start):
        votes[entity.text].add(entity)
    kept = []
    for entity in entities:
        label = votes[entity.text].label_instead_of(entity.label)
        kept.append(entity if label == entity.label else replace(entity, label=label, score=votes[entity.text].scores[label]))
    taken = [(entity.start, entity.end) for entity in kept]
    for name, given in votes.items():
        if len(name) < MIN_TAGGED_NAME:
            continue
        for start in whole_word_occurrences(text, name):
            end = start + len(name)
            if all(end <= other_start or start >= other_end for other_start, other_end in taken):
                kept.append(Entity(start, end, name, given.label, given.scores[given.label]))
                taken.append((start, end))
    return sorted(kept, key=lambda e: (e.start, e.end, e.label))
