"""Copy drafting: continue the output with the tokens that follow its longest suffix in the input.

Extracted entities, quotes and names are copied from the source text, so the input is a
draft model that costs nothing: the drafter finds the latest place where the last
``max_n .. 1`` emitted (or query) tokens occur in the input and drafts what follows there.
"""

from __future__ import annotations

from general_decoding.draft_verify import Drafter, DraftVerifyDecoder, RowState, longest_suffix_match
from general_decoding.registry import register_decoder


class CopyDrafter(Drafter):
    """Drafts continuations copied from the row's input (its context and prompt tokens)."""

    def __init__(self, max_n: int = 6) -> None:
        self.max_n = max_n

    def propose(self, row: int, state: RowState, budget: int) -> list[int]:
        end = longest_suffix_match(state.history, state.context[:-1], self.max_n)
        return [] if end is None else state.context[end:end + budget]


@register_decoder("copy")
def copy_decoder(max_n: int = 6, max_draft: int = 12) -> DraftVerifyDecoder:
    """Draft-and-verify with :class:`CopyDrafter`."""
    return DraftVerifyDecoder(CopyDrafter(max_n), max_draft)


def copy_candidates(source: list[int], token: int, depth: int) -> list[list[int]]:
    """What follows each occurrence of ``token`` in ``source`` (up to ``depth`` tokens), distinct,
    the latest occurrence first: every way an answer that just emitted ``token`` may go on if it
    copies ``source`` from there (a mention's first token fixes where in the text it starts)."""
    found = [source[i + 1:i + 1 + depth] for i in range(len(source) - 2, -1, -1) if source[i] == token]
    return [list(c) for c in dict.fromkeys(tuple(c) for c in found if c)]
