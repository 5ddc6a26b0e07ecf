"""The in-process runner (``padellm-ner jobs run``): no broker, the same service functions as
the Celery workers, one chunk after another in this process."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from pipeline import service
from pipeline.model_version import DEFAULT_DECODER
from pipeline.routing import EngineRouter


def run_job(sessions: sessionmaker[Session], router: EngineRouter, job_id: int, chunk_size: int,
            on_chunk: Callable[[service.ChunkOutcome], None] | None = None) -> dict:
    """Process every pending document of a job; returns the job's final status."""
    with sessions() as session:
        pending = service.pending_document_ids(session, job_id)
    for chunk in service.chunked(pending, chunk_size):
        outcome = service.process_chunk(sessions, router, job_id, chunk)
        if on_chunk:
            on_chunk(outcome)
    with sessions() as session:
        return service.job_status(session, job_id)


def run_pending(sessions: sessionmaker[Session], router: EngineRouter, chunk_size: int, limit: int | None = None,
                reprocess: bool = False, decoder: str = DEFAULT_DECODER,
                on_start: Callable[[int], None] | None = None,
                on_chunk: Callable[[service.ChunkOutcome], None] | None = None) -> dict | None:
    """Create a job over the pending documents (at most ``limit``) and run it here; ``None`` when
    there is nothing to do. ``on_start`` gets the number of documents."""
    with sessions.begin() as session:
        ids = service.documents_to_run(session, router.version_for, reprocess=reprocess, limit=limit)
        if not ids:
            return None
        job_id = service.create_job(session, ids, router.versions_for(service.languages_of(session, ids)), decoder).id
    if on_start:
        on_start(len(ids))
    return run_job(sessions, router, job_id, chunk_size, on_chunk)
