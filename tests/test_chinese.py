"""Chinese NER: the shipped zh models (Resume and Weibo on Gemma 3 270M), label display names,
Weibo's tokens."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ner_service.engine import NEREngine, NERModelConfig, UnknownLabelError, default_model_for_language, shipped_model_names
from ner_service.engine.model_loading import ModelNotFoundError
from corpora import read_conll
from training.examples import query_answers

#: Resume dev sentence 1 (../shared/data/resume/dev.txt) and its gold spans.
RESUME_TEXT = "历任公司副总经理、总工程师，"
RESUME_GOLD = {(2, 4, "ORG"), (4, 8, "TITLE"), (9, 13, "TITLE")}


@pytest.fixture(scope="module")
def zh_engine() -> NEREngine:
    return NEREngine.load("zh-resume")


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


def test_the_company_is_copied_from_the_text_and_the_unaligned_repair_changes_nothing(zh_engine: NEREngine) -> None:
    """Resume dev: asked for the ORG, the model copies the company of the sentence; the unaligned
    repair, with nothing to repair, changes nothing."""
    text = "1986年至1997年，在甘肃省畜产公司工作；"
    plain = NEREngine(zh_engine.ner_model, repair_unaligned=False).extract([text])[0]
    (repaired,) = zh_engine.extract([text])
    assert plain.stats.unmatched_mentions == 0 and plain.entities == repaired.entities
    assert (13, 20, "ORG", "甘肃省畜产公司") in {(e.start, e.end, e.label, e.text) for e in repaired.entities}


def test_the_resume_model_keeps_a_major_it_is_sure_of_and_drops_a_stray_character(zh_engine: NEREngine) -> None:
    """Resume dev: the major (PRO, about 0.94) stays where the model also answers the university
    and major as one ORG (about 0.37; ``shorter_span_margin``), and "出纳", which the model writes
    "纳出纳", is found at its place."""
    assert zh_engine.ner_model.config.shorter_span_margin == 0.1
    text = "马先生1978年毕业于伦敦大学生物化工专业，获学士学位。"
    (result,) = zh_engine.extract([text])
    assert (15, 21, "PRO") in {(e.start, e.end, e.label) for e in result.entities}
    longer_first = replace(zh_engine.ner_model, config=replace(zh_engine.ner_model.config, shorter_span_margin=None))
    (longer_kept,) = NEREngine(longer_first).extract([text])
    assert not any(e.label == "PRO" for e in longer_kept.entities)
    text = "华夏控股出纳、会计；"
    (result,) = zh_engine.extract([text])
    assert {(e.start, e.end, e.label) for e in result.entities} >= {(4, 6, "TITLE"), (7, 9, "TITLE")}


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
    pairs = [(qa.query, qa.answer) for qa in query_answers(example, ["NAME"], ["padellm", "ar"], {"NAME": "人名"})]
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


def test_a_text_is_read_as_chinese_when_most_of_its_letters_are_ideographs() -> None:
    from ner_service.engine.languages import guess_language

    assert guess_language("1986年至1997年，在甘肃省畜产公司工作；") == "zh"
    assert guess_language("在 Google 公司担任 Software Engineer 职位") == "zh"  # English names inside Chinese text
    assert guess_language("The Beijing office of 华为 opened .") == "en"
    assert guess_language("1996-08-30 , 3 - 1") is None


def test_extract_without_a_model_sends_a_chinese_text_to_the_chinese_model_and_says_so(zh_engine: NEREngine) -> None:
    import json
    import subprocess
    import sys

    text = "1986年至1997年，在甘肃省畜产公司工作；"
    done = subprocess.run([sys.executable, "-m", "padellm_ner.cli", "extract", text], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"1 of 1 text(s) in Chinese: model {default_model_for_language('zh')}" in done.stderr
    [line] = done.stdout.splitlines()
    (expected,) = zh_engine.extract([text])
    assert [(e["start"], e["end"], e["label"]) for e in json.loads(line)["entities"]] == [(e.start, e.end, e.label) for e in expected.entities]
    assert expected.entities, "compares entities, not empty lists"
