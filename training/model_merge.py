"""Start a run from several NER models at once: the public base plus each model's change from it.

Models tuned from one public base (``en-conll03`` and ``zh-resume`` both stand on Gemma 3 270M)
keep much of what each learned when their changes are added (task arithmetic): a run that must
learn both tasks and more starts from that sum instead of from one of them.
"""

from __future__ import annotations

import torch

from ner_service.engine.model_loading import load_causal_lm
from ner_service.engine.ner_model import base_chain, load_base


class MergeError(ValueError):
    """The models to merge do not stand on the same public base."""


def public_base(name: str) -> str:
    """The causal LM at the bottom of ``name``'s chain of bases."""
    chain = base_chain(name)
    if not chain:
        raise MergeError(f"{name!r} is self-contained: it has no public base to take its change from")
    return chain[-1]


@torch.no_grad()
def add_model_changes(model: torch.nn.Module, first: str, others: list[str], device: str = "cpu") -> None:
    """Add to ``model`` (``first`` loaded, its adapters merged) each of ``others``' change from the
    public base they share with ``first``, in place."""
    if not others:
        return
    base = public_base(first)
    for other in others:
        if public_base(other) != base:
            raise MergeError(f"{other!r} stands on {public_base(other)!r}, {first!r} on {base!r}: their changes cannot be added")
    public = dict(load_causal_lm(base, dtype=torch.float32, device=device)[0].named_parameters())
    target = dict(model.named_parameters())
    for other in others:
        tuned, _ = load_base(other, dtype=torch.float32, device=device)
        for name, weight in tuned.named_parameters():
            change = weight - public[name]
            if change.abs().max() > 0:
                target[name].add_(change.to(target[name].dtype))
        del tuned
