"""PaDeLLM's questions and answers: the (window, label, count, k) mention queries, the branches
decoded behind a window's prefix, and a decoded mention answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ner_service.engine import prompts
from ner_service.engine.ner_model import NERModel
from ner_service.engine.spans import Mention


class WindowLabel(NamedTuple):
    """A label in one window (by its index in the batch's windows): what a count is counted for."""

    window_index: int
    label: str


@dataclass(frozen=True)
class MentionQuery:
    """"The ``k``-th of the ``count`` mentions of ``label`` in window ``window_index``?" """

    window_index: int
    label: str
    count: int
    k: int

    @property
    def window_label(self) -> WindowLabel:
        return WindowLabel(self.window_index, self.label)

    @property
    def past_count(self) -> bool:
        """Whether it asks past its count (:func:`mention_queries` with ``past_count``)."""
        return self.k > self.count

    def token_ids(self, ner_model: NERModel) -> list[int]:
        shown = ner_model.config.prompt_name(self.label)
        return prompts.query_ids(ner_model.tokenizer, prompts.mention_query(shown, self.count, self.k))


def mention_queries(counts: dict[WindowLabel, int], past_count: bool = False) -> list[MentionQuery]:
    """One query per k of each (window, label) count; with ``past_count``, also the one past it
    (a model trained with past-count queries answers it with the mention a count one short left
    out, or with nothing)."""
    return [MentionQuery(key.window_index, key.label, n, k) for key, n in counts.items() for k in range(1, n + 1 + int(past_count))]


def count_query_ids(ner_model: NERModel, label: str) -> list[int]:
    """Token ids of ``label``'s count query."""
    return prompts.query_ids(ner_model.tokenizer, prompts.count_query(ner_model.config.prompt_name(label)))


@dataclass(frozen=True)
class Branch:
    """Tokens fed behind window ``window_index``'s prefix; a branch that starts with ``label``'s
    count query continues that label's cached count branch (only the rest is fed)."""

    window_index: int
    label: str
    tokens: list[int]

    @property
    def window_label(self) -> WindowLabel:
        return WindowLabel(self.window_index, self.label)


@dataclass(frozen=True)
class Answer:
    """A mention query's answer, the first token it was decoded from (None: empty answer) and
    how many tokens it took, its end token included."""

    mention: Mention
    first_token: int | None
    length: int = 1

    @property
    def mean_logprob(self) -> float:
        """Log-probability per token."""
        return self.mention.logprob / max(self.length, 1)


def answer_of(ner_model: NERModel, label: str, tokens: list[int], score: float) -> Answer:
    """The :class:`Answer` decoded as ``tokens`` with sequence log-probability ``score``."""
    text = prompts.parse_mention(ner_model.tokenizer.decode(tokens, skip_special_tokens=True))
    return Answer(Mention(label, text, score), tokens[0] if tokens else None, len(tokens) + 1)
