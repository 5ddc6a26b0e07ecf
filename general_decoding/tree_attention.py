"""Several branches over one shared prefix, packed in a single sequence.

Each branch token sees the prefix and the earlier tokens of its own branch; its position
id continues from the prefix, as if the branch were the only continuation. Training packs
all queries of a text this way (the prefix is paid for once), and the engine can run the
branches of one text in one forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

PREFIX = -1


class Trie(NamedTuple):
    """Token sequences merged where they begin alike (:func:`build_trie`): the nodes' token ids,
    each node's parent (-1 for a first token, parents before children) and the node each
    sequence ends at."""

    ids: list[int]
    parents: list[int]
    ends: list[int]


class JoinedTries(NamedTuple):
    """Tries laid one after another in one node list (:func:`join_tries`): the node ids, their
    parents (renumbered; -1 still marks a first token) and each trie's sequence ends."""

    ids: list[int]
    parents: list[int]
    ends: list[list[int]]


@dataclass(frozen=True)
class PackedTree:
    """One packed sequence: token ids, position ids and, per token, its branch (-1: prefix)."""

    input_ids: list[int]
    position_ids: list[int]
    branch_of: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)

    def parent_tree(self) -> tuple[list[int], list[int]]:
        """The same tree as ``(input_ids, parents)``, the form :func:`collate_parent_trees` takes."""
        return self.input_ids, parents_of(self)


def pack_branches(prefix: list[int], branches: list[list[int]]) -> PackedTree:
    """Lay ``branches`` one after another behind ``prefix``."""
    ids, positions, owner = list(prefix), list(range(len(prefix))), [PREFIX] * len(prefix)
    for number, branch in enumerate(branches):
        ids.extend(branch)
        positions.extend(range(len(prefix), len(prefix) + len(branch)))
        owner.extend([number] * len(branch))
    return PackedTree(ids, positions, owner)


def tree_mask(branch_of: torch.Tensor) -> torch.Tensor:
    """Boolean ``[L, L]`` mask: query i may attend key j (j <= i, same branch or prefix)."""
    length = branch_of.shape[0]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    same = (branch_of[None, :] == PREFIX) | (branch_of[None, :] == branch_of[:, None])
    return causal & same


def collate_trees(
    trees: list[PackedTree], pad_token_id: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad trees, one per row, into ``input_ids``, ``position_ids`` and an additive 4D
    attention mask ``[batch, 1, L, L]``: 0 where attention is allowed and the dtype's minimum
    elsewhere; padding positions attend to themselves only, so no row is empty."""
    length = max(len(t) for t in trees)
    input_ids = torch.full((len(trees), length), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((len(trees), length), dtype=torch.long)
    allowed = torch.eye(length, dtype=torch.bool).repeat(len(trees), 1, 1)
    for row, tree in enumerate(trees):
        input_ids[row, : len(tree)] = torch.tensor(tree.input_ids)
        position_ids[row, : len(tree)] = torch.tensor(tree.position_ids)
        allowed[row, : len(tree), : len(tree)] = tree_mask(torch.tensor(tree.branch_of))
    mask = torch.zeros((len(trees), 1, length, length), dtype=dtype)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    return input_ids, position_ids, mask


def chain_with_trie(prefix: list[int], trie: Trie) -> tuple[list[int], list[int]]:
    """One tree ``(input_ids, parents)``: ``prefix`` as a chain, then a trie from :func:`build_trie`
    whose first tokens follow the prefix's last token."""
    offset = len(prefix)
    parents = list(range(-1, offset - 1)) + [p + offset if p >= 0 else offset - 1 for p in trie.parents]
    return list(prefix) + list(trie.ids), parents


def collate_forest_rows(
    rows: list[list[tuple[list[int], list[int]]]], pad_token_id: int, dtype: torch.dtype = torch.float32
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


def parents_of(tree: PackedTree) -> list[int]:
    """Each token's parent (the token it follows; -1 for the first) in a packed tree."""
    parents, previous_in_branch = [], {PREFIX: -1}
    last_prefix = -1
    for index, branch in enumerate(tree.branch_of):
        if branch == PREFIX:
            parents.append(index - 1)
            last_prefix = index
        else:
            parents.append(previous_in_branch.get(branch, last_prefix))
        previous_in_branch[branch] = index
    return parents


def collate_parent_trees(
    rows: list[tuple[list[int], list[int]]], pad_token_id: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Like :func:`collate_trees` for general trees given as ``(input_ids, parents)``, one per
    row: a token sees its ancestors and itself, and its position is its depth."""
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
