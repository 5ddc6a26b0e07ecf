"""The API's unit of engine work: texts measured in estimated tokens, long texts cut into pieces
that interleave with other requests' batches, and a request's answer put back together.

A text's work is estimated without the tokenizer (about 4 UTF-8 bytes a token, plus a fixed
cost for its queries): admission multiplies it by a measured rate, so a systematic error in
the estimate is absorbed by the rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ner_service.engine import Extraction
from ner_service.engine.chunking import chunk_spans
from ner_service.engine.results import ExtractionStats

#: Estimated tokens a text costs beyond its own (its label queries).
PER_TEXT_TOKENS = 8


def estimated_tokens(text: str) -> int:
    """About 4 UTF-8 bytes a token (byte-level BPE on English; a CJK character is 3 bytes)."""
    return max(1, math.ceil(len(text.encode("utf-8", "surrogatepass")) / 4))


def work_of(text: str) -> int:
    """A text's estimated engine work, in tokens."""
    return estimated_tokens(text) + PER_TEXT_TOKENS


@dataclass(frozen=True)
class Piece:
    """``text`` is ``texts[text_index][offset:offset + len(text)]``; ``split``: a piece of a text
    longer than one piece (such pieces run in batches of their own)."""

    text_index: int
    offset: int
    text: str
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


def merged(text: str, parts: list[tuple[Piece, Extraction]]) -> Extraction:
    """One text's extraction from its pieces' (a whole text's is returned as it is)."""
    if len(parts) == 1 and not parts[0][0].split:
        return parts[0][1]
    entities = [replace(e, start=e.start + piece.offset, end=e.end + piece.offset) for piece, part in parts for e in part.entities]
    stats = ExtractionStats.combined([part.stats for _, part in parts])
    return Extraction(text, sorted(entities, key=lambda e: (e.start, e.end)), stats)
