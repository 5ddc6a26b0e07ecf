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

FORMATS = ("padellm", "ar")
IGNORE = -100


@dataclass(frozen=True)
class TrainingRow:
    """A packed tree and, per position, the token it must predict (``IGNORE`` elsewhere)."""

    tree: PackedTree
    targets: list[int]

    @property
    def answer_tokens(self) -> int:
        return sum(t != IGNORE for t in self.targets)


def query_answer_pairs(
    example: Example, labels: Sequence[str], formats: Sequence[str], names: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """The (query, answer) strings of one text in the requested formats; ``names`` maps a label
    to how prompts write it (the label itself when absent)."""
    names = names or {}
    pairs: list[tuple[str, str]] = []
    if "padellm" in formats:
        for label in labels:
            mentions, shown = example.mentions(label), names.get(label, label)
            pairs.append((prompts.count_query(shown), prompts.count_answer(len(mentions))))
            for k, mention in enumerate(mentions, start=1):
                pairs.append((prompts.mention_query(shown, len(mentions), k), prompts.mention_answer(mention)))
    if "ar" in formats:
        wanted = set(labels)
        ordered = [(names.get(s.label, s.label), example.text[s.start:s.end]) for s in example.spans if s.label in wanted]
        pairs.append((prompts.ar_query(), prompts.ar_answer(ordered)))
    return pairs


def build_row(
    example: Example,
    labels: Sequence[str],
    tokenizer: PreTrainedTokenizerBase,
    formats: Sequence[str] = FORMATS,
    names: Mapping[str, str] | None = None,
) -> TrainingRow:
    """Pack all of ``example``'s queries behind its prefix."""
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise ValueError(f"unknown format(s) {sorted(unknown)}; choose from {FORMATS}")
    eos = tokenizer.eos_token_id
    prefix = tokenizer(prompts.prefix(example.text)).input_ids
    branches, answer_starts = [], []
    for query, answer in query_answer_pairs(example, labels, formats, names):
        query_ids = tokenizer(query, add_special_tokens=False).input_ids
        answer_ids = tokenizer(answer, add_special_tokens=False).input_ids + [eos]
        branches.append(query_ids + answer_ids)
        answer_starts.append(len(query_ids))
    tree = pack_branches(prefix, branches)
    targets = [IGNORE] * len(tree)
    position = len(prefix)
    for branch, first_answer in zip(branches, answer_starts):
        for i in range(first_answer, len(branch)):
            targets[position + i - 1] = branch[i]
        position += len(branch)
    return TrainingRow(tree, targets)
