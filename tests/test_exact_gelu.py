"""The tanh-approximated GELU is computed exactly in bfloat16 CPU inference only, and a Gemma model
finds the same entities either way."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.activations import GELUTanh

from general_decoding.exact_gelu import ExactGELUForHalf, use_exact_gelu

SENTENCES = [
    "EU rejects German call to boycott British lamb .",
    "Peter Blackburn visited Brussels with officials of the European Commission .",
]


def test_bfloat16_inference_takes_the_exact_form_one_rounding_step_from_the_tanh_one() -> None:
    torch.manual_seed(0)
    x = (torch.randn(64, 512) * 3).to(torch.bfloat16)
    gelu = ExactGELUForHalf(GELUTanh())
    with torch.inference_mode():
        got, tanh = gelu(x), F.gelu(x, approximate="tanh")
    assert torch.equal(got, F.gelu(x))
    gap = (got.float() - tanh.float()).abs()
    assert float(gap.max()) <= 4.8e-4 + torch.finfo(torch.bfloat16).eps * float(tanh.float().abs().max())
    large = tanh.float().abs() >= 0.05  # what a product adds up: at most one rounding step apart
    assert bool((gap[large] <= torch.finfo(torch.bfloat16).eps * tanh.float().abs()[large]).all())
    assert not torch.equal(got, tanh)  # the forms do differ somewhere: the wrapper did take the exact one


def test_float32_and_training_keep_the_tanh_approximation() -> None:
    torch.manual_seed(0)
    gelu = ExactGELUForHalf(GELUTanh())
    x32 = torch.randn(8, 64) * 3
    with torch.inference_mode():
        assert torch.equal(gelu(x32), F.gelu(x32, approximate="tanh"))
    x16 = (torch.randn(8, 64) * 3).to(torch.bfloat16).requires_grad_()
    out = gelu(x16)
    assert torch.equal(out.detach(), F.gelu(x16.detach(), approximate="tanh"))
    out.float().sum().backward()
    assert x16.grad is not None and x16.grad.abs().sum() > 0


def test_a_bfloat16_gemma_model_finds_the_same_entities_with_either_form(en_engine) -> None:
    from ner_service.engine import NEREngine

    engine = NEREngine.load(en_engine.ner_model.config.name, dtype="bfloat16")
    model = engine.ner_model.model
    wrapped = [m for m in model.modules() if isinstance(m, ExactGELUForHalf)]
    assert len(wrapped) == model.config.num_hidden_layers  # one per MLP, as the loader leaves them
    exact = [[(e.start, e.end, e.label) for e in r.entities] for r in engine.extract(SENTENCES)]
    assert use_exact_gelu(model, enabled=False) == len(wrapped)
    assert not any(isinstance(m, ExactGELUForHalf) for m in model.modules())
    tanh = [[(e.start, e.end, e.label) for e in r.entities] for r in engine.extract(SENTENCES)]
    assert exact == tanh and any(exact)

