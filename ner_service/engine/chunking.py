"""Split long texts into windows the model was trained on, keeping character offsets."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

SENTENCE_END = re.compile(r"(?<=[.!?。！？；;])\s*|\n+")
SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Window:
    """``text`` is ``texts[text_index][offset:offset + len(text)]``: one window of one text."""

    text_index: int
    offset: int
    text: str


def windows_of(texts: Sequence[str], count_tokens: Callable[[str], int], max_tokens: int) -> list[Window]:
    """Every text's windows (:func:`chunk_spans`) in order; a blank text has none."""
    return [Window(index, start, text[start:end]) for index, text in enumerate(texts) if text.strip()
            for start, end in chunk_spans(text, count_tokens, max_tokens)]


def _pieces(text: str, start: int, end: int, pattern: re.Pattern[str]) -> list[tuple[int, int]]:
    """Cut ``text[start:end]`` after every match of ``pattern``."""
    cuts, position = [], start
    for match in pattern.finditer(text, start, end):
        if match.end() > position and match.end() < end:
            cuts.append((position, match.end()))
            position = match.end()
    cuts.append((position, end))
    return [c for c in cuts if c[1] > c[0]]


def chunk_spans(text: str, count_tokens: Callable[[str], int], max_tokens: int) -> list[tuple[int, int]]:
    """``(start, end)`` windows covering ``text``, each of at most ``max_tokens`` tokens.

    Sentences are packed greedily; a sentence too long on its own is cut at white space,
    and a run without white space (e.g. Chinese) is cut by characters.
    """
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    units: list[tuple[int, int]] = []
    for start, end in _pieces(text, 0, len(text), SENTENCE_END):
        if count_tokens(text[start:end]) <= max_tokens:
            units.append((start, end))
            continue
        for w_start, w_end in _pieces(text, start, end, SPACE):
            if count_tokens(text[w_start:w_end]) <= max_tokens:
                units.append((w_start, w_end))
            else:
                step = max(1, max_tokens // 2)
                units.extend((i, min(i + step, w_end)) for i in range(w_start, w_end, step))
    chunks: list[tuple[int, int]] = []
    for start, end in units:
        if chunks and count_tokens(text[chunks[-1][0]:end]) <= max_tokens:
            chunks[-1] = (chunks[-1][0], end)
        else:
            chunks.append((start, end))
    return [_strip(text, s, e) for s, e in chunks if text[s:e].strip()]


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end
