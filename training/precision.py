"""How a training run computes: the dtype its weights are kept in and the dtype of its matrix products.

``mixed`` keeps the weights, gradients and optimizer in float32 and runs the matrix products in
bfloat16 (``torch.autocast``). Whether that pays depends on the CPU: one without bfloat16
instructions (AVX2 only) emulates them, and a step ran about 25x slower than in float32; one with
them (AVX512_BF16 or AMX) runs a bfloat16 product several times faster than a float32 one
(docs/training.md). ``auto`` picks per machine: ``mixed`` on such a CPU, ``float32`` on any other
CPU, ``bfloat16`` weights on a GPU.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ContextManager

import torch

from training.configs import DTYPE_CHOICES


@dataclass(frozen=True)
class Precision:
    """The weights' dtype and, when it differs, the dtype of the matrix products (autocast)."""

    name: str
    weights: torch.dtype
    products: torch.dtype

    def autocast(self, device: str) -> ContextManager:
        """The context a forward pass runs in: autocast to :attr:`products` where they differ
        from the weights, nothing otherwise. The backward pass follows the forward's dtypes."""
        if self.products == self.weights:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(device).type, dtype=self.products)


PRECISIONS = {
    "float32": Precision("float32", torch.float32, torch.float32),
    "bfloat16": Precision("bfloat16", torch.bfloat16, torch.bfloat16),
    "mixed": Precision("mixed", torch.float32, torch.bfloat16),
}


def cpu_has_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AVX512_BF16 or AMX tiles)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def resolve_precision(dtype: str, device: str, cpu_bfloat16: bool | None = None) -> Precision:
    """The precision ``dtype`` names; for ``"auto"`` the fast one on ``device`` (``cpu_bfloat16``:
    whether the CPU has bfloat16 instructions, by default this machine's)."""
    if dtype == "auto":
        if torch.device(device).type != "cpu":
            return PRECISIONS["bfloat16"]
        return PRECISIONS["mixed" if (cpu_has_bfloat16() if cpu_bfloat16 is None else cpu_bfloat16) else "float32"]
    if dtype not in PRECISIONS:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_CHOICES)}")
    return PRECISIONS[dtype]
