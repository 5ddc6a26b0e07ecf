"""Jacobi and Gauss-Seidel-Jacobi decoding (Santilli et al. 2023).

The next tokens are unknowns of a fixed-point system: guess them all, predict every one in a
single forward, take the predictions as the next guesses, repeat. With the KV cache, each
iteration keeps the prefix that already agrees with greedy and re-guesses the rest. Jacobi
iterates over the whole output; GS-Jacobi over blocks of ``block_size`` tokens, one block
after the other. ``Generation.details["iterations_per_block"]`` reports the forwards each
block needed to reach its fixed point. As in every drafting decoder, :class:`DraftLength`
bounds how many guesses a forward holds; while they keep failing, the steps are greedy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from general_decoding.draft_verify import Drafter, DraftVerifyDecoder, RowState
from general_decoding.registry import register_decoder

if TYPE_CHECKING:  # for types only: the engine may run its own model class (no import of transformers' model classes)
    from transformers import PreTrainedModel


class JacobiDrafter(Drafter):
    """Fixed-point iteration over the whole output (``block_size=None``) or over blocks: each
    row's guesses are the previous forward's predictions."""

    # untrained Jacobi guesses rarely hold (about 1.05 tokens per forward on the shipped model,
    # below DraftLength's break-even): start greedy and probe
    expected_accepted = 0.05

    def __init__(self, block_size: int | None = None) -> None:
        if block_size is not None and block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self._guesses: list[list[int]] = []
        self._iterations: list[list[int]] = []

    def start(self, states: list[RowState], model: PreTrainedModel) -> None:
        self._guesses = [[] for _ in states]
        self._iterations = [[0] for _ in states]

    def propose(self, row: int, state: RowState, budget: int) -> list[int]:
        unknowns = budget
        if self.block_size is not None:  # the bonus token of this forward fills one of the block's unknowns
            unknowns = min(budget, self.block_size - len(state.tokens) % self.block_size - 1)
        guesses = self._guesses[row][:unknowns]
        return guesses + [state.history[-1]] * (unknowns - len(guesses))

    def observe(self, row: int, state: RowState, predictions: list[int], accepted: int, trailing: list[int],
                trailing_logprobs: list[float]) -> None:
        block_before = len(state.tokens) // self.block_size if self.block_size else 0
        fixed = len(state.tokens) + accepted + 1
        self._iterations[row][-1] += 1
        self._guesses[row] = predictions[accepted + 1:]
        if self.block_size and fixed // self.block_size > block_before:
            self._iterations[row].append(0)
            self._guesses[row] = []

    def details(self) -> dict[str, list[int]]:
        return {"iterations_per_block": [n for row in self._iterations for n in row if n]}


@register_decoder("jacobi")
def jacobi_decoder(block_size: int | None = None, max_draft: int = 32) -> DraftVerifyDecoder:
    """Jacobi decoding: draft-and-verify with :class:`JacobiDrafter` over the whole output."""
    return DraftVerifyDecoder(JacobiDrafter(block_size), max_draft)


@register_decoder("gs_jacobi")
def gauss_seidel_jacobi_decoder(block_size: int = 8, max_draft: int = 32) -> DraftVerifyDecoder:
    """Jacobi inside blocks of ``block_size`` tokens, blocks decoded one after the other."""
    return DraftVerifyDecoder(JacobiDrafter(block_size), max_draft)
