"""Query runners: how PaDeLLM's queries are run once the text is encoded, as branches behind
cached prefixes.

A :class:`QueryRunner` answers what a strategy asks of a batch of windows: first, the
next-token log-probabilities after some branches encoded with the prefixes (the count queries, and the
mention queries the most likely counts lead to); then any set of
:class:`~ner_service.engine.queries.Branch` es decoded behind their windows' prefixes.

:class:`SharedPrefixRunner` is the engine's. One forward encodes every prefix with those first
branches (:class:`PrefixCache`). A branch encoded whole there has its first answer token
already; one forward (:class:`BranchForward`) then feeds, as tries over the cache, every other
branch's rest (which yields its first token) and every known answer token with the text that
follows it wherever it occurs (a mention is a copy of the text: most finish in that forward,
their end token the verified bonus). A decoder goes on with the unfinished rows, each over its
window's cache row and its path. A decoder that ``shares_cache`` (``one_sequence``) decodes
the branches as one sequence over the cache instead. Told the tokens each answer may take
(:meth:`SharedPrefixRunner.restrict_answers`), it computes the logits of those tokens only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from general_decoding import Decoder, DraftVerifyDecoder, Generation, StopCriteria, TokenConstraint, choose, get_decoder, left_pad
from general_decoding.constraints import admissible_draft, continued
from general_decoding.copy_draft import copy_candidates
from general_decoding.kv_cache import release_after
from general_decoding.row_vocabulary import RowVocabulary, SparseLogprobs
from ner_service.engine.branch_forward import BranchForward, BranchRow, Node
from ner_service.engine.chunking import Window
from ner_service.engine.group_decoding import GroupInputs, batches, count_generation, decode_groups, empty_generation
from ner_service.engine.ner_model import NERModel
from ner_service.engine.prefix_cache import PrefixCache
from ner_service.engine.queries import Branch
from ner_service.engine.results import ExtractionStats

if TYPE_CHECKING:
    from ner_service.engine.answer_vocabulary import AnswerVocabulary

#: Tokens of the text drafted after a known answer token, per occurrence of that token.
MENTION_DRAFT_TOKENS = 4


def chosen(logprobs: SparseLogprobs, constraints: Sequence[TokenConstraint], rows: Sequence[int],
           outputs: Sequence[Sequence[int]]) -> list[int]:
    """The token each row of ``logprobs`` emits (:func:`~general_decoding.choose`): the most
    probable one; within ``constraints``, in the whole vocabulary's layout they index."""
    if not constraints:
        return logprobs.argmax().tolist()
    return choose(logprobs.to_dense(), constraints, rows, outputs).tolist()


def emit(result: Generation, row: int, token: int, logprob: float, stop: StopCriteria) -> bool:
    """Add ``token`` to ``row``'s answer in ``result``; whether the row goes on (no stop token, room left)."""
    result.scores[row] += logprob
    if token in stop.stop_token_ids:
        result.stopped[row] = True
        return False
    result.tokens[row].append(token)
    result.token_logprobs[row].append(logprob)
    return len(result.tokens[row]) < stop.max_new_tokens


class QueryRunner(Protocol):
    """Runs a strategy's queries behind the prefixes of one batch's windows."""

    def encode(self, branches: list[list[int]], stats: ExtractionStats) -> SparseLogprobs:
        """``[windows, branches]`` rows: the next-token log-probabilities after each branch behind each prefix."""

    def decode(self, branches: list[Branch], decoder: Decoder, max_new_tokens: int, stats: ExtractionStats,
               constraints: Sequence[TokenConstraint] = ()) -> Generation:
        """Each branch's answer, decoded by ``decoder`` within ``constraints``."""


class SharedPrefixRunner:
    """Queries as branches over one :class:`PrefixCache` of the windows (nothing re-encoded)."""

    def __init__(self, ner_model: NERModel, windows: list[Window], one_row: bool = False) -> None:
        self.ner_model, self.windows, self.one_row = ner_model, windows, one_row
        self.prefix: PrefixCache | None = None
        self.vocabulary: AnswerVocabulary | None = None

    def restrict_answers(self, vocabulary: "AnswerVocabulary") -> None:
        """From now on, every answer's logits over the tokens ``vocabulary`` gives its branch only
        (a decoder that does not take a row vocabulary keeps the whole output layer)."""
        self.vocabulary = vocabulary

    def _rows(self, branches: Sequence[tuple[int, Sequence[int]]]) -> RowVocabulary | None:
        return None if self.vocabulary is None or not branches else self.vocabulary.rows(branches)

    def encode(self, branches: list[list[int]], stats: ExtractionStats) -> SparseLogprobs:
        vocabulary = self._rows([(w, b) for w in range(len(self.windows)) for b in branches])
        self.prefix = PrefixCache.encode(self.ner_model, self.windows, branches, self.one_row, vocabulary)
        stats.forward_passes += 1
        return self.prefix.encoded_logprobs(branches)

    def decode(self, branches: list[Branch], decoder: Decoder, max_new_tokens: int, stats: ExtractionStats,
               constraints: Sequence[TokenConstraint] = ()) -> Generation:
        """Constrained branches and a decoder that does not share the cache go through one
        :class:`BranchForward` and then ``decoder`` (a constrained re-ask by a ``shares_cache``
        decoder is greedy); known answer tokens are followed by drafts when ``decoder`` drafts."""
        if self.prefix is None:
            raise RuntimeError("encode the prefixes first")
        stop = StopCriteria(max_new_tokens, self.ner_model.query_stop_token_ids)
        if constraints or not decoder.shares_cache:
            branch_decoder = get_decoder("greedy") if decoder.shares_cache else decoder
            stats.ran(branch_decoder)
            return self._branch_forward(branches, branch_decoder, stop, stats, constraints, drafts=isinstance(branch_decoder, DraftVerifyDecoder),
                                        vocabulary=self._rows([(b.window_index, b.tokens) for b in branches]))
        stats.ran(decoder)
        return self._one_sequence(branches, decoder, stop, stats)

    def _one_sequence(self, branches: list[Branch], decoder: Decoder, stop: StopCriteria, stats: ExtractionStats) -> Generation:
        """Branches of one sequence: all windows at once when they share one cache row."""
        prefix = self.prefix
        assert prefix is not None
        continuations = [prefix.continuation(b) for b in branches]
        owners = [b.window_index for b in branches]
        groups = [list(range(len(branches)))] if prefix.shared_row else \
            [[r for r in range(len(branches)) if owners[r] == w] for w in dict.fromkeys(owners)]

        def inputs(rows: list[int]) -> GroupInputs:
            # cached columns outside this row's prefix (other windows, branches, padding) are masked out
            ids, query_mask = left_pad([continuations[r].tokens for r in rows], self.ner_model.pad_token_id)
            cache = prefix.window_cache(owners[rows[0]])
            shared = torch.zeros(len(rows), cache.get_seq_length(), dtype=torch.long)
            shared[:, : prefix.mask.shape[1]] = prefix.mask[[owners[r] for r in rows]]
            for position, row in enumerate(rows):
                shared[position, list(continuations[row].columns)] = 1
            return GroupInputs(ids, torch.cat([shared, query_mask], dim=1), cache, [prefix.tokens[owners[r]] for r in rows])

        encoded = prefix.cache.get_seq_length()
        merged = decode_groups(self.ner_model, decoder, groups, len(branches), stop, inputs, [prefix.cache], stats,
                              vocabulary=self._rows([(b.window_index, b.tokens) for b in branches]))
        release_after(prefix.cache, encoded)  # a shared row grew by these branches, which no later branch sees
        count_generation(stats, merged)
        return merged

    def _branch_forward(self, branches: list[Branch], decoder: Decoder, stop: StopCriteria, stats: ExtractionStats,
                        constraints: Sequence[TokenConstraint], drafts: bool, vocabulary: RowVocabulary | None = None) -> Generation:
        """Known first tokens from the cached logits; one forward for the rest of the branches and
        for the drafts after known tokens; then ``decoder`` for the rows still unfinished
        (``vocabulary``: the tokens each branch may take, else the whole output layer)."""
        prefix = self.prefix
        assert prefix is not None
        result = empty_generation(len(branches))
        fed: dict[int, BranchRow] = {}
        asked: list[int] = []  # rows whose first token this forward gives
        known: list[int] = []  # rows whose first token the cached logits gave, fed with drafts
        for r, branch in enumerate(branches):
            cached = prefix.cached_logprobs(branch)
            if cached is None:
                continuation = prefix.continuation(branch)
                fed[r] = BranchRow(branch.window_index, continuation.columns, [continuation.tokens])
                asked.append(r)
                continue
            (token,) = chosen(cached, constraints, [r], [[]])
            if emit(result, r, token, cached.picked([token])[0], stop):
                candidates = copy_candidates(prefix.tokens[branch.window_index], token, MENTION_DRAFT_TOKENS) if drafts else []
                if constraints:
                    candidates = [c for c in (admissible_draft(c, constraints, r, [token]) for c in candidates) if c]
                columns = prefix.path_columns(branch.window_index, branch.tokens)
                fed[r] = BranchRow(branch.window_index, columns, [[token]] + [[token] + c for c in candidates])
                known.append(r)
        if not fed:
            count_generation(stats, result)
            return result
        forward = BranchForward(self.ner_model, prefix, [fed[r] for r in fed])
        result.forward_passes, result.accepted_per_pass = 1, [len(fed)]
        last: dict[int, Node] = {}
        pending: dict[int, int] = {}  # the emitted token each unfinished row feeds next
        index = {r: i for i, r in enumerate(fed)}
        if asked:
            nodes = [forward.answer_node(index[r]) for r in asked]
            logprobs = forward.logprobs(nodes, vocabulary.rows(asked) if vocabulary is not None else None)
            first = chosen(logprobs, constraints, asked, [[] for _ in asked])
            for r, node, token, logprob in zip(asked, nodes, first, logprobs.picked(first)):
                if emit(result, r, token, logprob, stop):
                    last[r], pending[r] = node, token
        for r in known:
            node, token = self._verify(forward, index[r], result, r, stop, constraints, vocabulary)
            if node is not None:
                last[r], pending[r] = node, token
        if pending:
            self._decode_rest(forward, branches, decoder, stop, stats, constraints, result, last, pending, vocabulary)
        stats.kv_cache_bytes = max(stats.kv_cache_bytes, forward.bytes())
        count_generation(stats, result)
        return result

    def _verify(self, forward: BranchForward, fed_row: int, result: Generation, row: int, stop: StopCriteria,
                constraints: Sequence[TokenConstraint], vocabulary: RowVocabulary | None = None) -> tuple[Node | None, int]:
        """Follow ``row``'s drafts from its known token while each next token (the greedy one within
        ``constraints``) was fed; emit them and the one after. Returns the last fed node on the way
        and that last token when the row goes on, else ``(None, stop token)``."""
        nodes = forward.subtree(fed_row)
        logprobs = forward.logprobs(nodes, vocabulary.rows([row] * len(nodes)) if vocabulary is not None else None)
        row_of = {node: index for index, node in enumerate(nodes)}
        node = forward.answer_node(fed_row)
        while True:
            row_lp = logprobs[row_of[node]:row_of[node] + 1]
            (token,) = chosen(row_lp, constraints, [row], [result.tokens[row]])
            goes_on = emit(result, row, token, row_lp.picked([token])[0], stop)
            following = forward.child(node, token)
            if not goes_on:
                return None, token
            if following is None or following not in row_of:
                return node, token
            node = following

    def _decode_rest(self, forward: BranchForward, branches: list[Branch], decoder: Decoder, stop: StopCriteria, stats: ExtractionStats,
                     constraints: Sequence[TokenConstraint], result: Generation, last: dict[int, Node], pending: dict[int, int],
                     vocabulary: RowVocabulary | None = None) -> None:
        """``decoder`` goes on from each unfinished row's last fed node, feeding its pending token;
        the answers are cut at ``stop.max_new_tokens`` tokens."""
        prefix = self.prefix
        assert prefix is not None
        rows = list(pending)
        room = max(stop.max_new_tokens - len(result.tokens[r]) for r in rows)
        # every row going on has emitted a token: what concerns a first token no longer applies
        after = continued([c for c in constraints if not c.first_token_only], list(range(len(branches))), [list(t) for t in result.tokens])
        rest = decode_groups(
            self.ner_model, decoder, batches(decoder, rows), len(branches), StopCriteria(max(room, 1), stop.stop_token_ids),
            lambda group: forward.inputs(group, last, pending, [prefix.tokens[branches[r].window_index] for r in group]),
            [prefix.cache, forward.cache], stats, after, vocabulary)
        for r in rows:
            keep = stop.max_new_tokens - len(result.tokens[r])
            tokens, logprobs = rest.tokens[r][:keep], rest.token_logprobs[r][:keep]
            cut = len(tokens) < len(rest.tokens[r])
            result.tokens[r] += tokens
            result.token_logprobs[r] += logprobs
            result.scores[r] += sum(logprobs) if cut else rest.scores[r]
            result.stopped[r] = rest.stopped[r] and not cut
        result.forward_passes += rest.forward_passes
        result.accepted_per_pass.extend(rest.accepted_per_pass)
