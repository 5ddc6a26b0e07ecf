"""Training rows in the PaDeLLM and AR formats, packed under one shared prefix per text.

One row per text: the prefix (the text) once, then every count query, every (label, k)
mention query and, optionally, the AR query, each with its answer, as branches of a
tree (:mod:`general_decoding.tree_attention`). Loss is taken on answer tokens only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from general_decoding.tree_attention import PackedTree, pack_branches
from ner_service.engine import prompts
from corpora import Example
from training.configs import FORMATS

IGNORE = -100


@dataclass(frozen=True)
class TrainingRow:
    """A packed tree and, per position, the token it must predict (``IGNORE`` elsewhere) and
    that target's weight in the loss (None: all 1)."""

    tree: PackedTree
    targets: list[int]
    weights: list[float] | None = None

    @property
    def answer_tokens(self) -> int:
        return sum(t != IGNORE for t in self.targets)


@dataclass(frozen=True)
class QueryAnswer:
    """One query of a text, its answer, and its kind (one of :data:`training.configs.QUERY_KINDS`)."""

    query: str
    answer: str
    kind: str


def query_answers(example: Example, labels: Sequence[str], formats: Sequence[str], names: Mapping[str, str] | None = None) -> list[QueryAnswer]:
    """The queries of one text in the requested formats with their answers; ``names`` maps a
    label to how prompts write it (the label itself when absent)."""
    names = names or {}
    found: list[QueryAnswer] = []
    if "padellm" in formats:
        for label in labels:
            mentions, shown = example.mentions(label), names.get(label, label)
            found.append(QueryAnswer(prompts.count_query(shown), prompts.count_answer(len(mentions)), "count"))
            for k, mention in enumerate(mentions, start=1):
                found.append(QueryAnswer(prompts.mention_query(shown, len(mentions), k), prompts.mention_answer(mention), "mention"))
    if "ar" in formats:
        wanted = set(labels)
        ordered = [(names.get(s.label, s.label), example.text[s.start:s.end]) for s in example.spans if s.label in wanted]
        found.append(QueryAnswer(prompts.ar_query(), prompts.ar_answer(ordered), "ar"))
    return found


def build_row(
    example: Example,
    labels: Sequence[str],
    tokenizer: PreTrainedTokenizerBase,
    formats: Sequence[str] = FORMATS,
    names: Mapping[str, str] | None = None,
    loss_weights: Mapping[str, float] | None = None,
) -> TrainingRow:
    """Pack all of ``example``'s queries behind its prefix; ``loss_weights`` (by query kind,
    missing kinds 1) weigh their answers' tokens in the loss."""
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise ValueError(f"unknown format(s) {sorted(unknown)}; choose from {FORMATS}")
    eos = tokenizer.eos_token_id
    prefix = tokenizer(prompts.prefix(example.text)).input_ids
    branches, answer_starts, kinds = [], [], []
    for qa in query_answers(example, labels, formats, names):
        query_ids = tokenizer(qa.query, add_special_tokens=False).input_ids
        answer_ids = tokenizer(qa.answer, add_special_tokens=False).input_ids + [eos]
        branches.append(query_ids + answer_ids)
        answer_starts.append(len(query_ids))
        kinds.append(qa.kind)
    tree = pack_branches(prefix, branches)
    targets = [IGNORE] * len(tree)
    weights = [0.0] * len(tree)
    position = len(prefix)
    for branch, first_answer, kind in zip(branches, answer_starts, kinds):
        for i in range(first_answer, len(branch)):
            targets[position + i - 1] = branch[i]
            weights[position + i - 1] = (loss_weights or {}).get(kind, 1.0)
        position += len(branch)
    return TrainingRow(tree, targets, weights if loss_weights else None)
