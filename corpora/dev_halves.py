"""Dev split in two fixed halves: one where settings are chosen, one where they are only reported.

A setting chosen on a dev set and reported on the same set flatters itself (a count bias tuned on
CoNLL-03 dev was 0.14 F1 below AR there and 2.0 below on new news). Every calibration chooses on
the ``choose`` half and reports both; a figure chosen on dev is quoted on the ``report`` half.

The halves split by document, so that no document's sentences fall on both sides: a column file's
``-DOCSTART-`` documents alternate (the 1st, 3rd, ... choose; the 2nd, 4th, ... report); a file
without documents (Resume, Weibo, JSONL) alternates blocks of :data:`BLOCK` consecutive texts,
the closest it has to documents (a file of fewer than four blocks alternates texts). The rule is
fixed here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from corpora.readers import Example, column_documents, read_conll, read_corpus

#: Consecutive texts of a file without documents that stay on one side.
BLOCK = 20
Half = Literal["choose", "report"]
HALVES: tuple[Half, ...] = ("choose", "report")


@dataclass(frozen=True)
class DevHalves:
    """A dev file's texts in its two halves (each in file order)."""

    choose: list[Example]
    report: list[Example]

    def half(self, name: Half) -> list[Example]:
        if name not in HALVES:
            raise ValueError(f"unknown half {name!r}; halves: {', '.join(HALVES)}")
        return self.choose if name == "choose" else self.report


def _groups(path: Path, nested: bool = False) -> list[list[Example]]:
    """The file's texts grouped as they are split: by document, else in blocks."""
    if path.suffix not in {".jsonl", ".json"}:
        documents = column_documents(path)
        if documents.has_docstart:
            sentences, groups, position = read_conll(path), [], 0
            for document in documents.documents:
                groups.append(sentences[position:position + len(document.sentence_lines)])
                position += len(document.sentence_lines)
            return groups
    texts = read_corpus(path, nested)
    block = BLOCK if len(texts) >= 4 * BLOCK else 1  # a small file alternates texts
    return [texts[start:start + block] for start in range(0, len(texts), block)]


def dev_halves(path: str | Path, nested: bool = False) -> DevHalves:
    """The two halves of a dev file (:mod:`corpora.dev_halves`; ``nested``: see :func:`corpora.read_jsonl`)."""
    groups = _groups(Path(path), nested)
    return DevHalves([e for group in groups[0::2] for e in group], [e for group in groups[1::2] for e in group])
