"""Celery tasks: process a chunk of a job, the nightly run and the sweeps that enqueue jobs never
handed to Redis and requeue stalled ones. The engine is loaded once per worker process (at
pool-process start, else on first use)."""

from __future__ import annotations

import logging
from datetime import timedelta

import redis.exceptions
import sqlalchemy.exc
from celery.signals import worker_process_init
from kombu.exceptions import OperationalError as BrokerError

from ner_service.engine import EnginePool
from ner_service.engine.defaults import DEFAULT_STRATEGY
from ner_service.settings import get_settings
from pipeline import crud, processing, routing
from pipeline.celery_app import app
from pipeline.db import session_factory
from pipeline.models import utcnow

log = logging.getLogger(__name__)

#: Errors worth retrying: the database or Redis is briefly unreachable or locked.
TRANSIENT = (sqlalchemy.exc.OperationalError, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, BrokerError)

_pool: EnginePool | None = None


def get_pool() -> EnginePool:
    """This process's engines: ``NER_MODEL`` and, on first use, the model of each other language."""
    global _pool
    if _pool is None or _pool.default != get_settings().ner_model:
        _pool = routing.configured_pool()
    return _pool


@worker_process_init.connect
def _load_engine(**_: object) -> None:
    # the worker's processes share the machine's cores: one torch thread each unless NER_THREADS says otherwise
    from ner_service.engine.cpu import available_cpus, configure_threads

    configure_threads(processes=available_cpus())
    try:
        pool = get_pool()
        pool.engine(pool.default)
    except Exception:  # noqa: BLE001 - the first task loads it again and fails its job with the error
        log.exception("could not load the NER model at worker start")


def enqueue_job(job_id: int) -> int:
    """Send the job's pending documents to the workers in chunks and record that it was handed
    over; returns the number of chunks. Raises one of :data:`TRANSIENT` when Redis fails (in the
    API and beat, also when it does not answer within ``REDIS_TIMEOUT_S``, a few retries)."""
    with session_factory()() as session:
        pending = crud.pending_document_ids(session, job_id)
    chunks = processing.chunked(pending, get_settings().pipeline_chunk_size)
    with app.producer_or_acquire() as producer:
        for chunk in chunks:
            process_chunk.apply_async((job_id, chunk), producer=producer)
    with session_factory().begin() as session:
        crud.mark_dispatched(session, job_id)
    return len(chunks)


@app.task(name="pipeline.process_chunk", bind=True, acks_late=True, reject_on_worker_lost=True,
          autoretry_for=TRANSIENT, retry_backoff=2, retry_backoff_max=300, retry_jitter=True, max_retries=12)
def process_chunk(self, job_id: int, document_ids: list[int]) -> dict[str, int]:
    """Process some documents of a job (idempotent: safe to run again after a crash or redelivery)."""
    try:
        outcome = processing.process_chunk(session_factory(), get_pool(), job_id, document_ids)
    except TRANSIENT:
        raise
    except crud.UnknownJobError:
        log.warning("job %s no longer exists; chunk dropped", job_id)
        return {"processed": 0, "failed": 0}
    except Exception as error:
        with session_factory().begin() as session:
            crud.fail_job(session, job_id, f"{type(error).__name__}: {error}")
        raise
    return {"processed": outcome.processed, "failed": outcome.failed}


def start_job(document_ids: list[int], strategy: str = DEFAULT_STRATEGY, labels: list | None = None) -> int:
    """Create a job over ``document_ids`` for the configured model (``labels``: None, its own) and enqueue it."""
    with session_factory().begin() as session:
        versions = routing.versions_for(get_pool(), crud.languages_of(session, document_ids))
        job_id = crud.create_job(session, document_ids, versions, strategy, labels=labels).id
    enqueue_job(job_id)
    return job_id


@app.task(name="pipeline.nightly", acks_late=True, autoretry_for=TRANSIENT, retry_backoff=2, max_retries=12)
def nightly() -> int | None:
    """Start a job over every pending document (and, with ``REPROCESS_ON_MODEL_CHANGE``, every
    document whose results are for another model version); returns its id."""
    settings = get_settings()
    with session_factory()() as session:
        ids = crud.documents_to_run(session, lambda language: routing.version_for(get_pool(), language), settings.reprocess_on_model_change)
    if not ids:
        log.info("nightly run: nothing to do")
        return None
    job_id = start_job(ids)
    log.info("nightly run: job %s over %d documents", job_id, len(ids))
    return job_id


@app.task(name="pipeline.dispatch_undispatched")
def dispatch_undispatched() -> list[int]:
    """Enqueue the jobs stored more than ``PIPELINE_ENQUEUE_RETRY_S`` ago and never handed to Redis
    (it failed or hung when they were submitted, or the API died in between). Beat runs this
    every ``PIPELINE_ENQUEUE_RETRY_S``, so a failure here is retried then."""
    cutoff = utcnow() - timedelta(seconds=get_settings().pipeline_enqueue_retry_s)
    with session_factory()() as session:
        waiting = crud.undispatched_jobs(session, cutoff)
    for job_id in waiting:
        log.warning("job %s was never enqueued; enqueueing %d chunks", job_id, enqueue_job(job_id))
    return waiting


@app.task(name="pipeline.requeue_stalled", autoretry_for=TRANSIENT, retry_backoff=2, max_retries=3)
def requeue_stalled() -> list[int]:
    """Enqueue again the pending documents of jobs without progress for the visibility timeout
    (e.g. their messages were lost when Redis restarted without persistence)."""
    cutoff = utcnow() - timedelta(seconds=get_settings().pipeline_visibility_timeout_s)
    with session_factory().begin() as session:
        stalled = crud.stalled_jobs(session, cutoff)
    for job_id in stalled:
        log.warning("job %s stalled; requeueing %d chunks", job_id, enqueue_job(job_id))
    return stalled
