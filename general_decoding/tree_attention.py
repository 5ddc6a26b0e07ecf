"""Several branches over one shared prefix, packed in a single sequence.

Each branch token sees the prefix and the earlier tokens of its own branch; its position
id continues from the prefix, as if the branch were the only continuation. Training packs
all queries of a text this way (the prefix is paid for once), and the engine can run the
branches of one text in one forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PREFIX = -1


@dataclass(frozen=True)
class PackedTree:
    """One packed sequence: token ids, position ids and, per token, its branch (-1: prefix)."""

    input_ids: list[int]
    position_ids: list[int]
    branch_of: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)


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
    """Right-pad trees into ``input_ids``, ``position_ids`` and an additive 4D attention mask.

    The mask has shape ``[batch, 1, L, L]`` with 0 where attention is allowed and the dtype's
    minimum elsewhere; padding positions attend to themselves only, so no row is empty.
    """
    length = max(len(t) for t in trees)
    batch = len(trees)
    input_ids = torch.full((batch, length), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((batch, length), dtype=torch.long)
    allowed = torch.eye(length, dtype=torch.bool).repeat(batch, 1, 1)
    for row, tree in enumerate(trees):
        n = len(tree)
        input_ids[row, :n] = torch.tensor(tree.input_ids)
        position_ids[row, :n] = torch.tensor(tree.position_ids)
        allowed[row, :n, :n] = tree_mask(torch.tensor(tree.branch_of))
    mask = torch.zeros((batch, 1, length, length), dtype=dtype)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    return input_ids, position_ids, mask


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
    """Like :func:`collate_trees` for general trees given as ``(input_ids, parents)``: a token
    sees its ancestors and itself, and its position is its depth."""
    length = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows), length), dtype=torch.long)
    allowed = torch.eye(length, dtype=torch.bool).repeat(len(rows), 1, 1)
    for row, (ids, parents) in enumerate(rows):
        depth = [0] * len(ids)
        for i, parent in enumerate(parents):
            if parent >= 0:
                allowed[row, i] |= allowed[row, parent]
                depth[i] = depth[parent] + 1
        input_ids[row, : len(ids)] = torch.tensor(ids)
        position_ids[row, : len(ids)] = torch.tensor(depth)
    mask = torch.zeros((len(rows), 1, length, length), dtype=dtype)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    return input_ids, position_ids, mask
