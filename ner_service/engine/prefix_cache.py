"""The prefix cache: every window encoded once, with its count queries as branches of the same
sequence under a tree attention mask, in one forward.

Short windows share a row of the cache (packed first-fit); ``mask[w]`` marks the cached
columns of window w's prefix, and each (window, label) count branch keeps its tokens and
columns, so that a mention query, which begins with its label's count query, continues that
branch instead of feeding it again.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch
from transformers import Cache, DynamicCache

from general_decoding.kv_cache import select_rows
from general_decoding.tree_attention import collate_tree_rows, pack_branches, pack_rows
from ner_service.engine import prompts
from ner_service.engine.chunking import Window
from ner_service.engine.ner_model import NERModel
from ner_service.engine.queries import Branch, count_query_ids


@dataclass(frozen=True)
class CountBranch:
    """A count query's tokens and the cache columns that hold them."""

    tokens: list[int]
    columns: list[int]


@dataclass(frozen=True)
class Continuation:
    """What a branch feeds behind its window's prefix: ``tokens``, after the cached ``columns``
    of the count branch it continues (none when it continues none)."""

    tokens: list[int]
    columns: tuple[int, ...] = ()


@dataclass
class PrefixCache:
    """The windows' prefix tokens, their KV cache, which cache row holds each window
    (``row_of``), which columns are its prefix (``mask``) and its count branches."""

    tokens: list[list[int]]
    cache: Cache
    mask: torch.Tensor
    row_of: list[int]
    count_branches: dict[tuple[int, str], CountBranch] = field(default_factory=dict)

    @classmethod
    def encode(cls, ner_model: NERModel, windows: list[Window], labels: list[str], one_row: bool = False) -> tuple["PrefixCache", torch.Tensor]:
        """One forward over every window's prefix and its count queries (``one_row``: every window
        in one row, for a decoder that ``shares_cache``). Returns the cache and the logits of each
        (window, label) count's first answer token, window-major."""
        model, device = ner_model.model, ner_model.device
        tokens = [prompts.prefix_ids(ner_model.tokenizer, w.text) for w in windows]
        queries = [count_query_ids(ner_model, label) for label in labels]
        trees = [pack_branches(p, queries) for p in tokens]
        lengths = [len(t) for t in trees]
        rows = pack_rows(lengths, sum(lengths) if one_row else None)
        ids, positions, tree_mask, offsets = collate_tree_rows([[trees[w] for w in row] for row in rows], ner_model.pad_token_id, dtype=model.dtype)
        with torch.inference_mode():
            out = model.get_decoder()(input_ids=ids.to(device), attention_mask=tree_mask.to(device), position_ids=positions.to(device),
                                      past_key_values=DynamicCache(), use_cache=True)
            start = [0] * len(windows)
            row_of = [0] * len(windows)
            for row, (members, row_offsets) in enumerate(zip(rows, offsets)):
                for w, offset in zip(members, row_offsets):
                    row_of[w], start[w] = row, offset
            ends = list(itertools.accumulate(len(q) for q in queries))
            logits = model.get_output_embeddings()(out.last_hidden_state[
                [row_of[w] for w in range(len(windows)) for _ in queries],
                [start[w] + len(p) + end - 1 for w, p in enumerate(tokens) for end in ends]])
        mask = torch.zeros(len(windows), ids.shape[1], dtype=torch.long, device=device)
        prefix_cache = cls(tokens, out.past_key_values, mask, row_of)
        for w, p in enumerate(tokens):
            mask[w, start[w]:start[w] + len(p)] = 1
            for label, query, end in zip(labels, queries, ends):
                first = start[w] + len(p) + end - len(query)
                prefix_cache.count_branches[w, label] = CountBranch(query, list(range(first, first + len(query))))
        return prefix_cache, logits

    @property
    def shared_row(self) -> bool:
        """Whether the cache holds every window in one row (branches then extend it in place)."""
        return self.cache.layers[0].keys.shape[0] == 1

    def window_cache(self, window: int) -> Cache:
        """The cache holding window ``window``'s prefix once: the shared cache itself when it
        holds a single row, else a copy of the window's row."""
        return self.cache if self.shared_row else select_rows(self.cache, [self.row_of[window]])

    def continuation(self, branch: Branch) -> Continuation:
        """What ``branch`` feeds: a branch that starts with its label's cached count query (and
        goes on after it) continues that count branch."""
        cached = self.count_branches.get((branch.window, branch.label))
        if cached is not None and branch.tokens[: len(cached.tokens)] == cached.tokens and len(branch.tokens) > len(cached.tokens):
            return Continuation(branch.tokens[len(cached.tokens):], tuple(cached.columns))
        return Continuation(branch.tokens)

    def visible(self, window: int, columns: tuple[int, ...], width: int) -> torch.Tensor:
        """``[width]`` bool: the cached columns a branch of ``window`` after ``columns`` sees."""
        seen = torch.zeros(width, dtype=torch.bool, device=self.mask.device)
        seen[: self.mask.shape[1]] = self.mask[window].bool()
        seen[list(columns)] = True
        return seen
