"""Reading documents to ingest: JSONL (``text`` plus optional ``external_id``, ``language``,
``source``), plain text (one document per line) or CoNLL column files (sentences joined into
documents at ``-DOCSTART-``). Every problem raises :class:`~corpora.readers.DataFormatError`
naming the file, the line and the reason, before anything is stored."""

from __future__ import annotations

import re
from pathlib import Path

from corpora import DOCSTART, DataFormatError, column_documents, json_records, read_conll, text_of

from pipeline.crud import NewDocument
from pipeline.schemas import text_problem

FORMATS = ("auto", "jsonl", "text", "conll")
CONLL_SUFFIXES = {".conll", ".conllu", ".iob", ".iob1", ".bio", ".bmes"}
TAG_LIKE = re.compile(r"^(O|[BIMES]-\S+)$")
STRING_FIELDS = ("external_id", "language", "source")


def _lines(path: Path) -> list[str]:
    return text_of(path).split("\n")


def detect_format(path: Path) -> str:
    """``jsonl`` for .jsonl/.json, ``conll`` for column files (a ``-DOCSTART-`` line, or token
    lines ending in a tag), else ``text``."""
    if path.suffix in {".jsonl", ".json"}:
        return "jsonl"
    if path.suffix in CONLL_SUFFIXES:
        return "conll"
    lines = [line.split() for line in _lines(path)[:200] if line.strip()]
    if lines and (lines[0][0] == DOCSTART or all(len(f) >= 2 and TAG_LIKE.match(f[-1]) for f in lines)):
        return "conll"
    return "text"


def _check_text(path: Path, number: int | None, text: str) -> None:
    """Refuse at ingest what a job would fail on (:func:`pipeline.schemas.text_problem`)."""
    problem = text_problem(text)
    if problem is not None:
        raise DataFormatError(path, number, problem)


def read_jsonl_documents(path: Path, source: str | None, language: str | None) -> list[NewDocument]:
    """One document per JSON line (blank lines skipped); ``external_id`` values must be unique."""
    documents, seen = [], {}
    for number, record in json_records(path):
        for key in STRING_FIELDS:
            if record.get(key) is not None and not (isinstance(record[key], str) and record[key]):
                raise DataFormatError(path, number, f'"{key}" must be a non-empty string')
        _check_text(path, number, record["text"])
        external_id = record.get("external_id")
        if external_id is not None:
            if external_id in seen:
                raise DataFormatError(path, number, f"external_id {external_id!r} already used on line {seen[external_id]}")
            seen[external_id] = number
        documents.append(NewDocument(record["text"], external_id, record.get("language") or language, record.get("source") or source))
    if not documents:
        raise DataFormatError(path, None, "no documents found")
    return documents


def read_text_documents(path: Path, source: str | None, language: str | None) -> list[NewDocument]:
    """One document per non-blank line."""
    documents = []
    for number, line in enumerate(_lines(path), start=1):
        text = line.rstrip("\r")
        if text.strip():
            _check_text(path, number, text)
            documents.append(NewDocument(text, None, language, source))
    return documents


def _conll_documents(path: Path) -> list[tuple[int, str]]:
    """``(first line, text)`` of every document of a CoNLL column file: its sentences (as
    :func:`corpora.readers.read_conll` reads them) joined by newlines into one document per
    ``-DOCSTART-`` section (one per sentence when the file has no ``-DOCSTART-`` lines)."""
    sentences = [example.text for example in read_conll(path)]
    layout = column_documents(path)
    groups = ([(d.first_line, len(d.sentence_lines)) for d in layout.documents] if layout.has_docstart
              else [(line, 1) for d in layout.documents for line in d.sentence_lines])
    documents, position = [], 0
    for first_line, size in groups:
        documents.append((first_line, "\n".join(sentences[position:position + size])))
        position += size
    if position != len(sentences):
        raise DataFormatError(path, None, f"found {position} sentences in documents but {len(sentences)} in the file")
    return documents


def read_documents(path: str | Path, fmt: str = "auto", source: str | None = None, language: str | None = None) -> list[NewDocument]:
    """The documents of a file to ingest (``fmt``: one of :data:`FORMATS`); ``source`` defaults to the file name."""
    path = Path(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    fmt = detect_format(path) if fmt == "auto" else fmt
    source = source or path.name
    if fmt == "jsonl":
        return read_jsonl_documents(path, source, language)
    if fmt == "conll":
        documents = _conll_documents(path)
        for number, text in documents:
            _check_text(path, number, text)
        return [NewDocument(text, None, language, source) for _, text in documents]
    return read_text_documents(path, source, language)
