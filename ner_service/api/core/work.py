"""The API's unit of engine work: texts measured in estimated tokens, long texts cut into pieces
that interleave with other requests' batches, and a request's answer put back together.

A text's work is estimated without the tokenizer, in about the tokens a byte-level BPE makes of
it (:func:`estimated_tokens`), plus the tokens of the queries the engine asks in each of its
windows: every label's count query and mention query, each of which writes the label (its name,
and its description where it has one). So a request is charged for its labels as well as its
text: on an open model many labels, or long descriptions, multiply a text's work (docs/api.md,
``benchmarks/work_estimate.py``). A blank text costs nothing (the
engine reads no window of it). Admission multiplies the work by a measured rate, so a
systematic error in the estimate is absorbed by the rate; what the estimate must get right is
the relative cost of requests (white space, digits, CJK, labels), or a request cheap on paper
could hold the engine for long.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ner_service.engine import Entity, Extraction, ExtractOptions, NERModelConfig
from ner_service.engine.chunking import Window, chunk_spans
from ner_service.engine.engine import MAX_WINDOW_TOKENS
from ner_service.engine.labels import LabelSpec
from ner_service.engine.results import ExtractionStats

#: Tokens of a label's queries in one window besides the label written twice: `` count``, ``:``
#: and the count of its count query, a line break, ``k`` and ``:`` of its mention query
#: (:func:`ner_service.engine.prompts.mention_query`, which continues the count query's branch).
QUERY_TOKENS_PER_LABEL = 6
#: Tokens of a window's prefix besides its text: the start token, ``Text:`` and a line break
#: (:func:`ner_service.engine.prompts.prefix`).
PREFIX_TOKENS = 4
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


def query_tokens(labels: Sequence[LabelSpec]) -> int:
    """Estimated tokens of the queries one window is asked for ``labels``."""
    return sum(2 * estimated_tokens(label.prompt) + QUERY_TOKENS_PER_LABEL for label in labels)


@dataclass(frozen=True)
class Reading:
    """How the engine reads a text for one request's options: in windows of at most
    ``max_window_tokens`` (one sentence each where ``one_sentence``), each a prefix and
    ``queries`` tokens of queries."""

    max_window_tokens: int = MAX_WINDOW_TOKENS
    one_sentence: bool = False
    queries: int = 0

    @classmethod
    def of(cls, options: ExtractOptions, config: NERModelConfig) -> Reading:
        """The reading of validated ``options`` on the model of ``config`` (its windows)."""
        return cls(config.window_tokens or MAX_WINDOW_TOKENS, config.sentence_windows, query_tokens(options.label_specs()))

    def work(self, text: str) -> int:
        """A text's estimated engine work, in tokens: its own, and a prefix and the queries in
        each window it is read in (none for a blank text)."""
        if not text.strip():
            return 0
        windows = len(chunk_spans(text, estimated_tokens, self.max_window_tokens, self.one_sentence))
        return estimated_tokens(text) + windows * (PREFIX_TOKENS + self.queries)


@dataclass(frozen=True)
class Piece(Window):
    """A :class:`Window` of a request's texts as the API queues it: its estimated work in
    ``units`` (tokens), and ``split``: a piece of a text longer than one piece (such pieces run
    in batches of their own)."""

    units: int
    split: bool


def pieces_of(texts: list[str], piece_tokens: int, long_text_tokens: int, reading: Reading = Reading()) -> list[Piece]:
    """Each text whole if it has at most ``long_text_tokens`` estimated tokens (it batches with
    other requests' texts), else cut at sentence ends (as the engine cuts windows) into pieces of
    at most ``piece_tokens``; each piece's work as ``reading`` reads it."""
    pieces = []
    for index, text in enumerate(texts):
        spans = chunk_spans(text, estimated_tokens, piece_tokens) \
            if text.strip() and estimated_tokens(text) > max(piece_tokens, long_text_tokens) else []
        if spans:
            pieces.extend(Piece(index, start, text[start:end], reading.work(text[start:end]), True) for start, end in spans)
        else:  # short, or all white space
            pieces.append(Piece(index, 0, text, reading.work(text), False))
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
