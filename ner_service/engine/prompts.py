"""The PaDeLLM-NER query protocol, shared by training and inference.

A text is encoded once as a prefix. Label-wise queries branch from it:

* count query ``"{label} count:"`` answered with the number of mentions, e.g. ``"2"``;
* mention query ``"{label} count:{n}\\n{label} {k}:"`` answered with the k-th mention in
  reading order, e.g. ``" John Smith"``;
* the autoregressive baseline's query ``"All entities:"`` answered with one line per
  mention in reading order, e.g. ``"\\nPER: John Smith\\nLOC: Paris"``.

Every answer ends with the tokenizer's end-of-sequence token. Prefix, query and answer are
tokenised separately and concatenated, at training and at inference alike.
"""

from __future__ import annotations

import re

PROMPT_VERSION = 1
AR_LINE = re.compile(r"^(?P<label>[^:\n]+): (?P<mention>.+)$")


def prefix(text: str) -> str:
    """The shared prefix that holds the text."""
    return f"Text: {text}\n"


def count_query(label: str) -> str:
    """Query for the number of mentions of ``label``."""
    return f"{label} count:"


def count_answer(count: int) -> str:
    """Answer to :func:`count_query`."""
    return str(count)


def parse_count(answer: str) -> int | None:
    """The count in a generated answer, or None when it is not a number."""
    answer = answer.strip()
    return int(answer) if answer.isdigit() else None


def mention_query(label: str, count: int, index: int) -> str:
    """Query for the ``index``-th (1-based) of ``count`` mentions of ``label``."""
    return f"{label} count:{count}\n{label} {index}:"


def mention_answer(mention: str) -> str:
    """Answer to :func:`mention_query`."""
    return f" {mention}"


def parse_mention(answer: str) -> str:
    """The mention in a generated answer."""
    return answer.strip()


def ar_query() -> str:
    """Query of the autoregressive baseline: every mention of every label in one sequence."""
    return "All entities:"


def ar_answer(mentions: list[tuple[str, str]]) -> str:
    """Answer to :func:`ar_query` for ``(label, mention)`` pairs in reading order."""
    return "".join(f"\n{label}: {mention}" for label, mention in mentions)


def parse_ar_line(line: str) -> tuple[str, str] | None:
    """``(label, mention)`` of one answer line, or None when the line is malformed."""
    match = AR_LINE.match(line.strip())
    if match is None or not match["mention"].strip():
        return None
    return match["label"].strip(), match["mention"].strip()
