"""A chunk's outcomes recorded exactly once: a document's entities for a results version are
inserted in the same transaction as its ``document_results`` marker (both ``INSERT ... ON
CONFLICT DO NOTHING``), and a job's counts move only when the document's ``job_documents`` row
leaves ``pending`` in that transaction. A redelivered chunk therefore writes and counts nothing twice."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, Table, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from pipeline.crud.jobs import UnknownJobError
from pipeline.models import Document, DocumentResult, DocumentStatus, EntityRow, Job, JobDocument, JobStatus, utcnow


def insert_ignoring_conflicts(session: Session, table: Table):
    """``INSERT ... ON CONFLICT DO NOTHING`` for the session's dialect (PostgreSQL or SQLite)."""
    dialect = session.get_bind().dialect.name
    module = {"postgresql": postgresql, "sqlite": sqlite}.get(dialect)
    if module is None:
        raise NotImplementedError(f"unsupported database dialect {dialect!r}")
    return module.insert(table).on_conflict_do_nothing()


def start_running(session: Session, job_id: int) -> Job:
    """The job, marked running if it was queued (the write comes first, so that SQLite takes its
    write lock before any read); raises :class:`UnknownJobError`."""
    session.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.QUEUED)
                    .values(status=JobStatus.RUNNING, started_at=utcnow(), updated_at=utcnow()))
    job = session.get(Job, job_id)
    if job is None:
        raise UnknownJobError(f"no job {job_id}")
    return job


def pending_documents(session: Session, job_id: int, document_ids: Sequence[int]) -> list[Row[Any]]:
    """``(id, text, language)`` of the documents among ``document_ids`` still pending in the job, in id order."""
    return list(session.execute(
        select(Document.id, Document.text, Document.language)
        .join(JobDocument, JobDocument.document_id == Document.id)
        .where(JobDocument.job_id == job_id, JobDocument.status == DocumentStatus.PENDING, Document.id.in_(list(document_ids)))
        .order_by(Document.id)
    ).all())


def documents_with_results(session: Session, version: str, document_ids: Sequence[int]) -> set[int]:
    """Those of ``document_ids`` whose results under ``version`` are stored."""
    return set(session.scalars(select(DocumentResult.document_id).where(
        DocumentResult.model_version == version, DocumentResult.document_id.in_(list(document_ids)))))


def _count(session: Session, job_id: int, column: str, now: datetime) -> None:
    counter = getattr(Job, column)
    session.execute(update(Job).where(Job.id == job_id).values({counter: counter + 1, Job.updated_at: now}))
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(JobStatus.ACTIVE), Job.processed + Job.failed >= Job.total)
        .values(status=JobStatus.COMPLETED, finished_at=now)
    )


def _leave_pending(session: Session, job_id: int, document_id: int, status: str) -> bool:
    moved = session.execute(
        update(JobDocument)
        .where(JobDocument.job_id == job_id, JobDocument.document_id == document_id, JobDocument.status == DocumentStatus.PENDING)
        .values(status=status)
    )
    return moved.rowcount == 1


def record_result(session: Session, job_id: int, document_id: int, version: str, entities: Sequence[Any]) -> bool:
    """Store a document's entities under ``version`` (once) and count it in the job (once).
    Returns whether the job's count moved."""
    now = utcnow()
    marker = insert_ignoring_conflicts(session, DocumentResult.__table__).values(
        document_id=document_id, model_version=version, job_id=job_id, entity_count=len(entities), created_at=now)
    first = session.execute(marker.returning(DocumentResult.document_id)).first() is not None  # no row on conflict
    if first and entities:
        rows = [{"document_id": document_id, "model_version": version, "start": e.start, "end": e.end,
                 "label": e.label, "text": e.text, "score": e.score} for e in entities]
        session.execute(insert_ignoring_conflicts(session, EntityRow.__table__), rows)
    if not _leave_pending(session, job_id, document_id, DocumentStatus.PROCESSED):
        return False
    session.execute(update(Document).where(Document.id == document_id).values(status=DocumentStatus.PROCESSED, error=None))
    _count(session, job_id, "processed", now)
    return True


def record_failure(session: Session, job_id: int, document_id: int, error: str) -> bool:
    """Store a document's error and count it as failed in the job (once)."""
    if not _leave_pending(session, job_id, document_id, DocumentStatus.FAILED):
        return False
    session.execute(update(Document).where(Document.id == document_id).values(status=DocumentStatus.FAILED, error=error))
    _count(session, job_id, "failed", utcnow())
    return True


def fail_job(session: Session, job_id: int, error: str) -> None:
    """Mark an active job as failed with ``error`` (a job-level failure, e.g. the model cannot load)."""
    now = utcnow()
    session.execute(update(Job).where(Job.id == job_id, Job.status.in_(JobStatus.ACTIVE))
                    .values(status=JobStatus.FAILED, error=error, finished_at=now, updated_at=now))
