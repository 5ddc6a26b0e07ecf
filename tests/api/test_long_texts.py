"""The real server (uvicorn, tiny model, SQLite) on long texts: an idle server answers the longest
text and the most texts a request may hold (the first try may be a 429 while the engine is
measured on that very work: the retry is answered), a text longer than a request may hold is a
413 naming the batch jobs, and one that could never be answered within the budget on this
server is a 413 too, not a 429 for ever."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ner_service.settings import Settings
from tests.local_services import live_server

SENTENCE = "Peter Blackburn of Reuters met officials of the European Commission in Brussels on Monday ."
MAX_CHARS = Settings().ner_max_entities_text_chars


def _article(chars: int) -> str:
    return (" ".join([SENTENCE] * (chars // len(SENTENCE) + 1)))[:chars]


def _env(folder: Path, redis_url: str, **overrides: str) -> dict[str, str]:
    return {"NER_MODEL": "tiny-conll03", "NER_API_KEYS": "", "NER_RATE_LIMIT_PER_MINUTE": "100000",
            "DATABASE_URL": f"sqlite:///{folder / 'pipeline.db'}", "REDIS_URL": redis_url, **overrides}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[str]:
    """The defaults (a fresh server assumes the pessimistic prior until it has measured the engine)."""
    folder = tmp_path_factory.mktemp("long-texts")
    with live_server(_env(folder, redis_url), folder / "uvicorn.log") as url:
        yield url


def _answered(http: httpx.Client, body: dict, tries: int = 6) -> httpx.Response:
    """``body`` posted until it is answered, waiting ``Retry-After`` after each 429 (at most ``tries``)."""
    for _ in range(tries):
        response = http.post("/v1/entities", json=body)
        if response.status_code != 429:
            return response
        time.sleep(int(response.headers["Retry-After"]))
    return response


@pytest.mark.parametrize("body", [{"text": _article(MAX_CHARS)}, {"texts": [SENTENCE] * Settings().ner_max_texts}],
                         ids=["the longest text", "the most texts"])
def test_an_idle_server_answers_the_documented_maximums(server: str, body: dict) -> None:
    with httpx.Client(base_url=server, timeout=120) as http:
        response = _answered(http, body)
    assert response.status_code == 200, response.text
    texts = body.get("texts") or [body["text"]]
    assert len(response.json()["results"]) == len(texts)


def test_a_text_longer_than_a_request_may_hold_names_the_batch_jobs(server: str) -> None:
    with httpx.Client(base_url=server, timeout=120) as http:
        response = http.post("/v1/entities", json={"text": _article(MAX_CHARS + 1)})
    assert response.status_code == 413 and "NER_MAX_ENTITIES_TEXT_CHARS" in response.text and "POST /v1/jobs" in response.text


def test_work_that_can_never_fit_the_budget_here_is_413_not_429_for_ever(tmp_path: Path, redis_url: str) -> None:
    # a budget of 40 ms: a short text fits once measured; 20,000 characters (about 5,000 tokens) never will on any machine
    env = _env(tmp_path, redis_url, NER_REQUEST_TIMEOUT_S="0.05", NER_MAX_ENTITIES_TEXT_CHARS="20000", NER_MAX_REQUEST_TOKENS="100000")
    with live_server(env, tmp_path / "uvicorn.log") as url, httpx.Client(base_url=url, timeout=120) as http:
        long = {"text": _article(20_000)}
        first = http.post("/v1/entities", json=long)
        assert first.status_code == 429 and "Retry-After" in first.headers, first.text  # the rate is not measured yet
        codes = []
        for _ in range(10):  # the engine is measured on the refused work; then the server knows it never fits
            time.sleep(int(first.headers["Retry-After"]))
            again = http.post("/v1/entities", json=long)
            codes.append(again.status_code)
            if again.status_code == 413:
                break
        assert codes[-1] == 413, codes
        assert "never be answered here" in again.text and "POST /v1/jobs" in again.text, again.text
