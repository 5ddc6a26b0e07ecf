"""Speculative decoding with a draft model (Leviathan et al. 2023), greedy verification.

A small causal LM with the same vocabulary drafts ``max_draft`` tokens greedily; the target
model verifies them in one forward and keeps the agreeing prefix plus its own next token.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from general_decoding.base import StopCriteria
from general_decoding.draft_verify import DraftVerifyDecoder, RowState
from general_decoding.greedy import GreedyDecoder
from general_decoding.registry import register_decoder


@register_decoder("speculative")
class SpeculativeDecoder(DraftVerifyDecoder):
    """Drafts with ``draft_model`` (a model, or a folder / alias loaded like any model)."""

    def __init__(self, draft_model: PreTrainedModel | str | None = None, max_draft: int = 4) -> None:
        super().__init__(max_draft)
        if draft_model is None:
            raise ValueError("speculative decoding needs a draft model: get_decoder('speculative', draft_model=...)")
        if isinstance(draft_model, str):
            from ner_service.engine.model_loading import load_causal_lm

            draft_model = load_causal_lm(draft_model)[0]
        self.draft_model = draft_model
        self._greedy = GreedyDecoder()

    def propose(self, row: int, state: RowState, budget: int) -> list[int]:
        ids = torch.tensor([state.history], device=self.draft_model.device)
        stop = StopCriteria(budget, frozenset())
        return self._greedy.generate(self.draft_model, ids, stop).tokens[0]
