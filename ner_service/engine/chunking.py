"""Split texts into the windows a model reads, keeping character offsets.

A model trained on single sentences (CoNLL-03) under-counts the mentions of a paragraph: asked
about five sentences at once, it answers as if it were one. Such a model reads each sentence as
a window of its own (``one_sentence``); a model trained on longer texts (Weibo posts) reads
sentences packed up to the token budget. A sentence longer than the budget (a run-on without
full stops, a long list) is read in windows of whole words cut at clause marks: the English
model, asked about 40-token windows rather than 160-token ones, finds more of a long sentence's
mentions (docs/benchmarks.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: Where a sentence ends: after a full stop, question or exclamation mark (and any closing quotes
#: or brackets) followed by white space and what can start a sentence; after a Chinese one
#: (。！？；) anyway; at a line break.
SENTENCE_BREAK = re.compile(r"""(?<=[.!?])["'”’)\]]*\s+(?=["'“‘(\[]?[A-Z0-9])|(?<=[。！？；])[”’」』）]*\s*|\n+""")
#: Where a long sentence may be cut: after white space, or after Chinese clause punctuation
#: (Chinese has no white space between words).
WORD_BREAK = re.compile(r"\s+|(?<=[，、；：）])")
#: A word that ends a clause (its comma, colon, semicolon or closing bracket), where a long
#: sentence is best cut.
CLAUSE_END = re.compile(r"[,;:)\]，、；：）]\s*$")
#: Words whose full stop does not end a sentence (besides initials, words with inner stops such as
#: U.S., and the numbers of a list: "2. England").
ABBREVIATIONS = frozenset("""mr mrs ms dr prof st jr sr inc co corp ltd gen sen rep gov lt col sgt capt mt no vs etc
    jan feb mar apr jun jul aug sep sept oct nov dec""".split())


@dataclass(frozen=True)
class Window:
    """``text`` is ``texts[text_index][offset:offset + len(text)]``: one window of one text."""

    text_index: int
    offset: int
    text: str


def windows_of(texts: Sequence[str], count_tokens: Callable[[str], int], max_tokens: int, one_sentence: bool = False) -> list[Window]:
    """Every text's windows (:func:`chunk_spans`) in order; a blank text has none."""
    return [Window(index, start, text[start:end]) for index, text in enumerate(texts) if text.strip()
            for start, end in chunk_spans(text, count_tokens, max_tokens, one_sentence)]


def mostly_single_sentences(texts: Sequence[str], share: float = 0.95) -> bool:
    """Whether at least ``share`` of ``texts`` are one sentence each (a model trained on them
    reads a sentence per window)."""
    return bool(texts) and sum(len(sentence_spans(text)) == 1 for text in texts) >= share * len(texts)


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each sentence of ``text`` (:data:`SENTENCE_BREAK`), white space
    included, so that the spans tile the text; a full stop after an abbreviation, an initial or
    a word with inner stops (U.S.) does not end a sentence."""
    spans, start = [], 0
    for match in SENTENCE_BREAK.finditer(text):
        if match.end() <= start or match.end() >= len(text):
            continue
        if text[match.start() - 1:match.start()] == "." and _abbreviation(text, match.start() - 1):
            continue
        spans.append((start, match.end()))
        start = match.end()
    spans.append((start, len(text)))
    return [(s, e) for s, e in spans if e > s]


def _abbreviation(text: str, stop: int) -> bool:
    """Whether the full stop at ``stop`` closes an abbreviation rather than a sentence (a stop
    set apart by a space, as in tokenised text "Somerset 4 .", never does)."""
    if stop == 0 or text[stop - 1].isspace():
        return False
    word = text[:stop].rsplit(None, 1)[-1] if text[:stop].strip() else ""
    return bool(word) and ("." in word or (len(word) == 1 and word.isupper()) or word.lower() in ABBREVIATIONS
                           or (word.isdigit() and len(word) <= 2))


def _pieces(text: str, start: int, end: int, pattern: re.Pattern[str]) -> list[tuple[int, int]]:
    """Cut ``text[start:end]`` after every match of ``pattern``."""
    cuts, position = [], start
    for match in pattern.finditer(text, start, end):
        if match.end() > position and match.end() < end:
            cuts.append((position, match.end()))
            position = match.end()
    cuts.append((position, end))
    return [c for c in cuts if c[1] > c[0]]


def chunk_spans(text: str, count_tokens: Callable[[str], int], max_tokens: int, one_sentence: bool = False) -> list[tuple[int, int]]:
    """``(start, end)`` windows covering ``text``, each of at most ``max_tokens`` tokens.

    Sentences are packed greedily, or with ``one_sentence`` each is a window of its own; a
    sentence too long on its own is cut into windows of words (:func:`_word_windows`), and a run
    without white space (e.g. Chinese) is cut by characters.
    """
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    units: list[tuple[int, int]] = []
    for start, end in sentence_spans(text):
        if count_tokens(text[start:end]) <= max_tokens:
            units.append((start, end))
        else:
            units.extend(_word_windows(text, start, end, count_tokens, max_tokens))
    chunks: list[tuple[int, int]] = []
    for start, end in units:
        if chunks and not one_sentence and count_tokens(text[chunks[-1][0]:end]) <= max_tokens:
            chunks[-1] = (chunks[-1][0], end)
        else:
            chunks.append((start, end))
    return [_strip(text, s, e) for s, e in chunks if text[s:e].strip()]


def _word_windows(text: str, start: int, end: int, count_tokens: Callable[[str], int], max_tokens: int) -> list[tuple[int, int]]:
    """Cut the over-long sentence ``text[start:end]`` into windows of whole words of at most
    ``max_tokens`` tokens, each ending at the last clause mark (:data:`CLAUSE_END`) of its second
    half where there is one, so that a window rarely cuts through a name."""
    windows: list[tuple[int, int]] = []
    window_start, clause_end = start, None
    for word_start, word_end in _pieces(text, start, end, WORD_BREAK):
        if count_tokens(text[word_start:word_end]) > max_tokens:  # a run without white space
            if word_start > window_start:
                windows.append((window_start, word_start))
            step = max(1, max_tokens // 2)
            windows.extend((i, min(i + step, word_end)) for i in range(word_start, word_end, step))
            window_start, clause_end = word_end, None
            continue
        if word_start > window_start and count_tokens(text[window_start:word_end]) > max_tokens:
            middle = window_start + (word_start - window_start) // 2
            cut = clause_end if clause_end is not None and clause_end > middle else word_start
            windows.append((window_start, cut))
            window_start = cut
            clause_end = None
        if CLAUSE_END.search(text, word_start, word_end):
            clause_end = word_end
    if window_start < end:
        windows.append((window_start, end))
    return windows


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end
