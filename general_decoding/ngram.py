"""ANPD: adaptive n-gram parallel decoding (Ou et al. 2024).

A multi-level n-gram table over the prompt and every token generated so far predicts the
next token from the longest matching context (n = ``max_n`` down to 2); chaining it drafts
up to ``max_draft`` tokens that one forward verifies. The table adapts as tokens are emitted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from general_decoding.draft_verify import Drafter, DraftVerifyDecoder, RowState
from general_decoding.registry import register_decoder

if TYPE_CHECKING:  # for types only: the engine may run its own model class (no import of transformers' model classes)
    from transformers import PreTrainedModel


class NGramTable:
    """Next token after each context of 1..``max_n - 1`` tokens (latest occurrence wins)."""

    def __init__(self, max_n: int) -> None:
        self.max_n = max_n
        self.next_token: dict[tuple[int, ...], int] = {}
        self.indexed = 0

    def update(self, tokens: list[int]) -> None:
        """Index every n-gram ending in ``tokens[self.indexed:]``."""
        for end in range(max(self.indexed, 1), len(tokens)):
            for n in range(1, self.max_n):
                if end - n >= 0:
                    self.next_token[tuple(tokens[end - n:end])] = tokens[end]
        self.indexed = len(tokens)

    def predict(self, tokens: list[int]) -> int | None:
        """The next token after ``tokens`` from the longest known context, if any."""
        for n in range(min(self.max_n - 1, len(tokens)), 0, -1):
            token = self.next_token.get(tuple(tokens[-n:]))
            if token is not None:
                return token
        return None


class NGramDrafter(Drafter):
    """Drafts by chaining the adaptive multi-level n-gram table (one per row)."""

    def __init__(self, max_n: int = 4) -> None:
        if max_n < 2:
            raise ValueError(f"max_n must be >= 2, got {max_n}")
        self.max_n = max_n
        self._tables: list[NGramTable] = []

    def start(self, states: list[RowState], model: PreTrainedModel) -> None:
        self._tables = [NGramTable(self.max_n) for _ in states]

    def propose(self, row: int, state: RowState, budget: int) -> list[int]:
        table = self._tables[row]
        history = state.history
        table.update(history)
        draft: list[int] = []
        while len(draft) < budget:
            token = table.predict(history + draft)
            if token is None:
                break
            draft.append(token)
        return draft


@register_decoder("anpd")
def anpd_decoder(max_n: int = 4, max_draft: int = 8) -> DraftVerifyDecoder:
    """Draft-and-verify with :class:`NGramDrafter` (ANPD)."""
    return DraftVerifyDecoder(NGramDrafter(max_n), max_draft)
