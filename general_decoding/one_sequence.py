"""Parallel branches within one sequence ("Accelerate Parallelizable Reasoning via Parallel
Decoding within One Sequence"): every row of the batch is a branch of a single sequence.

All branches are decoded greedily, one token per branch per forward, as columns of one
sequence of batch size 1 under a tree attention mask: a branch's token sees the shared
columns its row's ``attention_mask`` allows (the shared prefix) and the earlier tokens of
its own branch, with position ids continuing its own branch. The shared prefix's KV cache is
held once and never copied per branch; the cache grows by exactly the tokens fed (the
branches' queries, merged into a trie where branches that see the same columns begin alike,
and their emitted tokens), and a finished branch stops growing it.

Contract (``shares_cache``): ``past_key_values`` has batch size 1 and is shared by every
row; ``attention_mask[i]`` covers the shared cached columns (which of them row ``i`` may
see) and row ``i`` of ``input_ids`` (left padding marked 0). The output equals greedy
decoding of each row on its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers.cache_utils import Cache, DynamicCache

from general_decoding.base import DecodeInputs, Decoder, Generation
from general_decoding.registry import register_decoder
from general_decoding.row_vocabulary import RowVocabulary, output_softcap
from general_decoding.tree_attention import ancestor_mask, build_trie, join_tries

if TYPE_CHECKING:  # for types only: the engine may run its own model class (no import of transformers' model classes)
    from transformers import PreTrainedModel


class _SharedSequence:
    """The one sequence: its cache and, per branch, which cached columns it may attend to."""

    def __init__(self, model: PreTrainedModel, cache: Cache, visible: torch.Tensor, vocabulary: RowVocabulary | None) -> None:
        self.model = model
        self.cache = cache
        self.visible = visible  # [branches, cached columns] bool
        self.vocabulary = vocabulary  # the tokens each branch may take (None: the whole output layer)
        self.dtype = next(model.parameters()).dtype

    def feed(self, ids: torch.Tensor, positions: torch.Tensor, sees_cached: torch.Tensor, sees_new: torch.Tensor,
             branch_sees_new: torch.Tensor, keep: torch.Tensor, branches: list[int]) -> torch.Tensor:
        """Append tokens ``ids``: token i attends the cached columns ``sees_cached[i]`` and the
        new tokens ``sees_new[i]``; afterwards branch b sees the new tokens ``branch_sees_new[b]``.
        Returns the float32 next-token log-probabilities at new columns ``keep``, the next
        tokens of ``branches`` (one each, over its own vocabulary's tokens when there is one)."""
        allowed = torch.cat([sees_cached, sees_new], dim=1)
        bias = torch.zeros(1, 1, *allowed.shape, dtype=self.dtype, device=ids.device)
        bias.masked_fill_(~allowed[None, None], torch.finfo(self.dtype).min)
        forward = dict(input_ids=ids[None], attention_mask=bias, position_ids=positions[None], cache=self.cache, use_cache=True)
        self.visible = torch.cat([self.visible, branch_sees_new], dim=1)
        if self.vocabulary is None:
            return torch.log_softmax(self.model(**forward, logits_to_keep=keep).logits[0].float(), dim=-1)
        hidden = self.model.get_decoder()(**forward).last_hidden_state[0, keep]
        rows = self.vocabulary.rows(branches)
        return rows.logprobs(hidden[:, None], self.model.get_output_embeddings(), output_softcap(self.model))[:, 0]


@register_decoder("one_sequence")
class OneSequenceDecoder(Decoder):
    """Greedy decoding of every row as a branch of one sequence over a shared KV cache."""

    shares_cache = True
    supports_vocabulary = True

    def _generate(self, model: PreTrainedModel, inputs: DecodeInputs) -> Generation:
        input_ids, attention_mask, stop = inputs.input_ids, inputs.attention_mask, inputs.stop
        device = input_ids.device
        rows = input_ids.shape[0]
        cache = inputs.past_key_values if inputs.past_key_values is not None else DynamicCache()
        past = cache.get_seq_length()
        if past and cache.layers[0].keys.shape[0] != 1:
            raise ValueError(f"decoder {self.name!r} shares one cache of batch size 1; got {cache.layers[0].keys.shape[0]} rows")
        visible = attention_mask[:, :past].bool()
        query = attention_mask[:, past:].bool()
        lengths = query.sum(1)
        if bool((lengths == 0).any()):
            raise ValueError("every row needs at least one unpadded input token")
        sequence = _SharedSequence(model, cache, visible, inputs.vocabulary)
        # first forward: every branch's input tokens, branches that see the same cached columns
        # merged into a trie (a beginning they share is fed once)
        groups: dict[tuple[bool, ...], list[int]] = {}
        for row in range(rows):
            groups.setdefault(tuple(visible[row].tolist()), []).append(row)
        tries = [build_trie([input_ids[row][query[row]].tolist() for row in members]) for members in groups.values()]
        node_ids, node_parents, group_ends = join_tries(tries)
        ends = [0] * rows
        for members, member_ends in zip(groups.values(), group_ends):
            for row, end in zip(members, member_ends):
                ends[row] = end
        ancestors = ancestor_mask(node_parents).to(device)
        # each node sees the cached columns of its group (those of the group's first row)
        first_row = torch.tensor([members[0] for members, trie in zip(groups.values(), tries) for _ in trie.ids], device=device)
        starts = visible.sum(1)
        positions = starts[first_row] + ancestors.sum(1) - 1
        ends_t = torch.tensor(ends, device=device)
        step_lp = sequence.feed(torch.tensor(node_ids, device=device), positions, visible[first_row], ancestors, ancestors[ends_t], ends_t,
                                list(range(rows)))
        next_position = positions[ends_t] + 1

        tokens: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        scores = [0.0] * rows
        stopped = [False] * rows
        live = list(range(rows))
        forwards, accepted = 1, []
        while True:
            best = step_lp.argmax(-1).tolist()
            still = []
            for index, row in enumerate(live):
                token, logprob = best[index], float(step_lp[index, best[index]])
                scores[row] += logprob
                if token in stop.stop_token_ids:
                    stopped[row] = True
                    continue
                tokens[row].append(token)
                logprobs[row].append(logprob)
                if len(tokens[row]) < stop.max_new_tokens:
                    still.append(row)
            accepted.append(len(live))
            live = still
            if not live:
                break
            owners = torch.tensor(live, device=device)
            ids = torch.tensor([tokens[row][-1] for row in live], device=device)
            alone = torch.eye(len(live), dtype=torch.bool, device=device)  # one new token per branch
            branch_sees_new = torch.arange(rows, device=device)[:, None] == owners[None, :]
            step_lp = sequence.feed(ids, next_position[owners], sequence.visible[owners], alone, branch_sees_new,
                                    torch.arange(len(live), device=device), live)
            next_position[owners] += 1
            forwards += 1
        return Generation(tokens, logprobs, scores, stopped, forwards, accepted)
