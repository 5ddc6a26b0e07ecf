"""Draft, then verify in one forward: the mechanics every lossless drafting decoder shares.

Each row feeds ``[last, d_1 .. d_k]``; the model's greedy predictions ``g_0 .. g_k`` accept
the longest draft prefix with ``d_i == g_{i-1}`` and add the bonus token ``g_a``, so every
emitted token is exactly the greedy one. Rows of a batch accept different numbers of tokens:
the cache keeps the longest accepted run and the other rows' rejected columns are masked out
(positions skip masked columns), so no row ever attends to a rejected token.

What to draft is a :class:`Drafter`'s call (the input text, an n-gram table, Jacobi
guesses, a draft model), composed with the loop rather than subclassing it, in the manner of
Hugging Face's candidate generators; how many tokens a row drafts is :class:`DraftLength`'s.
Token constraints (:mod:`general_decoding.constraints`) apply to every verified column, so a
constrained answer is drafted and verified within its constraints.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers.cache_utils import Cache

from general_decoding.base import DecodeInputs, Decoder, Generation, StopCriteria, position_ids_from_mask
from general_decoding.constraints import TokenConstraint, admissible_draft, choose
from general_decoding.kv_cache import ReservedCache, keep_first, keep_rows
from general_decoding.row_vocabulary import next_logprobs

if TYPE_CHECKING:  # for types only: the engine may run its own model class (no import of transformers' model classes)
    from transformers import PreTrainedModel


@dataclass
class RowState:
    """One row's decoding so far: ``context`` is every token before the emitted ones."""

    context: list[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    score: float = 0.0
    stopped: bool = False
    done: bool = False

    @property
    def history(self) -> list[int]:
        """Context and emitted tokens: what a drafter may look at."""
        return self.context + self.tokens

    def emit(self, token: int, logprob: float, stop: StopCriteria) -> None:
        """Append a greedy token (a stop token ends the row without being emitted)."""
        self.score += logprob
        if token in stop.stop_token_ids:
            self.stopped = self.done = True
            return
        self.tokens.append(token)
        self.logprobs.append(logprob)
        self.done = len(self.tokens) >= stop.max_new_tokens


def prefill(model: PreTrainedModel, inputs: DecodeInputs, cache: Cache) -> list[RowState]:
    """Run the uncached prompt into ``cache`` and emit each row's first token (the greedy one
    within ``inputs.constraints``)."""
    input_ids, attention_mask = inputs.input_ids, inputs.attention_mask
    new_columns = attention_mask[:, -input_ids.shape[1]:].bool()
    contexts = inputs.context_ids or [[] for _ in range(input_ids.shape[0])]
    states = [RowState(list(c) + ids[keep].tolist()) for c, ids, keep in zip(contexts, input_ids.cpu(), new_columns.cpu())]
    positions = position_ids_from_mask(attention_mask)[:, -input_ids.shape[1]:]
    logprobs = next_logprobs(model, inputs.vocabulary, 1, input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                             cache=cache, use_cache=True)[:, -1]
    first = choose(logprobs.clone() if inputs.constraints else logprobs, inputs.constraints, range(len(states)), [[] for _ in states])
    for state, token, lp in zip(states, first.tolist(), logprobs.gather(-1, first[:, None])[:, 0].tolist()):
        state.emit(token, lp, inputs.stop)
    return states


class DraftLength:
    """How many tokens each row drafts next, so that drafting never costs much more than it
    saves. A verification forward of more tokens costs more than a greedy step (about 1.25x
    for 2-8 tokens on a CPU: ``benchmarks/skinny_linear.py``), so:

    * a row drafts ``start`` tokens; two more after a full-length draft accepted whole (up to
      ``most``); one fewer after a miss (never fewer than ``least`` or than were accepted);
    * it keeps a running mean of the tokens accepted per draft; below ``break_even`` (the
      extra cost of a verification forward, in greedy steps) it stops drafting and decodes
      greedily, drafting ``least`` tokens every ``probe_every`` steps to see whether drafts
      have started to pay again. A ``prior`` mean below ``break_even`` (a drafter measured not
      to pay) starts that way: the first draft is a probe after ``probe_every`` greedy steps.
    """

    def __init__(self, rows: int, most: int, start: int = 4, least: int = 3, break_even: float = 0.25,
                 smoothing: float = 0.3, probe_every: int = 8, prior: float = 1.0) -> None:
        self.most = most
        self.least = min(least, most)
        self.break_even = break_even
        self.smoothing = smoothing
        self.probe_every = probe_every
        self.lengths = [min(start, most) if prior >= break_even else 0] * rows
        self._accepted_mean = [prior] * rows  # the mean before any draft was verified
        self._idle = [0] * rows

    def budget(self, row: int) -> int:
        """The number of tokens ``row`` may draft now."""
        if self.lengths[row] == 0:
            self._idle[row] += 1
            return self.least if self._idle[row] % self.probe_every == 0 else 0
        return self.lengths[row]

    def update(self, row: int, drafted: int, accepted: int) -> None:
        """Record that ``accepted`` of the ``drafted`` tokens passed verification."""
        if drafted == 0:
            return
        mean = (1 - self.smoothing) * self._accepted_mean[row] + self.smoothing * accepted
        self._accepted_mean[row] = mean
        current = max(self.lengths[row], self.least)  # a probe counts as ``least``
        if mean < self.break_even:
            self.lengths[row] = 0
        elif accepted < drafted:
            self.lengths[row] = max(accepted, current - 1, self.least)
        elif drafted >= current:
            self.lengths[row] = min(current + 2, self.most)
        else:
            self.lengths[row] = current


class Drafter(ABC):
    """Proposes the tokens a row is expected to emit next; the decoder verifies them."""

    #: tokens a draft is expected to get accepted before any was verified (:class:`DraftLength`'s
    #: prior): a drafter measured not to pay starts greedy and probes
    expected_accepted: float = 1.0
    #: tokens fed after every draft whose predictions go to :meth:`observe` but are not verified
    #: (the placeholders of lexical units); set by :meth:`start`
    trailing: tuple[int, ...] = ()

    @abstractmethod
    def propose(self, row: int, state: RowState, budget: int) -> list[int]:
        """Up to ``budget`` tokens expected to follow ``state.history`` (may be empty)."""

    def start(self, states: list[RowState], model: PreTrainedModel) -> None:
        """Hook: called once per decoding call before the first draft."""

    def observe(self, row: int, state: RowState, predictions: list[int], accepted: int, trailing: list[int],
                trailing_logprobs: list[float]) -> None:
        """Hook: the greedy predictions after ``[last] + draft[:j]`` for every j, how many drafts
        were accepted, and the predictions at the :attr:`trailing` columns fed after the draft
        with their log-probabilities."""

    def details(self) -> dict[str, list[int]]:
        """Hook: drafter-specific counts for :attr:`Generation.details`."""
        return {}


class DraftVerifyDecoder(Decoder):
    """Greedy-exact decoding that verifies up to ``max_draft`` tokens of ``drafter`` per forward,
    the number per row set by :class:`DraftLength`, starting from ``expected_accepted`` (the
    drafter's) tokens accepted per draft.

    A verification forward feeds at most ``verify_tokens`` tokens over the batch: drafts are
    cut to fit. A large batch's forward is compute-bound, so drafted tokens would cost their
    full price and most are rejected; it decodes greedily, and drafts start paying as rows
    finish (finished rows leave the batch and the cache). One row drafts up to ``max_draft``."""

    supports_constraints = True
    supports_vocabulary = True
    verify_tokens = 24

    def __init__(self, drafter: Drafter, max_draft: int = 8) -> None:
        if max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {max_draft}")
        self.drafter = drafter
        self.max_draft = max_draft
        self.expected_accepted = drafter.expected_accepted

    def _draft(self, row: int, state: RowState, budget: int, constraints: Sequence[TokenConstraint]) -> list[int]:
        """The drafter's proposal, cut where a constraint would not admit it."""
        draft = self.drafter.propose(row, state, budget)
        return admissible_draft(draft, constraints, row, state.tokens) if constraints else draft

    @staticmethod
    def _choose(logprobs: torch.Tensor, rows: list[int], states: list[RowState], drafts: list[list[int]],
                constraints: Sequence[TokenConstraint]) -> torch.Tensor:
        """The token each row emits after ``[last] + draft[:j]`` for every column j of ``logprobs``
        ([rows, columns, vocabulary]): the most probable one within ``constraints``."""
        if not constraints:
            return logprobs.argmax(-1)
        columns = logprobs.shape[1]
        flat = logprobs.reshape(-1, logprobs.shape[-1]).clone()
        positions = [(row, state.tokens + draft[:j]) for row, state, draft in zip(rows, states, drafts) for j in range(columns)]
        chosen = choose(flat, constraints, [row for row, _ in positions], [output for _, output in positions])
        return chosen.reshape(len(rows), columns)

    def _generate(self, model: PreTrainedModel, inputs: DecodeInputs) -> Generation:
        """Every forward feeds each row's tokens not yet in the cache (the whole input at first,
        then the last emitted token) followed by its draft, the first forward included."""
        device = inputs.input_ids.device
        cache = inputs.past_key_values if inputs.past_key_values is not None else ReservedCache()
        new_columns = inputs.attention_mask[:, -inputs.input_ids.shape[1]:]
        contexts = inputs.context_ids or [[] for _ in range(inputs.input_ids.shape[0])]
        states = [RowState(list(c) + ids[keep.bool()].tolist()) for c, ids, keep in zip(contexts, inputs.input_ids.cpu(), new_columns.cpu())]
        self.drafter.start(states, model)
        lengths = DraftLength(len(states), self.max_draft, prior=self.expected_accepted)
        live = list(range(len(states)))  # the batch's rows still decoding, in cache order
        mask = inputs.attention_mask[:, : -inputs.input_ids.shape[1]]
        fed, fed_mask = inputs.input_ids, new_columns
        forwards, accepted_per_pass = 0, []
        while True:
            mask, emitted = self._verify(model, cache, states, live, mask, fed, fed_mask, lengths, inputs)
            forwards += 1
            accepted_per_pass.append(emitted)
            going = [i for i, r in enumerate(live) if not states[r].done]
            if not going:
                break
            if len(going) < len(live):  # finished rows leave the batch and the cache
                keep_rows(cache, torch.tensor(going, device=mask.device))
                live, mask = [live[i] for i in going], mask[going]
            fed = torch.tensor([[states[r].tokens[-1]] for r in live], device=device)
            fed_mask = torch.ones_like(fed)
        return Generation([s.tokens for s in states], [s.logprobs for s in states], [s.score for s in states],
                          [s.stopped for s in states], forwards, accepted_per_pass, self.drafter.details())

    def _verify(self, model: PreTrainedModel, cache: Cache, states: list[RowState], live: list[int], mask: torch.Tensor,
                fed: torch.Tensor, fed_mask: torch.Tensor, lengths: DraftLength, inputs: DecodeInputs) -> tuple[torch.Tensor, int]:
        """One forward: the ``live`` rows' uncached tokens ``fed`` (left-padded, ``fed_mask``)
        and their drafts; emit each row's greedy tokens (the accepted drafts and one more), keep
        the cache columns they need and return the attention mask over the cache and how many
        tokens were emitted."""
        stop, constraints = inputs.stop, inputs.constraints
        room = max(self.verify_tokens // len(live) - fed.shape[1], 0)
        trailing = list(self.drafter.trailing) if room > len(self.drafter.trailing) else []
        room -= len(trailing)
        drafts = [self._draft(r, states[r], budget, constraints)
                  if (budget := min(lengths.budget(r), room, stop.max_new_tokens - len(states[r].tokens) - 1)) > 0 else [] for r in live]
        width = max(len(d) for d in drafts)
        columns = width + len(trailing)  # each row: its draft, the trailing tokens, padding
        ids = torch.cat([fed, torch.tensor([d + trailing + [0] * (width - len(d)) for d in drafts], dtype=torch.long, device=fed.device)], dim=1)
        known = torch.cat([mask, fed_mask], dim=1)
        fed_now = torch.tensor([[1] * (len(d) + len(trailing)) + [0] * (width - len(d)) for d in drafts], dtype=known.dtype, device=known.device)
        full_mask = torch.cat([known, fed_now], dim=1)
        positions = torch.cat([position_ids_from_mask(known)[:, -fed.shape[1]:],
                               known.sum(-1, keepdim=True) + torch.arange(columns, device=mask.device)], dim=1)
        past = cache.get_seq_length()
        vocabulary = inputs.vocabulary.rows(live) if inputs.vocabulary is not None else None
        logprobs = next_logprobs(model, vocabulary, columns + 1, input_ids=ids, attention_mask=full_mask, position_ids=positions,
                                 cache=cache, use_cache=True)
        predictions = self._choose(logprobs, live, [states[r] for r in live], drafts, constraints)
        # unconstrained (constraints apply to verified columns only); without constraints that is ``predictions``
        trailing_predictions = trailing_logprobs = None
        if trailing:
            trailing_tokens = logprobs.argmax(-1) if constraints else predictions
            trailing_predictions = trailing_tokens.tolist()
            trailing_logprobs = logprobs.gather(-1, trailing_tokens[..., None])[..., 0].tolist()
        chosen = logprobs.gather(-1, predictions[..., None])[..., 0]
        accepted_drafts, emitted = [], 0
        for i, r in enumerate(live):
            state, draft = states[r], drafts[i]
            row_pred = predictions[i, : len(draft) + 1].tolist()
            accepted = 0
            while accepted < len(draft) and draft[accepted] == row_pred[accepted]:
                accepted += 1
            trailing_columns = slice(len(draft) + 1, len(draft) + 1 + len(trailing))
            self.drafter.observe(r, state, row_pred, accepted, trailing_predictions[i][trailing_columns] if trailing_predictions else [],
                                 trailing_logprobs[i][trailing_columns] if trailing_logprobs else [])
            lengths.update(r, len(draft), accepted)
            row_lp = chosen[i].tolist()
            before = len(state.tokens) + int(state.stopped)
            for j in range(accepted + 1):
                state.emit(row_pred[j], row_lp[j], stop)
                if state.done:
                    break
            emitted += len(state.tokens) + int(state.stopped) - before
            accepted_drafts.append(accepted)
        keep = max(accepted_drafts)  # the fed tokens and the accepted drafts are now valid cache
        keep_first(cache, past + fed.shape[1] + keep)
        valid = torch.arange(keep, device=mask.device)[None, :] < torch.tensor(accepted_drafts, device=mask.device)[:, None]
        return torch.cat([known, valid.long()], dim=1), emitted


def longest_suffix_match(history: list[int], source: list[int], max_n: int, min_n: int = 1) -> int | None:
    """End index in ``source`` of the latest occurrence of ``history``'s longest suffix
    (longest n first, from ``max_n`` down to ``min_n``); ``None`` if there is none."""
    for n in range(min(max_n, len(history)), min_n - 1, -1):
        suffix = history[-n:]
        for end in range(len(source) - 1, n - 2, -1):
            if source[end - n + 1:end + 1] == suffix:
                return end + 1
    return None
