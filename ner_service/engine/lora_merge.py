"""Merge a stored LoRA adapter straight into its base's weights, without building peft's layers.

A shipped model is an adapter over a public base; serving it merged is what makes it fast.
peft's ``PeftModel.from_pretrained(...).merge_and_unload()`` first wraps every target layer in a
LoRA layer (allocating, initialising and casting its matrices), then merges: most of a cold
start's loading time. The merge itself is ``W + scale * B @ A`` per target, which this module
computes from the adapter's files in one pass (float32 sums; bfloat16 products for a bfloat16 model).
It handles the plain LoRA that the trainers write (per-module ranks and alphas, rsLoRA, whole
modules saved beside it); any other kind of adapter is left to peft (:func:`mergeable` says
which). Every merged weight is a new tensor, so a base shared by several adapters
(:mod:`.shared_bases`) is never written into.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: The prefix peft writes before a module's name in an adapter's state dict.
SAVED_PREFIX = "base_model.model."
#: Adapter settings under which a merge is more than ``W + scale * B @ A`` (left to peft).
UNSUPPORTED_SETTINGS = ("use_dora", "fan_in_fan_out", "lora_bias", "layer_replication", "target_parameters",
                        "trainable_token_indices", "use_qalora", "alora_invocation_tokens")


@dataclass(frozen=True)
class LoraTarget:
    """One target layer's low-rank change: ``weight += scale * B @ A``."""

    module: str
    a: "torch.Tensor"
    b: "torch.Tensor"
    scale: float


def _pattern_value(pattern: dict[str, float], module: str, default: float) -> float:
    """A per-module rank or alpha: peft's keys match a module name's end (``(.*\\.)?key$``)."""
    for key, value in pattern.items():
        if re.fullmatch(rf"(.*\.)?{key}", module):
            return value
    return default


def mergeable(folder: Path) -> bool:
    """Whether ``folder`` holds a plain LoRA adapter in safetensors that :func:`merge_lora` merges."""
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError):
        return False
    if config.get("peft_type") != "LORA" or config.get("bias", "none") != "none" or not (folder / ADAPTER_WEIGHTS).is_file():
        return False
    return not any(config.get(setting) for setting in UNSUPPORTED_SETTINGS)


def _read(folder: Path) -> tuple[list[LoraTarget], dict[str, "torch.Tensor"]]:
    """The adapter's targets and its whole saved modules' tensors (by parameter name)."""
    from safetensors.torch import load_file

    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    tensors = {name.removeprefix(SAVED_PREFIX): tensor for name, tensor in load_file(str(folder / ADAPTER_WEIGHTS)).items()}
    rank, alpha = config["r"], config["lora_alpha"]
    ranks, alphas = config.get("rank_pattern") or {}, config.get("alpha_pattern") or {}
    targets, saved = [], {}
    for name, tensor in tensors.items():
        if ".lora_A." in name:
            module = name.split(".lora_A.")[0]
            r = _pattern_value(ranks, module, rank)
            a = _pattern_value(alphas, module, alpha)
            scale = a / math.sqrt(r) if config.get("use_rslora") else a / r
            targets.append(LoraTarget(module, tensor, tensors[name.replace(".lora_A.", ".lora_B.")], scale))
        elif ".lora_B." not in name:
            saved[name] = tensor
    return targets, saved


def merge_lora(model: "nn.Module", folder: Path) -> None:
    """Merge the LoRA adapter of ``folder`` into ``model`` (its base), in place of the module
    tree's parameters: each target's weight becomes a new tensor ``W + scale * B @ A``, each saved
    module's parameter the saved one. Checks every name before changing anything."""
    import torch

    targets, saved = _read(folder)
    modules = dict(model.named_modules())
    parameters = dict(model.named_parameters())
    missing = [t.module for t in targets if not isinstance(modules.get(t.module), torch.nn.Linear)]
    missing += [name for name in saved if name not in parameters]
    if missing:
        raise ValueError(f"adapter {folder} names what its base does not hold: {', '.join(missing[:5])}")
    with torch.no_grad():
        for target in targets:
            layer = modules[target.module]
            weight = layer.weight
            product = torch.bfloat16 if weight.dtype == torch.bfloat16 else torch.float32  # bfloat16 products accumulate in float32
            delta = (target.b.to(weight.device, product) @ target.a.to(weight.device, product)).to(torch.float32) * target.scale
            layer.weight = torch.nn.Parameter((weight.to(torch.float32) + delta).to(weight.dtype), requires_grad=False)
        for name, tensor in saved.items():
            owner, _, attribute = name.rpartition(".")
            current = parameters[name]
            setattr(modules[owner], attribute, torch.nn.Parameter(tensor.to(current.device, current.dtype, copy=True), requires_grad=False))
