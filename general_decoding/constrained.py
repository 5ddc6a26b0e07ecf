"""Constrained greedy decoding: each row's answer stays on a path of its own token trie.

Not a drop-in for greedy (its output differs whenever greedy leaves the trie), so these
decoders are not registered by name: a caller builds one with the tries of its rows, e.g. the
engine re-asking a mention query with its answer restricted to spans of the text.
:class:`ConstrainedGreedyDecoder` is the reference; :class:`ConstrainedCopyDecoder` gives the
same tokens in fewer forwards by drafting what follows in the input (an answer restricted to
spans of the input is a copy of it) and verifying the draft under the same restriction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from general_decoding.draft_verify import DraftVerifyDecoder, RowState, longest_suffix_match
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
            node = node.child(token)

    def child(self, token: int) -> "TokenTrie":
        """The node after ``token``, created if missing."""
        node = self.children.get(token)
        if node is None:
            node = self.children[token] = TokenTrie()
        return node

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


def _node(trie: TokenTrie | None, tokens: Sequence[int]) -> TokenTrie | None:
    """Where ``tokens`` lead in ``trie`` (None: no trie, or they left it)."""
    return trie.follow(tokens) if trie is not None else None


def _check_rows(tries: Sequence[TokenTrie | None], rows: int) -> None:
    if len(tries) < rows:
        raise ValueError(f"{len(tries)} tries for a batch of {rows} rows")


class ConstrainedGreedyDecoder(GreedyDecoder):
    """Greedy decoding where row i only emits continuations within ``tries[i]`` (None: free).
    Scores stay the model's log-probabilities of the tokens chosen."""

    name = "constrained_greedy"

    def __init__(self, tries: Sequence[TokenTrie | None]) -> None:
        self.tries = list(tries)

    def choose(self, step_logprobs: torch.Tensor, rows: list[int], tokens: list[list[int]]) -> torch.Tensor:
        _check_rows(self.tries, max(rows, default=-1) + 1)
        nodes = [_node(self.tries[row], tokens[row]) for row in rows]
        masked = step_logprobs.clone()
        restrict(masked, [node.children if node is not None else None for node in nodes])
        return masked.argmax(-1)


class ConstrainedCopyDecoder(DraftVerifyDecoder):
    """:class:`ConstrainedGreedyDecoder`'s tokens, drafted from the input: a row drafts what
    follows its latest tokens in its input, cut where the draft leaves its trie, and every
    verified column is restricted to the trie node it continues."""

    name = "constrained_copy"

    def __init__(self, tries: Sequence[TokenTrie | None], max_n: int = 6, max_draft: int = 12) -> None:
        super().__init__(max_draft)
        self.tries = list(tries)
        self.max_n = max_n

    def propose(self, row: int, state: RowState, budget: int) -> list[int]:
        end = longest_suffix_match(state.history, state.context[:-1], self.max_n)
        draft = [] if end is None else state.context[end:end + budget]
        node = _node(self.tries[row], state.tokens)
        if node is None:
            return draft
        kept = []
        for token in draft:
            if token not in node.children:
                break
            kept.append(token)
            node = node.children[token]
        return kept

    def choose(self, logprobs: torch.Tensor, rows: list[int], states: list[RowState], drafts: list[list[int]]) -> torch.Tensor:
        _check_rows(self.tries, max(rows, default=-1) + 1)
        masked = logprobs.clone()
        for position, (row, state, draft) in enumerate(zip(rows, states, drafts)):
            node = None if state.done else _node(self.tries[row], state.tokens)
            for column in range(min(len(draft) + 1, logprobs.shape[1])):
                if node is None:
                    break
                restrict(masked[position, column:column + 1], [node.children])
                node = node.children.get(draft[column]) if column < len(draft) else None
        return masked.argmax(-1)
