"""Block-wise semi-autoregressive sampling of a masked-diffusion LM, with or without a KV cache.

The answer (``answer_length`` mask tokens after each left-padded prompt) is decoded block by
block, left to right; inside a block, each step runs the model and an :class:`Unmasking`
rule fills some masked positions with their most likely tokens. Caches (Fast-dLLM):

* ``prefix``: at a block's first step the full sequence runs and the keys/values of the
  columns before the block are kept; later steps of the block run the block and everything
  after it against that cache;
* ``dual``: the keys/values of the columns after the block are kept too, and later steps run
  only the block.

The cache is approximate (the cached columns would see the newly unmasked tokens); it is
rebuilt at every block boundary, and every ``refresh_every`` steps when that is set
(``refresh_every=1`` reproduces the uncached sampler exactly). With a dual cache, a block's
first forward runs every column of the answer, most of them the masked columns after the block;
with ``full_forward_every`` k, only every k-th block does (None: only the first), and the others
start from the cache the block before started with (its suffix as the last full forward computed
it), running only the block before (now decoded) and the block. Once a row has produced the
end token, it leaves the batch: its later blocks are filled with end tokens without decoding.

``shift`` reads each position's token from the hidden state one column to its left, as the
model was trained when it was adapted from an autoregressive LM (Dream, DiffuLLaMA): the next-
token head it came with is kept. The column left of the block then runs with the block.
``causal_prompt`` keeps the prompt causal (:func:`causal_prompt_mask`): only the answer is
bidirectional, and the prompt's keys and values never change, so they are computed once
(:class:`PromptCache`) and every full forward runs the answer alone against them, exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers.cache_utils import DynamicCache

from general_decoding.base import left_pad
from general_decoding.diffusion.layout import bidirectional_mask, block_bounds, causal_prompt_mask
from general_decoding.diffusion.unmasking import FixedStepsUnmasking, LeftToRightUnmasking, ThresholdUnmasking, Unmasking
from general_decoding.kv_cache import keep_columns, keep_first, keep_rows

if TYPE_CHECKING:  # for types only: the engine may run its own model class (no import of transformers' model classes)
    from transformers import PreTrainedModel

CACHE_MODES = ("none", "prefix", "dual")


@dataclass
class DiffusionOutput:
    """The answers of a batch: tokens before the first end token, their log-confidence when
    unmasked, whether an end token came, and what the decoding cost."""

    tokens: list[list[int]]
    token_logprobs: list[list[float]]
    stopped: list[bool]
    forward_passes: int = 0
    steps_per_block: list[int] = field(default_factory=list)

    @property
    def generated_tokens(self) -> int:
        """Answer tokens produced, the end token included."""
        return sum(len(t) + int(s) for t, s in zip(self.tokens, self.stopped))


@dataclass(frozen=True)
class PromptCache:
    """The keys and values of a causal prompt's first ``columns`` columns, per layer, for every
    row of the batch: computed once, copied for the rows still decoding before each full forward."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    columns: int

    def for_rows(self, rows: torch.Tensor) -> DynamicCache:
        """A new cache holding ``rows`` of the prompt, to run the answer against."""
        cache = DynamicCache()
        for index, (keys, values) in enumerate(self.layers):
            cache.update(keys[rows], values[rows], index)
        return cache


@dataclass(frozen=True)
class BlockStartCache:
    """The keys and values of a dual cache as a block's first forward left them, for the next
    block to start from: absolute ``columns`` of the batch rows ``rows``, their padding mask, and
    how many blocks have started since the last full forward."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    columns: list[int]
    rows: torch.Tensor
    key_mask: torch.Tensor
    blocks_since_full: int

    @classmethod
    def of(cls, cache: DynamicCache, columns: list[int], rows: torch.Tensor, key_mask: torch.Tensor,
           blocks_since_full: int) -> "BlockStartCache":
        return cls([(layer.keys, layer.values) for layer in cache.layers], columns, rows, key_mask, blocks_since_full)

    def for_rows(self, rows: torch.Tensor, columns: list[int]) -> tuple[DynamicCache, torch.Tensor]:
        """A new cache of ``rows`` (a subset of this one's) holding ``columns`` (a subset of this
        one's), in that order, with their padding mask."""
        where = {row: index for index, row in enumerate(self.rows.tolist())}
        picked = torch.tensor([where[row] for row in rows.tolist()], device=self.key_mask.device)
        at = {column: index for index, column in enumerate(self.columns)}
        kept = torch.tensor([at[column] for column in columns], dtype=torch.long, device=self.key_mask.device)
        cache = DynamicCache()
        for index, (keys, values) in enumerate(self.layers):
            cache.update(keys[picked][:, :, kept], values[picked][:, :, kept], index)
        return cache, self.key_mask[picked][:, kept]


@dataclass
class BlockDiffusionSampler:
    """LLaDA / Fast-dLLM sampler over any Hugging Face decoder run with a bidirectional mask."""

    block_size: int = 8
    unmasking: Unmasking = field(default_factory=lambda: ThresholdUnmasking(0.9))
    cache: str = "none"
    refresh_every: int | None = None
    shift: bool = False
    causal_prompt: bool = False
    full_forward_every: int | None = 1

    def __post_init__(self) -> None:
        if self.cache not in CACHE_MODES:
            raise ValueError(f"unknown cache {self.cache!r}; choose one of {', '.join(CACHE_MODES)}")
        if self.refresh_every is not None and self.refresh_every < 1:
            raise ValueError(f"refresh_every must be >= 1, got {self.refresh_every}")
        if self.full_forward_every is not None and self.full_forward_every < 1:
            raise ValueError(f"full_forward_every must be >= 1 or None, got {self.full_forward_every}")
        if self.full_forward_every != 1 and self.cache != "dual":
            raise ValueError(f"a block that starts from the cache of the block before needs the dual cache, not {self.cache!r}")

    def sample(self, model: PreTrainedModel, prompts: list[list[int]], answer_length: int, mask_id: int, eos_id: int,
               pad_id: int | None = None) -> DiffusionOutput:
        """Decode an ``answer_length``-token answer behind every prompt (greedy, temperature 0)."""
        if not prompts or any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        with torch.inference_mode():
            return self._sample(model, prompts, answer_length, mask_id, eos_id, eos_id if pad_id is None else pad_id)

    def _sample(self, model: PreTrainedModel, prompts: list[list[int]], answer_length: int, mask_id: int, eos_id: int,
                pad_id: int) -> DiffusionOutput:
        device, dtype = model.device, model.dtype
        ids, key_mask = left_pad(prompts, pad_id)
        start_answer = ids.shape[1]
        ids = torch.cat([ids, torch.full((len(prompts), answer_length), mask_id, dtype=torch.long)], dim=1).to(device)
        key_mask = torch.cat([key_mask, torch.ones(len(prompts), answer_length, dtype=torch.long)], dim=1).to(device)
        positions = (key_mask.cumsum(-1) - 1).clamp(min=0)
        full_mask = self._mask(key_mask, dtype, start_answer).to(device)
        prompt = self._encode_prompt(model, ids, positions, full_mask, start_answer - int(self.shift)) if self.causal_prompt else None
        logprobs = torch.zeros(ids.shape, dtype=torch.float32, device=device)
        out = DiffusionOutput([], [], [])
        carried: BlockStartCache | None = None
        for start, end in block_bounds(start_answer, answer_length, self.block_size):
            done = (ids[:, start_answer:start] == eos_id).any(-1)
            ids[done, start:] = torch.where(ids[done, start:] == mask_id, eos_id, ids[done, start:])
            if done.all():
                break
            active = (~done).nonzero().squeeze(-1)  # finished rows leave the batch
            block_ids, block_logprobs = ids[active], logprobs[active]
            step, carried = self._block(model, block_ids, positions[active], key_mask[active], full_mask[active], block_logprobs, start_answer,
                                        start, end, mask_id, active, prompt, carried)
            ids[active], logprobs[active] = block_ids, block_logprobs
            out.forward_passes += step
            out.steps_per_block.append(step)
        for row, answer in enumerate(ids[:, start_answer:].tolist()):
            cut = answer.index(eos_id) if eos_id in answer else len(answer)
            out.tokens.append(answer[:cut])
            out.token_logprobs.append(logprobs[row, start_answer:start_answer + cut].tolist())
            out.stopped.append(cut < len(answer))
        return out

    def _mask(self, key_mask: torch.Tensor, dtype: torch.dtype, answer_start: int, query_columns: list[int] | None = None,
              key_columns: list[int] | None = None) -> torch.Tensor:
        """The attention mask of queries at ``query_columns`` over keys at ``key_columns`` (default: all)."""
        if self.causal_prompt:
            return causal_prompt_mask(key_mask, dtype, answer_start, query_columns, key_columns)
        return bidirectional_mask(key_mask, dtype, queries=None if query_columns is None else len(query_columns))

    def _encode_prompt(self, model: PreTrainedModel, ids: torch.Tensor, positions: torch.Tensor, full_mask: torch.Tensor,
                       columns: int) -> PromptCache | None:
        """Run the causal prompt's first ``columns`` columns once and keep their keys and values."""
        if columns < 1:
            return None
        cache = DynamicCache()
        model.get_decoder()(input_ids=ids[:, :columns], attention_mask=full_mask[:, :, :columns, :columns], position_ids=positions[:, :columns],
                            cache=cache, use_cache=True)
        return PromptCache([(layer.keys, layer.values) for layer in cache.layers], columns)

    def _block(self, model: PreTrainedModel, ids: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor, full_mask: torch.Tensor,
               logprobs: torch.Tensor, answer_start: int, start: int, end: int, mask_id: int, batch_rows: torch.Tensor,
               prompt: PromptCache | None = None, carried: BlockStartCache | None = None) -> tuple[int, BlockStartCache | None]:
        """Unmask columns ``[start, end)`` of every row in place; return the steps (forwards)
        taken and the cache this block started with. ``batch_rows``: which rows of the batch
        these are; ``prompt``: the batch's prompt cache; ``carried``: the cache the block before
        started with (see ``full_forward_every``). A row whose block is complete leaves the
        cached steps (rows never attend to each other, so this is exact); the first forward
        runs every row."""
        initial = (ids[:, start:end] == mask_id).sum(-1)
        step, cache, cached_mask, started = 0, None, None, None
        while (masked := ids[:, start:end] == mask_id).any():
            if self.cache == "none" or cache is None or (self.refresh_every and step % self.refresh_every == 0):
                rows = torch.arange(ids.shape[0], device=ids.device)  # the rows the cache holds
                if step == 0 and carried is not None and self._restarts(carried):
                    hidden, cache, cached_mask = self._restart(model, ids, positions, key_mask, carried, batch_rows, start, end, answer_start)
                    since_full = carried.blocks_since_full + 1
                else:
                    hidden, cache, cached_mask = self._full(model, ids, positions, key_mask, full_mask, start, end,
                                                            None if prompt is None else prompt.for_rows(batch_rows))
                    since_full = 0
                if self.full_forward_every != 1 and step == 0:
                    started = BlockStartCache.of(cache, self._cached_columns(start, end, ids.shape[1]), batch_rows, cached_mask, since_full)
            else:
                if not (live := masked[rows].any(-1)).all():
                    kept = live.nonzero().squeeze(-1)
                    keep_rows(cache, kept)
                    rows, cached_mask = rows[kept], cached_mask[kept]
                hidden = self._cached(model, ids[rows], positions[rows], key_mask[rows], cache, cached_mask, start, end, answer_start)
            row_masked = masked[rows]
            confidence, tokens = self._predict(model, hidden, row_masked, mask_id)
            chosen = self.unmasking.select(confidence.cpu(), row_masked.cpu(), step, initial[rows].cpu()).to(ids.device)
            ids[rows, start:end] = torch.where(chosen, tokens, ids[rows, start:end])
            logprobs[rows, start:end] = torch.where(chosen, confidence.log(), logprobs[rows, start:end])
            step += 1
        return step, started

    def _restarts(self, carried: BlockStartCache) -> bool:
        """Whether the next block starts from ``carried`` rather than with a full forward."""
        return self.full_forward_every is None or carried.blocks_since_full + 1 < self.full_forward_every

    def _restart(self, model: PreTrainedModel, ids: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor,
                 carried: BlockStartCache, batch_rows: torch.Tensor, start: int, end: int, answer_start: int,
                 ) -> tuple[torch.Tensor, DynamicCache, torch.Tensor]:
        """A block's first forward from the cache the block before started with: the columns
        it does not hold before ``end`` (the block before, now decoded) and the block run against
        the rest (the prompt and the suffix after the block, as an earlier forward left them).
        Returns what :meth:`_full` does."""
        cached = set(carried.columns)
        run = [c for c in range(end) if c >= start or c not in cached]
        held = [c for c in carried.columns if not start <= c < end]
        cache, held_mask = carried.for_rows(batch_rows, held)
        keys = torch.cat([held_mask, key_mask[:, run]], dim=1)
        mask = self._mask(keys, model.dtype, answer_start, run, held + run)
        result = model.get_decoder()(input_ids=ids[:, run], attention_mask=mask.to(ids.device), position_ids=positions[:, run],
                                     cache=cache, use_cache=True)
        lead = start - int(self.shift)
        hidden = result.last_hidden_state[:, lead - run[0]:end - int(self.shift) - run[0]]
        columns = self._cached_columns(start, end, ids.shape[1])
        physical = {column: index for index, column in enumerate(held + run)}
        keep_columns(cache, [physical[c] for c in columns])
        return hidden, cache, key_mask[:, columns]

    @staticmethod
    def _predict(model: PreTrainedModel, hidden: torch.Tensor, masked: torch.Tensor, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each masked position's most likely token and its probability (zero elsewhere): the
        output layer runs on the masked positions only, the costliest product of a cached step."""
        confidence = torch.zeros(masked.shape, dtype=torch.float32, device=hidden.device)
        tokens = torch.zeros(masked.shape, dtype=torch.long, device=hidden.device)
        rows, columns = masked.nonzero(as_tuple=True)
        logits = model.get_output_embeddings()(hidden[rows, columns]).float()
        logits[:, mask_id] = -torch.inf  # a position is never "unmasked" to the mask token
        confidence[rows, columns], tokens[rows, columns] = logits.softmax(-1).max(-1)
        return confidence, tokens

    def _full(self, model: PreTrainedModel, ids: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor,
              full_mask: torch.Tensor, start: int, end: int, prompt: DynamicCache | None = None,
              ) -> tuple[torch.Tensor, DynamicCache | None, torch.Tensor | None]:
        """Run the whole sequence (after the columns ``prompt`` holds, against them); return the
        hidden states that predict the block and, when caching, the keys/values of the columns
        the cache keeps (and their padding mask)."""
        use_cache = self.cache != "none"
        lead = start - int(self.shift)  # first column that runs with the block
        first = 0 if prompt is None else prompt.get_seq_length()
        cache = prompt if prompt is not None else DynamicCache() if use_cache else None
        result = model.get_decoder()(input_ids=ids[:, first:], attention_mask=full_mask[:, :, first:], position_ids=positions[:, first:],
                                     cache=cache, use_cache=cache is not None)
        hidden = result.last_hidden_state[:, lead - first:end - int(self.shift) - first]
        if not use_cache:
            return hidden, None, None
        columns = self._cached_columns(start, end, ids.shape[1])
        keep_columns(cache, columns)
        return hidden, cache, key_mask[:, columns]

    def _cached_columns(self, start: int, end: int, width: int) -> list[int]:
        """The columns a cache keeps for block ``[start, end)``: those before the columns that
        run with the block and, with a dual cache, those after the block."""
        lead = start - int(self.shift)
        return list(range(lead)) + (list(range(end, width)) if self.cache == "dual" else [])

    def _cached(self, model: PreTrainedModel, ids: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor,
                cache: DynamicCache, cached_mask: torch.Tensor, start: int, end: int, answer_start: int) -> torch.Tensor:
        """Run the block (and, with a prefix cache, what follows it) against the cache; the
        cache is cut back to its columns afterwards."""
        lead = start - int(self.shift)
        stop = end if self.cache == "dual" else ids.shape[1]
        keys = torch.cat([cached_mask, key_mask[:, lead:stop]], dim=1)
        columns = list(range(lead, stop))
        mask = self._mask(keys, model.dtype, answer_start, columns, self._cached_columns(start, end, ids.shape[1]) + columns)
        result = model.get_decoder()(input_ids=ids[:, lead:stop], attention_mask=mask.to(ids.device),
                                     position_ids=positions[:, lead:stop], cache=cache, use_cache=True)
        keep_first(cache, cached_mask.shape[1])
        return result.last_hidden_state[:, : end - start]


def llada_sampler(block_size: int = 8, steps_per_block: int | None = None) -> BlockDiffusionSampler:
    """The baseline: fixed steps per block (default one token per step), no cache."""
    return BlockDiffusionSampler(block_size, FixedStepsUnmasking(steps_per_block or block_size), cache="none")


def fast_dllm_sampler(block_size: int = 8, threshold: float = 0.9, cache: str = "dual", left_to_right: bool = False,
                      full_forward_every: int | None = 1) -> BlockDiffusionSampler:
    """Fast-dLLM: dual cache and confidence-threshold parallel unmasking; ``left_to_right``
    accepts only the run of confident positions after the first masked one
    (:class:`LeftToRightUnmasking`); with ``full_forward_every`` k only every k-th block starts
    with a full forward (None: the first), the others from the cache of the block before."""
    rule = LeftToRightUnmasking(threshold) if left_to_right else ThresholdUnmasking(threshold)
    return BlockDiffusionSampler(block_size, rule, cache=cache, full_forward_every=full_forward_every)
