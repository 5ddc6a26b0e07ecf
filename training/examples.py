"""Training rows in the PaDeLLM and AR formats, packed under one shared prefix per text.

One row per text: the prefix (the text) once, then every count query, every (label, k)
mention query and, optionally, the AR query, each with its answer, as branches of a token
tree (:mod:`general_decoding.tree_attention`). Branches that begin alike share their first
tokens (a label's mention queries repeat its count query: ``PER count:2\nPER 1:``), which
computes exactly what separate branches compute, with about a tenth fewer tokens on CoNLL-03.
Loss is taken on answer tokens only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from general_decoding.tree_attention import ParentTree, build_trie, chain_with_trie
from ner_service.engine import prompts
from corpora import Example
from training.configs import FORMATS

IGNORE = -100


@dataclass(frozen=True)
class TrainingRow:
    """A text's token tree (ids, and each token's parent: -1 for the first) and, per token, the
    token it must predict (``IGNORE`` elsewhere) and that target's weight in the loss (None: all 1)."""

    input_ids: list[int]
    parents: list[int]
    targets: list[int]
    weights: list[float] | None = None

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def tree(self) -> ParentTree:
        """The row as ``(input_ids, parents)``, the form the collation and the frozen pass take."""
        return self.input_ids, self.parents


@dataclass(frozen=True)
class QueryAnswer:
    """One query of a text, its answer, and its kind (one of :data:`training.configs.QUERY_KINDS`)."""

    query: str
    answer: str
    kind: str


def query_answers(example: Example, labels: Sequence[str], formats: Sequence[str], names: Mapping[str, str] | None = None,
                  past_count: bool = False, listed_labels: bool = False) -> list[QueryAnswer]:
    """The queries of one text in the requested formats with their answers; ``names`` maps a
    label to how prompts write it (the label itself when absent). With ``past_count``, each label
    is also asked for the mention one past the count its query states: under a count one short,
    its last mention (``PER count:1\nPER 2:`` answered " Anna"), under its count, nothing
    (``PER count:2\nPER 3:``): the question the engine adds to every count, so that a count one
    too low loses no mention. With ``listed_labels`` (an open-label model), the AR query names
    the labels it asks for."""
    names = names or {}
    found: list[QueryAnswer] = []
    if "padellm" in formats:
        for label in labels:
            mentions, shown = example.mentions(label), names.get(label, label)
            found.append(QueryAnswer(prompts.count_query(shown), prompts.count_answer(len(mentions)), "count"))
            for k, mention in enumerate(mentions, start=1):
                found.append(QueryAnswer(prompts.mention_query(shown, len(mentions), k), prompts.mention_answer(mention), "mention"))
            if past_count:
                n = len(mentions)
                if mentions:
                    found.append(QueryAnswer(prompts.mention_query(shown, n - 1, n), prompts.mention_answer(mentions[-1]), "mention"))
                found.append(QueryAnswer(prompts.mention_query(shown, n, n + 1), prompts.no_mention_answer(), "mention"))
    if "ar" in formats:
        wanted = set(labels)
        ordered = [(names.get(s.label, s.label), example.text[s.start:s.end]) for s in example.spans if s.label in wanted]
        listed = [names.get(label, label) for label in labels] if listed_labels else None
        found.append(QueryAnswer(prompts.ar_query(listed), prompts.ar_answer(ordered), "ar"))
    return found


def build_row(
    example: Example,
    labels: Sequence[str],
    tokenizer: PreTrainedTokenizerBase,
    formats: Sequence[str] = FORMATS,
    names: Mapping[str, str] | None = None,
    loss_weights: Mapping[str, float] | None = None,
    past_count: bool = False,
    listed_labels: bool = False,
) -> TrainingRow:
    """Pack all of ``example``'s queries behind its prefix, those that begin alike sharing their
    first tokens; ``loss_weights`` (by query kind, missing kinds 1) weigh their answers' tokens
    in the loss; ``past_count`` and ``listed_labels`` as in :func:`query_answers`."""
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise ValueError(f"unknown format(s) {sorted(unknown)}; choose from {FORMATS}")
    eos = tokenizer.eos_token_id
    prefix = tokenizer(prompts.prefix(example.text)).input_ids
    branches, answer_starts, kinds = [], [], []
    for qa in query_answers(example, labels, formats, names, past_count, listed_labels):
        query_ids = tokenizer(qa.query, add_special_tokens=False).input_ids
        answer_ids = tokenizer(qa.answer, add_special_tokens=False).input_ids + [eos]
        branches.append(query_ids + answer_ids)
        answer_starts.append(len(query_ids))
        kinds.append(qa.kind)
    trie = build_trie(branches)
    ids, parents = chain_with_trie(prefix, trie)
    targets = [IGNORE] * len(ids)
    weights = [0.0] * len(ids)
    for number, (branch, first_answer, kind) in enumerate(zip(branches, answer_starts, kinds)):
        columns = [len(prefix) - 1] + [len(prefix) + node for node in trie.path(number)]  # columns[i]: the token before branch[i]
        for i in range(first_answer, len(branch)):
            targets[columns[i]] = branch[i]
            weights[columns[i]] = (loss_weights or {}).get(kind, 1.0)
    return TrainingRow(ids, parents, targets, weights if loss_weights else None)
