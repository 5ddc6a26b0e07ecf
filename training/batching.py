"""Training rows grouped into batches of similar length under a padded-token budget."""

from __future__ import annotations

import random


def group_by_length(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices of rows (of the given lengths), shortest first, cut into batches whose padded size
    (longest row times rows) stays within ``batch_tokens`` (a longer row is a batch alone)."""
    batches: list[list[int]] = []
    current: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if current and lengths[index] * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def length_batches(lengths: list[int], batch_tokens: int, seed: int) -> list[list[int]]:
    """:func:`group_by_length`'s batches in an order that only ``seed`` decides."""
    batches = group_by_length(lengths, batch_tokens)
    random.Random(seed).shuffle(batches)
    return batches
