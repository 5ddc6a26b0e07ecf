"""Readers for NER corpora: CoNLL-style column files (IOB1, BIO, BMES; Weibo's char+position
tokens) and JSONL. Every reader gives :class:`Example` objects with character-offset spans.

A malformed file raises :class:`DataFormatError` naming the file, the line and the reason.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

TAG = re.compile(r"^(?P<prefix>[BIMES])-(?P<type>\S+)$")
WEIBO_TOKEN = re.compile(r"(\ufffd\ufffd|.)(\d+)")
SCHEME_PREFIXES = {"iob1": "BI", "bio": "BI", "bmes": "BMES", "auto": "BIMES"}
DOCSTART = "-DOCSTART-"

log = logging.getLogger(__name__)


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
    #: The part of its corpus the record comes from (a JSONL record's ``source``), where its file
    #: says: its corpus's ``sources.json`` lists the labels each source annotates (:func:`read_sources`).
    source: str | None = None

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
        if tag != "O" and match is None:
            raise DataFormatError(path, number, f"impossible tag {tag!r}: a tag is O or B-, I-, M-, E- or S- and the type, "
                                                f"like B-PER (IOB1, BIO or BMES; the tag is the last column)")
        if tag != "O" and match["prefix"] not in allowed:
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


def read_jsonl(path: str | Path, nested: bool = False) -> list[Example]:
    """Read ``{"text": ..., "entities": [{"start", "end", "label"}]}`` lines (``entities`` optional).
    ``nested``: keep entities that share characters (nested, crossing, or one span under two
    labels), as a file that is only scored may hold them; a file to train on may not (an AR answer
    lists a text's mentions one after another). An entity given twice is an error either way."""
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
            if not (_is_offset(start) and _is_offset(end) and isinstance(label, str) and label):
                raise DataFormatError(path, number, "entity start/end must be integers and label a non-empty string")
            if not 0 <= start < end <= len(text):
                raise DataFormatError(path, number, f"entity [{start}, {end}) is outside the text of length {len(text)}")
            problem = _label_problem(label) or _mention_problem(text, start, end)
            if problem:
                raise DataFormatError(path, number, f"entity {_show(text, Span(start, end, label))}: {problem}")
            spans.append(Span(start, end, label))
        spans.sort(key=lambda s: (s.start, s.end, s.label))
        twice = next((second for first, second in zip(spans, spans[1:]) if first == second), None)
        if twice is not None:
            raise DataFormatError(path, number, f"entity {_show(text, twice)} is given twice")
        clash = None if nested else _overlap(spans)
        if clash:
            first, second = clash
            raise DataFormatError(path, number, f"entity {_show(text, second)} overlaps entity {_show(text, first)}; "
                                                f"nested or crossing entities cannot be trained: keep one of them")
        source = record.get("source")
        examples.append(Example(text, spans, source if isinstance(source, str) and source else None))
    return examples


def read_sources(path: str | Path) -> dict[str, list[str]] | None:
    """The labels each source of a JSONL corpus file annotates, from the ``sources.json`` beside it
    (the format of the open corpora: a record is annotated for its own source's labels only; a
    label outside them says nothing about it); None where the file has none."""
    path = Path(path)
    listing = path.parent / "sources.json"
    if path.suffix not in {".jsonl", ".json"} or not listing.is_file():
        return None
    try:
        sources = json.loads(text_of(listing))
    except json.JSONDecodeError as error:
        raise DataFormatError(listing, error.lineno, f"not valid JSON: {error.msg}") from None
    if not (isinstance(sources, dict) and all(isinstance(labels, list) and all(isinstance(label, str) for label in labels)
                                               for labels in sources.values())):
        raise DataFormatError(listing, None, "must map each source to the list of labels it annotates")
    return {str(source): list(labels) for source, labels in sources.items()}


def _is_offset(value: object) -> bool:
    """An integer offset (``true``/``false`` are not: Python reads them as 1 and 0)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _show(text: str, span: Span) -> str:
    return f"[{span.start}, {span.end}) {span.label} {text[span.start:span.end]!r}"


def _label_problem(label: str) -> str | None:
    """Why ``label`` cannot be a label (None if it can): it must be selectable with ``--labels A,B``."""
    if label != label.strip():
        return f"label {label!r} starts or ends with whitespace"
    if "," in label:
        return f"label {label!r} holds a comma (labels are given comma-separated)"
    return None


def _mention_problem(text: str, start: int, end: int) -> str | None:
    """Why ``text[start:end]`` cannot be a mention (None if it can): offsets off by a character
    (or counted in bytes or UTF-16 units) usually show as whitespace at an edge."""
    mention = text[start:end]
    if not mention.strip():
        return "the mention is only whitespace"
    if mention != mention.strip():
        lead = len(mention) - len(mention.lstrip())
        trail = len(mention) - len(mention.rstrip())
        return f"the mention starts or ends with whitespace (offsets are characters, end exclusive: [{start + lead}, {end - trail})?)"
    return None


def _overlap(spans: list[Span]) -> tuple[Span, Span] | None:
    """The first two of ``spans`` (sorted by offset) that share a character, if any."""
    reach: Span | None = None  # the span seen so far that ends last
    for span in spans:
        if reach is not None and span.start < reach.end:
            return reach, span
        if reach is None or span.end > reach.end:
            reach = span
    return None


def read_corpus(path: str | Path, nested: bool = False) -> list[Example]:
    """Read a corpus file, JSONL (``.jsonl``/``.json``; ``nested``: see :func:`read_jsonl`) or
    column format (anything else: one tag a token, never nested)."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(path, None, "no such file")
    return read_jsonl(path, nested) if path.suffix in {".jsonl", ".json"} else read_conll(path)


@dataclass(frozen=True)
class ColumnDocument:
    """One document of a column file: the line (1-based) it starts at (its ``-DOCSTART-`` line,
    or its first sentence's) and the line each of its sentences starts at."""

    first_line: int
    sentence_lines: list[int]


@dataclass(frozen=True)
class ColumnDocuments:
    """How a column file's sentences group into documents: one per ``-DOCSTART-`` section, or the
    whole file when it has none."""

    has_docstart: bool
    documents: list[ColumnDocument]


def column_documents(path: str | Path) -> ColumnDocuments:
    """The documents of a column file; a ``-DOCSTART-`` line inside a sentence (no blank line
    before it) is a :class:`DataFormatError`."""
    path = Path(path)
    documents: list[ColumnDocument] = []
    in_sentence, has_docstart = False, False
    for number, line in enumerate(text_of(path).split("\n"), start=1):
        fields = line.split()
        if fields and fields[0] == DOCSTART:
            if in_sentence:
                raise DataFormatError(path, number, f"{DOCSTART} inside a sentence (expected a blank line before it)")
            has_docstart = True
            documents.append(ColumnDocument(number, []))
        elif fields and not in_sentence:
            if not documents:
                documents.append(ColumnDocument(number, []))
            documents[-1].sentence_lines.append(number)
            in_sentence = True
        elif not fields:
            in_sentence = False
    return ColumnDocuments(has_docstart, [d for d in documents if d.sentence_lines])


def read_conll_documents(path: str | Path, separator: str = "\n") -> list[Example]:
    """The documents of a column file (:func:`column_documents`) as examples: their sentences (as
    :func:`read_conll` reads them) joined by ``separator``, the spans moved to their place in the document."""
    sentences = read_conll(path)
    documents, position = [], 0
    for document in column_documents(path).documents:
        documents.append(joined(sentences[position:position + len(document.sentence_lines)], separator))
        position += len(document.sentence_lines)
    return documents


def joined(examples: Sequence[Example], separator: str) -> Example:
    """One example of ``examples`` written one after another, ``separator`` between them."""
    text, spans = "", []
    for example in examples:
        if text:
            text += separator
        spans += [Span(s.start + len(text), s.end + len(text), s.label) for s in example.spans]
        text += example.text
    return Example(text, spans)


def labels_of(examples: list[Example]) -> list[str]:
    """Sorted label set of ``examples``."""
    return sorted({span.label for example in examples for span in example.spans})


def check_labels(
    labels: Sequence[str] | None,
    examples: list[Example],
    path: str | Path,
    dev_examples: Sequence[Example] = (),
    dev_path: str | Path | None = None,
) -> list[str]:
    """The labels to train on the training data ``examples`` read from ``path``: ``labels`` (a
    ``--labels`` list) if given, else every label of the data. Raises :class:`DataFormatError`
    when a span would be dropped silently: the data holds a label that ``labels`` leaves out, or
    the data holds no entity (of ``labels``) at all, or ``labels`` repeats one. Logs one warning
    for the listed labels that never occur in the data (the model learns to answer 0 for them)
    and one for labels of the dev data that the model is not trained on (scored as misses)."""
    found = labels_of(examples)
    if labels is None:
        if not found:
            raise DataFormatError(path, None, "holds no entities: there is nothing to learn")
        chosen = found
    else:
        chosen = list(labels)
        given = ",".join(chosen)
        repeated = sorted({label for label in chosen if chosen.count(label) > 1})
        if repeated:
            raise DataFormatError(path, None, f"--labels {given} names {', '.join(repeated)} more than once")
        left_out = [label for label in found if label not in chosen]
        if left_out:
            counts = {label: sum(s.label == label for e in examples for s in e.spans) for label in left_out}
            raise DataFormatError(path, None, f"holds entities of label(s) {', '.join(f'{k} ({v})' for k, v in counts.items())} "
                                              f"that --labels {given} leaves out; they would be dropped from training: "
                                              f"add them to --labels or remove them from the data (its labels: {','.join(found)})")
        if not found:
            raise DataFormatError(path, None, f"holds no entities at all: there is nothing to learn for --labels {given}")
        absent = [label for label in chosen if label not in found]
        if absent:
            log.warning("%s: --labels %s names %s, which never occur in the training data; the model learns to answer "
                        "0 mentions for them", path, given, ", ".join(absent))
    untrained = [label for label in labels_of(list(dev_examples)) if label not in chosen]
    if untrained:
        log.warning("%s: the dev data holds label(s) %s that the model is not trained on (trained: %s); their entities "
                    "count as misses", dev_path, ", ".join(untrained), ",".join(chosen))
    return chosen
