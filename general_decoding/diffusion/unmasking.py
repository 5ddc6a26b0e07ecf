"""Which masked positions of the current block a denoising step fills in.

Every rule sees, per row, the confidence (probability of the most likely token) at each
position of the block and which positions are still masked, and returns the positions to
unmask; a row with a masked position always gets at least one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


def _top_k(confidence: torch.Tensor, masked: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The ``counts[row]`` most confident masked positions of each row."""
    scores = confidence.masked_fill(~masked, -1.0)
    order = scores.argsort(dim=-1, descending=True, stable=True)
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1]).expand_as(order))
    return masked & (ranks < counts[:, None])


class Unmasking(ABC):
    """A rule that picks the positions to unmask at one step."""

    @abstractmethod
    def select(self, confidence: torch.Tensor, masked: torch.Tensor, step: int, initial: torch.Tensor) -> torch.Tensor:
        """Boolean ``[batch, block]`` positions to unmask; ``step`` counts from 0 in the block,
        ``initial[row]`` is how many positions were masked when the block began."""


@dataclass(frozen=True)
class FixedStepsUnmasking(Unmasking):
    """LLaDA's low-confidence remasking: a block's masks are spread evenly over ``steps``
    steps (the first steps take the remainder) and the most confident ones are kept."""

    steps: int

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")

    def counts(self, initial: torch.Tensor, step: int) -> torch.Tensor:
        """How many positions each row unmasks at ``step`` (LLaDA's ``get_num_transfer_tokens``)."""
        return initial // self.steps + (step < initial % self.steps).long()

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, step: int, initial: torch.Tensor) -> torch.Tensor:
        counts = masked.sum(-1) if step >= self.steps - 1 else self.counts(initial, step)  # the last step takes the rest
        return _top_k(confidence, masked, counts.clamp(min=1))


@dataclass(frozen=True)
class ThresholdUnmasking(Unmasking):
    """Fast-dLLM: every masked position whose confidence exceeds ``threshold`` (at least the
    most confident one). ``threshold >= 1`` unmasks exactly one token per step."""

    threshold: float

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, step: int, initial: torch.Tensor) -> torch.Tensor:
        best = _top_k(confidence, masked, torch.ones(masked.shape[0], dtype=torch.long))
        return best | (masked & (confidence > self.threshold))


@dataclass(frozen=True)
class FactorUnmasking(Unmasking):
    """Fast-dLLM's factor rule: the ``n`` most confident masked positions where the n-th
    (1-based, in decreasing confidence) has confidence >= ``1 - factor / (n + 1)``, for the
    largest such run (at least one)."""

    factor: float

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, step: int, initial: torch.Tensor) -> torch.Tensor:
        ordered = confidence.masked_fill(~masked, -1.0).sort(dim=-1, descending=True).values
        n = torch.arange(1, ordered.shape[-1] + 1, dtype=ordered.dtype)
        passes = (ordered >= 1 - self.factor / (n + 1)) & (ordered >= 0)
        counts = passes.long().cumprod(-1).sum(-1)
        return _top_k(confidence, masked, counts.clamp(min=1))


@dataclass(frozen=True)
class LeftToRightUnmasking(Unmasking):
    """The first masked position of the block and the masked positions right after it while
    each one's confidence exceeds ``threshold``: a contiguous run, read left to right.

    For a model adapted from an autoregressive LM the first masked position is its next token,
    predicted with every token before it known; a position further right is accepted only with
    all positions between known or accepted in the same step. Positions accepted apart from
    each other (``ThresholdUnmasking``) each guess their neighbours and can disagree with them
    (a first name written twice, a word's ending repeated)."""

    threshold: float

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, step: int, initial: torch.Tensor) -> torch.Tensor:
        first = masked & (masked.long().cumsum(-1) == 1)
        passes = ~masked | first | (confidence > self.threshold)
        return masked & passes.long().cumprod(-1).bool()
