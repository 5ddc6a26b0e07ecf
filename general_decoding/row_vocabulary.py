"""Next-token log-probabilities over the tokens each row may take, not over the whole vocabulary.

A row whose answer can only take a few tokens (a count's digits and its end, a copy of its input
text) needs the output layer's rows of those tokens alone: Gemma 3's output layer has 262,144
rows, more weights than the rest of the model, and its product costs more than the rest of a
forward at every decoded position. A :class:`RowVocabulary` lists, per row of a decoding call,
the token ids its next token may be; :meth:`RowVocabulary.logprobs` multiplies the hidden states
by the union of those rows of the output layer only (gathered once per vocabulary), rules out
each row's tokens that are not its own, and normalises over what is left. The result has the
whole vocabulary's layout (every other token ``-inf``), so that decoders, constraints and stop
tokens index it by token id as before.

A row's distribution is normalised over its own tokens only, so a row's tokens and scores do not
depend on the other rows of its batch. What the whole output layer would have given the tokens
left out is not computed: where the most probable token of the whole vocabulary is one of them,
the row takes its most probable allowed token instead.

:func:`next_logprobs` runs one forward of a causal LM either way: with a vocabulary, the model's
decoder stack and then the restricted product; without, the model as it is (its whole output
layer). Decoders that take a vocabulary say so (``Decoder.supports_vocabulary``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class RowVocabulary:
    """Per row, the token ids its next token may be (``allowed[i]``: ids of row i; rows may share
    one tensor), over a vocabulary of ``vocab_size`` tokens."""

    def __init__(self, allowed: Sequence[torch.Tensor | Sequence[int]], vocab_size: int) -> None:
        if not allowed:
            raise ValueError("a row vocabulary needs at least one row")
        tensors: dict[int, torch.Tensor] = {}  # distinct id sets, by identity
        self._row_set: list[int] = []
        for ids in allowed:
            key = id(ids)
            if key not in tensors:
                tensors[key] = torch.as_tensor(ids, dtype=torch.long).unique()
                if not len(tensors[key]):
                    raise ValueError("every row must allow at least one token")
            self._row_set.append(key)
        self.vocab_size = vocab_size
        self.ids = torch.cat(list(tensors.values())).unique()  # sorted
        if int(self.ids[0]) < 0 or int(self.ids[-1]) >= vocab_size:
            raise ValueError(f"token ids must lie in [0, {vocab_size})")
        sets = list(tensors)
        member = torch.zeros(len(sets), len(self.ids), dtype=torch.bool)
        for index, key in enumerate(sets):
            member[index, torch.searchsorted(self.ids, tensors[key])] = True
        which = {key: index for index, key in enumerate(sets)}
        self.member = member[[which[key] for key in self._row_set]]  # [rows, ids]
        self._weights: dict[tuple[int, torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor | None]] = {}
        self._parent: RowVocabulary | None = None

    def __len__(self) -> int:
        return self.member.shape[0]

    def rows(self, rows: Sequence[int]) -> "RowVocabulary":
        """The vocabulary of ``rows`` (row i of the result is ``rows[i]`` here); it shares this
        one's gathered output rows."""
        selected = RowVocabulary.__new__(RowVocabulary)
        selected.vocab_size, selected.ids = self.vocab_size, self.ids
        selected.member = self.member[torch.as_tensor(list(rows), dtype=torch.long)]
        selected._row_set, selected._weights = [], {}
        selected._parent = self._parent or self
        return selected

    def allowed(self, row: int) -> torch.Tensor:
        """The token ids row ``row`` may take."""
        return self.ids[self.member[row]]

    def _head_rows(self, head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The output layer's rows (and biases) of :attr:`ids`, gathered once per head."""
        owner = self._parent or self
        weight = head.weight
        key = (id(head), weight.device, weight.dtype)
        if key not in owner._weights:
            ids = self.ids.to(weight.device)
            bias = getattr(head, "bias", None)
            owner._weights[key] = (weight.detach().index_select(0, ids), None if bias is None else bias.detach().index_select(0, ids))
        return owner._weights[key]

    def logprobs(self, hidden: torch.Tensor, head: nn.Module, softcap: float | None = None) -> torch.Tensor:
        """``[rows, positions, vocab_size]`` float32 log-probabilities of the next token after each
        of ``hidden`` (``[rows, positions, hidden]``, row i of this vocabulary): each row's over its
        own tokens, ``-inf`` elsewhere. ``softcap``: the model's final logit soft-capping, if any."""
        if hidden.shape[0] != len(self):
            raise ValueError(f"{hidden.shape[0]} rows of hidden states for a vocabulary of {len(self)} rows")
        weight, bias = self._head_rows(head)
        logits = torch.nn.functional.linear(hidden, weight, bias).float()
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        member = self.member.to(logits.device)[:, None, :]
        kept = logits.masked_fill_(~member, float("-inf")).log_softmax(-1)
        out = kept.new_full((*kept.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.ids.to(kept.device), kept)


def output_softcap(model: nn.Module) -> float | None:
    """The final logit soft-capping of ``model``'s config (Gemma 2's 30.0; None for most models)."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    return getattr(config, "final_logit_softcapping", None)


def next_logprobs(model: nn.Module, vocabulary: RowVocabulary | None, logits_to_keep: int, **forward: object) -> torch.Tensor:
    """One forward of ``model`` (``forward``: its keyword arguments, the cache included) and the
    float32 next-token log-probabilities at its last ``logits_to_keep`` positions,
    ``[rows, logits_to_keep, vocabulary]``: over ``vocabulary``'s tokens of each row when given,
    else over the whole output layer."""
    if vocabulary is None:
        logits = model(**forward, logits_to_keep=logits_to_keep).logits
        return torch.log_softmax(logits.float(), dim=-1)
    hidden = model.get_decoder()(**forward).last_hidden_state[:, -logits_to_keep:]
    return vocabulary.logprobs(hidden, model.get_output_embeddings(), output_softcap(model))
