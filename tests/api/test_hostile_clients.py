"""The real server (uvicorn, tiny model, SQLite, a private Redis) under hostile and heavy use:
tenants kept apart, load shed with 429 and never a 5xx, a long text interleaved with other keys'
short ones, failed authentications throttled, capability errors as 422, and the schema
migrated on start (or the start refused)."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.local_services import PrivateRedis, free_port, live_server

TEXT = "EU rejects German call to boycott British lamb ."
ALPHA, BETA = {"X-API-Key": "alpha-key"}, {"X-API-Key": "beta-key"}


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = PrivateRedis(free_port(), tmp_path_factory.mktemp("redis") / "redis.log")
    server.start()
    yield server.url
    server.stop()


def _env(folder: Path, redis_url: str, **overrides: str) -> dict[str, str]:
    return {"NER_MODEL": "tiny-conll03", "NER_API_KEYS": "alpha-key,beta-key", "NER_RATE_LIMIT_PER_MINUTE": "100000",
            "NER_MAX_REQUEST_TOKENS": "40000",
            "DATABASE_URL": f"sqlite:///{folder / 'pipeline.db'}", "REDIS_URL": redis_url, **overrides}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[str]:
    """Two keys, a fresh database the server migrates when it starts."""
    folder = tmp_path_factory.mktemp("hostile")
    with live_server(_env(folder, redis_url), folder / "uvicorn.log") as url:
        yield url


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
        for field, value in (("decoder", "lud"), ("decoder", "speculative"), ("backend", "lud"), ("strategy", "fast_dllm"),
                             ("decoder", "fast_dllm")):
            response = http.post("/v1/entities", headers=ALPHA, json={"text": TEXT, field: value})
            assert response.status_code == 422, (field, value, response.text)
            assert "support" in response.json()["detail"] or "masked-diffusion" in response.json()["detail"]
        response = http.post("/v1/jobs", headers=ALPHA, json={"documents": [{"text": TEXT}], "strategy": "fast_dllm"})
        assert response.status_code == 422


def test_bad_documents_are_refused_at_the_door_and_echoes_stay_small(server: str) -> None:
    with httpx.Client(base_url=server, timeout=60) as http:
        for text, reason in (("", "empty text"), ("   ", "empty text"), ("x" * 20_001, "NER_MAX_TEXT_CHARS"),
                             ("a\ud800", "unpaired surrogate")):
            body = json.dumps({"documents": [{"text": text}]}).encode()  # ASCII escapes: a lone surrogate travels as \ud800
            response = http.post("/v1/jobs", headers={**ALPHA, "Content-Type": "application/json"}, content=body)
            assert response.status_code == 422 and reason in response.text, (reason, response.text[:300])
        huge = http.post("/v1/entities", headers=ALPHA, json={"text": TEXT, "labels": ["PER"] * 500_000})
        assert huge.status_code == 422 and len(huge.content) < 2_000
        unknown = http.post("/v1/jobs", headers=ALPHA, json={"documents": [{"text": TEXT}], "priority": "high"})
        assert unknown.status_code == 422 and "priority" in unknown.text


def test_a_maximal_text_does_not_hold_back_another_keys_short_request(server: str) -> None:
    long_text = " ".join(f"Peter Blackburn of Reuters met officials in Brussels on day {i} ." for i in range(400))[:20_000]
    with httpx.Client(base_url=server, timeout=120) as http:
        def short() -> float:
            began = time.perf_counter()
            assert http.post("/v1/entities", headers=BETA, json={"text": TEXT}).status_code == 200
            return time.perf_counter() - began

        short()
        unloaded = statistics.median(short() for _ in range(7))
        answer: dict = {}

        def maximal() -> None:
            with httpx.Client(base_url=server, timeout=120) as own:
                began = time.perf_counter()
                answer["response"] = own.post("/v1/entities", headers=ALPHA, json={"text": long_text})
                answer["seconds"] = time.perf_counter() - began

        worker = threading.Thread(target=maximal)
        worker.start()
        time.sleep(0.2)
        loaded = []
        while worker.is_alive() and len(loaded) < 15:
            loaded.append(short())
        worker.join()
    response = answer["response"]
    assert response.status_code == 200, response.text[:300]
    result = response.json()["results"][0]
    assert all(long_text[e["start"]:e["end"]] == e["text"] for e in result["entities"])
    assert result["stats"]["forward_passes"] >= 90  # the whole text was read, in about 100 pieces of a forward or more each
    assert len(loaded) >= 3, f"the long text took {answer['seconds']:.2f} s: too short to measure beside it"
    # the short requests ran between the long text's pieces, not after it
    assert statistics.median(loaded) <= 2 * unloaded + 0.02, (unloaded, loaded, answer["seconds"])


def _engine_texts(http: httpx.Client) -> float:
    """Texts (pieces) the server's engine has run so far, from ``/metrics``."""
    import re

    return float(re.search(r"^padellm_engine_batch_texts_sum (\S+)$", http.get("/metrics").text, re.M).group(1))


def test_the_work_of_a_client_that_went_away_is_cancelled(server: str) -> None:
    long_text = " ".join(f"Peter Blackburn of Reuters met officials in Brussels on day {i} ." for i in range(400))[:20_000]
    with httpx.Client(base_url=server, timeout=60) as http:
        before = _engine_texts(http)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server}/v1/entities", headers=ALPHA, json={"texts": [long_text] * 6}, timeout=0.3)
        time.sleep(4.0)  # all of it takes about 3 s on the tiny model
        ran = _engine_texts(http) - before
    assert 0 < ran < 400, ran  # of about 600 pieces: the rest never reached the engine


def test_a_burst_beyond_capacity_gets_429_with_retry_after_and_no_5xx(tmp_path: Path, redis_url: str) -> None:
    env = _env(tmp_path, redis_url, NER_REQUEST_TIMEOUT_S="1.0")
    with live_server(env, tmp_path / "uvicorn.log") as url, httpx.Client(base_url=url, timeout=30) as http:
        assert http.post("/v1/entities", headers=ALPHA, json={"texts": [TEXT] * 8}).status_code == 200  # the rate is measured

        def send(index: int) -> tuple[int, str | None, float]:
            began = time.perf_counter()
            response = http.post("/v1/entities", headers=ALPHA if index % 2 else BETA,
                                 json={"texts": [f"{TEXT} {index} {k}" for k in range(8)]})
            return response.status_code, response.headers.get("Retry-After"), time.perf_counter() - began

        with ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(send, range(128)))
    codes = [code for code, _, _ in answers]
    assert not [code for code in codes if code >= 500], codes
    assert set(codes) <= {200, 429} and codes.count(429) >= 1 and codes.count(200) >= 8, codes
    assert all(retry is not None and int(retry) >= 1 for code, retry, _ in answers if code == 429)
    assert max(seconds for code, _, seconds in answers if code == 200) < 1.0 + 0.5  # admitted: answered within the timeout (+ client overhead)


def test_wrong_keys_from_one_address_are_throttled(tmp_path: Path, redis_url: str) -> None:
    env = _env(tmp_path, redis_url, NER_AUTH_FAILURES_PER_MINUTE="3")
    with live_server(env, tmp_path / "uvicorn.log") as url, httpx.Client(base_url=url, timeout=30) as http:
        codes = [http.get("/v1/models", headers={"X-API-Key": f"guess-{i}"}).status_code for i in range(5)]
        assert codes == [401, 401, 401, 429, 429]
        throttled = http.get("/v1/models", headers=ALPHA)  # even a right key, from this address, for a while
        assert throttled.status_code == 429 and int(throttled.headers["Retry-After"]) >= 1
        assert "failed authentications" in throttled.json()["detail"]


def test_an_unmigrated_database_is_migrated_on_start_or_refused(tmp_path: Path, redis_url: str) -> None:
    refusing = _env(tmp_path / "refuse", redis_url, PIPELINE_MIGRATE_ON_START="false")
    (tmp_path / "refuse").mkdir()
    with pytest.raises(RuntimeError, match=r"the server exited(.|\n)*alembic upgrade head"):
        with live_server(refusing, tmp_path / "refuse" / "uvicorn.log", ready_timeout_s=120):
            pass
    with live_server(_env(tmp_path, redis_url), tmp_path / "uvicorn.log") as url:
        submitted = httpx.post(f"{url}/v1/jobs", headers=ALPHA, json={"documents": [{"text": TEXT}]}, timeout=30)
        assert submitted.status_code == 202, submitted.text
