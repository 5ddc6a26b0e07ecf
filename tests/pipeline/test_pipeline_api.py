"""The jobs routes of the assembled app (no API keys: everything belongs to ``local``): jobs are
stored and their chunks land in Redis (db 13); status, entities and bad requests."""

from __future__ import annotations

import base64
import json

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import select

from pipeline import crud
from pipeline.model_version import model_version_of_path
from pipeline.models import Document, Job


@pytest.fixture
def client(migrated: str, redis_db13: str) -> TestClient:
    from ner_service.settings import Settings
    from padellm_ner.asgi import create_app

    return TestClient(create_app(Settings(ner_model="tiny-conll03", ner_api_keys="", ner_rate_limit_per_minute=10_000, database_url=migrated)))


def _job_row_id(sessions, public_id: str) -> int:
    with sessions() as session:
        return session.scalar(select(Job.id).where(Job.public_id == public_id))


def _queued_chunks(url: str) -> list[list]:
    """The arguments (job id, document ids) of the chunks waiting in the Celery queue."""
    messages = [json.loads(raw) for raw in redis.Redis.from_url(url).lrange("celery", 0, -1)]
    return [json.loads(base64.b64decode(message["body"]))[0] for message in messages]


def test_inline_job_is_stored_and_enqueued(client: TestClient, redis_db13: str, sessions) -> None:
    docs = [{"text": f"Text number {i} about Berlin.", "external_id": f"doc-{i}"} for i in range(6)] + [{"text": "张三，高级经济师。", "language": "zh"}]
    unserved = client.post("/v1/jobs", json={"documents": [*docs, {"text": "Ohne Id.", "language": "de"}]})
    assert unserved.status_code == 422 and "no model for language 'de'" in unserved.text
    answer = client.post("/v1/jobs", json={"documents": docs})
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert body["total"] == 7 and body["status"] == "queued" and body["strategy"] == "padellm"
    assert body["model_version"] == ",".join(sorted([model_version_of_path("tiny-conll03"), model_version_of_path("zh-resume")]))
    assert answer.headers["location"] == body["status_url"] == f"/v1/jobs/{body['job_id']}"
    job_row = _job_row_id(sessions, body["job_id"])
    with sessions() as session:
        stored = crud.pending_document_ids(session, job_row)
        assert len(stored) == 7 and session.get(Document, stored[-1]).language == "zh"
        assert crud.public_ids_of(session, stored) == body["document_ids"]
    chunks = _queued_chunks(redis_db13)
    assert sorted(doc_id for args in chunks for doc_id in args[1]) == stored
    assert {args[0] for args in chunks} == {job_row} and max(len(args[1]) for args in chunks) == 4
    status = client.get(body["status_url"]).json()
    assert (status["id"], status["status"], status["processed"], status["failed"], status["total"], status["progress"]) == (
        body["job_id"], "queued", 0, 0, 7, 0.0)
    first = body["document_ids"][0]
    entities = client.get(f"/v1/documents/{first}/entities").json()
    assert entities == {"document_id": first, "external_id": "doc-0", "status": "pending", "error": None, "model_version": None, "entities": []}
    # resubmitting the same external ids reuses the documents
    again = client.post("/v1/jobs", json={"documents": docs[:2], "strategy": "ar"})
    assert again.status_code == 202 and again.json()["total"] == 2 and again.json()["strategy"] == "ar"
    assert again.json()["document_ids"] == body["document_ids"][:2]
    labelled = client.post("/v1/jobs", json={"documents": docs[:1], "labels": ["PER"]})
    assert labelled.status_code == 202 and labelled.json()["labels"] == ["PER"] and body["labels"] is None
    assert client.get(labelled.json()["status_url"]).json()["labels"] == ["PER"]
    overlapping = client.post("/v1/jobs", json={"documents": docs[:1], "flat_ner": False})
    assert overlapping.status_code == 202 and overlapping.json()["flat_ner"] is False and body["flat_ner"] is True
    assert client.get(overlapping.json()["status_url"]).json()["flat_ner"] is False
    by_id = client.post("/v1/jobs", json={"document_ids": [first, body["document_ids"][-1]]})
    assert by_id.json()["total"] == 2 and by_id.json()["document_ids"] == [first, body["document_ids"][-1]]


def test_processed_document_entities(client: TestClient, sessions, tiny_engine) -> None:
    from ner_service.engine import EnginePool
    from pipeline.runner import run_job

    submitted = client.post("/v1/jobs", json={"documents": [{"text": "EU rejects German call to boycott British lamb ."}, {"text": "Bonn ."}]})
    job_id, (first, second) = submitted.json()["job_id"], submitted.json()["document_ids"]
    with sessions() as session:  # a text that passed the door but fails when the job runs (stored before the check)
        session.get(Document, crud.owned_document_ids(session, "local", [second])[0]).text = " "
        session.commit()
    run_job(sessions, EnginePool.serving(tiny_engine), _job_row_id(sessions, job_id), chunk_size=4)
    status = client.get(f"/v1/jobs/{job_id}").json()
    assert (status["status"], status["processed"], status["failed"], status["progress"]) == ("completed", 1, 1, 1.0)
    found = client.get(f"/v1/documents/{first}/entities").json()
    expected = tiny_engine.extract(["EU rejects German call to boycott British lamb ."])[0].entities
    assert expected, "compares entities, not empty lists"
    assert found["status"] == "processed" and found["model_version"] == model_version_of_path("tiny-conll03")
    assert [(e["start"], e["end"], e["label"]) for e in found["entities"]] == [(e.start, e.end, e.label) for e in expected]
    failed = client.get(f"/v1/documents/{second}/entities").json()
    assert (failed["status"], failed["error"]) == ("failed", "empty text")


@pytest.mark.parametrize(("payload", "code", "fragment"), [
    ({}, 422, "documents"),
    ({"documents": [{"text": "a"}], "document_ids": ["6f1c3d7e-93a4-4b8e-9d57-2f0b9c1e4a10"]}, 422, "either"),
    ({"documents": []}, 422, "at least 1"),
    ({"documents": [{"external_id": "x"}]}, 422, "text"),
    ({"documents": [{"text": "x" * 20_001}]}, 422, "more than NER_MAX_TEXT_CHARS=20000"),
    ({"documents": [{"text": "  "}]}, 422, "empty text"),
    ({"documents": [{"text": "a\ud800b"}]}, 422, "unpaired surrogate at character 1"),
    ({"document_ids": [41]}, 422, "UUID"),
    ({"documents": [{"text": "a"}], "strategy": "beam"}, 422, "unknown strategy 'beam'"),
    ({"documents": [{"text": "a"}], "strategy": "fast_dllm"}, 422, "not a masked-diffusion model"),
    ({"documents": [{"text": "a"}], "decoder": "ar"}, 422, "'ar' is a strategy: send it as `strategy`"),
    ({"documents": [{"text": "a"}], "decoder": "lud"}, 422, "not fine-tuned for lexical units"),
    ({"documents": [{"text": "a"}], "backend": "greedy"}, 422, "`backend` in a job is now `decoder`"),
    ({"documents": [{"text": "a"}], "labels": ["drug"]}, 422, "unknown label(s) 'drug' for model 'tiny-conll03'"),
    ({"documents": [{"text": "a"}], "labels": [{"name": "PER", "description": "a person"}]}, 422, "descriptions are for open-label models"),
    ({"documents": [{"text": "a"}], "labels": []}, 422, "at least 1"),
    ({"documents": [{"text": "a"}], "labels": ["x" * 100] * 21}, 422, "2,100 characters in all; at most 2,000"),
    ({"documents": [{"text": "a"}], "colour": "red"}, 422, "Extra inputs"),
    ({"documents": [{"text": "a", "colour": "red"}]}, 422, "Extra inputs"),
    ({"document_ids": ["6f1c3d7e-93a4-4b8e-9d57-2f0b9c1e4a10"]}, 404, "6f1c3d7e-93a4-4b8e-9d57-2f0b9c1e4a10"),
])
def test_bad_requests_get_clear_errors(client: TestClient, payload: dict, code: int, fragment: str) -> None:
    answer = client.post("/v1/jobs", content=json.dumps(payload), headers={"Content-Type": "application/json"})  # ASCII escapes: a lone surrogate travels
    assert answer.status_code == code and fragment in answer.text, answer.text


def test_a_job_on_an_open_model_says_which_labels_it_never_trained_on(migrated: str, redis_db13: str, open_model_folder,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from ner_service.settings import Settings, get_settings
    from padellm_ner.asgi import create_app

    monkeypatch.setenv("NER_MODEL", str(open_model_folder))  # the jobs' pool reads the process's settings
    get_settings.cache_clear()
    client = TestClient(create_app(Settings(ner_model=str(open_model_folder), ner_api_keys="", database_url=migrated)))
    job = client.post("/v1/jobs", json={"documents": [{"text": "Angela Merkel met Emmanuel Macron in Paris ."}],
                                        "labels": ["person", "weapon", {"name": "river", "description": "a stream of water"}]})
    assert job.status_code == 202, job.text
    assert job.json()["unfamiliar_labels"] == ["weapon"] and job.json()["labels"][1] == "weapon"  # asked all the same
    plain = client.post("/v1/jobs", json={"documents": [{"text": "Paris ."}], "labels": ["person"]})
    assert plain.status_code == 202 and plain.json()["unfamiliar_labels"] == []


def test_conflicting_external_id_and_unknown_ids(client: TestClient) -> None:
    assert client.post("/v1/jobs", json={"documents": [{"text": "one", "external_id": "e"}]}).status_code == 202
    conflict = client.post("/v1/jobs", json={"documents": [{"text": "two", "external_id": "e"}]})
    assert conflict.status_code == 409 and "'e'" in conflict.json()["detail"]
    unknown = "6f1c3d7e-93a4-4b8e-9d57-2f0b9c1e4a10"
    assert client.get(f"/v1/jobs/{unknown}").status_code == 404
    assert client.get(f"/v1/documents/{unknown}/entities").status_code == 404
    assert client.get("/v1/jobs/1").status_code == 422  # row numbers are not ids
    assert client.get("/v1/jobs/not-a-uuid").status_code == 422
