"""Speculative decoding with a draft model (Leviathan et al. 2023), greedy verification.

A small causal LM with the same vocabulary drafts ``max_draft`` tokens greedily; the target
model verifies them in one forward and keeps the agreeing prefix plus its own next token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from general_decoding.base import StopCriteria
from general_decoding.draft_verify import Drafter, DraftVerifyDecoder, RowState
from general_decoding.greedy import GreedyDecoder
from general_decoding.registry import register_decoder

if TYPE_CHECKING:  # for types only: the engine may run its own model class (no import of transformers' model classes)
    from transformers import PreTrainedModel


class ModelDrafter(Drafter):
    """Drafts with a loaded ``draft_model``'s greedy continuation of the row's history."""

    def __init__(self, draft_model: PreTrainedModel) -> None:
        self.draft_model = draft_model
        self._greedy = GreedyDecoder()

    def propose(self, row: int, state: RowState, budget: int) -> list[int]:
        ids = torch.tensor([state.history], device=self.draft_model.device)
        stop = StopCriteria(budget, frozenset())
        return self._greedy.generate(self.draft_model, ids, stop).tokens[0]


@register_decoder("speculative")
def speculative_decoder(draft_model: PreTrainedModel | None = None, max_draft: int = 4) -> DraftVerifyDecoder:
    """Draft-and-verify with :class:`ModelDrafter` (``draft_model``: a loaded causal LM)."""
    if draft_model is None:
        raise ValueError("speculative decoding needs a draft model: get_decoder('speculative', draft_model=a_loaded_model)")
    return DraftVerifyDecoder(ModelDrafter(draft_model), max_draft)
