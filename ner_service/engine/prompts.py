"""The PaDeLLM-NER query protocol, shared by training and inference.

A text is encoded once as a prefix. Label-wise queries branch from it:

* count query ``"{label} count:"`` answered with the number of mentions, e.g. ``"2"``;
* mention query ``"{label} count:{n}\\n{label} {k}:"`` answered with the k-th mention in
  reading order, e.g. ``" John Smith"``;
* the autoregressive baseline's query ``"All entities:"`` answered with one line per
  mention in reading order, e.g. ``"\\nPER: John Smith\\nLOC: Paris"``.

Every answer ends with the tokenizer's end-of-sequence token. Prefix, query and answer are
tokenised separately and concatenated, at training and at inference alike
(:func:`prefix_ids`, :func:`query_ids`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

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


def no_mention_answer() -> str:
    """Answer to a :func:`mention_query` whose ``index``-th mention the text does not hold:
    nothing, so the answer is the end token alone."""
    return ""


def parse_mention(answer: str) -> str:
    """The mention in a generated answer."""
    return answer.strip()


def ar_query(labels: Sequence[str] | None = None) -> str:
    """Query of the autoregressive baseline: every mention of every label in one sequence. An
    open-label model is told which labels it is asked for (``labels``, as prompts write them)."""
    return "All entities:" if labels is None else f"All entities ({'; '.join(labels)}):"


def label_prompt(name: str, description: str | None = None) -> str:
    """How a query writes a label asked at call time: its name as words (``restaurant_name`` as
    ``restaurant name``: an open model learnt names written so), and its description in brackets
    when it has one (``drug (a medicine or its active substance)``)."""
    words = " ".join(name.replace("_", " ").split()) or name
    return f"{words} ({description})" if description else words


def ar_answer(mentions: list[tuple[str, str]]) -> str:
    """Answer to :func:`ar_query` for ``(label, mention)`` pairs in reading order."""
    return "".join(f"\n{label}: {mention}" for label, mention in mentions)


def ar_answer_budget(tokenizer: "PreTrainedTokenizerBase", label_names: Iterable[str], text_tokens: int) -> int:
    """The most tokens an :func:`ar_answer` over a text of ``text_tokens`` tokens can take before
    its end token: every token a mention of its own, each on a line under the longest label (a
    line's tokens and a leading space on the mention's); at least 1."""
    line = max(len(tokenizer(f"\n{name}:", add_special_tokens=False).input_ids) for name in label_names)
    return max(1, text_tokens * (line + 2))


def parse_ar_line(line: str, labels: Sequence[str] | None = None) -> tuple[str, str] | None:
    """``(label, mention)`` of one answer line, or None when the line is malformed. Given the
    ``labels`` asked (an open model's, whose names may hold a colon), the line's label is the
    longest of them it starts with."""
    if labels is not None:
        line = line.strip()
        asked = [label for label in labels if line.startswith(f"{label}: ")]
        if not asked:
            return None
        label = max(asked, key=len)
        mention = line[len(label) + 2:].strip()
        return (label, mention) if mention else None
    match = AR_LINE.match(line.strip())
    if match is None or not match["mention"].strip():
        return None
    return match["label"].strip(), match["mention"].strip()


def prefix_ids(tokenizer: "PreTrainedTokenizerBase", text: str) -> list[int]:
    """Token ids of :func:`prefix` (with the tokenizer's special tokens, e.g. a BOS)."""
    return tokenizer(prefix(text)).input_ids


def query_ids(tokenizer: "PreTrainedTokenizerBase", query: str) -> list[int]:
    """Token ids of a query or an answer (no special tokens: it continues a prefix)."""
    return tokenizer(query, add_special_tokens=False).input_ids


def text_token_count(tokenizer: "PreTrainedTokenizerBase", text: str) -> int:
    """How many tokens ``text`` takes in a prompt: what a window's token budget counts."""
    return len(query_ids(tokenizer, text))


def ar_prompt_ids(tokenizer: "PreTrainedTokenizerBase", text: str, labels: Sequence[str] | None = None) -> list[int]:
    """The whole prompt of the all-entities query (AR baseline, diffusion); ``labels`` as in :func:`ar_query`."""
    return prefix_ids(tokenizer, text) + query_ids(tokenizer, ar_query(labels))


@dataclass(frozen=True)
class ARLine:
    """One mention of an all-entities answer: its label as written, the mention, and the
    log-probability of its line's tokens."""

    label: str
    mention: str
    logprob: float


def parse_ar_answer(tokenizer: "PreTrainedTokenizerBase", tokens: Sequence[int], logprobs: Sequence[float],
                    labels: Sequence[str] | None = None) -> list[ARLine]:
    """Split an all-entities answer (:func:`ar_answer`) into its lines; malformed lines are dropped
    (``labels`` as in :func:`parse_ar_line`). A line's log-probability sums its tokens up to the
    one holding its newline."""
    groups: list[tuple[list[int], float]] = []
    group: list[int] = []
    group_lp = 0.0
    for token, logprob in zip(tokens, logprobs):
        group.append(token)
        group_lp += logprob
        if "\n" in tokenizer.decode([token], skip_special_tokens=True):
            groups.append((group, group_lp))
            group, group_lp = [], 0.0
    groups.append((group, group_lp))
    parsed, carry = [], ""
    for group, logprob in groups:
        head, _, tail = (carry + tokenizer.decode(group, skip_special_tokens=True)).partition("\n")
        carry = tail
        pair = parse_ar_line(head, labels)
        if pair is not None:
            parsed.append(ARLine(pair[0], pair[1], logprob))
    return parsed
