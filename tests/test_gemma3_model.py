"""The package's own Gemma 3 class (ner_service/engine/gemma3_model.py) and the merged weights kept
in the cache (merged_weights.py): real Gemma 3 270M forwards against transformers' class, bit for
bit, in every form of call the engine and the decoders make; the engine on them; a cold process
that imports none of transformers' model classes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from general_decoding.kv_cache import ReservedCache
from ner_service.engine import NEREngine, gemma3_model
from ner_service.engine.cpu import torch_dtype
from ner_service.engine.model_loading import GEMMA3, SMOLLM2, ModelNotFoundError, cache_root, load_causal_lm, resolve_model_folder

REPO = Path(__file__).resolve().parent.parent
TEXTS = ["Peter Blackburn met John Smith in BRUSSELS .", "EU rejects German call to boycott British lamb .",
         "Japan began the defence of their Asian Cup title with a lucky 2-1 win against Syria in Al Ain on Friday ."]


def _both(dtype: torch.dtype):
    try:
        theirs, tokenizer = load_causal_lm(GEMMA3.alias, dtype=dtype)
    except ModelNotFoundError as error:
        pytest.skip(str(error))
    ours, _ = load_causal_lm(GEMMA3.alias, dtype=dtype, native=True)
    return theirs, ours, tokenizer


#: The dtype this machine serves in: bfloat16 on a CPU with bfloat16 instructions, else float32
#: (where bfloat16 products are emulated, and many times slower).
SERVED = torch_dtype("auto")


@pytest.fixture(scope="module")
def pair():
    """transformers' class and ours in the dtype this machine serves in (float32 too: below)."""
    return _both(SERVED)


def _batch(tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [tokenizer(text).input_ids for text in texts]
    width = max(map(len, rows))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    return ids, mask


def test_the_class_and_its_modules_carry_transformers_names_and_weights(pair) -> None:
    theirs, ours, _ = pair
    assert type(ours) is gemma3_model.Gemma3ForCausalLM and type(theirs).__module__.startswith("transformers.")
    their_state, our_state = theirs.state_dict(), ours.state_dict()
    assert set(their_state) == set(our_state)
    assert all(torch.equal(their_state[name], our_state[name]) for name in their_state)
    assert ours.lm_head.weight is ours.model.embed_tokens.weight and ours.dtype == theirs.dtype
    assert not any(p.requires_grad for p in ours.parameters())


def test_left_padded_rows_give_transformers_logits_bit_for_bit(pair) -> None:
    theirs, ours, tokenizer = pair
    ids, mask = _batch(tokenizer, TEXTS)
    with torch.inference_mode():
        for attention_mask in (None, mask):
            assert torch.equal(theirs(input_ids=ids, attention_mask=attention_mask).logits, ours(input_ids=ids, attention_mask=attention_mask).logits)
        assert torch.equal(theirs(input_ids=ids, attention_mask=mask, logits_to_keep=1).logits,
                           ours(input_ids=ids, attention_mask=mask, logits_to_keep=1).logits)


def _decoded_on_a_cache(model, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Logits of a prefix, then a draft of three tokens, then one token, appended to one cache."""
    cache = ReservedCache()
    with torch.inference_mode():
        return [model(input_ids=ids[:, :-4], attention_mask=mask[:, :-4], cache=cache, use_cache=True).logits,
                model(input_ids=ids[:, -4:-1], attention_mask=mask[:, :-1], cache=cache, use_cache=True).logits,
                model(input_ids=ids[:, -1:], attention_mask=mask, cache=cache, use_cache=True).logits]


def test_decoding_on_a_cache_gives_transformers_logits_bit_for_bit(pair) -> None:
    theirs, ours, tokenizer = pair
    ids, mask = _batch(tokenizer, TEXTS)
    assert all(torch.equal(a, b) for a, b in zip(_decoded_on_a_cache(theirs, ids, mask), _decoded_on_a_cache(ours, ids, mask)))


def test_in_float32_too_padded_rows_and_a_cache_give_transformers_logits_bit_for_bit() -> None:
    theirs, ours, tokenizer = _both(torch.float32)
    ids, mask = _batch(tokenizer, TEXTS)
    with torch.inference_mode():
        assert torch.equal(theirs(input_ids=ids, attention_mask=mask).logits, ours(input_ids=ids, attention_mask=mask).logits)
    assert all(torch.equal(a, b) for a, b in zip(_decoded_on_a_cache(theirs, ids, mask), _decoded_on_a_cache(ours, ids, mask)))


def test_a_tree_mask_of_its_own_and_positions_give_transformers_hidden_states(pair) -> None:
    theirs, ours, tokenizer = pair
    ids, _ = _batch(tokenizer, TEXTS[:1])
    width = ids.shape[1]
    allowed = torch.ones(width, width, dtype=torch.bool).tril()
    allowed[width - 2, width - 3] = False  # two branches side by side over one prefix
    bias = torch.zeros(1, 1, width, width, dtype=ours.dtype).masked_fill_(~allowed, torch.finfo(ours.dtype).min)
    positions = torch.arange(width)[None].clone()
    positions[0, -2:] = positions[0, -3]
    with torch.inference_mode():
        hidden = [m.get_decoder()(input_ids=ids, attention_mask=bias, position_ids=positions).last_hidden_state for m in (theirs, ours)]
        restarted = torch.cat([torch.arange(5), torch.arange(width - 5)])[None]  # without a cache: two sequences packed in one row
        packed = [m(input_ids=ids, position_ids=restarted, use_cache=False).logits for m in (theirs, ours)]
        cached = [m(input_ids=ids, position_ids=restarted).logits for m in (theirs, ours)]
    assert torch.equal(*hidden) and torch.equal(*packed) and torch.equal(*cached) and not torch.equal(packed[1], cached[1])


def test_past_the_sliding_window_the_local_layers_see_its_last_tokens_as_transformers(pair) -> None:
    theirs, ours, tokenizer = pair
    words = " ".join(["Peter Blackburn met John Smith in Brussels ."] * 80)
    ids = torch.tensor([tokenizer(words).input_ids[:530]])
    assert ids.shape[1] > ours.config.sliding_window
    with torch.inference_mode():
        assert torch.equal(theirs(input_ids=ids, logits_to_keep=4).logits, ours(input_ids=ids, logits_to_keep=4).logits)


def test_another_architecture_or_setting_loads_as_transformers_class(tmp_path: Path) -> None:
    try:
        llama = resolve_model_folder(SMOLLM2.alias)
    except ModelNotFoundError as error:
        pytest.skip(str(error))
    assert not gemma3_model.supported(llama)
    assert type(load_causal_lm(SMOLLM2.alias, native=True)[0]).__module__.startswith("transformers.")
    capped = tmp_path / "capped"
    capped.mkdir()
    config = json.loads((resolve_model_folder(GEMMA3.alias) / "config.json").read_text())
    (capped / "config.json").write_text(json.dumps({**config, "final_logit_softcapping": 30.0}))
    with pytest.raises(gemma3_model.UnsupportedCheckpointError, match="final_logit_softcapping"):
        gemma3_model.Gemma3Config.read(capped)


def test_the_engine_on_its_own_class_finds_what_it_finds_on_transformers_class(en_engine) -> None:
    assert type(en_engine.ner_model.model) is gemma3_model.Gemma3ForCausalLM
    theirs = NEREngine.load("en-conll03", native=False)
    assert type(theirs.ner_model.model).__module__.startswith("transformers.")
    assert [r.entities for r in en_engine.extract(TEXTS)] == [r.entities for r in theirs.extract(TEXTS)]


def test_a_merge_is_kept_once_and_read_back_with_the_same_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ner_service.engine import lora_merge, merged_weights

    if not (REPO / "ner_service" / "shipped_models" / "en-conll03" / "ner_model.json").is_file():
        pytest.skip("the shipped en-conll03 model is not in this checkout")
    shared_cache = cache_root()
    monkeypatch.setenv("PADELLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(merged_weights.SWITCH, "1")  # the suite runs with it off (tests/conftest.py)
    for part in ("converted", "gguf", "tokenizers"):  # the base as converted before, not converted again
        (tmp_path / "cache" / part).mkdir(parents=True, exist_ok=True)
        for found in (shared_cache / part).glob("*"):
            (tmp_path / "cache" / part / found.name).symlink_to(found)
    first = NEREngine.load("en-conll03", dtype=SERVED)
    [kept] = (tmp_path / "cache" / "merged").glob("*.safetensors")
    with monkeypatch.context() as patched:
        patched.setattr(lora_merge, "merge_lora", lambda *a, **k: pytest.fail("a kept merge is read back, not merged again"))
        again = NEREngine.load("en-conll03", dtype=SERVED)
    assert all(torch.equal(a, b) for a, b in zip(first.ner_model.model.state_dict().values(), again.ner_model.model.state_dict().values()))
    assert [r.entities for r in again.extract(TEXTS)] == [r.entities for r in first.extract(TEXTS)]
    kept.unlink()
    monkeypatch.setenv(merged_weights.SWITCH, "0")  # off: merged at each start, nothing written
    NEREngine.load("en-conll03", dtype=SERVED)
    assert not list((tmp_path / "cache" / "merged").glob("*.safetensors"))


def test_only_the_merges_used_last_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ner_service.engine import merged_weights

    monkeypatch.setenv("PADELLM_CACHE", str(tmp_path))
    model = gemma3_model.Gemma3ForCausalLM(gemma3_model.Gemma3Config(
        vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=4, rms_norm_eps=1e-6, query_pre_attn_scalar=4, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        rope_theta={"full_attention": 1e6, "sliding_attention": 1e4}))
    model.lm_head.weight = model.model.embed_tokens.weight
    paths = [tmp_path / "merged" / f"m{i}.safetensors" for i in range(merged_weights.MAX_KEPT + 1)]
    for age, path in enumerate(paths[:-1]):
        merged_weights.keep(model, path)
        os.utime(path, (1_000_000 + age, 1_000_000 + age))  # m0 the oldest
    merged_weights.mark_used(paths[0])  # read just now
    merged_weights.keep(model, paths[-1])  # one too many: the least recently used goes
    left = sorted(p.name for p in (tmp_path / "merged").iterdir())
    assert len(left) == merged_weights.MAX_KEPT and "m0.safetensors" in left and "m1.safetensors" not in left


def test_a_cold_extract_imports_none_of_transformers_model_classes() -> None:
    if not (REPO / "ner_service" / "shipped_models" / "en-conll03" / "ner_model.json").is_file():
        pytest.skip("the shipped en-conll03 model is not in this checkout")
    probe = ("import sys; from ner_service.engine import NEREngine; e = NEREngine.load('en-conll03', dtype='auto');"
             "found = e.extract(['Peter Blackburn met John Smith in BRUSSELS .'])[0].entities;"
             "print([m for m in ('transformers.modeling_utils', 'torch._dynamo', 'torch.distributed.tensor') if m in sys.modules], len(found))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[] 3"
