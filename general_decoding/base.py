"""The shared decoder interface: inputs, the :class:`Generation` result, and checks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers.cache_utils import Cache

from general_decoding.constraints import TokenConstraint
from general_decoding.row_vocabulary import RowVocabulary

if TYPE_CHECKING:  # for types only: the engine may run its own model class (no import of transformers' model classes)
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class StopCriteria:
    """When a row stops: a stop token (not emitted) or ``max_new_tokens`` emitted."""

    max_new_tokens: int
    stop_token_ids: frozenset[int]

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Generation:
    """What a decoder produced for a batch of rows.

    ``tokens[i]`` excludes the stop token; ``scores[i]`` is the sum of the log-probabilities
    of the emitted tokens and of the stop token when one was produced (the sequence
    log-probability under greedy decoding).
    """

    tokens: list[list[int]]
    token_logprobs: list[list[float]]
    scores: list[float]
    stopped: list[bool]
    forward_passes: int = 0
    accepted_per_pass: list[int] = field(default_factory=list)
    details: dict[str, list[int]] = field(default_factory=dict)  # decoder-specific counts

    @property
    def tokens_per_forward(self) -> float:
        """Mean number of tokens emitted (over all rows) per forward pass."""
        emitted = sum(len(t) + int(s) for t, s in zip(self.tokens, self.stopped))
        return emitted / max(self.forward_passes, 1)


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[batch, width]`` ids and 0/1 attention mask with every row right-aligned (left-padded
    with ``pad_id``), so that every row's next token is predicted from the last column."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row):] = 1
    return ids, mask


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position of each column counting only attended columns (padding holes skipped)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass(frozen=True)
class DecodeInputs:
    """What a decoder decodes from, validated by :meth:`Decoder.generate`.

    ``input_ids`` holds the tokens not yet in ``past_key_values`` (rows left-padded, so that
    every row's next token is predicted from the last column); ``attention_mask`` covers the
    cached columns and ``input_ids``; ``context_ids`` (optional) are each row's tokens already
    in the cache, for decoders that draft from the input; ``constraints`` rule tokens out
    (:mod:`general_decoding.constraints`); ``vocabulary`` (optional) lists the tokens each row may
    take, whose output-layer rows alone are computed (:mod:`general_decoding.row_vocabulary`)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    past_key_values: Cache | None
    stop: StopCriteria
    context_ids: list[list[int]] | None = None
    constraints: tuple[TokenConstraint, ...] = ()
    vocabulary: RowVocabulary | None = None

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]


class Decoder(ABC):
    """A drop-in replacement for greedy decoding.

    The cache is the decoder's once passed: it is extended in place, and a decoder may drop the
    rows that finished from it."""

    name: str = ""
    supports_batch: bool = True
    #: :class:`TokenConstraint` s are honoured (every emitted token is the constrained argmax)
    supports_constraints: bool = False
    #: rows are branches over one shared ``past_key_values`` of batch size 1 (see one_sequence)
    shares_cache: bool = False
    #: a :class:`RowVocabulary` is honoured (each row's logits over its own tokens only)
    supports_vocabulary: bool = False

    def generate(
        self,
        model: PreTrainedModel,
        input_ids: torch.Tensor,
        stop: StopCriteria,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        context_ids: list[list[int]] | None = None,
        constraints: Sequence[TokenConstraint] = (),
        vocabulary: RowVocabulary | None = None,
    ) -> Generation:
        """Decode greedily-equivalent continuations of every row of ``input_ids`` (see
        :class:`DecodeInputs`), within ``constraints`` and over ``vocabulary`` when given."""
        if input_ids.ndim != 2 or input_ids.shape[1] == 0:
            raise ValueError("input_ids must be a non-empty [batch, length] tensor of token ids")
        if input_ids.shape[0] > 1 and not self.supports_batch:
            raise ValueError(f"decoder {self.name!r} decodes one sequence at a time; got a batch of {input_ids.shape[0]}")
        if constraints and not self.supports_constraints:
            raise ValueError(f"decoder {self.name!r} does not take token constraints")
        if vocabulary is not None and not self.supports_vocabulary:
            raise ValueError(f"decoder {self.name!r} does not take a row vocabulary")
        if vocabulary is not None and len(vocabulary) != input_ids.shape[0]:
            raise ValueError(f"the vocabulary has {len(vocabulary)} rows, input_ids {input_ids.shape[0]}")
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if attention_mask is None:
            attention_mask = torch.ones(input_ids.shape[0], past + input_ids.shape[1], dtype=torch.long, device=input_ids.device)
        if attention_mask.shape != (input_ids.shape[0], past + input_ids.shape[1]):
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}, expected {(input_ids.shape[0], past + input_ids.shape[1])}"
            )
        if context_ids is not None and len(context_ids) != input_ids.shape[0]:
            raise ValueError(f"context_ids has {len(context_ids)} rows, input_ids {input_ids.shape[0]}")
        inputs = DecodeInputs(input_ids, attention_mask.long(), past_key_values, stop, context_ids, tuple(constraints), vocabulary)
        with torch.inference_mode():
            return self._generate(model, inputs)

    @abstractmethod
    def _generate(self, model: PreTrainedModel, inputs: DecodeInputs) -> Generation:
        """Decoder-specific loop; inputs are already validated."""
