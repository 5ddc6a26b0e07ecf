"""The tanh approximation of GELU computed as the exact GELU where bfloat16 cannot tell them apart.

Gemma's MLP (``gelu_pytorch_tanh``) calls ``F.gelu(x, approximate="tanh")``. On the CPU, PyTorch's
bfloat16 kernel of the tanh form is 3-5x slower than that of the exact (erf) form on the same
tensor, and it is about a ninth of a bfloat16 forward. The two functions differ by at most
4.7e-4 anywhere (near x = 2.7, where bfloat16's step is 1.6e-2): in bfloat16 a value of the size
the next product adds up differs at most by one rounding step, and only where it lies that close
to a rounding boundary. So for bfloat16 (and float16) inference on the CPU the activation takes
the exact form; in float32, with autograd on (training), or on another device it stays the tanh
approximation the model was trained with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: The dtypes whose resolution hides the difference between the two forms.
HALF_DTYPES = (torch.bfloat16, torch.float16)


class ExactGELUForHalf(nn.Module):
    """A tanh-approximated GELU module that computes the exact GELU for CPU inference in 16 bits."""

    def __init__(self, tanh_gelu: nn.Module) -> None:
        super().__init__()
        self.tanh_gelu = tanh_gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in HALF_DTYPES and x.is_cpu and not torch.is_grad_enabled():
            return F.gelu(x)
        return self.tanh_gelu(x)


def tanh_gelu_classes() -> tuple[type, ...]:
    """The activation modules of Hugging Face models that compute ``gelu(x, approximate="tanh")``."""
    from transformers import activations

    return tuple({getattr(activations, name) for name in ("GELUTanh", "PytorchGELUTanh") if hasattr(activations, name)})


def is_tanh_gelu(module: nn.Module) -> bool:
    """Whether ``module`` computes ``gelu(x, approximate="tanh")``: torch's ``nn.GELU("tanh")`` or a
    Hugging Face activation (:func:`tanh_gelu_classes`, asked only of modules torch does not define)."""
    if isinstance(module, nn.GELU):
        return module.approximate == "tanh"
    return type(module).__module__.startswith("transformers.") and isinstance(module, tanh_gelu_classes())


def use_exact_gelu(model: nn.Module, enabled: bool = True) -> int:
    """Wrap every tanh-approximated GELU module of ``model`` in :class:`ExactGELUForHalf` in place
    (or unwrap them, with ``enabled=False``); returns how many were changed. No weights change."""
    changed = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if enabled and is_tanh_gelu(child):
                setattr(parent, name, ExactGELUForHalf(child))
            elif not enabled and isinstance(child, ExactGELUForHalf):
                setattr(parent, name, child.tanh_gelu)
            else:
                continue
            changed += 1
    return changed
