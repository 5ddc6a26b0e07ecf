"""One forward of branch tries behind cached prefixes.

Each answer row feeds token sequences behind its window's prefix and the cached path it
continues (a query's rest, or an answer's known tokens and drafts to verify). The rows behind
the same cached columns are merged into one trie (what they begin alike is fed once); tries of
windows in the same cache row are packed into node rows up to the largest trie. Every node sees
its window's prefix, its cached path and its trie ancestors, at the position of its depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from general_decoding.kv_cache import cache_bytes, select_rows, select_visible
from general_decoding.row_vocabulary import RowVocabulary, SparseLogprobs, hidden_logprobs
from general_decoding.tree_attention import ancestor_mask, build_trie, join_tries, pack_rows
from ner_service.engine.group_decoding import GroupInputs
from ner_service.engine.ner_model import NERModel
from ner_service.engine.prefix_cache import PrefixCache


@dataclass(frozen=True)
class BranchRow:
    """What one answer row feeds: ``sequences`` behind window ``window_index``'s prefix and the cached
    ``columns``; the first sequence ends at the row's answer node (whose logits give its next
    token), the others extend it (drafts to verify)."""

    window_index: int
    columns: tuple[int, ...]
    sequences: list[list[int]]


@dataclass(frozen=True)
class Node:
    """A fed token: its node row and its index there."""

    row: int
    index: int


#: The most cache columns (rows times width) one forward may copy for its node rows before the
#: packing that copies fewest is taken over the one that feeds fewest node slots: about 600 MB of
#: Gemma 3 270M's float32 cache. Many labels of many windows cross it (each label's tries in a
#: row of their own would copy the window's cache once a label).
MAX_COPIED_COLUMNS = 16_384


def _node_rows(by_cache_row: dict[int, list[int]], sizes: list[int], width: int) -> list[tuple[int, list[int]]]:
    """Tries (by index, of ``sizes`` nodes) packed into node rows, each row behind one cache row
    of ``width`` columns, which it copies: up to the largest trie, or each cache row's tries in
    one row, whichever feeds fewer node slots (rows times the longest row; a lone text's tries
    then share one row), unless it copies more than :data:`MAX_COPIED_COLUMNS`; then whichever
    copies fewer."""
    packings = []
    for capacity in (max(sizes), max(sum(sizes[g] for g in members) for members in by_cache_row.values())):
        rows = [(cache_row, [members[i] for i in packed]) for cache_row, members in by_cache_row.items()
                for packed in pack_rows([sizes[g] for g in members], capacity)]
        longest = max(sum(sizes[g] for g in members) for _, members in rows)
        packings.append((rows, len(rows) * longest, len(rows) * (width + longest)))
    rows, _, columns = min(packings, key=lambda packing: packing[1])
    return rows if columns <= MAX_COPIED_COLUMNS else min(packings, key=lambda packing: packing[2])[0]


class BranchForward:
    """Feeds :class:`BranchRow` s in one forward over ``prefix``; gives each row's answer node,
    the nodes under it, log-probabilities at nodes and the inputs to decode on from a node."""

    def __init__(self, ner_model: NERModel, prefix: PrefixCache, rows: list[BranchRow]) -> None:
        self.ner_model, self.prefix, self.rows = ner_model, prefix, rows
        groups: dict[tuple[int, tuple[int, ...]], list[int]] = {}  # rows behind the same cached columns
        for r, row in enumerate(rows):
            groups.setdefault((row.window_index, row.columns), []).append(r)
        tries = [build_trie([s for r in members for s in rows[r].sequences]) for members in groups.values()]
        by_cache_row: dict[int, list[int]] = {}
        for g, (window_index, _) in enumerate(groups):
            by_cache_row.setdefault(prefix.row_of[window_index], []).append(g)
        width = prefix.cache.get_seq_length()  # a decoder that shares_cache may have extended it in place
        node_rows = _node_rows(by_cache_row, [len(trie.ids) for trie in tries], width)
        keys = list(groups)
        self.ends: list[list[Node]] = [[] for _ in rows]  # per row: the node each of its sequences ends at
        row_ids: list[list[int]] = []
        row_parents: list[list[int]] = []
        row_base: list[list[torch.Tensor]] = []  # per node: the cached columns it sees
        for node_row, (_, members) in enumerate(node_rows):
            joined = join_tries([tries[g] for g in members])
            row_ids.append(joined.ids)
            row_parents.append(joined.parents)
            row_base.append([])
            for g, group_ends in zip(members, joined.ends):
                window_index, columns = keys[g]
                row_base[node_row] += [prefix.visible(window_index, columns, width)] * len(tries[g].ids)
                sequence_ends = iter(group_ends)
                for r in groups[keys[g]]:
                    self.ends[r] = [Node(node_row, next(sequence_ends)) for _ in rows[r].sequences]
        self.parents = row_parents
        self.children: list[dict[tuple[int, int], int]] = [{(p, t): n for n, (t, p) in enumerate(zip(ids, parents))}
                                                            for ids, parents in zip(row_ids, row_parents)]
        nodes = max(len(ids) for ids in row_ids)
        input_ids = torch.full((len(node_rows), nodes), ner_model.pad_token_id, dtype=torch.long)
        positions = torch.zeros((len(node_rows), nodes), dtype=torch.long)
        self.allowed = torch.zeros((len(node_rows), nodes, width + nodes), dtype=torch.bool)
        self.allowed[:, :, width:] = torch.eye(nodes, dtype=torch.bool)  # padding sees itself only
        for node_row, (ids, parents) in enumerate(zip(row_ids, row_parents)):
            n = len(ids)
            ancestors = ancestor_mask(parents)
            base = torch.stack(row_base[node_row])
            input_ids[node_row, :n] = torch.tensor(ids)
            positions[node_row, :n] = base.sum(1) + ancestors.sum(1) - 1  # after the columns it sees, at its depth
            self.allowed[node_row, :n, :width] = base
            self.allowed[node_row, :n, width:width + n] = ancestors
        model, device = ner_model.model, ner_model.device
        self.cache = select_rows(prefix.cache, [cache_row for cache_row, _ in node_rows])
        bias = torch.zeros(self.allowed.shape, dtype=model.dtype).masked_fill_(~self.allowed, torch.finfo(model.dtype).min)[:, None]
        with torch.inference_mode():
            self.hidden = model.get_decoder()(input_ids=input_ids.to(device), attention_mask=bias.to(device), position_ids=positions.to(device),
                                              cache=self.cache, use_cache=True).last_hidden_state

    def logprobs(self, nodes: list[Node], vocabulary: RowVocabulary | None = None) -> SparseLogprobs:
        """A row per node: the next-token log-probabilities after it (one pass of the output
        layer; with ``vocabulary``, a row per node, over each node's tokens only)."""
        with torch.inference_mode():
            return hidden_logprobs(self.ner_model.model, self.hidden[[n.row for n in nodes], [n.index for n in nodes]], vocabulary)

    def answer_node(self, row: int) -> Node:
        """The node where row ``row``'s first sequence ends."""
        return self.ends[row][0]

    def subtree(self, row: int) -> list[Node]:
        """Row ``row``'s answer node and every node its other sequences (which extend the first)
        add after it, parents before children."""
        start = self.answer_node(row)
        found: dict[Node, None] = {start: None}
        for end in self.ends[row][1:]:
            path, index = [], end.index
            while index != start.index:
                path.append(Node(end.row, index))
                index = self.parents[end.row][index]
            found.update(dict.fromkeys(reversed(path)))
        return list(found)

    def child(self, node: Node, token: int) -> Node | None:
        """The node after ``node`` that feeds ``token``, if one was fed."""
        index = self.children[node.row].get((node.index, token))
        return None if index is None else Node(node.row, index)

    def inputs(self, rows: list[int], last: dict[int, Node], next_token: dict[int, int], contexts: list[list[int]]) -> GroupInputs:
        """Decoder inputs of ``rows``: each feeds ``next_token[r]`` after its node ``last[r]``, over a
        copy of the columns it sees of that node's row of the cache (its prefix and the node's
        path; ``contexts``: per row)."""
        visible = torch.stack([self.allowed[last[r].row, last[r].index] for r in rows])
        cache, seen = select_visible(self.cache, [last[r].row for r in rows], visible)
        mask = torch.cat([seen, torch.ones(len(rows), 1, dtype=torch.long)], dim=1)
        return GroupInputs(torch.tensor([[next_token[r]] for r in rows]), mask, cache, contexts)

    def bytes(self) -> int:
        """KV-cache bytes held: the prefix cache and this forward's node rows."""
        return cache_bytes(self.prefix.cache) + cache_bytes(self.cache)
