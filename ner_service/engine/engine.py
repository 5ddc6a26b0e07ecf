"""The one NER engine: PaDeLLM-NER label-wise parallel decoding and its autoregressive baseline.

PaDeLLM, for a batch of texts:

1. one forward runs every text (or window of a long text) once as a prefix, with all of
   its count queries as branches of the same sequence under a tree attention mask: it
   yields each (text, label) count's first token and the prefix's KV cache;
2. one batch of mention queries, one row per (text, label, k), each row selecting its
   text's cached prefix and continuing its label's cached count branch (nothing is
   re-encoded), decoded by any registered decoder of :mod:`general_decoding`; the same
   batch decodes the rest of each count (normally its end token) to confirm it: a longer
   count re-asks that label's mentions. A decoder that ``shares_cache`` (``one_sequence``)
   decodes a window's rows as branches of one sequence over the prefix cache instead;
   a mention answered more often than its text holds it (a model losing its place in a
   long list answers the k-th query with a neighbour) is re-asked with that first token banned,
   and one that is not in the text at all is re-asked with its answer restricted to the text's spans;
3. mentions are mapped to character offsets and a span predicted under two labels keeps
   the more probable label.

The baseline ("ar") asks the same model for every mention of every label in one sequence.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import Cache, DynamicCache

from general_decoding import Decoder, Generation, StopCriteria, get_decoder
from general_decoding.base import left_pad, position_ids_from_mask
from general_decoding.constrained import ConstrainedCopyDecoder, TokenTrie, restrict
from general_decoding.diffusion import BlockDiffusionSampler
from general_decoding.kv_cache import cache_bytes, select_rows
from general_decoding.tree_attention import ancestor_mask, build_trie, collate_tree_rows, join_tries, pack_branches, pack_rows
from ner_service.engine import diffusion, prompts
from ner_service.engine.chunking import chunk_spans
from ner_service.engine.span_tries import SpanTries
from ner_service.engine.ner_model import DEFAULT_MODEL, NERModel
from ner_service.engine.spans import Entity, Mention, align_mentions, occurrences, resolve_label_conflicts

STRATEGIES = ("padellm", "ar", "fast_dllm")
#: The token decoder of mention (and AR) answers unless a call names one: copy drafting gives
#: greedy's tokens (lossless) in fewer forwards, since mentions are copied from the text.
DEFAULT_DECODER = "copy"


def available_strategies() -> list[str]:
    """Names of the extraction strategies (how the engine asks the model)."""
    return list(STRATEGIES)
#: A mention re-asked within the text's spans is kept when its log-probability per token is at
#: least this: on zh-resume's dev set (its model card), about 23 % of the answers between -2.0
#: and -1.6 were right (break-even at its F1), 9 % between -2.4 and -2.0.
UNALIGNED_MIN_MEAN_LOGPROB = -1.6


class UnknownLabelError(ValueError):
    """A requested label that the model does not know."""


@dataclass
class ExtractionStats:
    """Cost of the batch a text was processed in (shared by the texts of that batch)."""

    forward_passes: int = 0
    generated_tokens: int = 0
    unmatched_mentions: int = 0
    latency_ms: float = 0.0
    batch_texts: int = 0
    kv_cache_bytes: int = 0  # peak bytes of KV cache held while decoding (PaDeLLM's branches)

    def to_dict(self) -> dict[str, float | int]:
        return dict(self.__dict__)


@dataclass
class Extraction:
    """Entities of one text."""

    text: str
    entities: list[Entity]
    stats: ExtractionStats = field(default_factory=ExtractionStats)

    def to_dict(self) -> dict[str, object]:
        return {"entities": [e.to_dict() for e in self.entities], "stats": self.stats.to_dict()}


@dataclass(frozen=True)
class _Window:
    text_index: int
    offset: int
    text: str


@dataclass(frozen=True)
class _Answer:
    """A mention query's answer, the first token it was decoded from (None: empty answer) and
    how many tokens it took, its end token included."""

    mention: Mention
    first_token: int | None
    length: int = 1

    @property
    def mean_logprob(self) -> float:
        """Log-probability per token."""
        return self.mention.logprob / max(self.length, 1)


@dataclass
class _Prefixes:
    """The windows' prefix tokens and, when shared, their KV cache: short windows share a cache
    row (``row_of``), and ``mask[w]`` marks the cached columns of window w's prefix."""

    tokens: list[list[int]]
    cache: Cache | None = None
    mask: torch.Tensor | None = None
    row_of: list[int] = field(default_factory=list)
    #: per (window, label), the count query's tokens and their columns in ``cache``
    count_branches: dict[tuple[int, str], tuple[list[int], list[int]]] = field(default_factory=dict)


class NEREngine:
    """Extract entities with a loaded :class:`NERModel`; shared by CLI, API, spaCy and workers."""

    diffusion_sampler: BlockDiffusionSampler | None = None  # decoder "fast_dllm"; None: diffusion.default_sampler()

    def __init__(self, ner_model: NERModel, max_window_tokens: int = 160, max_batch_texts: int = 16, share_prefix: bool = True,
                 count_bias: float | None = None, repair_duplicates: bool = True, repair_unaligned: bool | None = None) -> None:
        """``share_prefix=False`` re-encodes the text for every query, as the reference
        implementation does; it exists for comparison (benchmarks, tests). ``count_bias``
        (default: the model's ``count_bias``) favours larger counts: a count's first digit d
        gets ``d * count_bias`` added to its log-probability. ``repair_duplicates`` re-asks
        a PaDeLLM mention repeated more often than the text holds it; ``repair_unaligned``
        (default: the model's) re-asks one that is not in the text at all, its answer restricted
        to spans of the text (:meth:`_repair`)."""
        self.ner_model = ner_model
        self.repair_duplicates = repair_duplicates
        self.repair_unaligned = ner_model.config.repair_unaligned if repair_unaligned is None else repair_unaligned
        self.count_bias = ner_model.config.count_bias if count_bias is None else count_bias
        self.share_prefix = share_prefix
        self.max_window_tokens = max_window_tokens
        self.max_batch_texts = max_batch_texts
        tokenizer = ner_model.tokenizer
        self._eos = ner_model.eos_token_id
        self._pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self._eos
        self._stop_ids = frozenset({self._eos})
        digit_ids = {digit: tokenizer.convert_tokens_to_ids(str(digit)) for digit in range(10)}
        self._digit_ids = {d: t for d, t in digit_ids.items() if t is not None and t != tokenizer.unk_token_id}

    @classmethod
    def load(cls, name_or_path: str | Path = DEFAULT_MODEL, dtype: torch.dtype = torch.float32, device: str = "cpu", **options: Any) -> "NEREngine":
        """Load a shipped model by name (or a model folder) and wrap it in an engine."""
        return cls(NERModel.load(name_or_path, dtype=dtype, device=device), **options)

    @property
    def labels(self) -> list[str]:
        return list(self.ner_model.config.labels)

    @property
    def name(self) -> str:
        return self.ner_model.config.name

    def check_labels(self, labels: Sequence[str] | None) -> list[str]:
        """The requested labels, validated (all of the model's labels when None)."""
        if labels is None:
            return self.labels
        unknown = [label for label in labels if label not in self.ner_model.config.labels]
        if unknown:
            raise UnknownLabelError(f"unknown label(s) {', '.join(map(repr, unknown))}; this model knows: {', '.join(self.labels)}")
        return list(dict.fromkeys(labels))

    def extract(
        self,
        texts: Sequence[str],
        labels: Sequence[str] | None = None,
        strategy: str = "padellm",
        decoder: str | Decoder = DEFAULT_DECODER,
    ) -> list[Extraction]:
        """Entities of every text. ``strategy`` is how the model is asked (``padellm``, ``ar``,
        ``fast_dllm``); ``decoder`` how its answers' tokens are produced: a registered decoder's
        name or a configured :class:`Decoder` (e.g. speculative with its draft model)."""
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not a string")
        wanted = self.check_labels(labels)
        generator = decoder if isinstance(decoder, Decoder) else get_decoder(decoder)
        results: list[Extraction] = []
        for start in range(0, len(texts), self.max_batch_texts):
            batch = list(texts[start:start + self.max_batch_texts])
            results.extend(self._extract_batch(batch, wanted, strategy, generator))
        return results

    # -- one batch -------------------------------------------------------------------------

    def _extract_batch(self, texts: list[str], labels: list[str], strategy: str, generator: Decoder) -> list[Extraction]:
        began = time.perf_counter()
        stats = ExtractionStats(batch_texts=len(texts))
        windows = self._windows(texts)
        mentions: list[list[Mention]] = [[] for _ in windows]
        if windows:
            run = {"padellm": self._padellm, "ar": self._autoregressive, "fast_dllm": self._fast_dllm}[strategy]
            run(windows, labels, generator, mentions, stats)
        per_text: list[list[Entity]] = [[] for _ in texts]
        for window, found in zip(windows, mentions):
            entities, missing = align_mentions(window.text, found)
            stats.unmatched_mentions += missing
            per_text[window.text_index].extend(
                Entity(e.start + window.offset, e.end + window.offset, e.text, e.label, e.score) for e in entities
            )
        stats.latency_ms = (time.perf_counter() - began) * 1000
        return [Extraction(text, resolve_label_conflicts(found), stats) for text, found in zip(texts, per_text)]

    def _windows(self, texts: list[str]) -> list[_Window]:
        tokenizer = self.ner_model.tokenizer

        def count(piece: str) -> int:
            return len(tokenizer(piece, add_special_tokens=False).input_ids)

        windows = []
        for index, text in enumerate(texts):
            if not text.strip():
                continue
            for start, end in chunk_spans(text, count, self.max_window_tokens):
                windows.append(_Window(index, start, text[start:end]))
        return windows

    def _tokens(self, text: str) -> list[int]:
        return self.ner_model.tokenizer(text, add_special_tokens=False).input_ids

    def _prefix_tokens(self, window: _Window) -> list[int]:
        return self.ner_model.tokenizer(prompts.prefix(window.text)).input_ids

    def _left_pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return left_pad(rows, self._pad)

    def _device(self) -> torch.device:
        return self.ner_model.model.device

    def _count_step(self, windows: list[_Window], labels: list[str], stats: ExtractionStats,
                    one_row: bool = False) -> tuple[_Prefixes, list[int]]:
        """One forward: every window's prefix with all its count queries as branches of one
        sequence (tree attention); short windows share a row, and ``one_row`` puts them all in
        one (for a decoder that ``shares_cache``). Returns the prefixes, with their KV cache kept
        for the next step, and the first answer token of each (window, label) count query."""
        prefixes = _Prefixes([self._prefix_tokens(w) for w in windows])
        queries = [self._tokens(prompts.count_query(self.ner_model.config.prompt_name(label))) for label in labels]
        model = self.ner_model.model
        with torch.inference_mode():
            if not self.share_prefix:
                logits = self._next_token_logits([p + q for p in prefixes.tokens for q in queries])
            else:
                trees = [pack_branches(p, queries) for p in prefixes.tokens]
                lengths = [len(t) for t in trees]
                rows = pack_rows(lengths, sum(lengths) if one_row else None)
                ids, positions, tree_mask, offsets = collate_tree_rows([[trees[w] for w in row] for row in rows], self._pad, dtype=model.dtype)
                out = model.get_decoder()(input_ids=ids.to(self._device()), attention_mask=tree_mask.to(self._device()),
                                          position_ids=positions.to(self._device()), past_key_values=DynamicCache(), use_cache=True)
                start = [0] * len(windows)
                prefixes.row_of = [0] * len(windows)
                for row, (members, row_offsets) in enumerate(zip(rows, offsets)):
                    for w, offset in zip(members, row_offsets):
                        prefixes.row_of[w], start[w] = row, offset
                ends = list(itertools.accumulate(len(q) for q in queries))
                logits = model.get_output_embeddings()(out.last_hidden_state[
                    [prefixes.row_of[w] for w in range(len(windows)) for _ in queries],
                    [start[w] + len(p) + end - 1 for w, p in enumerate(prefixes.tokens) for end in ends]])
                prefixes.cache = out.past_key_values
                prefixes.mask = torch.zeros(len(windows), ids.shape[1], dtype=torch.long, device=self._device())
                for w, p in enumerate(prefixes.tokens):
                    prefixes.mask[w, start[w]:start[w] + len(p)] = 1
                    for label, query, end in zip(labels, queries, ends):
                        first = start[w] + len(p) + end - len(query)
                        prefixes.count_branches[w, label] = (query, list(range(first, first + len(query))))
        stats.forward_passes += 1
        return prefixes, self._biased_counts(logits).argmax(-1).tolist()

    def _biased_counts(self, logits: torch.Tensor) -> torch.Tensor:
        """Count logits with ``count_bias`` added per unit of each digit token (a no-op at 0)."""
        if not self.count_bias:
            return logits
        bias = torch.zeros(logits.shape[-1], dtype=torch.float32, device=logits.device)
        for digit, token in self._digit_ids.items():
            bias[token] = self.count_bias * digit
        return logits.float().log_softmax(-1) + bias

    def _next_token_logits(self, rows: list[list[int]]) -> torch.Tensor:
        """The next-token logits after each row, the rows encoded from scratch (no cache)."""
        ids, mask = self._left_pad(rows)
        with torch.inference_mode():
            return self.ner_model.model(input_ids=ids.to(self._device()), attention_mask=mask.to(self._device()),
                                        position_ids=position_ids_from_mask(mask).to(self._device()), logits_to_keep=1).logits[:, -1]

    def _branch(
        self,
        prefixes: _Prefixes,
        owners: list[int],
        queries: list[list[int]],
        generator: Decoder,
        max_new_tokens: int,
        stats: ExtractionStats,
        seen: list[list[int]] | None = None,
    ) -> Generation:
        """Decode one query per row, each behind the prefix of window ``owners[row]`` and the
        cached columns ``seen[row]`` (the count branch a mention query continues).

        Over cached prefixes, a decoder that ``shares_cache`` decodes the queries as branches of
        one sequence over the prefix cache; the others get :meth:`_trie_branches`. Without a
        cache (``share_prefix=False``) each row re-encodes its window's prefix."""
        stop = StopCriteria(max_new_tokens, self._stop_ids)
        if prefixes.cache is not None and not generator.shares_cache:
            return self._trie_branches(prefixes, owners, queries, seen or [[] for _ in queries], generator, stop, stats)
        if prefixes.cache is not None:  # branches of one sequence: all windows at once when they share one cache row
            one_row = prefixes.cache.layers[0].keys.shape[0] == 1
            groups = [list(range(len(queries)))] if one_row else [[r for r in range(len(queries)) if owners[r] == w] for w in dict.fromkeys(owners)]
        else:
            groups = self._batches(generator, list(range(len(queries))))

        def inputs(rows: list[int]) -> tuple[torch.Tensor, torch.Tensor, Cache | None, list[list[int]] | None]:
            owner_rows = [owners[r] for r in rows]
            if prefixes.cache is None or prefixes.mask is None:
                ids, mask = self._left_pad([prefixes.tokens[o] + queries[r] for o, r in zip(owner_rows, rows)])
                return ids, mask, None, None
            # cached columns outside this row's prefix (other windows, branches, padding) are masked out
            ids, query_mask = self._left_pad([queries[r] for r in rows])
            cache = self._window_cache(prefixes, owner_rows[0])
            shared = torch.zeros(len(rows), cache.get_seq_length(), dtype=torch.long)
            shared[:, : prefixes.mask.shape[1]] = prefixes.mask[owner_rows].cpu()
            for position, row in enumerate(rows):
                shared[position, seen[row] if seen else []] = 1
            return ids, torch.cat([shared, query_mask], dim=1), cache, [prefixes.tokens[o] for o in owner_rows]

        held = [prefixes.cache] if prefixes.cache is not None else []
        merged = self._decode(generator, groups, len(queries), stop, inputs, held, stats)
        stats.forward_passes += merged.forward_passes
        stats.generated_tokens += sum(len(t) for t in merged.tokens)
        return merged

    @staticmethod
    def _batches(generator: Decoder, rows: list[int]) -> list[list[int]]:
        """``rows`` as one batch, or one by one for a decoder that does not batch."""
        if not rows:
            return []
        return [rows] if generator.supports_batch else [[r] for r in rows]

    def _decode(
        self,
        generator: Decoder,
        groups: list[list[int]],
        total: int,
        stop: StopCriteria,
        inputs: Callable[[list[int]], tuple[torch.Tensor, torch.Tensor, Cache | None, list[list[int]] | None]],
        held: list[Cache],
        stats: ExtractionStats,
    ) -> Generation:
        """Decode each group of rows (of ``total``) in one :meth:`Decoder.generate` call;
        ``inputs(group)`` gives its input ids, attention mask, cache and context ids. ``held``
        are the caches kept meanwhile (for ``kv_cache_bytes``); rows in no group stay empty."""
        merged = Generation([[] for _ in range(total)], [[] for _ in range(total)], [0.0] * total, [False] * total)
        for rows in groups:
            ids, mask, cache, context = inputs(rows)
            out = generator.generate(self.ner_model.model, ids.to(self._device()), stop, attention_mask=mask.to(self._device()),
                                     past_key_values=cache, context_ids=context)
            for position, row in enumerate(rows):
                merged.tokens[row] = out.tokens[position]
                merged.token_logprobs[row] = out.token_logprobs[position]
                merged.scores[row] = out.scores[position]
                merged.stopped[row] = out.stopped[position]
            extra = [cache] if cache is not None and all(cache is not c for c in held) else []
            stats.kv_cache_bytes = max(stats.kv_cache_bytes, sum(cache_bytes(c) for c in held + extra))
            merged.forward_passes += out.forward_passes
            merged.accepted_per_pass.extend(out.accepted_per_pass)
        return merged

    def _trie_branches(
        self,
        prefixes: _Prefixes,
        owners: list[int],
        queries: list[list[int]],
        seen: list[list[int]],
        generator: Decoder,
        stop: StopCriteria,
        stats: ExtractionStats,
        banned_first: Sequence[int | None] | None = None,
        answer_tries: Sequence[TokenTrie | None] | None = None,
    ) -> Generation:
        """:meth:`_branch` over the cached prefixes: one forward feeds every query, the queries
        that continue the same cached columns merged into a trie (a count's confirmation and
        its label's mention queries share the count and the label tokens); it yields each
        row's first answer token (never ``banned_first[row]``; within ``answer_tries[row]``). Then
        ``generator`` decodes the unfinished rows, each row over its window's cache row and its
        query's trie path (a :class:`ConstrainedCopyDecoder` when ``answer_tries`` are given)."""
        assert prefixes.cache is not None and prefixes.mask is not None
        device = self._device()
        groups: dict[tuple[int, tuple[int, ...]], list[int]] = {}  # queries behind the same cached columns
        for r, (owner, columns) in enumerate(zip(owners, seen)):
            groups.setdefault((owner, tuple(columns)), []).append(r)
        tries = [build_trie([queries[r] for r in members]) for members in groups.values()]
        # node rows: tries of windows in the same cache row, packed up to the largest trie
        by_cache_row: dict[int, list[int]] = {}
        for g, (owner, _) in enumerate(groups):
            by_cache_row.setdefault(prefixes.row_of[owner], []).append(g)
        capacity = max(len(ids) for ids, _, _ in tries)
        node_rows = [(cache_row, [members[i] for i in packed]) for cache_row, members in by_cache_row.items()
                     for packed in pack_rows([len(tries[g][0]) for g in members], capacity)]
        width = prefixes.cache.get_seq_length()  # a decoder that shares_cache may have extended it in place
        keys = list(groups)
        row_ids: list[list[int]] = []
        row_parents: list[list[int]] = []
        row_base: list[list[torch.Tensor]] = []  # per node: the cached columns it sees
        last: list[tuple[int, int]] = [(0, 0)] * len(queries)  # per query: (node row, node)
        for row, (_, members) in enumerate(node_rows):
            ids, parents, ends = join_tries([tries[g] for g in members])
            row_ids.append(ids)
            row_parents.append(parents)
            row_base.append([])
            for g, group_ends in zip(members, ends):
                owner, columns = keys[g]
                base = torch.zeros(width, dtype=torch.bool, device=prefixes.mask.device)
                base[: prefixes.mask.shape[1]] = prefixes.mask[owner].bool()
                base[list(columns)] = True
                row_base[row] += [base] * len(tries[g][0])
                for r, end in zip(groups[keys[g]], group_ends):
                    last[r] = (row, end)
        nodes = max(len(ids) for ids in row_ids)
        input_ids = torch.full((len(node_rows), nodes), self._pad, dtype=torch.long)
        positions = torch.zeros((len(node_rows), nodes), dtype=torch.long)
        allowed = torch.zeros((len(node_rows), nodes, width + nodes), dtype=torch.bool)
        allowed[:, :, width:] = torch.eye(nodes, dtype=torch.bool)  # padding sees itself only
        for row, (ids, parents) in enumerate(zip(row_ids, row_parents)):
            n = len(ids)
            ancestors = ancestor_mask(parents)
            base = torch.stack(row_base[row])
            input_ids[row, :n] = torch.tensor(ids)
            positions[row, :n] = base.sum(1) + ancestors.sum(1) - 1  # after the columns it sees, at its depth
            allowed[row, :n, :width] = base
            allowed[row, :n, width:width + n] = ancestors
        model = self.ner_model.model
        cache = select_rows(prefixes.cache, [cache_row for cache_row, _ in node_rows])
        bias = torch.zeros(allowed.shape, dtype=model.dtype).masked_fill_(~allowed, torch.finfo(model.dtype).min)[:, None]
        with torch.inference_mode():
            hidden = model.get_decoder()(input_ids=input_ids.to(device), attention_mask=bias.to(device), position_ids=positions.to(device),
                                         past_key_values=cache, use_cache=True).last_hidden_state
            first_lp = torch.log_softmax(model.get_output_embeddings()(hidden[[r for r, _ in last], [c for _, c in last]]).float(), dim=-1)
            first = _first_tokens(first_lp, banned_first, answer_tries)
        result = Generation([[] for _ in queries], [[] for _ in queries], [0.0] * len(queries), [False] * len(queries), forward_passes=1,
                            accepted_per_pass=[len(queries)])
        unfinished = []
        for r, token in enumerate(first):
            result.scores[r] = float(first_lp[r, token])
            if token in stop.stop_token_ids:
                result.stopped[r] = True
                continue
            result.tokens[r], result.token_logprobs[r] = [token], [result.scores[r]]
            if stop.max_new_tokens > 1:
                unfinished.append(r)

        def inputs(rows: list[int]) -> tuple[torch.Tensor, torch.Tensor, Cache | None, list[list[int]] | None]:
            visible = torch.stack([allowed[last[r][0], last[r][1]] for r in rows]).long()  # its trie path
            mask = torch.cat([visible, torch.ones(len(rows), 1, dtype=torch.long)], dim=1)
            return (torch.tensor([[first[r]] for r in rows]), mask, select_rows(cache, [last[r][0] for r in rows]),
                    [prefixes.tokens[owners[r]] for r in rows])

        generator = _continuing(answer_tries, first, unfinished, generator)
        rest = self._decode(generator, self._batches(generator, unfinished), len(queries), StopCriteria(max(stop.max_new_tokens - 1, 1), stop.stop_token_ids),
                            inputs, [prefixes.cache, cache], stats)
        for r in unfinished:
            result.tokens[r] += rest.tokens[r]
            result.token_logprobs[r] += rest.token_logprobs[r]
            result.scores[r] += rest.scores[r]
            result.stopped[r] = rest.stopped[r]
        result.forward_passes += rest.forward_passes
        result.accepted_per_pass.extend(rest.accepted_per_pass)
        stats.kv_cache_bytes = max(stats.kv_cache_bytes, cache_bytes(prefixes.cache) + cache_bytes(cache))
        stats.forward_passes += result.forward_passes
        stats.generated_tokens += sum(len(t) for t in result.tokens)
        return result

    @staticmethod
    def _window_cache(prefixes: _Prefixes, window: int) -> Cache:
        """The cache holding window ``window``'s prefix once: the shared cache itself when it
        holds a single row (branches then extend it in place), else a copy of the window's row."""
        assert prefixes.cache is not None
        if prefixes.cache.layers[0].keys.shape[0] == 1:
            return prefixes.cache
        return select_rows(prefixes.cache, [prefixes.row_of[window]])

    def _padellm(
        self, windows: list[_Window], labels: list[str], generator: Decoder, mentions: list[list[Mention]], stats: ExtractionStats
    ) -> None:
        prefixes, first_tokens = self._count_step(windows, labels, stats, one_row=generator.shares_cache)
        decode = self.ner_model.tokenizer.decode
        counts: dict[tuple[int, str], int] = {}
        confirm: list[tuple[int, str, int]] = []
        for (w, label), token in zip(itertools.product(range(len(windows)), labels), first_tokens):
            count = prompts.parse_count(decode([token], skip_special_tokens=True)) or 0
            if count:
                counts[w, label] = count
                confirm.append((w, label, token))
        # The count's remaining digits (usually just the end token) are decoded in the same
        # batch as the mention queries, which assume the count is complete.
        rows = self._mention_rows(counts)
        answers, continued = self._mention_step(prefixes, rows, confirm, generator, stats)
        longer = {key: int(f"{counts[key]}{digits}") for key, digits in continued.items()}
        if longer:  # rare: a count of several tokens; ask that label's mentions again
            kept = [i for i, (w, label, _, _) in enumerate(rows) if (w, label) not in longer]
            rows, answers = [rows[i] for i in kept], [answers[i] for i in kept]
            again = self._mention_rows(longer)
            rows += again
            answers += self._mention_step(prefixes, again, [], generator, stats)[0]
        self._repair(windows, prefixes, rows, answers, generator, stats)
        for (w, _, _, _), answer in zip(rows, answers):
            mentions[w].append(answer.mention)

    @staticmethod
    def _mention_rows(counts: dict[tuple[int, str], int]) -> list[tuple[int, str, int, int]]:
        """One (window, label, count, k) mention query per k of each count."""
        return [(w, label, n, k) for (w, label), n in counts.items() for k in range(1, n + 1)]

    def _mention_step(
        self,
        prefixes: _Prefixes,
        rows: list[tuple[int, str, int, int]],
        confirm: list[tuple[int, str, int]],
        generator: Decoder,
        stats: ExtractionStats,
    ) -> tuple[list[_Answer], dict[tuple[int, str], str]]:
        """Decode every (window, label, count, k) mention query, plus count continuations to
        confirm; return the answers and the digits that continued a count."""
        shown = self.ner_model.config.prompt_name
        full = self._mention_queries(rows)
        full += [(w, label, self._tokens(prompts.count_query(shown(label))) + [token]) for w, label, token in confirm]
        if not full:
            return [], {}
        owners, queries, seen = self._continue_count_branches(prefixes, full)
        out = self._branch(prefixes, owners, queries, generator, self.ner_model.config.max_mention_tokens, stats, seen)
        answers = [self._answer(label, tokens, score) for (_, label, _, _), tokens, score in zip(rows, out.tokens, out.scores)]
        decode = self.ner_model.tokenizer.decode
        continued = {}
        for (w, label, _), tokens in zip(confirm, out.tokens[len(rows):]):
            digits = re.match(r"\d*", decode(tokens, skip_special_tokens=True))[0]  # type: ignore[index]
            if digits:
                continued[w, label] = digits
        return answers, continued

    def _mention_queries(self, rows: list[tuple[int, str, int, int]]) -> list[tuple[int, str, list[int]]]:
        """(window, label, query tokens) of each (window, label, count, k) mention query."""
        shown = self.ner_model.config.prompt_name
        return [(w, label, self._tokens(prompts.mention_query(shown(label), n, k))) for w, label, n, k in rows]

    @staticmethod
    def _continue_count_branches(
        prefixes: _Prefixes, full: list[tuple[int, str, list[int]]]
    ) -> tuple[list[int], list[list[int]], list[list[int]]]:
        """Owners, queries and cached columns of (window, label, query tokens) rows: a query that
        starts with its label's cached count query continues that branch (only the rest is fed)."""
        queries, seen = [], []
        for w, label, query in full:
            cached, columns = prefixes.count_branches.get((w, label), ([], []))
            reuse = bool(cached) and query[: len(cached)] == cached and len(query) > len(cached)
            queries.append(query[len(cached):] if reuse else query)
            seen.append(columns if reuse else [])
        return [w for w, _, _ in full], queries, seen

    def _answer(self, label: str, tokens: list[int], score: float) -> _Answer:
        text = prompts.parse_mention(self.ner_model.tokenizer.decode(tokens, skip_special_tokens=True))
        return _Answer(Mention(label, text, score), tokens[0] if tokens else None, len(tokens) + 1)

    def _repair(
        self,
        windows: list[_Window],
        prefixes: _Prefixes,
        rows: list[tuple[int, str, int, int]],
        answers: list[_Answer],
        generator: Decoder,
        stats: ExtractionStats,
    ) -> None:
        """Re-ask the mention queries whose answers alignment would lose, in place:

        * with ``repair_unaligned``, an answer not in its window (or empty although the count
          promised a mention), restricted to spans of the window; the new answer is kept when
          its log-probability per token reaches ``UNALIGNED_MIN_MEAN_LOGPROB``. A weak model
          (zh-resume) writes a mention of its own rather than copying one far more often than
          a strong one;
        * with ``repair_duplicates``, a surplus copy (:func:`_surplus_copies`) with its first
          token banned (and within the window's spans with ``repair_unaligned``). Such copies
          mostly come from a model answering the k-th query of a long list with a neighbour."""
        tries = SpanTries(self.ner_model.tokenizer, [w.text for w in windows], self._eos, self.ner_model.config.max_mention_tokens) \
            if self.repair_unaligned else None
        if tries is not None:
            redo = _unaligned(windows, rows, answers)
            for i, answer in zip(redo, self._re_ask(prefixes, rows, redo, generator, stats, tries=tries)):
                if answer.mean_logprob >= UNALIGNED_MIN_MEAN_LOGPROB:
                    answers[i] = answer
        if self.repair_duplicates:
            redo = _surplus_copies(windows, rows, answers)
            banned = [answers[i].first_token for i in redo]
            for i, answer in zip(redo, self._re_ask(prefixes, rows, redo, generator, stats, banned, tries)):
                answers[i] = answer

    def _re_ask(
        self, prefixes: _Prefixes, rows: list[tuple[int, str, int, int]], redo: list[int], generator: Decoder,
        stats: ExtractionStats, banned: list[int | None] | None = None, tries: SpanTries | None = None,
    ) -> list[_Answer]:
        """Answer the mention queries ``rows[i]`` (i in ``redo``) again, the j-th one's first
        answer token never ``banned[j]`` and, with ``tries``, its answer a span of its window.

        Over cached prefixes, :meth:`_trie_branches` picks the first token (then ``generator``
        goes on; greedy for one that ``shares_cache``); without a cache, one forward picks it
        and :meth:`_branch` goes on. With a trie, constrained greedy decodes the rest."""
        if not redo:
            return []
        rows = [rows[i] for i in redo]
        answer_tries = [tries[w] for w, _, _, _ in rows] if tries is not None else None
        owners, queries, seen = self._continue_count_branches(prefixes, self._mention_queries(rows))
        stop = StopCriteria(self.ner_model.config.max_mention_tokens, self._stop_ids)
        if prefixes.cache is not None:
            out = self._trie_branches(prefixes, owners, queries, seen, get_decoder("greedy") if generator.shares_cache else generator,
                                      stop, stats, banned_first=banned, answer_tries=answer_tries)
        else:
            with torch.inference_mode():
                logprobs = self._next_token_logits([prefixes.tokens[o] + q for o, q in zip(owners, queries)]).float().log_softmax(-1)
                first = _first_tokens(logprobs, banned, answer_tries)
            stats.forward_passes += 1
            stats.generated_tokens += sum(t not in self._stop_ids for t in first)
            out = Generation([[] for _ in queries], [[] for _ in queries], [float(logprobs[r, t]) for r, t in enumerate(first)],
                             [t in self._stop_ids for t in first], forward_passes=1)
            going = [r for r, token in enumerate(first) if token not in self._stop_ids]
            if going:
                rest = self._branch(prefixes, [owners[r] for r in going], [queries[r] + [first[r]] for r in going],
                                    _continuing(answer_tries, first, going, generator), max(stop.max_new_tokens - 1, 1), stats, [seen[r] for r in going])
                for r, tokens, score, stopped in zip(going, rest.tokens, rest.scores, rest.stopped):
                    out.tokens[r] = [first[r]] + tokens
                    out.scores[r] += score
                    out.stopped[r] = stopped
        return [self._answer(label, tokens, score) for (_, label, _, _), tokens, score in zip(rows, out.tokens, out.scores)]

    def _fast_dllm(
        self, windows: list[_Window], labels: list[str], generator: Decoder, mentions: list[list[Mention]], stats: ExtractionStats
    ) -> None:
        diffusion.extract_mentions(self, windows, labels, mentions, stats, self.diffusion_sampler)

    def _autoregressive(
        self, windows: list[_Window], labels: list[str], generator: Decoder, mentions: list[list[Mention]], stats: ExtractionStats
    ) -> None:
        ids, mask = self._left_pad(self._ar_prompts(windows))
        stop = StopCriteria(self.ner_model.config.max_ar_tokens, self._stop_ids)
        out = self._decode(generator, self._batches(generator, list(range(len(windows)))), len(windows), stop,
                           lambda rows: (ids[rows], mask[rows], None, None), [], stats)
        stats.forward_passes += out.forward_passes
        stats.generated_tokens += sum(len(t) for t in out.tokens)
        for w, (tokens, logprobs) in enumerate(zip(out.tokens, out.token_logprobs)):
            mentions[w].extend(self._ar_mentions(tokens, logprobs, labels))

    def _ar_prompts(self, windows: list[_Window]) -> list[list[int]]:
        """Each window's prompt for the all-entities query (AR baseline, diffusion)."""
        query = self._tokens(prompts.ar_query())
        return [self._prefix_tokens(w) + query for w in windows]

    def _ar_mentions(self, tokens: list[int], logprobs: list[float], labels: list[str]) -> list[Mention]:
        """The mentions of ``labels`` in an all-entities answer."""
        return [Mention(label, text, logprob) for label, text, logprob in self._ar_lines(tokens, logprobs) if label in labels]

    def _ar_lines(self, tokens: list[int], logprobs: list[float]) -> list[tuple[str, str, float]]:
        """Split an AR answer into ``(label, mention, logprob)`` lines (malformed lines dropped)."""
        decode = self.ner_model.tokenizer.decode
        groups: list[tuple[list[int], float]] = []
        group: list[int] = []
        group_lp = 0.0
        for token, logprob in zip(tokens, logprobs):
            group.append(token)
            group_lp += logprob
            if "\n" in decode([token], skip_special_tokens=True):
                groups.append((group, group_lp))
                group, group_lp = [], 0.0
        groups.append((group, group_lp))
        parsed, carry = [], ""
        for group, logprob in groups:
            head, _, tail = (carry + decode(group, skip_special_tokens=True)).partition("\n")
            carry = tail
            pair = prompts.parse_ar_line(head)
            if pair is not None:
                parsed.append((self.ner_model.config.label_of(pair[0]), pair[1], logprob))
        return parsed


def _unaligned(windows: list[_Window], rows: list[tuple[int, str, int, int]], answers: list[_Answer]) -> list[int]:
    """The answers that are empty or not in their window."""
    return [i for i, ((w, _, _, _), answer) in enumerate(zip(rows, answers))
            if not answer.mention.text or not occurrences(windows[w].text, answer.mention.text)]


def _surplus_copies(windows: list[_Window], rows: list[tuple[int, str, int, int]], answers: list[_Answer]) -> list[int]:
    """The answers that repeat a more probable answer of the same (window, label) beyond the
    number of times the window holds that mention (in order)."""
    copies: dict[tuple[int, str, str], list[int]] = {}
    for i, ((w, label, _, _), answer) in enumerate(zip(rows, answers)):
        if answer.mention.text:
            copies.setdefault((w, label, answer.mention.text), []).append(i)
    surplus: list[int] = []
    for (w, _, text), members in copies.items():
        room = len(occurrences(windows[w].text, text))
        if 0 < room < len(members):
            surplus += sorted(members, key=lambda i: answers[i].mention.logprob, reverse=True)[room:]
    return sorted(surplus)


def _first_tokens(logprobs: torch.Tensor, banned: Sequence[int | None] | None, tries: Sequence[TokenTrie | None] | None) -> list[int]:
    """Each row's most probable first answer token, never ``banned[row]`` and, where
    ``tries[row]`` is given, one that starts an answer in it. ``logprobs`` is masked in place."""
    banned = banned or [None] * len(logprobs)
    if tries is not None:
        restrict(logprobs, [None if trie is None else [t for t in trie.children if t != ban] for trie, ban in zip(tries, banned)])
    for row, token in enumerate(banned):
        if token is not None:
            logprobs[row, token] = float("-inf")
    return logprobs.argmax(-1).tolist()


def _continuing(tries: Sequence[TokenTrie | None] | None, first: list[int], rows: list[int], generator: Decoder) -> Decoder:
    """What decodes ``rows`` after their ``first`` tokens: ``generator`` when no row has a trie,
    else constrained greedy (drafting from the input), each row within its trie."""
    if tries is None or all(trie is None for trie in tries):
        return generator
    return ConstrainedCopyDecoder([trie.children.get(first[r]) if (trie := tries[r]) is not None else None for r in rows])
