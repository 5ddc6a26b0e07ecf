"""Next-token log-probabilities over the tokens each row may take, not over the whole vocabulary.

A row whose answer can only take a few tokens (a count's digits and its end, a copy of its input
text) needs the output layer's rows of those tokens alone: Gemma 3's output layer has 262,144
rows, more weights than the rest of the model, and its product costs more than the rest of a
forward at every decoded position. A :class:`RowVocabulary` lists, per row of a decoding call,
the token ids its next token may be; :meth:`RowVocabulary.logprobs` multiplies the hidden states
by the union of those rows of the output layer only (gathered once per vocabulary), rules out
each row's tokens that are not its own, and normalises over what is left. The result has the
whole vocabulary's layout (every other token ``-inf``), so that decoders, constraints and stop
tokens index it by token id as before; :meth:`RowVocabulary.sparse_logprobs` keeps it over the
union's columns only (:class:`SparseLogprobs`), for a caller that chooses tokens without
writing and reading 262,144 columns a row for the few hundred computed.

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
from dataclasses import dataclass, replace

import torch
from torch import nn


@dataclass(frozen=True)
class SparseLogprobs:
    """Next-token log-probabilities over some token ids of a vocabulary, ``-inf`` for every
    other: ``values[..., j]`` is token ``ids[j]``'s (``ids`` sorted). Indexing selects rows over
    the leading dimensions; the vocabulary stays whole."""

    values: torch.Tensor
    ids: torch.Tensor
    vocab_size: int

    @classmethod
    def dense(cls, logprobs: torch.Tensor) -> "SparseLogprobs":
        """Log-probabilities over a whole vocabulary (``[..., vocab_size]``) in this form."""
        return cls(logprobs, torch.arange(logprobs.shape[-1], device=logprobs.device), logprobs.shape[-1])

    def __getitem__(self, rows: object) -> "SparseLogprobs":
        return replace(self, values=self.values[rows])

    def __len__(self) -> int:
        return self.values.shape[0]

    def flat(self) -> "SparseLogprobs":
        """The rows of every leading dimension in one."""
        return replace(self, values=self.values.reshape(-1, self.values.shape[-1]))

    def to_dense(self) -> torch.Tensor:
        """A new ``[..., vocab_size]`` tensor: the whole vocabulary's layout, which token
        constraints index by token id."""
        if len(self.ids) == self.vocab_size:
            return self.values.clone()
        out = self.values.new_full((*self.values.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.ids, self.values)

    def columns(self, token_ids: Sequence[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's column in :attr:`values`, and whether the token is there at all."""
        tokens = torch.as_tensor(token_ids, dtype=torch.long, device=self.ids.device)
        found = torch.searchsorted(self.ids, tokens).clamp_(max=len(self.ids) - 1)
        return found, self.ids[found] == tokens

    def of(self, token_ids: Sequence[int]) -> torch.Tensor:
        """``[..., len(token_ids)]``: each row's log-probability of each of these tokens."""
        found, present = self.columns(token_ids)
        return self.values[..., found].masked_fill(~present, float("-inf"))

    def picked(self, token_ids: Sequence[int] | torch.Tensor) -> list[float]:
        """Row i's log-probability of token ``token_ids[i]`` (rows of a 2-D :attr:`values`)."""
        found, present = self.columns(token_ids)
        rows = torch.arange(len(found), device=found.device)
        return self.values[rows, found].masked_fill(~present, float("-inf")).tolist()

    def plus(self, token_ids: Sequence[int], amounts: torch.Tensor) -> "SparseLogprobs":
        """These log-probabilities with ``amounts[..., j]`` (broadcast over the rows) added to each
        row's of token ``token_ids[j]``; a token not here keeps ``-inf``. A copy: the values may be
        inference tensors, which cannot change in place."""
        found, present = self.columns(token_ids)
        values = self.values.clone()
        values[..., found[present]] += amounts.to(values)[..., present]
        return replace(self, values=values)

    def argmax(self) -> torch.Tensor:
        """Each row's most probable token id."""
        return self.ids[self.values.argmax(-1)]


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
        return self.sparse_logprobs(hidden, head, softcap).to_dense()

    def sparse_logprobs(self, hidden: torch.Tensor, head: nn.Module, softcap: float | None = None) -> SparseLogprobs:
        """:meth:`logprobs` over the columns of :attr:`ids` only."""
        if hidden.shape[0] != len(self):
            raise ValueError(f"{hidden.shape[0]} rows of hidden states for a vocabulary of {len(self)} rows")
        weight, bias = self._head_rows(head)
        logits = torch.nn.functional.linear(hidden, weight, bias).float()
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        return self.normalised(logits)

    def normalised(self, logits: torch.Tensor) -> SparseLogprobs:
        """Float32 ``logits`` over the columns of :attr:`ids` (``[rows, ..., len(ids)]``, row i of
        this vocabulary; overwritten) as each row's log-probabilities over its own tokens."""
        member = self.member.to(logits.device).view(len(self), *[1] * (logits.dim() - 2), len(self.ids))
        kept = logits.masked_fill_(~member, float("-inf")).log_softmax(-1)
        return SparseLogprobs(kept, self.ids.to(kept.device), self.vocab_size)


def output_softcap(model: nn.Module) -> float | None:
    """The final logit soft-capping of ``model``'s config (Gemma 2's 30.0; None for most models)."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    return getattr(config, "final_logit_softcapping", None)


def hidden_logprobs(model: nn.Module, hidden: torch.Tensor, vocabulary: RowVocabulary | None) -> SparseLogprobs:
    """A row per hidden state (``[rows, hidden]``, row i of ``vocabulary``): the float32
    next-token log-probabilities over that row's tokens when a vocabulary is given, else over the
    whole output layer."""
    head = model.get_output_embeddings()
    if vocabulary is not None:
        return vocabulary.sparse_logprobs(hidden[:, None], head, output_softcap(model))[:, 0]
    return SparseLogprobs.dense(torch.log_softmax(head(hidden).float(), dim=-1))


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
