"""Real Celery workers (prefork subprocesses) on PostgreSQL and a private redis-server: a worker
SIGKILLed mid-batch and Redis restarted without persistence mid-job both end with every
document's entities stored exactly once and exact counts; beat fires a nightly run that is due and
its job completes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from celery.beat import PersistentScheduler
from sqlalchemy import func, select

from pipeline import crud, processing
from pipeline.celery_app import app, parse_cron
from pipeline.model_version import model_version
from pipeline.models import DocumentResult, EntityRow, Job, JobDocument
from tests.local_services import Workers

VISIBILITY_S = 8
DOCUMENTS = 48


def _texts() -> list[str]:
    return [f"Report {i}: Peter Blackburn met officials of the European Commission in Brussels on Monday, "
            f"and Germany said on day {i} it would follow the advice of the EU ." for i in range(DOCUMENTS)]


@pytest.fixture
def workers(migrated: str, private_redis, tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(migrated, private_redis.url, tmp_path, PIPELINE_VISIBILITY_TIMEOUT_S=str(VISIBILITY_S))
    yield pool
    pool.close()


@pytest.fixture(params=["postgresql"])
def database_url(request: pytest.FixtureRequest) -> str:
    """These tests run on PostgreSQL, the production database."""
    return request.getfixturevalue(f"{request.param}_url")


def _submit(sessions, redis_url: str, engine) -> tuple[int, list[int]]:
    with sessions.begin() as session:
        ids = crud.add_documents(session, [crud.NewDocument(t) for t in _texts()])
        job_id = crud.create_job(session, ids, model_version(engine)).id
    with app.connection_for_write(redis_url) as connection, connection.Producer() as producer:
        for chunk in processing.chunked(ids, 4):
            app.send_task("pipeline.process_chunk", (job_id, chunk), producer=producer)
    with sessions.begin() as session:
        crud.mark_dispatched(session, job_id)  # handed over, as enqueue_job records it
    return job_id, ids


def _wait(sessions, job_id: int, until, timeout: float, workers: Workers) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sessions() as session:
            job = session.get(Job, job_id)
            if until(job):
                return job
        time.sleep(0.05)
    pytest.fail(f"job {job_id} did not get there in {timeout} s: {job.status} {job.processed}/{job.total}\n{workers.tail()}")


def _assert_exactly_once(sessions, job_id: int, ids: list[int], engine) -> None:
    version = model_version(engine)
    expected = engine.extract(_texts())
    assert sum(len(r.entities) for r in expected) >= DOCUMENTS, "compares entities, not empty lists"
    with sessions() as session:
        job = session.get(Job, job_id)
        assert (job.status, job.processed, job.failed, job.total) == ("completed", DOCUMENTS, 0, DOCUMENTS)
        assert session.scalar(select(func.count()).select_from(DocumentResult)) == DOCUMENTS
        assert set(session.scalars(select(JobDocument.status).where(JobDocument.job_id == job_id))) == {"processed"}
        assert session.scalar(select(func.count()).select_from(EntityRow)) == sum(len(r.entities) for r in expected)
        for doc_id, result in zip(ids, expected):
            marker = session.get(DocumentResult, (doc_id, version))
            assert marker is not None and marker.entity_count == len(result.entities)
            stored = session.execute(select(EntityRow.start, EntityRow.end, EntityRow.label)
                                     .where(EntityRow.document_id == doc_id, EntityRow.model_version == version)).all()
            assert sorted(stored) == sorted((e.start, e.end, e.label) for e in result.entities)


def test_worker_killed_mid_batch_loses_and_doubles_nothing(workers: Workers, sessions, private_redis, tiny_engine) -> None:
    first = workers.worker("first")
    job_id, ids = _submit(sessions, private_redis.url, tiny_engine)
    _wait(sessions, job_id, lambda j: j.processed >= 2, 180, workers)
    workers.kill(first)
    with sessions() as session:
        at_kill = session.get(Job, job_id).processed
    assert at_kill < DOCUMENTS, "the job finished before the worker could be killed"
    workers.worker("second")  # the killed worker's unacknowledged chunk comes back after the visibility timeout
    _wait(sessions, job_id, lambda j: j.status == "completed", 300, workers)
    _assert_exactly_once(sessions, job_id, ids, tiny_engine)


def test_redis_restart_without_persistence_mid_job(workers: Workers, sessions, private_redis, tiny_engine) -> None:
    workers.worker("only")
    workers.beat()
    job_id, ids = _submit(sessions, private_redis.url, tiny_engine)
    _wait(sessions, job_id, lambda j: j.processed >= 2, 180, workers)
    private_redis.stop()  # every queued chunk is lost with it
    time.sleep(1)
    private_redis.start()
    # the worker reconnects; beat's stalled-job sweep enqueues the pending documents again
    _wait(sessions, job_id, lambda j: j.status == "completed", 300, workers)
    _assert_exactly_once(sessions, job_id, ids, tiny_engine)
    assert f"job {job_id} stalled; requeueing" in workers.log_text()


def _last_nightly_run_two_days_ago(schedule_file: Path) -> None:
    """Beat's schedule file as a beat stopped since the day before yesterday left it: the nightly
    entry (the settings' cron, 02:00) last ran two days ago, so the next beat finds a run due at
    once instead of at the next 02:00."""
    scheduler = PersistentScheduler(app=app, schedule_filename=str(schedule_file))
    entry = scheduler.schedule["nightly-pending-documents"]
    assert not entry.is_due().is_due, "a fresh schedule waits for the next 02:00"
    entry.last_run_at = app.now() - timedelta(days=2)
    scheduler.close()


def test_beat_fires_the_nightly_run_over_pending_documents(workers: Workers, sessions, tiny_engine) -> None:
    with sessions.begin() as session:
        ids = crud.add_documents(session, [crud.NewDocument(t) for t in _texts()[:3]])
    _last_nightly_run_two_days_ago(workers.beat_schedule)
    workers.worker("nightly")
    workers.beat()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        with sessions() as session:
            job = session.scalar(select(Job).where(Job.status == "completed"))
        if job is not None:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the nightly run did not complete a job in 240 s\n{workers.tail()}")
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 1
        assert (job.total, job.processed, job.failed, job.model_version) == (3, 3, 0, model_version(tiny_engine))
        assert sorted(session.scalars(select(JobDocument.document_id).where(JobDocument.job_id == job.id))) == ids
        assert session.scalar(select(func.count()).select_from(DocumentResult)) == 3
    assert "Scheduler: Sending due task nightly-pending-documents (pipeline.nightly)" in workers.log_text()
    assert f"nightly run: job {job.id} over 3 documents" in workers.log_text()


def test_beat_schedule_comes_from_the_settings() -> None:
    nightly = app.conf.beat_schedule["nightly-pending-documents"]
    assert nightly["task"] == "pipeline.nightly" and nightly["schedule"] == parse_cron("0 2 * * *")
    assert parse_cron("30 1 * * 1-5").hour == {1} and parse_cron("30 1 * * 1-5").day_of_week == {1, 2, 3, 4, 5}
    with pytest.raises(ValueError, match="5 fields"):
        parse_cron("0 2 * *")
    assert app.conf.task_acks_late and app.conf.task_reject_on_worker_lost and app.conf.worker_prefetch_multiplier == 1
    assert app.conf.worker_proc_alive_timeout >= 60  # a pool process loads the model before it reports up
