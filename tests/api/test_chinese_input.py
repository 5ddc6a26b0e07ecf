"""Chinese input as users send it, over HTTP to the shipped Chinese models: full-width
punctuation, Chinese mixed with English, Weibo's emoji, @user and #topics#, traditional
characters, and a 20,000-character text. Each gets entities whose offsets slice their own text
(in code points), or a 4xx that says why: never a 500."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

TEXTS = {
    "full-width punctuation and digits": "张三（男），１９６５年出生，毕业于北京大学！现任华为公司“总经理”。",
    "Chinese mixed with English": "李明，MBA，曾任Google China工程师，现任阿里巴巴集团CTO。",
    "Weibo: @user, emoji, a flag, a skin tone, a topic, a link": "@王小明 今天去了北京天安门🇨🇳😀👍🏽，和张伟一起吃饭 #北京# http://t.cn/abc",
    "traditional characters": "陳先生畢業於臺灣大學，現任鴻海集團董事長。",
    "ideographic space and a line break": "王五　男\n汉族，中共党员，本科学历。",
}


@pytest.mark.parametrize("model", ["zh-resume", "zh-weibo"])
@pytest.mark.parametrize("text", list(TEXTS.values()), ids=list(TEXTS))
def test_chinese_text_gets_entities_at_their_own_offsets(client: TestClient, model: str, text: str) -> None:
    response = client.post("/v1/entities", json={"text": text, "model": model})
    assert response.status_code == 200, response.text
    (result,) = response.json()["results"]
    entities = result["entities"]
    assert entities, "every text names a person, a place or an organisation"
    for entity in entities:
        assert text[entity["start"]:entity["end"]] == entity["text"], entity
        assert entity["text"].strip() == entity["text"] and entity["text"]


def test_the_resume_model_reads_full_width_text_as_it_reads_ascii(client: TestClient) -> None:
    """The same resume line with full-width and with ASCII punctuation: the same person and school."""
    found = {}
    for text in ("张三，1965年出生，毕业于北京大学。", "张三，１９６５年出生，毕业于北京大学！"):
        (result,) = client.post("/v1/entities", json={"text": text, "language": "zh"}).json()["results"]
        entities = result["entities"]
        found[text] = {(e["text"], e["label"]) for e in entities}
    first, second = found.values()
    assert ("张三", "NAME") in first and ("张三", "NAME") in second
    assert {e for e in first if e[1] in ("NAME", "ORG")} == {e for e in second if e[1] in ("NAME", "ORG")}


def test_a_5000_character_chinese_text_is_refused_for_its_tokens_naming_the_way_out(client: TestClient) -> None:
    """5,000 characters (NER_MAX_ENTITIES_TEXT_CHARS) are about 10,000 tokens of work, more than one
    request may hold: a 413 that says so and names batch jobs, whatever the machine's rate; a
    character more than the texts' limit is refused for its length."""
    text = ("张三毕业于北京大学，现任华为公司工程师。" * 1000)[:5_000]
    response = client.post("/v1/entities", json={"text": text, "language": "zh"})
    assert response.status_code == 413, response.text
    detail = response.json()["detail"]
    assert "tokens of work" in detail and "NER_MAX_REQUEST_TOKENS" in detail and "/v1/jobs" in detail, detail
    too_long = client.post("/v1/entities", json={"text": text + "张", "language": "zh"})
    assert too_long.status_code == 413 and "at most 5000" in too_long.text and "POST /v1/jobs" in too_long.text, too_long.text
