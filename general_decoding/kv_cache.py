"""Operations on Hugging Face ``Cache`` objects that decoders and the engine share."""

from __future__ import annotations

import torch
from transformers import Cache, DynamicCache


def select_rows(cache: Cache, rows: torch.Tensor | list[int]) -> DynamicCache:
    """A new cache holding rows ``rows`` of ``cache`` (a row may repeat: a branch of a shared prefix)."""
    index = torch.as_tensor(rows, dtype=torch.long)
    data = []
    for layer in cache.layers:
        index = index.to(layer.keys.device)
        data.append((layer.keys.index_select(0, index), layer.values.index_select(0, index)))
    return DynamicCache(ddp_cache_data=data)


def keep_rows(cache: Cache, rows: torch.Tensor) -> None:
    """Keep only the batch rows ``rows`` (in that order), in place: drop rows that finished."""
    for layer in cache.layers:
        index = rows.to(layer.keys.device)
        layer.keys = layer.keys.index_select(0, index)
        layer.values = layer.values.index_select(0, index)


def keep_first(cache: Cache, length: int) -> None:
    """Drop every cached column after the first ``length`` (roll back rejected tokens), in place."""
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, :length]
        layer.values = layer.values[:, :, :length]


def cache_bytes(cache: Cache) -> int:
    """Bytes held by the keys and values of ``cache``."""
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def keep_columns(cache: Cache, columns: list[int]) -> None:
    """Keep only the cached columns ``columns`` (in that order), in place: the accepted
    tokens of a verified branch that was not at the end of the sequence."""
    for layer in cache.layers:
        index = torch.as_tensor(columns, dtype=torch.long, device=layer.keys.device)
        layer.keys = layer.keys.index_select(2, index)
        layer.values = layer.values.index_select(2, index)
