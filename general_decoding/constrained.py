"""Constrained greedy decoding: each row's answer stays on a path of its own token trie.

Not a drop-in for greedy (its output differs whenever greedy leaves the trie), so it is not
registered by name: a caller builds it with the tries of its rows, e.g. the engine re-asking
a mention query with its answer restricted to spans of the text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from general_decoding.greedy import GreedyDecoder


class TokenTrie:
    """Token sequences as a prefix tree: which tokens may follow a prefix. A sequence that may
    end somewhere carries its stop token there, so "may stop" is "the stop token may follow"."""

    __slots__ = ("children",)

    def __init__(self, sequences: Iterable[Sequence[int]] = ()) -> None:
        self.children: dict[int, TokenTrie] = {}
        for sequence in sequences:
            self.add(sequence)

    def add(self, tokens: Sequence[int]) -> None:
        """Insert one token sequence."""
        node = self
        for token in tokens:
            node = node.children.setdefault(token, TokenTrie())

    def follow(self, tokens: Sequence[int]) -> "TokenTrie | None":
        """The node after ``tokens``, or None when they leave the trie."""
        node: TokenTrie | None = self
        for token in tokens:
            node = node.children.get(token) if node is not None else None
        return node


def restrict(logprobs: torch.Tensor, allowed: Sequence[Iterable[int] | None]) -> None:
    """In place, rule out every token but ``allowed[row]`` in each row (None: leave the row
    free; a row with nothing allowed is left free as well rather than made impossible)."""
    for row, tokens in enumerate(allowed):
        keep = list(tokens) if tokens is not None else []
        if keep:
            kept = logprobs[row, keep].clone()
            logprobs[row] = float("-inf")
            logprobs[row, keep] = kept


class ConstrainedGreedyDecoder(GreedyDecoder):
    """Greedy decoding where row i only emits continuations within ``tries[i]`` (None: free).
    Scores stay the model's log-probabilities of the tokens chosen."""

    name = "constrained_greedy"

    def __init__(self, tries: Sequence[TokenTrie | None]) -> None:
        self.tries = list(tries)

    def _choose(self, step_logprobs: torch.Tensor, rows: list[int], tokens: list[list[int]]) -> torch.Tensor:
        if len(self.tries) <= max(rows, default=-1):
            raise ValueError(f"{len(self.tries)} tries for a batch of at least {max(rows) + 1} rows")
        nodes = [trie.follow(tokens[row]) if (trie := self.tries[row]) is not None else None for row in rows]
        masked = step_logprobs.clone()
        restrict(masked, [node.children if node is not None else None for node in nodes])
        return masked.argmax(-1)
