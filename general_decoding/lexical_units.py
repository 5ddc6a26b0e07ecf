"""Lexical-unit decoding (Sun et al. 2024, "Decoding at the Speed of Thought"): a model
fine-tuned by :mod:`training.lexical_units` predicts, from ``unit_size - 1`` placeholder
tokens fed after the last token, the tokens that follow the next one; a whole unit is
emitted in one forward when the model is confident, one token otherwise.

Each forward feeds, per row, the tokens emitted by the previous forward (not yet cached) and
the placeholders. The last emitted token's column gives the next token ``g_0`` (exactly the
greedy token); placeholder ``j`` gives ``g_j``, kept while its probability is at least
``threshold`` (and every earlier one was kept). Placeholder columns leave the cache after
the forward. Not lossless: a confident placeholder may differ from what greedy decoding
would have produced; ``threshold > 1`` is plain greedy decoding.

:func:`restrict_adapter_to_placeholders` makes a LoRA adapter apply at placeholder columns only:
every other column then computes exactly what the model without the adapter computes, so the
greedy token of each forward is the original model's, and placeholders cannot change it.
"""

from __future__ import annotations

import math

import torch
from transformers import PreTrainedModel

from general_decoding.base import DecodeInputs, Decoder, Generation, position_ids_from_mask
from general_decoding.draft_verify import prefill
from general_decoding.kv_cache import ReservedCache, keep_first
from general_decoding.registry import register_decoder

#: Attribute of ``model.config`` holding the placeholder token id of a LUD-trained model.
PLACEHOLDER_ATTRIBUTE = "lud_placeholder_id"


def placeholder_id_of(model: PreTrainedModel) -> int:
    """The placeholder token id a LUD-trained model was fine-tuned with."""
    value = getattr(model.config, PLACEHOLDER_ATTRIBUTE, None)
    if value is None:
        raise ValueError("this model was not fine-tuned for lexical units (train it with `padellm-ner train-lud`)")
    return int(value)


class PlaceholderColumns:
    """Which columns of the current forward hold the placeholder token: the gate of a LoRA
    adapter restricted by :func:`restrict_adapter_to_placeholders`."""

    def __init__(self, placeholder_id: int) -> None:
        self.placeholder_id = placeholder_id
        self.mask: torch.Tensor | None = None

    def see(self, input_ids: torch.Tensor) -> None:
        """Take the columns of ``input_ids`` (``[batch, length]``) for the next forward."""
        self.mask = input_ids == self.placeholder_id

    def gate(self, module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        """A forward hook on a LoRA ``B`` matrix: its update, zero outside placeholder columns."""
        if self.mask is None or self.mask.shape != output.shape[:2]:
            raise RuntimeError("the placeholder columns of this forward are unknown: feed input_ids, or call see() first")
        return output * self.mask.to(output.device, output.dtype).unsqueeze(-1)


def restrict_adapter_to_placeholders(model: PreTrainedModel, placeholder_id: int) -> PlaceholderColumns:
    """Gate every (unmerged) LoRA update of ``model`` to the columns that hold ``placeholder_id``;
    the columns are read from the token ids each forward embeds (training from hidden states
    calls :meth:`PlaceholderColumns.see` itself)."""
    columns = PlaceholderColumns(placeholder_id)
    gated = 0
    for module in model.modules():
        lora_b = getattr(module, "lora_B", None)
        if isinstance(lora_b, torch.nn.ModuleDict):
            for linear in lora_b.values():
                linear.register_forward_hook(columns.gate)
                gated += 1
    if not gated:
        raise ValueError("the model has no LoRA adapter to restrict to placeholder columns")
    model.get_input_embeddings().register_forward_hook(lambda module, args, output: columns.see(args[0]))
    return columns


def accepted_unit(first: int, placeholder_tokens: list[int], placeholder_probs: list[float], threshold: float) -> list[int]:
    """``first`` and the leading placeholder predictions whose probability is >= ``threshold``."""
    unit = [first]
    for token, probability in zip(placeholder_tokens, placeholder_probs):
        if probability < threshold:
            break
        unit.append(token)
    return unit


@register_decoder("lud")
class LexicalUnitDecoder(Decoder):
    """Up to ``unit_size`` tokens per forward: the greedy token and the confident placeholders."""

    def __init__(self, unit_size: int = 4, threshold: float = 0.9, placeholder_id: int | None = None) -> None:
        if unit_size < 2:
            raise ValueError(f"unit_size must be >= 2, got {unit_size}")
        self.unit_size, self.threshold, self.placeholder_id = unit_size, threshold, placeholder_id

    def _generate(self, model: PreTrainedModel, inputs: DecodeInputs) -> Generation:
        placeholder = self.placeholder_id if self.placeholder_id is not None else placeholder_id_of(model)
        placeholders = self.unit_size - 1
        device, stop = inputs.input_ids.device, inputs.stop
        cache = inputs.past_key_values if inputs.past_key_values is not None else ReservedCache()
        states = prefill(model, inputs, cache)
        pending = [[s.tokens[-1]] if not s.done else [] for s in states]  # emitted, not yet cached
        forwards, accepted_per_pass = 1, [len(states)]
        mask = inputs.attention_mask
        while not all(s.done for s in states):
            width = max(len(p) for p in pending)
            ids = torch.tensor([[0] * (width - len(p)) + p + [placeholder] * placeholders for p in pending], device=device)
            block = torch.tensor([[0] * (width - len(p)) + [1] * len(p) + [int(bool(p))] * placeholders for p in pending],
                                 device=device)
            full_mask = torch.cat([mask, block], dim=1)
            positions = position_ids_from_mask(full_mask)[:, -ids.shape[1]:]
            past = cache.get_seq_length()
            logits = model(input_ids=ids, attention_mask=full_mask, position_ids=positions, cache=cache,
                           use_cache=True, logits_to_keep=self.unit_size).logits
            forwards += 1
            probs = torch.softmax(logits.float(), dim=-1)
            best_p, best = probs.max(-1)
            emitted_now = 0
            for state, row_pending, row_best, row_p in zip(states, pending, best.tolist(), best_p.tolist()):
                if not row_pending:
                    continue
                row_pending.clear()
                unit = accepted_unit(row_best[0], row_best[1:], row_p[1:], self.threshold)
                before = len(state.tokens) + int(state.stopped)
                for token, probability in zip(unit, row_p):
                    state.emit(token, math.log(max(probability, 1e-45)), stop)
                    if state.done:
                        break
                    row_pending.append(token)
                emitted_now += len(state.tokens) + int(state.stopped) - before
                if state.done:
                    row_pending.clear()
            accepted_per_pass.append(emitted_now)
            keep_first(cache, past + width)  # placeholder columns leave the cache
            mask = torch.cat([mask, block[:, :width]], dim=1)
        return Generation([s.tokens for s in states], [s.logprobs for s in states], [s.score for s in states],
                          [s.stopped for s in states], forwards, accepted_per_pass)
