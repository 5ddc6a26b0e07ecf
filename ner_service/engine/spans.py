"""From generated mentions to character spans: offset alignment and overlapping spans."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

#: The CJK ideographs (unified, extension A, compatibility), as a regular-expression class body.
CJK = "\u3400-\u9fff\uf900-\ufaff"
_CJK_CHARACTER = re.compile(f"[{CJK}]")


@dataclass(frozen=True)
class Entity:
    """A predicted entity: ``text[start:end]`` under ``label``, with its probability ``score``."""

    start: int
    end: int
    text: str
    label: str
    score: float

    def to_dict(self) -> dict[str, object]:
        return {"start": self.start, "end": self.end, "text": self.text, "label": self.label, "score": round(self.score, 6)}


@dataclass(frozen=True)
class Mention:
    """A generated mention string under ``label`` with its sequence log-probability."""

    label: str
    text: str
    logprob: float


def is_cjk(char: str) -> bool:
    """Whether ``char`` is a CJK ideograph."""
    return _CJK_CHARACTER.fullmatch(char) is not None


def _is_word_char(char: str) -> bool:
    return char.isalnum() and not is_cjk(char)


def occurrences(text: str, mention: str) -> list[int]:
    """Start offsets of ``mention`` in ``text``; word-boundary matches come first."""
    starts = _starts(text, mention)
    whole = [s for s in starts if _whole_word(text, s, s + len(mention))]
    return whole + [s for s in starts if not _whole_word(text, s, s + len(mention))]


def whole_word_occurrences(text: str, mention: str) -> list[int]:
    """Start offsets of ``mention`` in ``text`` where it is not part of a longer word."""
    return [s for s in _starts(text, mention) if _whole_word(text, s, s + len(mention))]


def _starts(text: str, mention: str) -> list[int]:
    starts, position = [], text.find(mention)
    while position >= 0:
        starts.append(position)
        position = text.find(mention, position + 1)
    return starts


def _whole_word(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` neither continues the word before it nor the word after it."""
    left_ok = start == 0 or not (_is_word_char(text[start - 1]) and _is_word_char(text[start]))
    right_ok = end == len(text) or not (_is_word_char(text[end]) and _is_word_char(text[end - 1]))
    return left_ok and right_ok


def align_mentions(text: str, mentions: list[Mention]) -> tuple[list[Entity], int]:
    """Map mentions to offsets; return the entities and how many mentions were not found.

    Mentions of one label are taken in the order given (reading order): each goes to the
    first untaken occurrence at or after the previous one of its label, else to any
    untaken occurrence. A label's occurrence is never used twice. Then each entity that lies
    inside a longer one moves to a free occurrence of its text that overlaps no entity, where
    there is one: "律师" (TITLE) first occurs inside "海问律师事务所" (ORG) in "海问律师事务所律师",
    and "Venice" (LOC) inside "Venice Film Festival" (ORG) in "... opened in Venice". A mention
    with no such occurrence stays inside the longer one: nested, where entities may overlap.
    """
    entities: list[Entity] = []
    missing = 0
    cursor: dict[str, int] = {}
    taken: dict[str, set[int]] = {}
    for mention in mentions:
        if not mention.text:
            missing += 1
            continue
        used = taken.setdefault(mention.label, set())
        free = [s for s in occurrences(text, mention.text) if s not in used]
        after = [s for s in free if s >= cursor.get(mention.label, 0)]
        chosen = (after or free or [None])[0]
        if chosen is None:
            missing += 1
            continue
        used.add(chosen)
        end = chosen + len(mention.text)
        cursor[mention.label] = end
        entities.append(Entity(chosen, end, mention.text, mention.label, math.exp(mention.logprob)))
    return _moved_out_of_longer(text, entities, taken), missing


def _overlaps(entity: Entity, start: int, end: int) -> bool:
    """Whether ``entity`` shares a character with ``[start, end)`` (touching is not overlapping)."""
    return entity.start < end and start < entity.end


def _moved_out_of_longer(text: str, entities: list[Entity], taken: dict[str, set[int]]) -> list[Entity]:
    """``entities`` with each one inside a longer entity moved to the first free occurrence of
    its text (after it, else before) that overlaps no other entity; the longest are settled first."""
    placed = list(entities)
    for index in sorted(range(len(placed)), key=lambda i: placed[i].start - placed[i].end):
        entity = placed[index]
        length = entity.end - entity.start
        others = [o for i, o in enumerate(placed) if i != index]
        if not any(_overlaps(o, entity.start, entity.end) and o.end - o.start > length for o in others):
            continue
        used = taken[entity.label]
        clear = [s for s in occurrences(text, entity.text)
                 if s not in used and not any(_overlaps(o, s, s + length) for o in others)]
        if clear:
            start = ([s for s in clear if s > entity.start] or clear)[0]
            used.discard(entity.start)
            used.add(start)
            placed[index] = Entity(start, start + length, entity.text, entity.label, entity.score)
    return placed


def resolve_overlaps(entities: list[Entity], shorter_span_margin: float | None = None) -> list[Entity]:
    """Entities never overlap (the corpora, spaCy's ``doc.ents`` and the page are flat). Longest
    first, of one span the most probable label: a span stays where it overlaps none kept, since a
    mention found only inside another entity repeats part of it ("Merkel" in "Angela Merkel").
    With a ``shorter_span_margin`` (a model's, chosen on dev), a span also replaces the longer ones
    it overlaps where it is more probable than each of them by that much: "生物化工专业" (PRO,
    0.94) in "伦敦大学生物化工专业" (ORG, 0.37), where a Chinese model joined two entities; English
    names nest ("Venice" in "Venice Film Festival"), so the English models keep the longer.
    Sorted by offset."""
    kept: list[Entity] = []
    for entity in sorted(entities, key=lambda e: (e.start - e.end, -e.score, e.start)):
        overlapped = [o for o in kept if _overlaps(o, entity.start, entity.end)]
        if overlapped:
            if shorter_span_margin is None or not _more_probable_than_longer(entity, entities, shorter_span_margin):
                continue
            kept = [o for o in kept if o not in overlapped]
        kept.append(entity)
    return sorted(kept, key=lambda e: (e.start, e.end, e.label))


def distinct_spans(entities: list[Entity]) -> list[Entity]:
    """Every label's entities, overlaps kept (``flat_ner`` off: spans nest, cross, and one span
    may carry several labels), each (span, label) once at its highest score; sorted by offset."""
    best: dict[tuple[int, int, str], Entity] = {}
    for entity in entities:
        key = (entity.start, entity.end, entity.label)
        if key not in best or entity.score > best[key].score:
            best[key] = entity
    return sorted(best.values(), key=lambda e: (e.start, e.end, e.label))


def _more_probable_than_longer(entity: Entity, entities: list[Entity], margin: float) -> bool:
    """Whether ``entity`` overlaps longer entities and is more probable than each by ``margin``."""
    longer = [other.score for other in entities
              if _overlaps(other, entity.start, entity.end) and other.end - other.start > entity.end - entity.start]
    return bool(longer) and entity.score - max(longer) >= margin
