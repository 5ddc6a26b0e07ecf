"""The direct LoRA merge (ner_service/engine/lora_merge.py) gives the weights peft's merge gives."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ner_service.engine.lora_merge import mergeable
from ner_service.engine.ner_model import NERModel, load_base, resolve_ner_model

pytestmark = pytest.mark.slow


def _peft_merged(folder: Path, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The base's parameters, and peft's merge of the adapter into them."""
    from peft import PeftModel

    base, _ = load_base("gemma3-270m", dtype)
    before = {name: tensor.detach().clone() for name, tensor in base.named_parameters()}
    return before, dict(PeftModel.from_pretrained(base, folder).merge_and_unload().named_parameters())


def test_the_shipped_adapter_merged_from_its_files_has_the_weights_of_peft_merge(en_engine) -> None:
    folder = resolve_ner_model("en-conll03")
    assert mergeable(folder)
    merged = dict(en_engine.ner_model.model.named_parameters())  # float32, merged by lora_merge
    base, reference = _peft_merged(folder, torch.float32)
    assert merged.keys() == reference.keys()
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-5, atol=1e-6, msg=name)
    changed = [name for name in merged if not torch.equal(merged[name], base[name])]
    assert any(name.endswith("mlp.down_proj.weight") for name in changed)  # a LoRA target
    assert any(name.endswith("input_layernorm.weight") for name in changed)  # a module saved whole
    assert not any("embed_tokens" in name for name in changed)


def test_a_bfloat16_merge_is_the_float32_merge_rounded(en_engine) -> None:
    model = NERModel.load("en-conll03", dtype=torch.bfloat16).model
    exact = dict(en_engine.ner_model.model.named_parameters())
    for name, tensor in model.named_parameters():
        assert tensor.dtype == torch.bfloat16
        torch.testing.assert_close(tensor.float(), exact[name], rtol=2e-2, atol=2e-3, msg=name)


def test_an_adapter_other_than_plain_lora_is_left_to_peft(tmp_path: Path) -> None:
    source = resolve_ner_model("en-conll03")
    config = json.loads((source / "adapter_config.json").read_text())
    for setting, value in (("use_dora", True), ("bias", "all"), ("peft_type", "IA3")):
        folder = tmp_path / setting
        folder.mkdir()
        (folder / "adapter_model.safetensors").symlink_to(source / "adapter_model.safetensors")
        (folder / "adapter_config.json").write_text(json.dumps({**config, setting: value}))
        assert not mergeable(folder), setting
    shutil.copy(source / "adapter_config.json", tmp_path / "adapter_config.json")
    assert not mergeable(tmp_path)  # no weights in safetensors
