"""Token constraints: what a decoder may emit next, given what a row has emitted so far.

In the manner of Hugging Face's logits processors, a :class:`TokenConstraint` adjusts the
next-token log-probabilities (rules tokens out, or adds a bias) and never decodes anything
itself; every decoder that ``supports_constraints`` picks its tokens through :func:`choose`,
so one constraint works with greedy decoding, with every drafter and for a single forward's
choice alike. Constraints compose: they apply in order. A drafting decoder also cuts a draft
where a constraint would not admit it (:func:`admissible_draft`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence

import torch


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


class TokenConstraint(ABC):
    """Adjusts next-token log-probabilities of a batch's rows from what each row emitted."""

    #: it only ever concerns a row's first token (an answer that began is free of it)
    first_token_only: bool = False

    @abstractmethod
    def apply(self, logprobs: torch.Tensor, rows: Sequence[int], outputs: Sequence[Sequence[int]]) -> None:
        """In place: ``logprobs[i]`` ([positions, vocabulary]) is the next-token distribution of
        batch row ``rows[i]`` after it emitted ``outputs[i]``."""

    def admits(self, row: int, output: Sequence[int], token: int) -> bool:
        """Whether ``token`` may follow ``output`` in ``row`` (a drafter's draft is cut where not)."""
        return True


def restrict(logprobs: torch.Tensor, allowed: Sequence[Iterable[int] | None]) -> None:
    """In place, rule out every token but ``allowed[i]`` at each position i (None: leave it
    free). A position where every allowed token is ruled out already is left as it is rather
    than made impossible."""
    for position, tokens in enumerate(allowed):
        if tokens is None:
            continue
        keep = [t for t in tokens if logprobs[position, t] > float("-inf")]
        if keep:
            kept = logprobs[position, keep].clone()
            logprobs[position] = float("-inf")
            logprobs[position, keep] = kept


class TrieConstraint(TokenConstraint):
    """Row i emits only continuations within ``tries[i]`` (None: free; free as well once its
    output left the trie, or where the trie allows nothing more)."""

    def __init__(self, tries: Sequence[TokenTrie | None]) -> None:
        self.tries = list(tries)

    def _node(self, row: int, output: Sequence[int]) -> TokenTrie | None:
        if row >= len(self.tries):
            raise ValueError(f"{len(self.tries)} tries for a batch row {row}")
        trie = self.tries[row]
        return trie.follow(output) if trie is not None else None

    def apply(self, logprobs: torch.Tensor, rows: Sequence[int], outputs: Sequence[Sequence[int]]) -> None:
        nodes = [self._node(row, output) for row, output in zip(rows, outputs)]
        restrict(logprobs, [node.children if node is not None else None for node in nodes])

    def admits(self, row: int, output: Sequence[int], token: int) -> bool:
        node = self._node(row, output)
        return node is None or not node.children or token in node.children


class BannedFirstToken(TokenConstraint):
    """Row i's first token is never ``banned[i]`` (None: anything goes)."""

    first_token_only = True

    def __init__(self, banned: Sequence[int | None]) -> None:
        self.banned = list(banned)

    def apply(self, logprobs: torch.Tensor, rows: Sequence[int], outputs: Sequence[Sequence[int]]) -> None:
        for position, (row, output) in enumerate(zip(rows, outputs)):
            if not output and self.banned[row] is not None:
                logprobs[position, self.banned[row]] = float("-inf")

    def admits(self, row: int, output: Sequence[int], token: int) -> bool:
        return bool(output) or token != self.banned[row]


class TokenBias(TokenConstraint):
    """Adds ``bias[token]`` to the log-probability of each listed token (e.g. larger counts)."""

    def __init__(self, bias: Mapping[int, float]) -> None:
        self.bias = dict(bias)

    def apply(self, logprobs: torch.Tensor, rows: Sequence[int], outputs: Sequence[Sequence[int]]) -> None:
        if self.bias:
            tokens = list(self.bias)
            logprobs[:, tokens] += torch.tensor([self.bias[t] for t in tokens], dtype=logprobs.dtype, device=logprobs.device)


class Continued(TokenConstraint):
    """``constraint`` over answers that already began: batch row i here is row ``rows[i]`` of
    the constraint, whose answer so far is ``emitted[i]`` followed by what is emitted here."""

    def __init__(self, constraint: TokenConstraint, rows: Sequence[int], emitted: Sequence[Sequence[int]]) -> None:
        self.constraint, self.rows, self.emitted = constraint, list(rows), [list(e) for e in emitted]

    def apply(self, logprobs: torch.Tensor, rows: Sequence[int], outputs: Sequence[Sequence[int]]) -> None:
        self.constraint.apply(logprobs, [self.rows[r] for r in rows], [self.emitted[r] + list(o) for r, o in zip(rows, outputs)])

    def admits(self, row: int, output: Sequence[int], token: int) -> bool:
        return self.constraint.admits(self.rows[row], self.emitted[row] + list(output), token)


def continued(constraints: Sequence[TokenConstraint], rows: Sequence[int], emitted: Sequence[Sequence[int]]) -> tuple[TokenConstraint, ...]:
    """Every constraint :class:`Continued` after ``emitted``."""
    return tuple(Continued(c, rows, emitted) for c in constraints)


def choose(logprobs: torch.Tensor, constraints: Sequence[TokenConstraint], rows: Sequence[int],
           outputs: Sequence[Sequence[int]]) -> torch.Tensor:
    """The token each position emits: the most probable one once ``constraints`` applied
    (``logprobs`` [positions, vocabulary], position i of batch row ``rows[i]`` after ``outputs[i]``).
    Without constraints ``logprobs`` is left untouched; with them it is changed in place."""
    for constraint in constraints:
        constraint.apply(logprobs, rows, outputs)
    return logprobs.argmax(-1)


def admissible_draft(draft: Sequence[int], constraints: Sequence[TokenConstraint], row: int, output: Sequence[int]) -> list[int]:
    """``draft`` up to the first token a constraint would not admit after ``output``."""
    kept: list[int] = []
    for token in draft:
        if not all(c.admits(row, list(output) + kept, token) for c in constraints):
            break
        kept.append(token)
    return kept
