"""The real server (uvicorn, tiny model, a private Redis) on SQLite and on PostgreSQL refuses what
it would otherwise ignore or misread, saying what it takes: options a model ignores, a body that is
not JSON (400) or not sent as JSON (415), a document listed twice in a job; nothing is stored."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from sqlalchemy import func, select

from pipeline.db import session_factory
from pipeline.models import Document, Job
from tests.local_services import PrivateRedis, free_port, live_server

ALPHA = {"X-API-Key": "alpha-key"}
TEXT = "EU rejects German call to boycott British lamb ."


@dataclass
class Served:
    url: str
    database_url: str

    def count(self, table) -> int:
        with session_factory(self.database_url)() as session:
            return session.scalar(select(func.count()).select_from(table))


@pytest.fixture(scope="module")
def server(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("refusals")
    redis = PrivateRedis(free_port(), folder / "redis.log")
    redis.start()
    env = {"NER_MODEL": "tiny-conll03", "NER_API_KEYS": "alpha-key", "NER_RATE_LIMIT_PER_MINUTE": "100000",
           "DATABASE_URL": module_database_url, "REDIS_URL": redis.url}
    try:
        with live_server(env, folder / "uvicorn.log") as url:
            yield Served(url, module_database_url)
    finally:
        redis.stop()


@pytest.fixture
def http(server: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=ALPHA, timeout=60) as client:
        yield client


@pytest.mark.parametrize(("body", "says"), [
    ({"model": "en-conll03-diffusion", "strategy": "fast_dllm", "decoder": "greedy"}, "strategy 'fast_dllm' takes no decoder"),
    ({"model": "en-conll03-diffusion", "strategy": "padellm"}, "is a masked-diffusion model"),
    ({"model": "en-conll03-diffusion", "strategy": "ar"}, "supports the strategies fast_dllm"),
    ({"strategy": "fast_dllm"}, "supports the strategies padellm, ar"),
])
def test_options_a_model_would_ignore_are_refused_with_what_it_supports(http: httpx.Client, body: dict, says: str) -> None:
    response = http.post("/v1/entities", json={"text": TEXT, **body})
    assert response.status_code == 422 and says in response.text, response.text


@pytest.mark.parametrize("path", ["/v1/entities", "/v1/jobs"])
def test_a_body_that_is_not_json_is_a_400_and_one_sent_as_text_a_415(server: Served, http: httpx.Client, path: str) -> None:
    jobs, documents = server.count(Job), server.count(Document)
    broken = http.post(path, content=b'{"text": ', headers={"Content-Type": "application/json"})
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["detail"], broken.text
    as_text = http.post(path, content=b'{"text": "Bonn ."}', headers={"Content-Type": "text/plain"})
    assert as_text.status_code == 415 and "'text/plain'" in as_text.json()["detail"] and "application/json" in as_text.json()["detail"]
    assert (server.count(Job), server.count(Document)) == (jobs, documents)


def test_a_document_listed_twice_in_a_job_is_refused(server: Served, http: httpx.Client) -> None:
    first = http.post("/v1/jobs", json={"documents": [{"text": TEXT}]})
    assert first.status_code == 202, first.text
    [document] = first.json()["document_ids"]
    jobs = server.count(Job)
    twice = http.post("/v1/jobs", json={"document_ids": [document, document]})
    assert twice.status_code == 422 and f"document id {document} is listed more than once" in twice.text, twice.text
    assert server.count(Job) == jobs
    once = http.post("/v1/jobs", json={"document_ids": [document]})
    assert once.status_code == 202 and once.json()["total"] == 1 and once.json()["document_ids"] == [document], once.text
    assert uuid.UUID(once.json()["job_id"])


def test_a_job_takes_the_decoder_as_post_v1_entities_does(server: Served, http: httpx.Client) -> None:
    submitted = http.post("/v1/jobs", json={"documents": [{"text": TEXT}], "strategy": "ar", "decoder": "greedy"})
    assert submitted.status_code == 202 and submitted.json()["decoder"] == "greedy", submitted.text
    job = http.get(f"/v1/jobs/{submitted.json()['job_id']}")
    assert job.status_code == 200 and (job.json()["strategy"], job.json()["decoder"]) == ("ar", "greedy"), job.text
    for body, says in (({"decoder": "beam"}, "unknown decoder 'beam'"), ({"decoder": "padellm"}, "'padellm' is a strategy"),
                       ({"backend": "greedy"}, "`backend` in a job is now `decoder`")):
        jobs = server.count(Job)
        refused = http.post("/v1/jobs", json={"documents": [{"text": TEXT}], **body})
        assert refused.status_code == 422 and says in refused.text, refused.text
        assert server.count(Job) == jobs
