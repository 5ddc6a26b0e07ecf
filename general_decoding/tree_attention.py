"""Token trees in a single sequence: a shared prefix and its branches under a tree mask.

A tree is given as ``(input_ids, parents)``: each token sees its ancestors and itself, and its
position id is its depth, as if its branch were the only continuation of the prefix. Branches
that begin alike are merged into a trie (:func:`build_trie`), so a shared beginning is computed
once. Training packs all queries of a text this way (the prefix and the queries' common words
are paid for once), and the engine runs the branches of many texts in one forward.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

#: A token tree: its token ids and each token's parent (-1 for the first; parents before children).
ParentTree = tuple[list[int], list[int]]


class Trie(NamedTuple):
    """Token sequences merged where they begin alike (:func:`build_trie`): the nodes' token ids,
    each node's parent (-1 for a first token, parents before children) and the node each
    sequence ends at."""

    ids: list[int]
    parents: list[int]
    ends: list[int]

    def path(self, number: int) -> list[int]:
        """The nodes of sequence ``number``, first token first."""
        nodes, node = [], self.ends[number]
        while node >= 0:
            nodes.append(node)
            node = self.parents[node]
        return nodes[::-1]


class JoinedTries(NamedTuple):
    """Tries laid one after another in one node list (:func:`join_tries`): the node ids, their
    parents (renumbered; -1 still marks a first token) and each trie's sequence ends."""

    ids: list[int]
    parents: list[int]
    ends: list[list[int]]


def chain_with_trie(prefix: list[int], trie: Trie) -> ParentTree:
    """One tree ``(input_ids, parents)``: ``prefix`` as a chain, then a trie from :func:`build_trie`
    whose first tokens follow the prefix's last token."""
    offset = len(prefix)
    parents = list(range(-1, offset - 1)) + [p + offset if p >= 0 else offset - 1 for p in trie.parents]
    return list(prefix) + list(trie.ids), parents


def collate_forest_rows(
    rows: list[list[ParentTree]], pad_token_id: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[list[int]]]:
    """Lay each row's trees (``(input_ids, parents)``, parents before children) one after
    another, right-pad the rows, and build the additive 4D attention mask ``[batch, 1, L, L]``
    (0 where allowed, the dtype's minimum elsewhere): a token sees its ancestors and itself, and
    its position is its depth. A tree sees nothing of the other trees in its row; padding
    positions attend to themselves only, so no row is empty. Also returns each tree's first column."""
    length = max(sum(len(ids) for ids, _ in trees) for trees in rows)
    batch = len(rows)
    input_ids = torch.full((batch, length), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((batch, length), dtype=torch.long)
    allowed = torch.eye(length, dtype=torch.bool).repeat(batch, 1, 1)
    offsets: list[list[int]] = []
    for row, trees in enumerate(rows):
        start = 0
        offsets.append([])
        for ids, parents in trees:
            end = start + len(ids)
            ancestors = ancestor_mask(parents)
            input_ids[row, start:end] = torch.tensor(ids)
            position_ids[row, start:end] = ancestors.sum(1) - 1
            allowed[row, start:end, start:end] = ancestors
            offsets[-1].append(start)
            start = end
    mask = torch.zeros((batch, 1, length, length), dtype=dtype)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    return input_ids, position_ids, mask, offsets


def pack_rows(lengths: list[int], capacity: int | None = None) -> list[list[int]]:
    """Group items (by index) into rows no longer than ``capacity`` (default: the longest item),
    first-fit decreasing: short sequences share a row instead of being padded to the longest."""
    capacity = max(lengths, default=0) if capacity is None else max(capacity, *lengths, 0)
    rows: list[list[int]] = []
    free: list[int] = []
    for item in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, room in enumerate(free) if room >= lengths[item]), None)
        if row is None:
            rows.append([])
            free.append(capacity)
            row = len(rows) - 1
        rows[row].append(item)
        free[row] -= lengths[item]
    return rows


def collate_parent_trees(
    rows: list[ParentTree], pad_token_id: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad general trees given as ``(input_ids, parents)``, one per row, into ``input_ids``,
    ``position_ids`` and an additive 4D attention mask ``[batch, 1, L, L]`` (0 where allowed, the
    dtype's minimum elsewhere): a token sees its ancestors and itself, and its position is its
    depth; padding positions attend to themselves only, so no row is empty."""
    ids, positions, mask, _ = collate_forest_rows([[tree] for tree in rows], pad_token_id, dtype)
    return ids, positions, mask


def build_trie(sequences: list[list[int]]) -> Trie:
    """Merge token sequences that share a beginning into one :class:`Trie`. Feeding its nodes
    under :func:`ancestor_mask` computes every sequence at once, shared tokens once."""
    ids: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}
    ends = []
    for sequence in sequences:
        if not sequence:
            raise ValueError("a trie sequence needs at least one token")
        node = -1
        for token in sequence:
            if (node, token) not in index:
                index[node, token] = len(ids)
                ids.append(token)
                parents.append(node)
            node = index[node, token]
        ends.append(node)
    return Trie(ids, parents, ends)


def join_tries(tries: list[Trie]) -> JoinedTries:
    """Lay tries from :func:`build_trie` one after another in one node list."""
    ids: list[int] = []
    parents: list[int] = []
    ends: list[list[int]] = []
    for trie_ids, trie_parents, trie_ends in tries:
        offset = len(ids)
        ids += trie_ids
        parents += [p + offset if p >= 0 else -1 for p in trie_parents]
        ends.append([end + offset for end in trie_ends])
    return JoinedTries(ids, parents, ends)


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """Boolean ``[N, N]``: node i may attend node j when j is i or one of its ancestors
    (parents come before their children)."""
    allowed = torch.eye(len(parents), dtype=torch.bool)
    for node, parent in enumerate(parents):
        if parent >= 0:
            allowed[node] |= allowed[parent]
    return allowed
