"""Branches behind cached prefixes: how PaDeLLM's queries are run once the text is encoded.

A :class:`QueryRunner` answers the two questions a strategy asks of a batch of windows: the
count queries' first tokens, then any set of :class:`~ner_service.engine.queries.Branch` es
decoded behind their windows' prefixes. :class:`SharedPrefixRunner` is the engine's: one
forward encodes every prefix with its count branches (:class:`PrefixCache`); a set of branches
is then fed in one forward as tries over the cache (branches behind the same cached columns
share their common beginning), which yields each branch's first answer token, and a decoder
goes on from there, each row over its window's cache row and its trie path. A decoder that
``shares_cache`` (``one_sequence``) decodes the branches as one sequence over the cache instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from general_decoding import Decoder, Generation, StopCriteria, TokenConstraint, choose, get_decoder, left_pad
from general_decoding.constraints import continued
from general_decoding.kv_cache import cache_bytes, select_rows
from general_decoding.tree_attention import ancestor_mask, build_trie, join_tries, pack_rows
from ner_service.engine.chunking import Window
from ner_service.engine.decoding import GroupInputs, batches, count_generation, decode_groups
from ner_service.engine.ner_model import NERModel
from ner_service.engine.prefix_cache import PrefixCache
from ner_service.engine.queries import Branch
from ner_service.engine.results import ExtractionStats


class QueryRunner(Protocol):
    """Runs a strategy's queries behind the prefixes of one batch's windows."""

    def count_logits(self, labels: list[str], stats: ExtractionStats) -> torch.Tensor:
        """Logits of each (window, label) count query's first answer token, window-major."""

    def decode(self, branches: list[Branch], decoder: Decoder, max_new_tokens: int, stats: ExtractionStats,
               constraints: Sequence[TokenConstraint] = ()) -> Generation:
        """Each branch's answer, decoded by ``decoder`` within ``constraints``."""


class SharedPrefixRunner:
    """Queries as branches over one :class:`PrefixCache` of the windows (nothing re-encoded)."""

    def __init__(self, ner_model: NERModel, windows: list[Window], one_row: bool = False) -> None:
        self.ner_model, self.windows, self.one_row = ner_model, windows, one_row
        self.prefix: PrefixCache | None = None

    def count_logits(self, labels: list[str], stats: ExtractionStats) -> torch.Tensor:
        self.prefix, logits = PrefixCache.encode(self.ner_model, self.windows, labels, self.one_row)
        stats.forward_passes += 1
        return logits

    def decode(self, branches: list[Branch], decoder: Decoder, max_new_tokens: int, stats: ExtractionStats,
               constraints: Sequence[TokenConstraint] = ()) -> Generation:
        """Constrained branches and a decoder that does not share the cache go through
        :meth:`_tree_branches` (a constrained re-ask by a ``shares_cache`` decoder is greedy)."""
        if self.prefix is None:
            raise RuntimeError("count_logits encodes the prefixes first")
        stop = StopCriteria(max_new_tokens, self.ner_model.stop_token_ids)
        if constraints or not decoder.shares_cache:
            return self._tree_branches(branches, get_decoder("greedy") if decoder.shares_cache else decoder, stop, stats, constraints)
        return self._one_sequence(branches, decoder, stop, stats)

    def _one_sequence(self, branches: list[Branch], decoder: Decoder, stop: StopCriteria, stats: ExtractionStats) -> Generation:
        """Branches of one sequence: all windows at once when they share one cache row."""
        prefix = self.prefix
        assert prefix is not None
        going = [prefix.continuation(b) for b in branches]
        owners = [b.window for b in branches]
        groups = [list(range(len(branches)))] if prefix.shared_row else \
            [[r for r in range(len(branches)) if owners[r] == w] for w in dict.fromkeys(owners)]

        def inputs(rows: list[int]) -> GroupInputs:
            # cached columns outside this row's prefix (other windows, branches, padding) are masked out
            ids, query_mask = left_pad([going[r].tokens for r in rows], self.ner_model.pad_token_id)
            cache = prefix.window_cache(owners[rows[0]])
            shared = torch.zeros(len(rows), cache.get_seq_length(), dtype=torch.long)
            shared[:, : prefix.mask.shape[1]] = prefix.mask[[owners[r] for r in rows]].cpu()
            for position, row in enumerate(rows):
                shared[position, list(going[row].columns)] = 1
            return GroupInputs(ids, torch.cat([shared, query_mask], dim=1), cache, [prefix.tokens[owners[r]] for r in rows])

        merged = decode_groups(self.ner_model, decoder, groups, len(branches), stop, inputs, [prefix.cache], stats)
        count_generation(stats, merged)
        return merged

    def _tree_branches(self, branches: list[Branch], decoder: Decoder, stop: StopCriteria, stats: ExtractionStats,
                       constraints: Sequence[TokenConstraint]) -> Generation:
        """One forward feeds every branch, those behind the same cached columns merged into a trie
        (a count's confirmation and its label's mention queries share the count and the label
        tokens); it yields each branch's first answer token, within ``constraints``. Then
        ``decoder`` decodes the unfinished branches, each over its window's cache row and its
        branch's trie path."""
        prefix = self.prefix
        assert prefix is not None
        model, device = self.ner_model.model, self.ner_model.device
        going = [prefix.continuation(b) for b in branches]
        owners = [b.window for b in branches]
        groups: dict[tuple[int, tuple[int, ...]], list[int]] = {}  # branches behind the same cached columns
        for r, (owner, continuation) in enumerate(zip(owners, going)):
            groups.setdefault((owner, continuation.columns), []).append(r)
        tries = [build_trie([going[r].tokens for r in members]) for members in groups.values()]
        # node rows: tries of windows in the same cache row, packed up to the largest trie
        by_cache_row: dict[int, list[int]] = {}
        for g, (owner, _) in enumerate(groups):
            by_cache_row.setdefault(prefix.row_of[owner], []).append(g)
        capacity = max(len(ids) for ids, _, _ in tries)
        node_rows = [(cache_row, [members[i] for i in packed]) for cache_row, members in by_cache_row.items()
                     for packed in pack_rows([len(tries[g][0]) for g in members], capacity)]
        width = prefix.cache.get_seq_length()  # a decoder that shares_cache may have extended it in place
        keys = list(groups)
        row_ids: list[list[int]] = []
        row_parents: list[list[int]] = []
        row_base: list[list[torch.Tensor]] = []  # per node: the cached columns it sees
        last: list[tuple[int, int]] = [(0, 0)] * len(branches)  # per branch: (node row, node)
        for row, (_, members) in enumerate(node_rows):
            ids, parents, ends = join_tries([tries[g] for g in members])
            row_ids.append(ids)
            row_parents.append(parents)
            row_base.append([])
            for g, group_ends in zip(members, ends):
                owner, columns = keys[g]
                row_base[row] += [prefix.visible(owner, columns, width)] * len(tries[g][0])
                for r, end in zip(groups[keys[g]], group_ends):
                    last[r] = (row, end)
        nodes = max(len(ids) for ids in row_ids)
        input_ids = torch.full((len(node_rows), nodes), self.ner_model.pad_token_id, dtype=torch.long)
        positions = torch.zeros((len(node_rows), nodes), dtype=torch.long)
        allowed = torch.zeros((len(node_rows), nodes, width + nodes), dtype=torch.bool)
        allowed[:, :, width:] = torch.eye(nodes, dtype=torch.bool)  # padding sees itself only
        for row, (ids, parents) in enumerate(zip(row_ids, row_parents)):
            n = len(ids)
            ancestors = ancestor_mask(parents)
            base = torch.stack(row_base[row])
            input_ids[row, :n] = torch.tensor(ids)
            positions[row, :n] = base.sum(1) + ancestors.sum(1) - 1  # after the columns it sees, at its depth
            allowed[row, :n, :width] = base
            allowed[row, :n, width:width + n] = ancestors
        cache = select_rows(prefix.cache, [cache_row for cache_row, _ in node_rows])
        bias = torch.zeros(allowed.shape, dtype=model.dtype).masked_fill_(~allowed, torch.finfo(model.dtype).min)[:, None]
        with torch.inference_mode():
            hidden = model.get_decoder()(input_ids=input_ids.to(device), attention_mask=bias.to(device), position_ids=positions.to(device),
                                         past_key_values=cache, use_cache=True).last_hidden_state
            first_lp = torch.log_softmax(model.get_output_embeddings()(hidden[[r for r, _ in last], [c for _, c in last]]).float(), dim=-1)
            everyone = range(len(branches))
            first = choose(first_lp.clone() if constraints else first_lp, constraints, everyone, [[] for _ in everyone]).tolist()
        result = Generation([[] for _ in branches], [[] for _ in branches], [0.0] * len(branches), [False] * len(branches),
                            forward_passes=1, accepted_per_pass=[len(branches)])
        unfinished = []
        for r, token in enumerate(first):
            result.scores[r] = float(first_lp[r, token])
            if token in stop.stop_token_ids:
                result.stopped[r] = True
                continue
            result.tokens[r], result.token_logprobs[r] = [token], [result.scores[r]]
            if stop.max_new_tokens > 1:
                unfinished.append(r)

        def inputs(rows: list[int]) -> GroupInputs:
            visible = torch.stack([allowed[last[r][0], last[r][1]] for r in rows]).long()  # its trie path
            mask = torch.cat([visible, torch.ones(len(rows), 1, dtype=torch.long)], dim=1)
            return GroupInputs(torch.tensor([[first[r]] for r in rows]), mask, select_rows(cache, [last[r][0] for r in rows]),
                               [prefix.tokens[owners[r]] for r in rows])

        after_first = continued(constraints, list(everyone), [[token] for token in first])
        rest = decode_groups(self.ner_model, decoder, batches(decoder, unfinished), len(branches),
                             StopCriteria(max(stop.max_new_tokens - 1, 1), stop.stop_token_ids), inputs, [prefix.cache, cache], stats, after_first)
        for r in unfinished:
            result.tokens[r] += rest.tokens[r]
            result.token_logprobs[r] += rest.token_logprobs[r]
            result.scores[r] += rest.scores[r]
            result.stopped[r] = rest.stopped[r]
        result.forward_passes += rest.forward_passes
        result.accepted_per_pass.extend(rest.accepted_per_pass)
        stats.kv_cache_bytes = max(stats.kv_cache_bytes, cache_bytes(prefix.cache) + cache_bytes(cache))
        count_generation(stats, result)
        return result
