"""Lexical-unit decoding (Sun et al. 2024, "Decoding at the Speed of Thought"): a model
fine-tuned by :mod:`training.lexical_units` predicts, from ``unit_size - 1`` placeholder
tokens fed after the last token, the tokens that follow the next one, so that a whole unit can
be emitted in one forward.

``get_decoder("lud")`` verifies the units: the placeholders' predictions are drafts that the
next forward checks against the greedy tokens (:class:`LexicalUnitDrafter` in the
draft-and-verify loop), so the answer is token for token greedy. ``get_decoder("lud",
threshold=t)`` is the paper's acceptance (:class:`ConfidentUnitDecoder`): every placeholder at
least ``t`` probable is emitted unverified, faster per forward but not lossless.

An adapter restricted to placeholder columns leaves every other column exactly what the model
without it computes, so the greedy token of each forward is the original model's:
:func:`restrict_adapter_to_placeholders` for training (peft's trainable layers, gated by a hook),
:func:`placeholder_adapter` for inference (a gather and a scatter-add per layer).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from general_decoding.base import DecodeInputs, Decoder, Generation, position_ids_from_mask
from general_decoding.draft_verify import Drafter, DraftVerifyDecoder, RowState, prefill
from general_decoding.kv_cache import ReservedCache, keep_first
from general_decoding.registry import register_decoder

if TYPE_CHECKING:  # for types only: the engine may run its own model class (no import of transformers' model classes)
    from transformers import PreTrainedModel

#: Attribute of ``model.config`` holding the placeholder token id of a LUD-trained model.
PLACEHOLDER_ATTRIBUTE = "lud_placeholder_id"


def placeholder_id_of(model: PreTrainedModel, given: int | None = None) -> int:
    """``given``, else the placeholder token id a LUD-trained model was fine-tuned with."""
    if given is not None:
        return given
    value = getattr(model.config, PLACEHOLDER_ATTRIBUTE, None)
    if value is None:
        raise ValueError("this model was not fine-tuned for lexical units (train it with `padellm-ner train-lud`)")
    return int(value)


class PlaceholderColumns:
    """Which columns of the current forward hold the placeholder token: the gate of a LoRA
    adapter restricted by :func:`restrict_adapter_to_placeholders` or :func:`placeholder_adapter`."""

    def __init__(self, placeholder_id: int) -> None:
        self.placeholder_id = placeholder_id
        self.mask: torch.Tensor | None = None
        self.flat: torch.Tensor | None = None

    def see(self, input_ids: torch.Tensor) -> None:
        """Take the columns of ``input_ids`` (``[batch, length]``) for the next forward: ``mask``,
        and ``flat``, their indices in the flattened batch (None when there is none)."""
        self.mask = input_ids == self.placeholder_id
        flat = self.mask.reshape(-1).nonzero().squeeze(1)
        self.flat = flat if flat.numel() else None

    def gate(self, module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        """A forward hook on a LoRA ``B`` matrix: its update, zero outside placeholder columns."""
        if self.mask is None or self.mask.shape != output.shape[:2]:
            raise RuntimeError("the placeholder columns of this forward are unknown: feed input_ids, or call see() first")
        return output * self.mask.to(output.device, output.dtype).unsqueeze(-1)


class PlaceholderLoRALinear(torch.nn.Module):
    """A linear layer plus a frozen LoRA update (``up @ down``, scaled) at placeholder columns
    only: a gather, two thin products and a scatter-add, nothing at all in a forward without
    placeholders. The inference form of a lexical-unit adapter (:func:`placeholder_adapter`)."""

    def __init__(self, base: torch.nn.Module, down: torch.Tensor, up: torch.Tensor, columns: PlaceholderColumns) -> None:
        super().__init__()
        self.base = base
        dtype = base.weight.dtype  # peft keeps adapters in float32 under a bfloat16 base: products in the base's dtype
        self.register_buffer("down", down.detach().t().contiguous().to(dtype), persistent=False)  # [in, r]
        self.register_buffer("up", up.detach().t().contiguous().to(dtype), persistent=False)  # [r, out], scaled
        self.columns = columns

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        rows = self.columns.flat
        if rows is None:
            return out
        update = torch.mm(torch.mm(x.reshape(-1, x.shape[-1]).index_select(0, rows), self.down), self.up)
        flat = out.reshape(-1, out.shape[-1])
        return flat.index_add_(0, rows, update.to(flat.dtype)).reshape(out.shape)


def _see_input_ids(model: PreTrainedModel, columns: PlaceholderColumns) -> None:
    model.get_input_embeddings().register_forward_hook(lambda module, args, output: columns.see(args[0]))


def restrict_adapter_to_placeholders(model: PreTrainedModel, placeholder_id: int) -> PlaceholderColumns:
    """Gate every (unmerged, trainable) LoRA update of ``model`` to the columns that hold
    ``placeholder_id``; the columns are read from the token ids each forward embeds (training
    from hidden states calls :meth:`PlaceholderColumns.see` itself)."""
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
    _see_input_ids(model, columns)
    return columns


def placeholder_adapter(model: PreTrainedModel, placeholder_id: int) -> PlaceholderColumns:
    """Replace every LoRA layer of ``model`` (a peft model's base model, for inference) by a
    :class:`PlaceholderLoRALinear` of its base layer and its active adapter's weights."""
    columns = PlaceholderColumns(placeholder_id)
    lora_layers = [(name, module) for name, module in model.named_modules()
                   if isinstance(getattr(module, "lora_A", None), torch.nn.ModuleDict) and module.lora_A]
    if not lora_layers:
        raise ValueError("the model has no LoRA adapter to restrict to placeholder columns")
    for name, module in lora_layers:
        (adapter,) = module.active_adapters
        replacement = PlaceholderLoRALinear(module.base_layer, module.lora_A[adapter].weight,
                                            module.lora_B[adapter].weight * module.scaling[adapter], columns)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, replacement)
    _see_input_ids(model, columns)
    return columns


def confident_prefix(tokens: list[int], probabilities: list[float], threshold: float) -> list[int]:
    """The leading ``tokens`` whose probability is >= ``threshold``."""
    prefix = []
    for token, probability in zip(tokens, probabilities):
        if probability < threshold:
            break
        prefix.append(token)
    return prefix


def accepted_unit(first: int, placeholder_tokens: list[int], placeholder_probs: list[float], threshold: float) -> list[int]:
    """``first`` and the leading placeholder predictions whose probability is >= ``threshold``."""
    return [first] + confident_prefix(placeholder_tokens, placeholder_probs, threshold)


class ConfidentUnitDecoder(Decoder):
    """Up to ``unit_size`` tokens per forward: the greedy token and the confident placeholders."""

    def __init__(self, unit_size: int = 4, threshold: float = 0.9, placeholder_id: int | None = None) -> None:
        if unit_size < 2:
            raise ValueError(f"unit_size must be >= 2, got {unit_size}")
        self.unit_size, self.threshold, self.placeholder_id = unit_size, threshold, placeholder_id

    def _generate(self, model: PreTrainedModel, inputs: DecodeInputs) -> Generation:
        placeholder = placeholder_id_of(model, self.placeholder_id)
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


class LexicalUnitDrafter(Drafter):
    """Drafts what the placeholders fed after the previous draft predicted: the tokens after
    that forward's bonus token, valid when its draft was accepted whole (else none), up to the
    first prediction less than ``min_probability`` probable: a column the next forward would
    most likely reject costs a verification column for nothing."""

    def __init__(self, unit_size: int = 4, placeholder_id: int | None = None, min_probability: float = 0.0) -> None:
        if unit_size < 2:
            raise ValueError(f"unit_size must be >= 2, got {unit_size}")
        if not 0.0 <= min_probability < 1.0:
            raise ValueError(f"min_probability must be in [0, 1), got {min_probability}")
        self.unit_size, self.placeholder_id, self.min_probability = unit_size, placeholder_id, min_probability
        self._next: list[list[int]] = []

    def start(self, states: list[RowState], model: PreTrainedModel) -> None:
        placeholder = placeholder_id_of(model, self.placeholder_id)
        self.trailing = (placeholder,) * (self.unit_size - 1)
        self._next = [[] for _ in states]

    def propose(self, row: int, state: RowState, budget: int) -> list[int]:
        return self._next[row][:budget]

    def observe(self, row: int, state: RowState, predictions: list[int], accepted: int, trailing: list[int],
                trailing_logprobs: list[float]) -> None:
        whole = accepted == len(predictions) - 1
        self._next[row] = confident_prefix(trailing, [math.exp(lp) for lp in trailing_logprobs], self.min_probability) if whole else []


@register_decoder("lud")
def lexical_unit_decoder(unit_size: int = 4, threshold: float | None = None, placeholder_id: int | None = None,
                         min_probability: float = 0.0) -> Decoder:
    """Units drafted by the placeholders and verified (token for token greedy; a draft stops
    before a placeholder prediction less than ``min_probability`` probable), or with a
    ``threshold`` accepted unverified when confident (:class:`ConfidentUnitDecoder`)."""
    if threshold is None:
        return DraftVerifyDecoder(LexicalUnitDrafter(unit_size, placeholder_id, min_probability), max_draft=unit_size - 1)
    return ConfidentUnitDecoder(unit_size, threshold, placeholder_id)
