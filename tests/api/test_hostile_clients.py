"""The real server (uvicorn, tiny model, SQLite, a private Redis) under hostile and heavy use:
tenants kept apart, load shed with 429 and never a 5xx, a long text interleaved with other keys'
short ones, failed authentications throttled, capability errors as 422, and the schema
migrated on start (or the start refused).

These tests pass as well on a machine busy with other work as on an idle one: admission runs at
a rate the test fixes (``NER_FIXED_MS_PER_TOKEN``) instead of the rate this machine happens to
have now, the timeouts are far longer than the work, and what is checked is the order in which
the server did things (read from its ``/metrics``), never how many seconds they took."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from ner_service.api.core.work import Reading, pieces_of
from ner_service.engine import ExtractOptions, NERModelConfig
from ner_service.settings import Settings
from tests.conftest import TINY_DIR
from tests.local_services import live_server

TEXT = "EU rejects German call to boycott British lamb ."
ALPHA, BETA = {"X-API-Key": "alpha-key"}, {"X-API-Key": "beta-key"}
#: The longest text of a batch job (NER_MAX_TEXT_CHARS), let into the API here (NER_MAX_ENTITIES_TEXT_CHARS): about 150 pieces of engine work.
LONG_TEXT = " ".join(f"Peter Blackburn of Reuters met officials in Brussels on day {i} ." for i in range(400))[:20_000]


def _env(folder: Path, redis_url: str, **overrides: str) -> dict[str, str]:
    return {"NER_MODEL": "tiny-conll03", "NER_API_KEYS": "alpha-key,beta-key", "NER_RATE_LIMIT_PER_MINUTE": "100000",
            "NER_MAX_REQUEST_TOKENS": "200000", "NER_MAX_ENTITIES_TEXT_CHARS": "20000",
            "DATABASE_URL": f"sqlite:///{folder / 'pipeline.db'}", "REDIS_URL": redis_url, **overrides}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[str]:
    """Two keys, a fresh database the server migrates when it starts; admission at a fixed 1 ms a
    token and a 300 s timeout, so that no request of these tests is shed or timed out however
    busy the machine is (admission itself is tested with the burst below)."""
    folder = tmp_path_factory.mktemp("hostile")
    env = _env(folder, redis_url, NER_FIXED_MS_PER_TOKEN="1", NER_REQUEST_TIMEOUT_S="300")
    with live_server(env, folder / "uvicorn.log") as url:
        yield url


def _metric(http: httpx.Client, name: str) -> float:
    """The value of the unlabelled sample ``name`` in the server's ``/metrics``."""
    return float(re.search(rf"^{name} (\S+)$", http.get("/metrics").text, re.M).group(1))


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 240.0) -> None:
    """Poll until ``condition()`` holds; the deadline only bounds a test that fails."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.01)


def test_two_keys_never_see_each_others_jobs_documents_or_entities(server: str) -> None:
    with httpx.Client(base_url=server, timeout=60) as http:
        mine = http.post("/v1/jobs", headers=ALPHA, json={"documents": [{"text": TEXT, "external_id": "report-1"}]})
        assert mine.status_code == 202, mine.text
        job, [document] = mine.json()["job_id"], mine.json()["document_ids"]
        assert http.get(f"/v1/jobs/{job}", headers=ALPHA).status_code == 200
        assert http.get(f"/v1/documents/{document}/entities", headers=ALPHA).json()["external_id"] == "report-1"
        # the other key: not found, whatever the route
        assert http.get(f"/v1/jobs/{job}", headers=BETA).status_code == 404
        assert http.get(f"/v1/documents/{document}/entities", headers=BETA).status_code == 404
        stolen = http.post("/v1/jobs", headers=BETA, json={"document_ids": [document]})
        assert stolen.status_code == 404 and document in stolen.text
        # external ids are per key: the same id with another text is another document, not a 409 that tells it exists
        theirs = http.post("/v1/jobs", headers=BETA, json={"documents": [{"text": "Another text .", "external_id": "report-1"}]})
        assert theirs.status_code == 202 and theirs.json()["document_ids"] != [document]
        assert http.post("/v1/jobs", headers=ALPHA, json={"documents": [{"text": "Another text .", "external_id": "report-1"}]}).status_code == 409
        # ids are random UUIDs: nothing to count or guess
        assert len({job, document, theirs.json()["job_id"], *theirs.json()["document_ids"]}) == 4 and len(job) == 36


def test_capabilities_a_model_lacks_are_422_with_what_it_supports(server: str) -> None:
    with httpx.Client(base_url=server, timeout=60) as http:
        for field, value in (("decoder", "lud"), ("decoder", "speculative"), ("strategy", "fast_dllm")):
            response = http.post("/v1/entities", headers=ALPHA, json={"text": TEXT, field: value})
            assert response.status_code == 422, (field, value, response.text)
            assert "support" in response.json()["detail"] or "masked-diffusion" in response.json()["detail"]
        response = http.post("/v1/jobs", headers=ALPHA, json={"documents": [{"text": TEXT}], "strategy": "fast_dllm"})
        assert response.status_code == 422


def test_blank_documents_are_refused_and_echoes_stay_small(server: str) -> None:
    """(Empty, too long and lone-surrogate documents: tests/pipeline/test_pipeline_hostile_input.py.)"""
    with httpx.Client(base_url=server, timeout=60) as http:
        response = http.post("/v1/jobs", headers=ALPHA, json={"documents": [{"text": " \t\n "}]})
        assert response.status_code == 422 and "empty text" in response.text, response.text[:300]
        huge = http.post("/v1/entities", headers=ALPHA, json={"text": TEXT, "labels": ["PER"] * 500_000})
        assert huge.status_code == 422 and len(huge.content) < 2_000
        unknown = http.post("/v1/jobs", headers=ALPHA, json={"documents": [{"text": TEXT}], "priority": "high"})
        assert unknown.status_code == 422 and "priority" in unknown.text


def test_a_maximal_text_does_not_hold_back_another_keys_short_request(server: str) -> None:
    answer: dict = {}

    def maximal() -> None:
        with httpx.Client(base_url=server, timeout=300) as own:
            answer["response"] = own.post("/v1/entities", headers=ALPHA, json={"text": LONG_TEXT})

    with httpx.Client(base_url=server, timeout=300) as http:
        assert _metric(http, "padellm_queue_texts") == 0
        worker = threading.Thread(target=maximal)
        worker.start()
        _wait_for(lambda: _metric(http, "padellm_queue_texts") == 1 or not worker.is_alive(), "the long text queued")
        beside = 0  # short requests of the other key answered while the long text was still unanswered
        while worker.is_alive() and beside < 5:
            assert http.post("/v1/entities", headers=BETA, json={"text": TEXT}).status_code == 200
            beside += _metric(http, "padellm_queue_texts") == 1  # the short one's own text is no longer counted
        worker.join()
    response = answer["response"]
    assert response.status_code == 200, response.text[:300]
    result = response.json()["results"][0]
    assert all(LONG_TEXT[e["start"]:e["end"]] == e["text"] for e in result["entities"])
    assert result["stats"]["forward_passes"] >= 90  # the whole text was read, in about 100 pieces of a forward or more each
    # the short requests ran between the long text's pieces, not after them (queued behind it, none would be)
    assert beside >= 3, beside


def _abandoned_post(server: str, path: str, headers: dict[str, str], body: bytes) -> socket.socket:
    """A connection that has sent a whole POST; the client goes away when it is closed."""
    url = httpx.URL(server)
    connection = socket.create_connection((url.host, url.port))
    head = [f"POST {path} HTTP/1.1", f"Host: {url.host}:{url.port}", "Content-Type: application/json",
            f"Content-Length: {len(body)}", *(f"{name}: {value}" for name, value in headers.items())]
    connection.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    return connection


def test_the_work_of_a_client_that_went_away_is_cancelled(server: str) -> None:
    texts = [LONG_TEXT] * 6
    settings = Settings()  # the server's piece sizes: the defaults
    pieces = len(pieces_of(texts, settings.ner_piece_tokens, settings.ner_long_text_tokens))
    with httpx.Client(base_url=server, timeout=300) as http:
        before = _metric(http, "padellm_engine_batch_texts_sum")
        with _abandoned_post(server, "/v1/entities", ALPHA, json.dumps({"texts": texts}).encode()):
            _wait_for(lambda: _metric(http, "padellm_engine_batch_texts_sum") > before, "the request's first piece run")
        # the client is gone while about 600 pieces wait: the server lets go of them ...
        _wait_for(lambda: _metric(http, "padellm_queue_texts") == 0, "the abandoned request's texts released")
        assert 'status="499"' in http.get("/metrics").text  # ... because the client went away, not for a timeout
        # a request after it runs once the engine is done with whatever batch it was running
        assert http.post("/v1/entities", headers=ALPHA, json={"text": TEXT}).status_code == 200
        ran = _metric(http, "padellm_engine_batch_texts_sum") - before - 1
    assert 0 < ran < pieces / 2, (ran, pieces)  # the rest never reached the engine


def test_a_burst_beyond_capacity_gets_429_with_retry_after_and_no_5xx(tmp_path: Path, redis_url: str) -> None:
    """128 requests of 8 texts from 64 threads on a server whose admission (a fixed rate: the
    test's, not this machine's) fits 8 of them in the budget of its 30 s timeout. The first 8
    fill the queue and one batch (64 texts, so the batch does not wait for more); the ones that
    arrive meanwhile are shed with 429 and Retry-After; none is a 504 or another 5xx."""
    bodies = [{"texts": [f"{TEXT} {index:03d} {k}" for k in range(8)]} for index in range(128)]
    config = NERModelConfig.read(TINY_DIR)
    reading = Reading.of(ExtractOptions(config.name).validated(config), config)  # how the server counts the tiny model's work
    [tokens] = {sum(reading.work(text) for text in body["texts"]) for body in bodies}  # every request is the same work
    budget_s = 30.0 * 0.8  # NER_REQUEST_TIMEOUT_S * NER_ADMISSION_FRACTION
    ms_per_token = round(budget_s * 1000 / (8.5 * tokens), 3)
    assert 8 * tokens * ms_per_token / 1000 <= budget_s < 9 * tokens * ms_per_token / 1000  # 8 fit, not 9
    env = _env(tmp_path, redis_url, NER_REQUEST_TIMEOUT_S="30", NER_FIXED_MS_PER_TOKEN=str(ms_per_token),
               NER_BATCH_MAX_TEXTS="64", NER_BATCH_WAIT_MS="2000")
    with live_server(env, tmp_path / "uvicorn.log") as url, httpx.Client(base_url=url, timeout=300) as http:
        def send(index: int) -> httpx.Response:
            return http.post("/v1/entities", headers=ALPHA if index % 2 else BETA, json=bodies[index])

        with ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(send, range(128)))
    codes = [answer.status_code for answer in answers]
    assert not [code for code in codes if code >= 500], codes  # admitted requests were answered within the timeout
    assert set(codes) <= {200, 429} and codes.count(429) >= 1 and codes.count(200) >= 8, codes
    for answer in answers:
        if answer.status_code == 429:
            assert "at capacity" in answer.json()["detail"] and 1 <= int(answer.headers["Retry-After"]) <= 30, answer.text


def test_wrong_keys_from_one_address_are_throttled_and_right_keys_pass(tmp_path: Path, redis_url: str) -> None:
    env = _env(tmp_path, redis_url, NER_AUTH_FAILURES_PER_MINUTE="3")
    with live_server(env, tmp_path / "uvicorn.log") as url, httpx.Client(base_url=url, timeout=30) as http:
        codes = [http.get("/v1/models", headers={"X-API-Key": f"guess-{i}"}).status_code for i in range(5)]
        assert codes == [401, 401, 401, 429, 429]
        throttled = http.post("/v1/entities", json={"text": TEXT})  # a missing key is a failure too
        assert throttled.status_code == 429 and int(throttled.headers["Retry-After"]) >= 1
        assert "failed authentications" in throttled.json()["detail"]
        # a tenant at the same address (behind the same NAT or ingress) is not locked out by a stranger's guesses
        assert [http.get("/v1/models", headers=ALPHA).status_code for _ in range(5)] == [200] * 5


def test_an_unmigrated_database_is_migrated_on_start_or_refused(tmp_path: Path, redis_url: str) -> None:
    refusing = _env(tmp_path / "refuse", redis_url, PIPELINE_MIGRATE_ON_START="false")
    (tmp_path / "refuse").mkdir()
    with pytest.raises(RuntimeError, match=r"the server exited(.|\n)*alembic upgrade head"):
        with live_server(refusing, tmp_path / "refuse" / "uvicorn.log", ready_timeout_s=120):
            pass
    with live_server(_env(tmp_path, redis_url), tmp_path / "uvicorn.log") as url:
        submitted = httpx.post(f"{url}/v1/jobs", headers=ALPHA, json={"documents": [{"text": TEXT}]}, timeout=30)
        assert submitted.status_code == 202, submitted.text
