"""Chinese NER: the shipped zh models (Resume on Gemma 3 270M, Weibo a character model), the
character tokenizer and its extension, label display names, Weibo tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from ner_service.engine import NEREngine, NERModelConfig, UnknownLabelError, default_model_for_language, shipped_model_names
from ner_service.engine.model_loading import ModelNotFoundError
from training.char_model import CHINESE_LABEL_NAMES, build_char_tokenizer, char_llama_config, extend_char_vocabulary, prompt_strings
from corpora import read_conll
from training.examples import query_answers

#: Resume dev sentence 1 (../shared/data/resume/dev.txt) and its gold spans.
RESUME_TEXT = "历任公司副总经理、总工程师，"
RESUME_GOLD = {(2, 4, "ORG"), (4, 8, "TITLE"), (9, 13, "TITLE")}


@pytest.fixture(scope="module")
def zh_engine() -> NEREngine:
    return NEREngine.load("zh-resume")


@pytest.fixture(scope="module")
def char_engine() -> NEREngine:
    """The shipped character model (one token per character)."""
    return NEREngine.load("zh-weibo")


def test_char_tokenizer_is_one_token_per_character_and_round_trips() -> None:
    texts = ["张三，1990年毕业于北京大学。", "Hello  world\n第二行\tTab"]
    tokenizer = build_char_tokenizer(texts + prompt_strings(["NAME", "人名"]))
    for text in texts + ["Text: 张三\nNAME count:2\n人名 1: 张三"]:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert len(ids) == len(text)
        assert tokenizer.decode(ids) == text
    assert tokenizer.convert_ids_to_tokens(tokenizer("李四", add_special_tokens=False).input_ids) == ["<unk>", "<unk>"]


def test_a_char_model_extended_to_new_characters_keeps_what_it_knew(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer(["张三毕业于北京大学。"])
    model = LlamaForCausalLM(char_llama_config(len(tokenizer), tokenizer.eos_token_id, layers=1, hidden=64))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    known = "张三毕业于北京"
    with torch.inference_mode():
        before = model(input_ids=torch.tensor([tokenizer(known).input_ids])).logits
    assert extend_char_vocabulary(tmp_path, ["李四在微博说：北京好"]) == 8  # 李 四 在 微 博 说 ： 好
    assert extend_char_vocabulary(tmp_path, ["北京"]) == 0
    extended = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    grown = LlamaForCausalLM.from_pretrained(tmp_path)
    assert len(extended) == len(tokenizer) + 8 == grown.get_input_embeddings().weight.shape[0]
    assert extended(known).input_ids == tokenizer(known).input_ids  # old ids unchanged
    new = extended("李四说北京好").input_ids
    assert extended.unk_token_id not in new and extended.decode(new) == "李四说北京好"
    with torch.inference_mode():  # the old characters read as before; the new rows only add vocabulary
        after = grown(input_ids=torch.tensor([extended(known).input_ids])).logits
        torch.testing.assert_close(after[..., : len(tokenizer)], before)
        assert grown(input_ids=torch.tensor([new])).logits.isfinite().all()


def test_shipped_zh_tokenizer_round_trips_a_resume_sentence(zh_engine: NEREngine) -> None:
    tokenizer = zh_engine.ner_model.tokenizer
    ids = tokenizer(RESUME_TEXT, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == RESUME_TEXT and len(ids) < len(RESUME_TEXT)  # Gemma writes Chinese words as one token
    assert zh_engine.ner_model.config.base == "gemma3-270m"


@pytest.mark.parametrize("strategy", ["padellm", "ar"])
def test_zh_model_by_name_finds_resume_entities_at_exact_character_offsets(zh_engine: NEREngine, strategy: str) -> None:
    assert zh_engine.ner_model.config.language == "zh"
    (result,) = zh_engine.extract([RESUME_TEXT], strategy=strategy)
    found = {(e.start, e.end, e.label) for e in result.entities}
    for entity in result.entities:
        assert RESUME_TEXT[entity.start:entity.end] == entity.text
    assert (2, 4, "ORG") in found and len(found) >= 2 and found <= RESUME_GOLD, sorted(found)


def test_weibo_model_by_name_finds_a_nominal_and_a_named_person() -> None:
    """Weibo dev: 富二代 ("rich second generation", PER.NOM) and the name 陈雨 (PER.NAM), at their offsets."""
    text = "俩个富二代。。。什么时候都饿的人陈雨奇葩的世界"
    (result,) = NEREngine.load("zh-weibo").extract([text])
    assert {(e.start, e.end, e.label) for e in result.entities} == {(2, 5, "PER.NOM"), (16, 18, "PER.NAM")}


def test_the_company_the_character_model_rewrote_is_read_from_the_text(zh_engine: NEREngine) -> None:
    """Resume dev: asked for the ORG, the character model wrote a name of its own and needed the
    unaligned repair; the Gemma model copies the company of the sentence, and the repair, with
    nothing to repair, changes nothing."""
    text = "1986年至1997年，在甘肃省畜产公司工作；"
    plain = NEREngine(zh_engine.ner_model, repair_unaligned=False).extract([text])[0]
    (repaired,) = zh_engine.extract([text])
    assert plain.stats.unmatched_mentions == 0 and plain.entities == repaired.entities
    assert (13, 20, "ORG", "甘肃省畜产公司") in {(e.start, e.end, e.label, e.text) for e in repaired.entities}


def test_constrained_copy_drafting_answers_as_constrained_greedy(char_engine: NEREngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The character model rewrites mentions (the Gemma model copies them): the repairs it needs
    give the same entities drafted by copy as by greedy, in fewer forwards."""
    from ner_service.engine.strategies import repairs

    texts = ["1986年至1997年，在甘肃省畜产公司工作；", "2013年4月至今任云南罗平锌电股份有限公司董事。",
             "1964年4月出生，中国国籍，无境外居留权，美国亚利桑那州立大学凯瑞商学院工商管理硕士。"]
    drafted = char_engine.extract(texts)
    monkeypatch.setattr(repairs, "CONSTRAINED_DECODER", "greedy")
    reference = char_engine.extract(texts)
    assert [[(e.start, e.end, e.label) for e in r.entities] for r in drafted] == [[(e.start, e.end, e.label) for e in r.entities] for r in reference]
    assert sum(r.stats.forward_passes for r in drafted) < sum(r.stats.forward_passes for r in reference)


def test_character_models_slice_span_answers_from_one_encoding(char_engine: NEREngine, monkeypatch: pytest.MonkeyPatch) -> None:
    from ner_service.engine import span_tries

    tokenizer, eos = char_engine.ner_model.tokenizer, char_engine.ner_model.eos_token_id
    texts = [RESUME_TEXT, "张三，1990年毕业于北京大学。"]
    assert span_tries.one_token_per_character(tokenizer)
    sliced = span_tries.SpanTries(tokenizer, texts, eos, 48)
    monkeypatch.setattr(span_tries, "one_token_per_character", lambda tokenizer: False)
    encoded = span_tries.SpanTries(tokenizer, texts, eos, 48)

    def answers(node, path=()):
        yield from ([path] if not node.children else [])
        for token, child in node.children.items():
            yield from answers(child, path + (token,))

    for i in range(len(texts)):
        assert set(answers(sliced[i])) == set(answers(encoded[i]))
        assert tokenizer(" 北京大学", add_special_tokens=False).input_ids + [eos] in [list(a) for a in answers(sliced[1])]


def test_unknown_label_lists_the_chinese_models_labels(zh_engine: NEREngine) -> None:
    with pytest.raises(UnknownLabelError, match="'PER'.*CONT, EDU, LOC, NAME, ORG, PRO, RACE, TITLE"):
        zh_engine.extract([RESUME_TEXT], labels=["NAME", "PER"])


def test_zh_models_are_listed_and_chosen_by_language() -> None:
    assert {"en-conll03", "zh-resume", "zh-weibo"} <= set(shipped_model_names())
    assert default_model_for_language("zh") == "zh-resume"
    assert default_model_for_language("zh-CN") == "zh-resume"
    assert default_model_for_language("en") == "en-conll03"
    with pytest.raises(ModelNotFoundError, match="en, zh"):
        default_model_for_language("fr")


def test_label_display_names_reach_the_prompts_and_map_back(tmp_path: Path) -> None:
    config = NERModelConfig(name="x", labels=["NAME", "ORG"], label_names={"NAME": "人名"})
    assert (config.prompt_name("NAME"), config.prompt_name("ORG")) == ("人名", "ORG")
    assert (config.label_of("人名"), config.label_of("ORG")) == ("NAME", "ORG")
    path = tmp_path / "resume.txt"
    path.write_text("张 B-NAME\n三 E-NAME\n在 O\n\n", encoding="utf-8")
    (example,) = read_conll(path)
    pairs = [(qa.query, qa.answer) for qa in query_answers(example, ["NAME"], ["padellm", "ar"], {"NAME": CHINESE_LABEL_NAMES["NAME"]})]
    assert pairs == [("人名 count:", "1"), ("人名 count:1\n人名 1:", " 张三"), ("All entities:", "\n人名: 张三")]


def test_weibo_char_and_position_tokens(tmp_path: Path) -> None:
    path = tmp_path / "weibo.txt"
    path.write_text(
        "我0\tO\n在1\tO\n北0\tB-GPE.NAM\n京1\tI-GPE.NAM\n73\tO\n\ufffd\ufffd0\tO\n女12\tB-PER.NOM\n人13\tI-PER.NOM\n\n", encoding="utf-8"
    )
    (example,) = read_conll(path)
    assert example.text == "我在北京7\ufffd\ufffd女人"
    assert [(example.text[s.start:s.end], s.start, s.end, s.label) for s in example.spans] == [
        ("北京", 2, 4, "GPE.NAM"), ("女人", 7, 9, "PER.NOM"),
    ]
