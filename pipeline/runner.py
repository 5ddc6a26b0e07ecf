"""The in-process runner (``padellm-ner jobs run``): no broker, the same functions as the Celery
workers, one chunk after another in this process."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from ner_service.engine import EnginePool
from ner_service.engine.defaults import DEFAULT_STRATEGY
from pipeline import crud, processing, routing
from pipeline.schemas import JobOut


def run_job(sessions: sessionmaker[Session], pool: EnginePool, job_id: int, chunk_size: int,
            on_chunk: Callable[[processing.ChunkOutcome], None] | None = None) -> dict:
    """Process every pending document of a job; returns its final status (a :class:`JobOut` as JSON)."""
    with sessions() as session:
        pending = crud.pending_document_ids(session, job_id)
    for chunk in processing.chunked(pending, chunk_size):
        outcome = processing.process_chunk(sessions, pool, job_id, chunk)
        if on_chunk:
            on_chunk(outcome)
    with sessions() as session:
        return JobOut.of(crud.find_job(session, job_id)).model_dump(mode="json")


def run_pending(sessions: sessionmaker[Session], pool: EnginePool, chunk_size: int, limit: int | None = None,
                reprocess: bool = False, strategy: str = DEFAULT_STRATEGY, labels: list | None = None, decoder: str | None = None,
                flat_ner: bool = True,
                on_start: Callable[[int], None] | None = None,
                on_chunk: Callable[[processing.ChunkOutcome], None] | None = None) -> dict | None:
    """Create a job over the pending documents (at most ``limit``) with ``strategy``, ``decoder``
    (None: the default), ``labels`` (None: each model's) and ``flat_ner`` and run it here; ``None`` when there is nothing to do.
    ``on_start`` gets the number of documents."""
    if chunk_size < 1:  # refused before a job exists: none is left 'running' with nothing to run it
        raise ValueError(f"chunk_size must be at least 1, not {chunk_size}")
    with sessions.begin() as session:
        ids = crud.documents_to_run(session, lambda language: routing.version_for(pool, language), reprocess=reprocess, limit=limit)
        if not ids:
            return None
        job_id = crud.create_job(session, ids, routing.versions_for(pool, crud.languages_of(session, ids)), strategy, labels=labels,
                                 decoder=decoder, flat_ner=flat_ner).id
        crud.mark_dispatched(session, job_id)  # this process runs it: beat's sweep must not enqueue it
    if on_start:
        on_start(len(ids))
    return run_job(sessions, pool, job_id, chunk_size, on_chunk)
