"""One copy of a base's weights for every adapter on it within a process.

An adapter merged into its base changes only the layers it targets (Gemma 3's adapters: the top
9 of 18 layers and some norms); its 670 MB embedding and its other layers are the base's.
:class:`SharedBases` loads each base once; :func:`shared_copy` gives an adapter a module tree of
its own whose parameters are the base's, and :func:`own_lora_targets` gives it its own copy of
the layers the merge will change, so that merging never writes into the shared weights.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Base = tuple["PreTrainedModel", "PreTrainedTokenizerBase"]


def shared_copy(model: "nn.Module") -> "nn.Module":
    """A copy of ``model``'s modules that holds ``model``'s own parameters and buffers (no weights copied)."""
    memo = {id(tensor): tensor for tensor in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo)


def own_lora_targets(peft_model: "nn.Module") -> None:
    """Give every layer a LoRA adapter wraps its own copy of its weights (before a merge writes into them)."""
    import torch
    from peft.tuners.lora import LoraLayer

    for module in peft_model.modules():
        if isinstance(module, LoraLayer):
            layer = module.get_base_layer()
            for name, parameter in list(layer.named_parameters(recurse=False)):
                setattr(layer, name, torch.nn.Parameter(parameter.detach().clone(), requires_grad=False))


def resident_bytes(modules: Iterable["nn.Module"]) -> int:
    """The bytes of the distinct tensor storages of ``modules`` (shared weights counted once)."""
    seen: dict[tuple[str, int], int] = {}
    for module in modules:
        for tensor in (*module.parameters(), *module.buffers()):
            storage = tensor.untyped_storage()
            seen[str(tensor.device), storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


@dataclass
class SharedBases:
    """Bases by name (a causal LM, or another NER model merged), each loaded once by ``load``."""

    load: Callable[[str], Base]
    _bases: dict[str, Base] = field(default_factory=dict)
    _locks: dict[str, threading.Lock] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, name: str) -> Base:
        """The base ``name``: the model itself (copy it with :func:`shared_copy`) and its tokenizer."""
        with self._lock:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:  # one load per base; other bases load meanwhile
            if name not in self._bases:
                loaded = self.load(name)
                with self._lock:
                    self._bases[name] = loaded
            return self._bases[name]

    def names(self) -> list[str]:
        with self._lock:
            return list(self._bases)

    def models(self) -> list["nn.Module"]:
        with self._lock:
            return [model for model, _ in self._bases.values()]

    def keep_only(self, names: set[str]) -> None:
        """Forget the bases not in ``names`` (their weights go once no adapter holds them)."""
        with self._lock:
            for name in [name for name in self._bases if name not in names]:
                del self._bases[name]
