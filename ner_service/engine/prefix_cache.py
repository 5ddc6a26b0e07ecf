"""The prefix cache: every window encoded once, with the first queries (the count queries and
any speculated continuation of them) as a trie of branches under a tree attention mask, in one
forward.

Short windows share a row of the cache (packed first-fit); ``mask[w]`` marks the cached
columns of window w's prefix, and every cached branch path keeps its column, so that a later
branch continues the longest cached path it begins with instead of feeding it again. The
next-token log-probabilities after each encoded branch are kept: a branch encoded whole needs no
forward to get its first answer token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import Cache, DynamicCache

from general_decoding.kv_cache import select_rows
from general_decoding.row_vocabulary import RowVocabulary, SparseLogprobs, hidden_logprobs
from general_decoding.tree_attention import build_trie, chain_with_trie, collate_forest_rows, pack_rows
from ner_service.engine import prompts
from ner_service.engine.chunking import Window
from ner_service.engine.ner_model import NERModel
from ner_service.engine.queries import Branch


@dataclass(frozen=True)
class Continuation:
    """What a branch feeds behind its window's prefix: ``tokens``, after the cached ``columns``
    of the branch path it continues (none when it continues none)."""

    tokens: list[int]
    columns: tuple[int, ...] = ()


@dataclass
class PrefixCache:
    """The windows' prefix tokens, their KV cache, which cache row holds each window
    (``row_of``), which columns are its prefix (``mask``, on the CPU), the column of every cached branch
    path (``paths[w]``), and the next-token log-probabilities after each encoded branch
    (``logprobs``, a row each: ``logprob_rows[w][path]``)."""

    tokens: list[list[int]]
    cache: Cache
    mask: torch.Tensor
    row_of: list[int]
    logprobs: SparseLogprobs
    paths: list[dict[tuple[int, ...], int]] = field(default_factory=list)
    logprob_rows: list[dict[tuple[int, ...], int]] = field(default_factory=list)

    @classmethod
    def encode(cls, ner_model: NERModel, windows: list[Window], branches: list[list[int]], one_row: bool = False,
               vocabulary: RowVocabulary | None = None) -> "PrefixCache":
        """One forward over every window's prefix with ``branches`` behind it, merged into a trie
        (``one_row``: every window in one row, for a decoder that ``shares_cache``). With
        ``vocabulary`` (a row per window and branch, window by window), the log-probabilities kept
        are over each row's tokens only (``-inf`` elsewhere)."""
        model, device = ner_model.model, ner_model.device
        tokens = [prompts.prefix_ids(ner_model.tokenizer, w.text) for w in windows]
        trie = build_trie(branches)
        trees = [chain_with_trie(p, trie) for p in tokens]
        lengths = [len(ids) for ids, _ in trees]
        rows = pack_rows(lengths, sum(lengths) if one_row else None)
        ids, positions, tree_mask, offsets = collate_forest_rows([[trees[w] for w in row] for row in rows], ner_model.pad_token_id, dtype=model.dtype)
        start = [0] * len(windows)
        row_of = [0] * len(windows)
        for row, (members, row_offsets) in enumerate(zip(rows, offsets)):
            for w, offset in zip(members, row_offsets):
                row_of[w], start[w] = row, offset
        ends = trie.ends
        node_paths: list[tuple[int, ...]] = []
        for token, parent in zip(trie.ids, trie.parents):
            node_paths.append((node_paths[parent] if parent >= 0 else ()) + (token,))
        with torch.inference_mode():
            out = model.get_decoder()(input_ids=ids.to(device), attention_mask=tree_mask.to(device), position_ids=positions.to(device),
                                      cache=DynamicCache(), use_cache=True)
            hidden = out.last_hidden_state[
                [row_of[w] for w in range(len(windows)) for _ in ends],
                [start[w] + len(p) + end for w, p in enumerate(tokens) for end in ends]]
            logprobs = hidden_logprobs(model, hidden, vocabulary)
        mask = torch.zeros(len(windows), ids.shape[1], dtype=torch.long)  # host-side bookkeeping, like the masks built from it
        prefix_cache = cls(tokens, out.cache, mask, row_of, logprobs)
        for w, p in enumerate(tokens):
            mask[w, start[w]:start[w] + len(p)] = 1
            first_node = start[w] + len(p)
            prefix_cache.paths.append({path: first_node + node for node, path in enumerate(node_paths)})
            prefix_cache.logprob_rows.append({node_paths[end]: w * len(ends) + b for b, end in enumerate(ends)})
        return prefix_cache

    @property
    def shared_row(self) -> bool:
        """Whether the cache holds every window in one row (branches then extend it in place)."""
        return self.cache.layers[0].keys.shape[0] == 1

    def window_cache(self, window_index: int) -> Cache:
        """The cache holding window ``window_index``'s prefix once: the shared cache itself when it
        holds a single row, else a copy of the window's row."""
        return self.cache if self.shared_row else select_rows(self.cache, [self.row_of[window_index]])

    def continuation(self, branch: Branch) -> Continuation:
        """What ``branch`` feeds: the rest after the longest cached path it begins with (at least
        one token is fed, whose logits are the branch's)."""
        paths = self.paths[branch.window_index]
        cached = 0
        while cached < len(branch.tokens) - 1 and tuple(branch.tokens[: cached + 1]) in paths:
            cached += 1
        columns = tuple(paths[tuple(branch.tokens[:i])] for i in range(1, cached + 1))
        return Continuation(branch.tokens[cached:], columns)

    def cached_logprobs(self, branch: Branch) -> SparseLogprobs | None:
        """The next-token log-probabilities after ``branch`` (one row) when it was encoded whole, else None."""
        row = self.logprob_rows[branch.window_index].get(tuple(branch.tokens))
        return None if row is None else self.logprobs[row:row + 1]

    def encoded_logprobs(self, branches: list[list[int]]) -> SparseLogprobs:
        """``[windows, branches]`` rows: the next-token log-probabilities after each of
        ``branches`` (all encoded whole) behind each window's prefix."""
        return self.logprobs[torch.tensor([[rows[tuple(b)] for b in branches] for rows in self.logprob_rows])]

    def path_columns(self, window_index: int, tokens: list[int]) -> tuple[int, ...]:
        """The cached columns of a branch path encoded whole."""
        paths = self.paths[window_index]
        return tuple(paths[tuple(tokens[:i])] for i in range(1, len(tokens) + 1))

    def visible(self, window_index: int, columns: tuple[int, ...], width: int) -> torch.Tensor:
        """``[width]`` bool: the cached columns a branch of window ``window_index`` after ``columns`` sees."""
        seen = torch.zeros(width, dtype=torch.bool)
        seen[: self.mask.shape[1]] = self.mask[window_index].bool()
        seen[list(columns)] = True
        return seen
