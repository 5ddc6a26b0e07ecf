"""SkinnyLinear computes what nn.Linear computes, and a model using it decodes as before."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from general_decoding import StopCriteria, get_decoder
from general_decoding.skinny_linear import MAX_ROWS, SkinnyLinear, use_skinny_linear
from ner_service.engine import prompts


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (3, 1), (2, 5), (1, MAX_ROWS), (1, MAX_ROWS + 1), (4, 50)])
def test_same_values_as_linear(bias: bool, shape: tuple[int, int]) -> None:
    torch.manual_seed(0)
    plain = nn.Linear(64, 96, bias=bias)
    skinny = copy.deepcopy(plain)
    assert use_skinny_linear(skinny) == 1 and type(skinny) is SkinnyLinear
    x = torch.randn(*shape, 64)
    with torch.inference_mode():
        got, want = skinny(x), plain(x)
    assert got.shape == want.shape == (*shape, 96)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_training_takes_the_plain_path_and_gets_gradients() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(8, 4)
    use_skinny_linear(layer)
    x = torch.randn(2, 8)
    out = layer(x)
    assert torch.equal(out, F.linear(x, layer.weight, layer.bias))
    out.sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0


def test_state_dict_is_unchanged() -> None:
    layer = nn.Linear(8, 4)
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    use_skinny_linear(layer)
    assert layer.state_dict().keys() == before.keys()
    assert all(torch.equal(layer.state_dict()[k], v) for k, v in before.items())


def test_loaded_models_use_it_and_greedy_output_is_unchanged(tiny_engine) -> None:
    """load_causal_lm turns the layers; turning them back gives the same greedy tokens."""
    model, tokenizer = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is SkinnyLinear for m in linears)
    plain = copy.deepcopy(model)
    assert use_skinny_linear(plain, enabled=False) == len(linears)
    ids = torch.tensor([tokenizer(prompts.prefix("EU rejects German call to boycott British lamb .")).input_ids
                        + tokenizer(prompts.ar_query(), add_special_tokens=False).input_ids])
    stop = StopCriteria(24, frozenset({tiny_engine.ner_model.eos_token_id}))
    greedy = get_decoder("greedy")
    assert greedy.generate(model, ids, stop).tokens == greedy.generate(plain, ids, stop).tokens
