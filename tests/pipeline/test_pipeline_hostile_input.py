"""The real server (uvicorn, tiny model, a private Redis) on SQLite and on PostgreSQL: one rule
for strings at the door whatever the database (NUL characters and unpaired surrogates are a 422
on every route, never a 500 from PostgreSQL), and ``Idempotency-Key`` on ``POST /v1/jobs``: a
retried submission gets the first job, never a copy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
from sqlalchemy import func, select

from pipeline.db import session_factory
from pipeline.models import Document, Job
from tests.local_services import PrivateRedis, free_port, live_server

ALPHA, BETA = {"X-API-Key": "alpha-key"}, {"X-API-Key": "beta-key"}
TEXT = "EU rejects German call to boycott British lamb ."
NUL_MESSAGE = "contains a NUL character (\\u0000) at character 2"


@dataclass
class Served:
    """A live server and the database it stores into."""

    url: str
    database_url: str

    def count(self, table) -> int:
        with session_factory(self.database_url)() as session:
            return session.scalar(select(func.count()).select_from(table))


@pytest.fixture(scope="module")
def server(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("hostile-input")
    redis = PrivateRedis(free_port(), folder / "redis.log")
    redis.start()
    env = {"NER_MODEL": "tiny-conll03", "NER_API_KEYS": "alpha-key,beta-key", "NER_RATE_LIMIT_PER_MINUTE": "100000",
           "DATABASE_URL": module_database_url, "REDIS_URL": redis.url}
    try:
        with live_server(env, folder / "uvicorn.log") as url:
            yield Served(url, module_database_url)
    finally:
        redis.stop()


@pytest.fixture
def http(server: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def _post(http: httpx.Client, path: str, body: object, headers: dict[str, str] = ALPHA) -> httpx.Response:
    """POST ``body`` as ASCII JSON (``\\u0000`` and lone surrogates travel as escapes)."""
    return http.post(path, headers={**headers, "Content-Type": "application/json"}, content=json.dumps(body).encode())


def _messages(response: httpx.Response) -> list[str]:
    return [error["msg"] for error in response.json()["detail"]]


@pytest.mark.parametrize(("document", "field"), [
    ({"text": "a \x00 b"}, "text"),
    ({"text": TEXT, "external_id": "ex\x00"}, "external_id"),
    ({"text": TEXT, "language": "en\x00"}, "language"),
])
def test_nul_in_any_field_of_a_job_is_a_422_on_every_database(server: Served, http: httpx.Client, document: dict, field: str) -> None:
    documents = server.count(Document)
    response = _post(http, "/v1/jobs", {"documents": [document]})
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"][-1] == field and NUL_MESSAGE in error["msg"]
    assert server.count(Document) == documents


def test_nul_in_other_routes_and_fields_is_the_same_422(server: Served, http: httpx.Client) -> None:
    job = _post(http, "/v1/jobs", {"documents": [{"text": TEXT}]})
    assert job.status_code == 202, job.text
    document = job.json()["document_ids"][0]
    # the jobs route and /v1/entities answer a NUL in a text with the same message
    jobs_text = _messages(_post(http, "/v1/jobs", {"documents": [{"text": "a \x00 b"}]}))
    for body in ({"text": "a \x00 b"}, {"texts": [TEXT, "a \x00 b"]}):
        response = _post(http, "/v1/entities", body)
        assert response.status_code == 422 and _messages(response) == jobs_text, response.text
    for body in ({"text": TEXT, "labels": ["PE\x00R"]}, {"text": TEXT, "model": "ti\x00y"}, {"text": TEXT, "language": "en\x00"},
                 {"text": TEXT, "strategy": "pa\x00ellm"}):
        response = _post(http, "/v1/entities", body)
        assert response.status_code == 422 and NUL_MESSAGE in " ".join(_messages(response)), (body, response.text)
    assert _post(http, "/v1/jobs", {"documents": [{"text": TEXT}], "strategy": "pa\x00ellm"}).status_code == 422
    entities = http.get(f"/v1/documents/{document}/entities", params={"model_version": "v\x00"}, headers=ALPHA)
    assert entities.status_code == 422 and "NUL character" in entities.text, entities.text


def test_bad_documents_are_refused_at_the_door(server: Served, http: httpx.Client) -> None:
    documents = server.count(Document)
    for document, reason in (({"text": ""}, "empty text"), ({"text": "x" * 20_001}, "NER_MAX_TEXT_CHARS"),
                             ({"text": "a\ud800"}, "unpaired surrogate"), ({"text": TEXT, "external_id": "a\udc00"}, "external_id"),
                             ({"text": TEXT, "external_id": "x" * 256}, "at most 255"), ({"text": TEXT, "language": ""}, "at least 1")):
        response = _post(http, "/v1/jobs", {"documents": [document]})
        assert response.status_code == 422 and reason in response.text, (reason, response.text[:300])
    assert server.count(Document) == documents


def test_a_retried_submission_gets_the_first_job(server: Served, http: httpx.Client) -> None:
    body = {"documents": [{"text": TEXT, "external_id": "retried-1"}, {"text": "Bonn ."}, {"text": "Bonn ."}]}
    first = _post(http, "/v1/jobs", body, {**ALPHA, "Idempotency-Key": "submit-1"})
    assert first.status_code == 202 and "Idempotent-Replayed" not in first.headers, first.text
    jobs, documents = server.count(Job), server.count(Document)
    again = _post(http, "/v1/jobs", body, {**ALPHA, "Idempotency-Key": "submit-1"})
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true", again.text
    assert {k: v for k, v in again.json().items() if k != "status"} == {k: v for k, v in first.json().items() if k != "status"}
    assert again.headers["Location"] == first.headers["Location"]
    assert (server.count(Job), server.count(Document)) == (jobs, documents)
    # the same key with another body: refused, saying why
    other = _post(http, "/v1/jobs", {"documents": [{"text": "Another text ."}]}, {**ALPHA, "Idempotency-Key": "submit-1"})
    assert other.status_code == 422 and "Idempotency-Key 'submit-1' was sent before with another request body" in other.json()["detail"]
    # keys are per API key: another key's "submit-1" is another job
    theirs = _post(http, "/v1/jobs", body, {**BETA, "Idempotency-Key": "submit-1"})
    assert theirs.status_code == 202 and theirs.json()["job_id"] != first.json()["job_id"]
    assert server.count(Job) == jobs + 1
    for key in ("", "x" * 256, "with space", "tab\tkey"):
        response = _post(http, "/v1/jobs", body, {**ALPHA, "Idempotency-Key": key})
        assert response.status_code == 422, (key, response.text)


def test_concurrent_submissions_with_one_key_store_one_job(server: Served) -> None:
    body = {"documents": [{"text": f"Concurrent text {i} about Berlin ."} for i in range(3)]}
    jobs, documents = server.count(Job), server.count(Document)

    def submit(_: int) -> httpx.Response:
        with httpx.Client(base_url=server.url, timeout=120) as own:
            return _post(own, "/v1/jobs", body, {**ALPHA, "Idempotency-Key": "concurrent-1"})

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(submit, range(8)))
    assert all(a.status_code in (200, 202) for a in answers), [a.text for a in answers]
    assert sorted(a.status_code for a in answers) == [200] * 7 + [202]
    assert len({a.json()["job_id"] for a in answers}) == 1 and len({tuple(a.json()["document_ids"]) for a in answers}) == 1
    assert (server.count(Job), server.count(Document)) == (jobs + 1, documents + 3)
