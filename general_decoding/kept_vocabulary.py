"""Logits over a kept part of a large vocabulary.

NER answers are copied from the text, written as digits, or end the answer, so a model whose
output layer spans 262,144 tokens (Gemma 3) spends most of a step's head on rows no answer
uses. A :class:`KeptVocabulary` lists the token ids that matter (chosen once per model from its
training rows and the tokenizer's single characters, shipped beside the model as a list of ids).
Training takes its softmax over them (a target is its index in the kept list);
:class:`KeptHead` is an output layer that computes only their logits and gives every other
token the lowest logit, so that decoders still index logits by token id: it makes a decoding
step cheaper, but a text holding a word the training rows never did can read differently
(``benchmarks/kept_vocabulary.py``), so models load with their whole output layer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from general_decoding.skinny_linear import SkinnyLinear

FILE = "kept_vocabulary.json"


@dataclass(frozen=True)
class KeptVocabulary:
    """Sorted token ids whose logits are computed; every other token is never predicted."""

    ids: torch.Tensor

    @classmethod
    def of(cls, token_ids: Iterable[int], tokenizer) -> "KeptVocabulary":
        """``token_ids`` (those of the training rows), the special tokens, and every token that
        writes one character, so that a text unlike the training texts can still be spelt."""
        kept = set(token_ids) | set(tokenizer.all_special_ids)
        for token, index in tokenizer.get_vocab().items():
            if len(token.lstrip("▁Ġ")) <= 1:
                kept.add(index)
        return cls(torch.tensor(sorted(kept), dtype=torch.long))

    def __len__(self) -> int:
        return len(self.ids)

    def logits(self, hidden: torch.Tensor, head: torch.nn.Linear) -> torch.Tensor:
        """Logits of ``hidden`` over the kept tokens only, in the order of :attr:`ids`."""
        ids = self.ids.to(head.weight.device)
        weight = head.weight.index_select(0, ids)
        bias = None if head.bias is None else head.bias.index_select(0, ids)
        return torch.nn.functional.linear(hidden, weight, bias)

    def indices(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The kept-list index of each token id (all of them must be kept)."""
        ids = self.ids.to(token_ids.device)
        found = torch.searchsorted(ids, token_ids)
        if bool((found >= len(ids)).any()) or bool((ids[found.clamp(max=len(ids) - 1)] != token_ids).any()):
            raise ValueError("a target token is not in the kept vocabulary")
        return found

    def save(self, folder: Path) -> None:
        (folder / FILE).write_text(json.dumps(self.ids.tolist()) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> "KeptVocabulary | None":
        path = folder / FILE
        return cls(torch.tensor(json.loads(path.read_text(encoding="utf-8")), dtype=torch.long)) if path.is_file() else None


class KeptHead(SkinnyLinear):
    """An output layer over the kept rows of a head's weight; its logits span the whole
    vocabulary, the lowest finite value for every token not kept."""

    def __init__(self, head: torch.nn.Linear, vocabulary: KeptVocabulary) -> None:
        super().__init__(head.in_features, len(vocabulary), bias=head.bias is not None,
                         device=head.weight.device, dtype=head.weight.dtype)
        with torch.no_grad():
            self.weight.copy_(head.weight.index_select(0, vocabulary.ids.to(head.weight.device)))
            if head.bias is not None:
                self.bias.copy_(head.bias.index_select(0, vocabulary.ids.to(head.weight.device)))
        self.register_buffer("kept_ids", vocabulary.ids.to(head.weight.device), persistent=False)
        self.vocab_size = head.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = super().forward(x)
        out = kept.new_full((*kept.shape[:-1], self.vocab_size), torch.finfo(kept.dtype).min)
        return out.index_copy_(-1, self.kept_ids, kept)


def use_kept_vocabulary(model: torch.nn.Module, vocabulary: KeptVocabulary) -> None:
    """Give ``model`` (a transformers causal LM) a :class:`KeptHead` over ``vocabulary``."""
    model.set_output_embeddings(KeptHead(model.get_output_embeddings(), vocabulary))
