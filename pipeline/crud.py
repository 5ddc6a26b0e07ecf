"""Database operations of the pipeline: documents, jobs and their results.

Exactly-once results: a document's entities for a results version are inserted in the same
transaction as its ``document_results`` marker (both ``INSERT ... ON CONFLICT DO NOTHING``),
and a job's counts move only when the document's ``job_documents`` row leaves ``pending`` in
that transaction. A redelivered chunk therefore writes and counts nothing twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Table, and_, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from ner_service.engine import available_strategies
from pipeline.model_version import DEFAULT_STRATEGY
from pipeline.models import LOCAL_OWNER, Document, DocumentResult, DocumentStatus, EntityRow, Job, JobDocument, JobStatus, utcnow
from pipeline.schemas import DocumentEntitiesOut, EntityOut, JobOut


class UnknownJobError(LookupError):
    """No job has this id."""


class UnknownDocumentsError(LookupError):
    """Some document ids do not exist, or belong to another owner (``missing`` lists them)."""

    def __init__(self, missing: Sequence[int | str]) -> None:
        super().__init__(f"unknown document ids: {', '.join(map(str, missing))}")
        self.missing = list(missing)


class DocumentConflictError(ValueError):
    """An ``external_id`` already names a document with another text."""


@dataclass(frozen=True)
class NewDocument:
    """A document to store, for ``owner`` (an API key's id; :data:`LOCAL_OWNER` otherwise)."""

    text: str
    external_id: str | None = None
    language: str | None = None
    source: str | None = None
    owner: str = LOCAL_OWNER


def content_hash(text: str) -> str:
    """SHA-256 of the text (hex)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def insert_ignoring_conflicts(session: Session, table: Table):
    """``INSERT ... ON CONFLICT DO NOTHING`` for the session's dialect (PostgreSQL or SQLite)."""
    dialect = session.get_bind().dialect.name
    module = {"postgresql": postgresql, "sqlite": sqlite}.get(dialect)
    if module is None:
        raise NotImplementedError(f"unsupported database dialect {dialect!r}")
    return module.insert(table).on_conflict_do_nothing()


def add_documents(session: Session, documents: Iterable[NewDocument]) -> list[int]:
    """Store documents and return their ids in order. A known ``external_id`` of the same owner
    with the same text reuses its document (re-submission is idempotent); with another text it
    raises :class:`DocumentConflictError` (another owner's ``external_id`` is another document).
    Text with NUL characters raises ``ValueError``."""
    ids: list[int] = []
    seen: dict[tuple[str, str], Document] = {}
    for doc in documents:
        if "\x00" in doc.text:
            raise ValueError("text contains NUL characters")
        digest = content_hash(doc.text)
        if doc.external_id is not None:
            existing = seen.get((doc.owner, doc.external_id)) or session.scalar(
                select(Document).where(Document.owner == doc.owner, Document.external_id == doc.external_id))
            if existing is not None:
                if existing.content_hash != digest:
                    raise DocumentConflictError(f"external_id {doc.external_id!r} already names a document with another text")
                ids.append(existing.id)
                continue
        row = Document(text=doc.text, external_id=doc.external_id, language=doc.language, source=doc.source, owner=doc.owner,
                       content_hash=digest, status=DocumentStatus.PENDING)
        session.add(row)
        session.flush()
        if doc.external_id is not None:
            seen[(doc.owner, doc.external_id)] = row
        ids.append(row.id)
    return ids


def owned_document_ids(session: Session, owner: str, public_ids: Sequence[str]) -> list[int]:
    """The row ids of ``owner``'s documents with these public ids, in order; raises
    :class:`UnknownDocumentsError` for the public ids that name none of them."""
    found = dict(session.execute(select(Document.public_id, Document.id)
                                 .where(Document.owner == owner, Document.public_id.in_(list(public_ids)))).all())
    missing = [p for p in dict.fromkeys(public_ids) if p not in found]
    if missing:
        raise UnknownDocumentsError(missing)
    return [found[p] for p in public_ids]


def public_ids_of(session: Session, document_ids: Sequence[int]) -> list[str]:
    """The public ids of documents, in the order of their row ids."""
    found = dict(session.execute(select(Document.id, Document.public_id).where(Document.id.in_(list(document_ids)))).all())
    return [found[i] for i in document_ids]


def create_job(session: Session, document_ids: Sequence[int], model_version: str, strategy: str = DEFAULT_STRATEGY,
               owner: str = LOCAL_OWNER) -> Job:
    """A queued job of ``owner`` over the (deduplicated) documents; raises ``ValueError`` for no
    documents or an unknown strategy and :class:`UnknownDocumentsError` for ids that do not exist."""
    if strategy not in available_strategies():
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(available_strategies())}")
    unique = list(dict.fromkeys(document_ids))
    if not unique:
        raise ValueError("a job needs at least one document")
    found = set(session.scalars(select(Document.id).where(Document.id.in_(unique))))
    missing = [i for i in unique if i not in found]
    if missing:
        raise UnknownDocumentsError(missing)
    job = Job(status=JobStatus.QUEUED, total=len(unique), processed=0, failed=0, model_version=model_version, strategy=strategy,
              owner=owner)
    session.add(job)
    session.flush()
    session.add_all(JobDocument(job_id=job.id, document_id=i, status=DocumentStatus.PENDING) for i in unique)
    session.flush()
    return job


def pending_document_ids(session: Session, job_id: int) -> list[int]:
    """Documents of the job not yet processed or failed, in id order."""
    return list(session.scalars(
        select(JobDocument.document_id)
        .where(JobDocument.job_id == job_id, JobDocument.status == DocumentStatus.PENDING)
        .order_by(JobDocument.document_id)
    ))


def languages_of(session: Session, document_ids: Sequence[int]) -> set[str | None]:
    """The distinct languages of some documents (``None`` for documents without one)."""
    return set(session.scalars(select(Document.language).where(Document.id.in_(list(document_ids))).distinct()))


def documents_to_run(session: Session, version_of: Callable[[str | None], str | None], reprocess: bool = False,
                     limit: int | None = None) -> list[int]:
    """Pending documents, plus (``reprocess``) processed documents with results only for other
    model versions than ``version_of(language)``, the current one for their language;
    documents already in a queued or running job are left out."""
    active = select(JobDocument.document_id).join(Job, Job.id == JobDocument.job_id).where(Job.status.in_(JobStatus.ACTIVE))
    wanted = Document.status == DocumentStatus.PENDING
    if reprocess:
        languages = session.scalars(select(Document.language).where(Document.status == DocumentStatus.PROCESSED).distinct())
        current_by_language = [(language, version) for language in languages if (version := version_of(language))]
        if current_by_language:
            is_current = or_(*(and_(Document.language.is_(None) if language is None else Document.language == language,
                                    DocumentResult.model_version == version) for language, version in current_by_language))
            current = select(DocumentResult.document_id).join(Document, Document.id == DocumentResult.document_id).where(is_current)
            wanted = wanted | ((Document.status == DocumentStatus.PROCESSED) & Document.id.not_in(current))
    query = select(Document.id).where(wanted, Document.id.not_in(active)).order_by(Document.id)
    return list(session.scalars(query.limit(limit) if limit else query))


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


def stalled_jobs(session: Session, older_than: datetime) -> list[int]:
    """Active jobs without progress since ``older_than``; they are touched (``updated_at`` = now)
    so that the next sweep leaves them alone unless they stall again."""
    ids = list(session.scalars(select(Job.id).where(Job.status.in_(JobStatus.ACTIVE), Job.updated_at < older_than).order_by(Job.id)))
    if ids:
        session.execute(update(Job).where(Job.id.in_(ids)).values(updated_at=utcnow()))
    return ids


def job_status(session: Session, job_id: int | str, owner: str | None = None) -> dict[str, Any]:
    """The job's status and progress as a JSON-ready dict (:class:`JobOut`), by row id or public
    id (with ``owner``, only among that owner's jobs); raises :class:`UnknownJobError`."""
    found = select(Job).where(Job.id == job_id if isinstance(job_id, int) else Job.public_id == job_id)
    job = session.scalar(found if owner is None else found.where(Job.owner == owner))
    if job is None:
        raise UnknownJobError(f"no job {job_id}")
    return _job_out(job)


def recent_jobs(session: Session, limit: int = 20) -> list[dict[str, Any]]:
    """The latest jobs, newest first."""
    return [_job_out(job) for job in session.scalars(select(Job).order_by(Job.id.desc()).limit(limit))]


def _job_out(job: Job) -> dict[str, Any]:
    progress = round((job.processed + job.failed) / job.total, 4) if job.total else 1.0
    fields = {c: getattr(job, c) for c in JobOut.model_fields if c not in ("id", "progress")}
    return JobOut.model_validate({**fields, "id": job.public_id, "progress": progress}).model_dump(mode="json")


def document_entities(session: Session, document_id: int | str, version: str | None = None, owner: str | None = None) -> dict[str, Any] | None:
    """A document's entities for ``version`` (default: its latest results) as a JSON-ready dict
    (:class:`DocumentEntitiesOut`), by row id or public id (with ``owner``, only among that
    owner's documents), or ``None`` if there is no such document."""
    found = select(Document).where(Document.id == document_id if isinstance(document_id, int) else Document.public_id == document_id)
    document = session.scalar(found if owner is None else found.where(Document.owner == owner))
    if document is None:
        return None
    document_id = document.id
    if version is None:
        version = session.scalar(select(DocumentResult.model_version).where(DocumentResult.document_id == document_id)
                                 .order_by(DocumentResult.created_at.desc()).limit(1))
    entities = session.scalars(select(EntityRow).where(EntityRow.document_id == document_id, EntityRow.model_version == version)
                               .order_by(EntityRow.start, EntityRow.end, EntityRow.label)) if version else []
    return DocumentEntitiesOut(document_id=document.public_id, external_id=document.external_id, status=document.status, error=document.error,
                               model_version=version, entities=[EntityOut.model_validate(e) for e in entities]).model_dump(mode="json")
