"""Sequence layout of a diffusion batch: aligned answers after left-padded prompts, full attention."""

from __future__ import annotations

import torch


def bidirectional_mask(key_mask: torch.Tensor, dtype: torch.dtype, queries: int | None = None) -> torch.Tensor:
    """Additive ``[batch, 1, queries, keys]`` mask: every query sees every non-padding key.

    ``key_mask`` is the 0/1 ``[batch, keys]`` padding mask; ``queries`` defaults to all keys
    (the last ``queries`` keys are the queries when a cache holds the others). Passing a 4D
    mask makes a Hugging Face decoder non-causal: transformers uses a 4D mask as given.
    """
    queries = key_mask.shape[1] if queries is None else queries
    blocked = (key_mask == 0)[:, None, None, :].expand(-1, 1, queries, -1)
    return torch.zeros(blocked.shape, dtype=dtype).masked_fill(blocked, torch.finfo(dtype).min)


def block_bounds(answer_start: int, answer_length: int, block_size: int) -> list[tuple[int, int]]:
    """``[start, end)`` columns of each block of the answer; the last block may be shorter."""
    if block_size < 1 or answer_length < 1:
        raise ValueError(f"block_size and answer_length must be >= 1, got {block_size} and {answer_length}")
    end = answer_start + answer_length
    return [(start, min(start + block_size, end)) for start in range(answer_start, end, block_size)]


def causal_prompt_mask(key_mask: torch.Tensor, dtype: torch.dtype, answer_start: int, query_columns: list[int] | None = None,
                       key_columns: list[int] | None = None) -> torch.Tensor:
    """Additive ``[batch, 1, queries, keys]`` mask: answer columns (from ``answer_start`` on) see
    every non-padding key, prompt columns only the prompt up to themselves, as in the causal LM
    a model was adapted from, so the prompt never depends on the answer.

    ``key_mask`` is the 0/1 padding mask of the keys, whose absolute columns are
    ``key_columns`` (default: all, in order); ``query_columns`` default to the key columns.
    """
    keys = torch.arange(key_mask.shape[1]) if key_columns is None else torch.tensor(key_columns)
    queries = keys if query_columns is None else torch.tensor(query_columns)
    future = (queries[:, None] < answer_start) & (keys[None, :] > queries[:, None])
    blocked = (key_mask == 0)[:, None, None, :] | future[None, None]
    return torch.zeros(blocked.shape, dtype=dtype).masked_fill(blocked, torch.finfo(dtype).min)
