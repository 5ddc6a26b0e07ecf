"""POST /v1/entities and GET /v1/models against the real app on the tiny model."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from ner_service.engine import DEFAULT_DECODER, NEREngine, NERModelConfig, shipped_model_names
from ner_service.engine.ner_model import CURRENT_MODELS, resolve_ner_model
from corpora import read_conll_documents
from ner_service.api.core.work import pieces_of
from tests.api.conftest import TINY
from tests.entity_lists import as_entities, assert_same_entities
from tests.conftest import SHIPPED_DIFFUSION, SHIPPED_EN

TEXTS = ["EU rejects German call to boycott British lamb .", "Peter Blackburn", "", "BRUSSELS 1996-08-22"]


def _engine_view(engine: NEREngine, texts: list[str], **options: object) -> list[list[dict]]:
    return [[e.to_dict() for e in result.entities] for result in engine.extract(texts, **options)]


def test_one_text_matches_the_engine(client: TestClient, tiny_engine: NEREngine) -> None:
    text = TEXTS[0]
    response = client.post("/v1/entities", json={"text": text})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == TINY and body["strategy"] == "padellm" and body["decoder"] == DEFAULT_DECODER
    assert body["labels"] == tiny_engine.labels
    [result] = body["results"]
    assert result["entities"] == _engine_view(tiny_engine, [text])[0] and result["entities"], "compares entities, not empty lists"
    for entity in result["entities"]:
        assert text[entity["start"]:entity["end"]] == entity["text"]
    assert result["stats"]["forward_passes"] >= 1 and result["stats"]["batch_texts"] >= 1
    assert body["elapsed_ms"] > 0


@pytest.mark.parametrize("strategy", ["padellm", "ar"])
def test_several_texts_keep_their_order_and_options(client: TestClient, tiny_engine: NEREngine, strategy: str) -> None:
    response = client.post("/v1/entities", json={"texts": TEXTS, "labels": ["MISC", "LOC"], "strategy": strategy, "decoder": "greedy", "model": TINY})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["labels"] == ["LOC", "MISC"] and body["strategy"] == strategy and body["decoder"] == "greedy"
    answered = [r["entities"] for r in body["results"]]
    assert answered == _engine_view(tiny_engine, TEXTS, labels=["LOC", "MISC"], strategy=strategy, decoder="greedy")
    assert any(answered), "compares entities, not empty lists"
    assert body["results"][2] == {"entities": [], "stats": body["results"][2]["stats"]}  # the empty text


def test_threshold_drops_the_entities_scored_below_it(client: TestClient, tiny_engine: NEREngine) -> None:
    expected = _engine_view(tiny_engine, TEXTS)
    scores = sorted({e["score"] for entities in expected for e in entities})
    assert len(scores) >= 2, scores  # a cut between two scores keeps some and drops some
    cut = (scores[0] + scores[-1]) / 2
    response = client.post("/v1/entities", json={"texts": TEXTS, "threshold": cut})
    assert response.status_code == 200, response.text
    kept = [r["entities"] for r in response.json()["results"]]
    assert kept == [[e for e in entities if e["score"] >= cut] for entities in expected] and 0 < sum(map(len, kept)) < sum(map(len, expected))
    refused = client.post("/v1/entities", json={"text": TEXTS[0], "threshold": 1.5})
    assert refused.status_code == 422 and "threshold" in refused.text


def test_flat_ner_is_true_or_false(client: TestClient) -> None:
    refused = client.post("/v1/entities", json={"text": TEXTS[0], "flat_ner": "sometimes"})
    assert refused.status_code == 422 and "flat_ner" in refused.text
    assert client.post("/v1/entities", json={"text": TEXTS[0], "flat_ner": False}).status_code == 200


@pytest.mark.parametrize(("fields", "message"), [
    ({"decoder": "ar"}, "'ar' is a strategy: send it as `strategy`"),  # the old ``decoder`` named the strategy
    ({"backend": "anpd"}, "`backend` is now `decoder`"),  # ... and ``backend`` the decoder
    ({"strategy": "ar", "decoder": "ar", "backend": "greedy"}, "`backend` is now `decoder`"),
])
def test_the_old_field_names_are_refused_naming_the_new_ones(client: TestClient, fields: dict, message: str) -> None:
    response = client.post("/v1/entities", json={"text": TEXTS[0], "model": TINY} | fields)
    assert response.status_code == 422 and message in response.text, response.text


@pytest.mark.parametrize(("decoder", "used"), [(None, ["copy"]), ("greedy", ["greedy"])])
def test_the_response_says_which_decoders_ran(client: TestClient, decoder: str | None, used: list[str]) -> None:
    response = client.post("/v1/entities", json={"texts": TEXTS, "strategy": "ar", "decoder": decoder})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["decoder"] == (decoder or DEFAULT_DECODER) and body["decoders_used"] == used
    assert all(result["stats"]["decoders"] == used for result in body["results"] if result["entities"] or result["stats"]["forward_passes"])


BAD_REQUESTS = [
    pytest.param({"content": b""}, 422, "Field required", id="empty body"),
    pytest.param({"content": b'{"text": '}, 400, "not valid JSON", id="broken JSON"),
    pytest.param({"content": b'{"text": "a"}', "headers": {"Content-Type": "text/plain"}}, 415, "sent as 'text/plain'", id="sent as text"),
    pytest.param({"content": b'{"text": "caf\xe9"}'}, 400, "parsing the body", id="invalid UTF-8"),
    pytest.param({"content": b'{"text": "\\ud800x"}'}, 422, "unpaired surrogate", id="lone surrogate"),
    pytest.param({"json": {"text": 3}}, 422, "valid string", id="text not a string"),
    pytest.param({"json": {"texts": "one"}}, 422, "valid list", id="texts not a list"),
    pytest.param({"json": {"texts": [1, 2]}}, 422, "valid string", id="texts of numbers"),
    pytest.param({"json": ["a"]}, 422, "valid dictionary", id="a list"),
    pytest.param({"json": {}}, 422, "exactly one", id="neither text nor texts"),
    pytest.param({"json": {"text": "a", "texts": ["b"]}}, 422, "exactly one", id="both"),
    pytest.param({"json": {"texts": []}}, 422, "at least 1", id="no texts"),
    pytest.param({"json": {"text": "a", "labels": []}}, 422, "at least 1", id="empty labels"),
    pytest.param({"json": {"text": "a", "labels": ["PER", "FOOD"]}}, 422, "unknown label(s) 'FOOD'", id="unknown label"),
    pytest.param({"json": {"text": "a", "strategy": "beam"}}, 422, "unknown strategy 'beam'", id="unknown strategy"),
    pytest.param({"json": {"text": "a", "decoder": "beam"}}, 422, "unknown decoder 'beam'", id="unknown decoder"),
    pytest.param({"json": {"text": "a", "backend": "magic"}}, 422, "`backend` is now `decoder`", id="the old name of the decoder"),
    pytest.param({"json": {"text": "a", "strategy": "ar", "decoder": "padellm"}}, 422, "'padellm' is a strategy", id="a strategy as decoder"),
    pytest.param({"json": {"text": "a", "decoder": "lud"}}, 422, "not fine-tuned for lexical units", id="lud on a model without"),
    pytest.param({"json": {"text": "a", "decoder": "speculative"}}, 422, "needs a loaded draft model", id="speculative by name"),
    pytest.param({"json": {"text": "a", "strategy": "fast_dllm"}}, 422, "supports the strategies padellm, ar", id="fast_dllm on an AR model"),
    pytest.param({"json": {"text": "a", "labels": ["x" * 101]}}, 422, "at most 100 characters", id="label too long"),
    pytest.param({"json": {"text": "a", "labels": ["PER"] * 51}}, 422, "at most 50 items", id="too many labels"),
    pytest.param({"json": {"text": "a", "labels": [{"name": f"kind {i}", "description": "d" * 290} for i in range(7)]}}, 422,
                 "2,072 characters in all; at most 2,000", id="labels too long in all"),
    pytest.param({"json": {"text": "a", "labels": [{"name": "PER", "description": "a person"}]}}, 422, "descriptions are for open-label models",
                 id="a description for a model of its own labels"),
    pytest.param({"json": {"text": "a", "model": "../etc"}}, 422, "unknown model '../etc'", id="unknown model"),
    pytest.param({"json": {"text": "a", "language": "fr"}}, 422, "no model for language 'fr'", id="unknown language"),
    pytest.param({"json": {"text": "a", "colour": "red"}}, 422, "Extra inputs", id="unknown field"),
    pytest.param({"json": {"text": "x" * 101}}, 413, "at most 100", id="text too long"),
    pytest.param({"json": {"texts": ["a"] * 5}}, 413, "at most 4", id="too many texts"),
    pytest.param({"content": b'{"text": "' + b"x" * 70_000 + b'"}'}, 413, "Content Too Large", id="body too large"),
]


@pytest.mark.parametrize(("request_kwargs", "status", "message"), BAD_REQUESTS)
def test_bad_input_gets_a_clear_4xx(make_client, request_kwargs: dict, status: int, message: str) -> None:
    client = make_client(ready=False, ner_max_text_chars=100, ner_max_entities_text_chars=100, ner_max_texts=4)
    headers = {"Content-Type": "application/json"} | request_kwargs.pop("headers", {})
    response = client.post("/v1/entities", headers=headers, **request_kwargs)
    assert response.status_code == status, response.text
    assert message in response.text


def test_models_are_listed_from_their_config(client: TestClient) -> None:
    body = client.get("/v1/models").json()
    assert body["default"] == TINY
    assert [m["name"] for m in body["models"]] == sorted({TINY, *(m for m in CURRENT_MODELS if m in shipped_model_names())})  # NER_MODELS
    for model in body["models"]:
        config = NERModelConfig.read(resolve_ner_model(model["name"]))
        assert model["labels"] == config.labels and model["language"] == config.language and model["base"] == config.base
        assert model["adapter"] == (config.base != ".") and model["open_labels"] == config.open_labels
        assert model["trained_names"] == config.trained_names and bool(model["trained_names"]) == config.open_labels
        assert model["default"] == (model["name"] == TINY)
        assert model["loaded"] == (model["name"] == TINY)  # listing loads nothing
    assert [m["name"] for m in body["models"] if m["open_labels"]] == [m for m in ("open",) if m in shipped_model_names()]


def test_an_open_model_says_which_labels_it_never_trained_on_and_still_answers_them(make_client, open_model_folder) -> None:
    client = make_client(ner_model=str(open_model_folder))
    text = "Angela Merkel met Emmanuel Macron in Paris ."
    labels = ["PER", "weapon", {"name": "river", "description": "a stream of water"}, "Location"]
    response = client.post("/v1/entities", json={"text": text, "labels": labels})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["unfamiliar_labels"] == ["weapon"]  # "river" is described, "Location" a name it trained on
    assert ("Angela Merkel", "PER") in {(e["text"], e["label"]) for e in body["results"][0]["entities"]}
    assert client.post("/v1/entities", json={"text": text}).json()["unfamiliar_labels"] == []  # its default labels
    [listed] = [m for m in client.get("/v1/models").json()["models"] if m["name"] == body["model"]]
    assert listed["open_labels"] and "person" in listed["trained_names"] and "weapon" not in listed["trained_names"]


def test_a_model_of_its_own_labels_has_no_unfamiliar_ones(client: TestClient) -> None:
    assert client.post("/v1/entities", json={"text": TEXTS[0], "labels": ["PER"]}).json()["unfamiliar_labels"] == []


@pytest.mark.slow
def test_a_real_entity_with_the_english_model(make_client) -> None:
    if not SHIPPED_EN.is_file():
        pytest.skip("the shipped en-conll03 model is not in this checkout")
    client = make_client(ner_request_timeout_s=300.0)
    response = client.post("/v1/entities", json={"text": "Angela Merkel visited Paris .", "model": "en-conll03"})
    assert response.status_code == 200, response.text
    found = {(e["text"], e["label"]) for e in response.json()["results"][0]["entities"]}
    assert ("Angela Merkel", "PER") in found and ("Paris", "LOC") in found
    # flat_ner off: every label's entities; New York the place stays inside New York the team (tests/test_overlapping_entities.py)
    text = "He flew to New York to watch the New York Yankees ."
    for flat_ner, expected in ((False, [(11, "LOC"), (33, "LOC"), (33, "ORG")]), (True, [(11, "LOC"), (33, "ORG")])):
        response = client.post("/v1/entities", json={"text": text, "model": "en-conll03", "flat_ner": flat_ner})
        assert response.status_code == 200, response.text
        assert [(e["start"], e["label"]) for e in response.json()["results"][0]["entities"]] == expected


@pytest.mark.slow
def test_a_document_cut_into_pieces_gets_the_entities_the_engine_gives_it_whole(make_client, en_engine, data_dir) -> None:
    """The API cuts a long text into pieces that batch apart; put back together, a name keeps one
    label across them as the engine keeps it across a text's windows (document_consistency)."""
    document = next(d for d in read_conll_documents(data_dir / "conll2003" / "dev.txt") if "BARATELLI TO COACH NICE" in d.text)
    client = make_client(ner_request_timeout_s=300.0, ner_long_text_tokens=64, ner_piece_tokens=64)
    response = client.post("/v1/entities", json={"text": document.text, "model": "en-conll03"})
    assert response.status_code == 200, response.text
    assert len(pieces_of([document.text], 64, 64)) > 1
    (whole,) = en_engine.extract([document.text])
    assert_same_entities([as_entities(response.json()["results"][0]["entities"])], [whole.entities])
    assert {e.label for e in whole.entities if e.text == "Nice"} == {"ORG"}


@pytest.mark.slow
def test_the_diffusion_model_answers_fast_dllm_and_an_ar_model_names_it(make_client) -> None:
    if not SHIPPED_DIFFUSION.is_file():
        pytest.skip("the shipped en-conll03-diffusion model is not in this checkout")
    client = make_client(ner_request_timeout_s=300.0)
    text = "Angela Merkel met Emmanuel Macron in Paris ."
    response = client.post("/v1/entities", json={"text": text, "model": "en-conll03-diffusion", "strategy": "fast_dllm"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["model"], body["strategy"], body["decoder"], body["decoders_used"]) == ("en-conll03-diffusion", "fast_dllm", None, [])
    entities = body["results"][0]["entities"]
    assert ("Paris", "LOC") in {(e["text"], e["label"]) for e in entities}
    assert all(text[e["start"]:e["end"]] == e["text"] for e in entities)
    refused = client.post("/v1/entities", json={"text": text, "strategy": "fast_dllm"})  # the default model is autoregressive
    assert refused.status_code == 422 and "the shipped ones: en-conll03-diffusion" in refused.text, refused.text


def test_language_picks_its_default_model_and_model_wins(client: TestClient) -> None:
    text = "高勇，男，中国国籍，无境外居留权，"
    response = client.post("/v1/entities", json={"text": text, "language": "zh"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "zh-resume" and set(body["labels"]) == set(NERModelConfig.read(resolve_ner_model("zh-resume")).labels)
    for entity in body["results"][0]["entities"]:  # character offsets
        assert text[entity["start"]:entity["end"]] == entity["text"]
    assert client.post("/v1/entities", json={"text": "Peter", "language": "zh", "model": TINY}).json()["model"] == TINY
