"""Linear layers that stay fast on the CPU when a forward feeds only a few tokens.

Decoding feeds one token per row (greedy) or a handful (a draft to verify, a tree of
branches). For so few rows, ``F.linear`` (``x @ W.T``) makes the CPU BLAS pack the whole
weight matrix on every call, and one row takes its single-threaded matrix-vector path:
on a 2-core machine a 2-token forward of SmolLM2-135M cost 1.6-2x a 1-token forward. The
same product taken the other way round, ``(W @ x.T).T``, streams the weights once for all
rows (a lone row is doubled so that it takes the same kernel). With it the 2-token forward
costs about 1.4x the 1-token one, and both get faster (``benchmarks/general_decoders.py``).

Past a few rows the BLAS is fast for multiples of 8 only: over the 210 linear layers of
SmolLM2-135M (weights streamed from memory, as in a forward) 15 rows took 99 ms and 16 rows
52 ms, 31 rows 117 ms and 32 rows 72 ms. More than 8 rows are therefore padded with zero rows
to the next multiple of 8 (:func:`padded_rows`), which are cut from the result
(``benchmarks/skinny_linear.py`` measures forwards of odd widths both ways).

Only inference on the CPU takes the other path: on another device, with autograd on, or
for more than :data:`MAX_ROWS` rows the layer is a plain ``nn.Linear``. The weights and the
state dict are untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: above this many rows ``F.linear`` is as fast (the product is compute-bound)
MAX_ROWS = 128
#: past 8 rows, products are computed for a multiple of this many rows
ROW_BLOCK = 8


def padded_rows(rows: int) -> int:
    """The number of rows a product of ``rows`` rows is computed for: 2 for 1 (the kernel of
    two rows is the faster), up to 8 as they are, then the next multiple of :data:`ROW_BLOCK`."""
    if rows == 1:
        return 2
    return rows if rows <= ROW_BLOCK else -(-rows // ROW_BLOCK) * ROW_BLOCK


class SkinnyLinear(nn.Linear):
    """``nn.Linear`` whose CPU inference forward for at most :data:`MAX_ROWS` rows computes
    ``(W @ x.T).T``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if not x.is_cpu or torch.is_grad_enabled() or not 0 < rows <= MAX_ROWS or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, x.shape[-1])
        padded = padded_rows(rows)
        if padded > rows:
            flat = torch.cat([flat, flat.new_zeros(padded - rows, flat.shape[1])])
        out = torch.mm(self.weight, flat.t()).t()[:rows]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def use_skinny_linear(model: nn.Module, enabled: bool = True) -> int:
    """Turn every plain ``nn.Linear`` of ``model`` into a :class:`SkinnyLinear` in place (or
    back, with ``enabled=False``; the weights stay); returns how many were turned."""
    source, target = (nn.Linear, SkinnyLinear) if enabled else (SkinnyLinear, nn.Linear)
    turned = 0
    for module in model.modules():
        if type(module) is source:
            module.__class__ = target
            turned += 1
    return turned
