"""Readers for NER corpora: CoNLL-style column files (IOB1, BIO, BMES; Weibo's char+position
tokens) and JSONL. Every reader gives :class:`Example` objects with character-offset spans.

A malformed file raises :class:`DataFormatError` naming the file, the line and the reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

TAG = re.compile(r"^(?P<prefix>[BIMES])-(?P<type>\S+)$")
WEIBO_TOKEN = re.compile(r"(\ufffd\ufffd|.)(\d+)")
SCHEME_PREFIXES = {"iob1": "BI", "bio": "BI", "bmes": "BMES", "auto": "BIMES"}
DOCSTART = "-DOCSTART-"


class DataFormatError(ValueError):
    """A corpus file that cannot be read; the message names file, line and reason."""

    def __init__(self, path: Path | str, line: int | None, reason: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {reason}")
        self.path, self.line, self.reason = str(path), line, reason


@dataclass(frozen=True)
class Span:
    """``text[start:end]`` is a mention of ``label``."""

    start: int
    end: int
    label: str


@dataclass
class Example:
    """A text and its gold spans (sorted by offset)."""

    text: str
    spans: list[Span] = field(default_factory=list)

    def mentions(self, label: str) -> list[str]:
        """Mentions of ``label`` in reading order."""
        return [self.text[s.start:s.end] for s in self.spans if s.label == label]


def text_of(path: Path) -> str:
    """The file's text: it must exist, be UTF-8 and not be empty."""
    if not path.is_file():
        raise DataFormatError(path, None, "no such file")
    data = path.read_bytes()
    if not data.strip():
        raise DataFormatError(path, None, "file is empty")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise DataFormatError(path, line, f"invalid UTF-8 byte 0x{data[error.start]:02x}") from None


def json_records(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` of each non-blank line of a JSONL file; every object must have
    a string ``"text"``."""
    for number, line in enumerate(text_of(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataFormatError(path, number, f"broken JSON: {error.msg}") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise DataFormatError(path, number, 'expected an object with a string "text"')
        yield number, record


def _is_cjk(token: str) -> bool:
    return len(token) == 1 and "\u3000" <= token <= "\u9fff"


def _tags_to_spans(tags: list[str], starts: list[int], ends: list[int]) -> list[Span]:
    """The conlleval rule for IOB1/IOB2/BMES: a mention starts at B-/S-, or at I-/M-/E- after
    O, E-, S- or another type; E-/S- close it."""
    spans: list[Span] = []
    current: tuple[int, int, str] | None = None  # (first token, last token, type)
    previous_prefix = "O"
    for i, tag in enumerate(tags):
        if tag == "O":
            if current:
                spans.append(Span(starts[current[0]], ends[current[1]], current[2]))
            current, previous_prefix = None, "O"
            continue
        prefix, kind = tag[0], tag[2:]
        if prefix in "BS" or current is None or current[2] != kind or previous_prefix in "ES":
            if current:
                spans.append(Span(starts[current[0]], ends[current[1]], current[2]))
            current = (i, i, kind)
        else:
            current = (current[0], i, kind)
        previous_prefix = prefix
    if current:
        spans.append(Span(starts[current[0]], ends[current[1]], current[2]))
    return spans


def read_conll(path: str | Path, scheme: str = "auto", joiner: str | None = None) -> list[Example]:
    """Read a column file: one token per line, the tag in the last column, blank line between
    sentences, ``-DOCSTART-`` lines skipped. Tokens are joined by ``joiner`` (default: nothing
    for character-level Chinese, else one space). Weibo's ``char+position`` tokens are detected
    (every token matches) and reduced to their character."""
    path = Path(path)
    if scheme not in SCHEME_PREFIXES:
        raise ValueError(f"unknown tag scheme {scheme!r}; choose one of {', '.join(SCHEME_PREFIXES)}")
    allowed = SCHEME_PREFIXES[scheme]
    sentences: list[list[tuple[str, str]]] = []
    current: list[tuple[str, str]] = []
    columns: int | None = None
    for number, line in enumerate(text_of(path).split("\n"), start=1):
        fields = line.split()
        if not fields:
            if current:
                sentences.append(current)
                current = []
            continue
        if fields[0] == DOCSTART:
            continue
        if len(fields) < 2:
            raise DataFormatError(path, number, f"expected a token and a tag, found {len(fields)} column")
        columns = columns or len(fields)
        if len(fields) != columns:
            raise DataFormatError(path, number, f"expected {columns} columns like the first token line, found {len(fields)}")
        tag = fields[-1]
        match = TAG.match(tag)
        if tag != "O" and (match is None or match["prefix"] not in allowed):
            raise DataFormatError(path, number, f"impossible tag {tag!r} for scheme {scheme}")
        current.append((fields[0], tag))
    if current:
        sentences.append(current)
    if not sentences:
        raise DataFormatError(path, None, "no sentences found")
    weibo = all(WEIBO_TOKEN.fullmatch(token) for sentence in sentences for token, _ in sentence)
    examples = []
    for sentence in sentences:
        tokens = [WEIBO_TOKEN.fullmatch(t)[1] if weibo else t for t, _ in sentence]  # type: ignore[index]
        glue = joiner if joiner is not None else ("" if weibo or sum(map(_is_cjk, tokens)) * 2 > len(tokens) else " ")
        starts, ends, position = [], [], 0
        for token in tokens:
            starts.append(position)
            position += len(token)
            ends.append(position)
            position += len(glue)
        examples.append(Example(glue.join(tokens), _tags_to_spans([tag for _, tag in sentence], starts, ends)))
    return examples


def read_jsonl(path: str | Path) -> list[Example]:
    """Read ``{"text": ..., "entities": [{"start", "end", "label"}]}`` lines (``entities`` optional)."""
    path = Path(path)
    examples = []
    for number, record in json_records(path):
        text, spans = record["text"], []
        entities = record.get("entities", [])
        if not isinstance(entities, list):
            raise DataFormatError(path, number, '"entities" must be a list')
        for entity in entities:
            try:
                start, end, label = entity["start"], entity["end"], entity["label"]
            except (KeyError, TypeError):
                raise DataFormatError(path, number, 'each entity needs "start", "end" and "label"') from None
            if not (isinstance(start, int) and isinstance(end, int) and isinstance(label, str) and label):
                raise DataFormatError(path, number, "entity start/end must be integers and label a non-empty string")
            if not 0 <= start < end <= len(text):
                raise DataFormatError(path, number, f"entity [{start}, {end}) is outside the text of length {len(text)}")
            spans.append(Span(start, end, label))
        examples.append(Example(text, sorted(spans, key=lambda s: (s.start, s.end))))
    return examples


def read_corpus(path: str | Path) -> list[Example]:
    """Read a corpus file, JSONL (``.jsonl``/``.json``) or column format (anything else)."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, None, "no such file")
    return read_jsonl(path) if path.suffix in {".jsonl", ".json"} else read_conll(path)


def labels_of(examples: list[Example]) -> list[str]:
    """Sorted label set of ``examples``."""
    return sorted({span.label for example in examples for span in example.spans})
