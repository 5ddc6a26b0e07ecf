"""The API's unit of engine work: texts measured in estimated tokens, long texts cut into pieces
that interleave with other requests' batches, and a request's answer put back together.

A text's work is estimated without the tokenizer, in about the tokens a byte-level BPE makes of
it (:func:`estimated_tokens`), plus a fixed cost for its queries; a blank text costs nothing (the
engine reads no window of it). Admission multiplies the work by a measured rate, so a
systematic error in the estimate is absorbed by the rate; what the estimate must get right is
the relative cost of texts (white space, digits, CJK), or a text cheap on paper could hold the
engine for long.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from ner_service.engine import Entity, Extraction
from ner_service.engine.chunking import Window, chunk_spans
from ner_service.engine.results import ExtractionStats

#: Estimated tokens a text costs beyond its own (its label queries).
PER_TEXT_TOKENS = 8
#: What counts as one token among ASCII characters: up to 4 letters of a word, 4 white-space
#: characters of a run (a single space joins the next word's token), a digit or a punctuation mark.
_ASCII_TOKEN = re.compile(r"[A-Za-z]{1,4}|\s{4}|[!-@\[-`{-~]")


def estimated_tokens(text: str) -> int:
    """About the tokens of a byte-level BPE (0.7-1.3x SmolLM2's on English, German, French,
    digits, punctuation, URLs, CJK and emoji; more on long runs of spaces): :data:`_ASCII_TOKEN`
    matches, and a non-ASCII character is one token plus one for every 2 UTF-8 bytes beyond its
    first (a CJK character 2)."""
    ascii_chars = len(text.encode("ascii", "ignore"))
    extra_bytes = len(text.encode("utf-8", "surrogatepass")) - len(text)
    return len(_ASCII_TOKEN.findall(text)) + (len(text) - ascii_chars) + extra_bytes // 2


def work_of(text: str) -> int:
    """A text's estimated engine work, in tokens (none for a blank text)."""
    return estimated_tokens(text) + PER_TEXT_TOKENS if text.strip() else 0


@dataclass(frozen=True)
class Piece(Window):
    """A :class:`Window` of a request's texts as the API queues it: its estimated work in
    ``units`` (tokens), and ``split``: a piece of a text longer than one piece (such pieces run
    in batches of their own)."""

    units: int
    split: bool


def pieces_of(texts: list[str], piece_tokens: int, long_text_tokens: int) -> list[Piece]:
    """Each text whole if its work fits ``long_text_tokens`` (it batches with other requests'
    texts), else cut at sentence ends (as the engine cuts windows) into pieces that fit
    ``piece_tokens``."""
    pieces = []
    for index, text in enumerate(texts):
        spans = chunk_spans(text, estimated_tokens, max(1, piece_tokens - PER_TEXT_TOKENS)) \
            if work_of(text) > max(piece_tokens, long_text_tokens) else []
        if spans:
            pieces.extend(Piece(index, start, text[start:end], work_of(text[start:end]), True) for start, end in spans)
        else:  # short, or all white space
            pieces.append(Piece(index, 0, text, work_of(text), False))
    return pieces


def merged(text: str, parts: list[tuple[Piece, Extraction]], text_entities: Callable[[str, list[Entity]], list[Entity]]) -> Extraction:
    """One text's extraction from its pieces' (a whole text's is returned as it is): their
    entities as the model found them (:attr:`Extraction.found`) moved to their place in ``text``,
    then made the text's by ``text_entities`` (the engine's
    :meth:`~ner_service.engine.NEREngine.text_entities`, which keeps a name's label one across
    the pieces where the model says so, as it does across a whole text's windows)."""
    if len(parts) == 1 and not parts[0][0].split:
        return parts[0][1]
    entities = [replace(e, start=e.start + piece.offset, end=e.end + piece.offset) for piece, part in parts
                for e in (part.entities if part.found is None else part.found)]
    stats = ExtractionStats.combined([part.stats for _, part in parts])
    return Extraction(text, text_entities(text, entities), stats, entities)
