"""Job logic shared by the Celery tasks, the in-process runner and the REST router.

Exactly-once results: a document's entities for a results version are inserted in the same
transaction as its ``document_results`` marker (both ``INSERT ... ON CONFLICT DO NOTHING``),
and a job's counts move only when the document's ``job_documents`` row leaves ``pending`` in
that transaction. A redelivered chunk therefore writes and counts nothing twice.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Table, and_, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from ner_service.engine import STRATEGIES, ModelNotFoundError
from ner_service.settings import get_settings
from pipeline.model_version import DEFAULT_DECODER, results_version
from pipeline.models import Document, DocumentResult, DocumentStatus, EntityRow, Job, JobDocument, JobStatus, utcnow
from pipeline.routing import EngineRouter

log = logging.getLogger(__name__)


class UnknownJobError(LookupError):
    """No job has this id."""


class UnknownDocumentsError(LookupError):
    """Some document ids do not exist (``missing`` lists them)."""

    def __init__(self, missing: Sequence[int]) -> None:
        super().__init__(f"unknown document ids: {', '.join(map(str, missing))}")
        self.missing = list(missing)


class DocumentConflictError(ValueError):
    """An ``external_id`` already names a document with another text."""


@dataclass(frozen=True)
class NewDocument:
    """A document to store."""

    text: str
    external_id: str | None = None
    language: str | None = None
    source: str | None = None


@dataclass
class ChunkOutcome:
    """What one :func:`process_chunk` call changed: documents newly processed or failed in the job."""

    processed: int = 0
    failed: int = 0


def content_hash(text: str) -> str:
    """SHA-256 of the text (hex)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be processed, or ``None``."""
    if not text.strip():
        return "empty text"
    limit = get_settings().ner_max_text_chars
    if len(text) > limit:
        return f"text has {len(text)} characters, more than NER_MAX_TEXT_CHARS={limit}"
    return None


def insert_ignoring_conflicts(session: Session, table: Table):
    """``INSERT ... ON CONFLICT DO NOTHING`` for the session's dialect (PostgreSQL or SQLite)."""
    dialect = session.get_bind().dialect.name
    module = {"postgresql": postgresql, "sqlite": sqlite}.get(dialect)
    if module is None:
        raise NotImplementedError(f"unsupported database dialect {dialect!r}")
    return module.insert(table).on_conflict_do_nothing()


def chunked(items: Sequence[int], size: int) -> list[list[int]]:
    """``items`` in lists of at most ``size``."""
    return [list(items[i:i + size]) for i in range(0, len(items), max(1, size))]


def add_documents(session: Session, documents: Iterable[NewDocument]) -> list[int]:
    """Store documents and return their ids in order. A known ``external_id`` with the same text
    reuses its document (re-submission is idempotent); with another text it raises
    :class:`DocumentConflictError`. Text with NUL characters raises ``ValueError``."""
    ids: list[int] = []
    seen: dict[str, Document] = {}
    for doc in documents:
        if "\x00" in doc.text:
            raise ValueError("text contains NUL characters")
        digest = content_hash(doc.text)
        if doc.external_id is not None:
            existing = seen.get(doc.external_id) or session.scalar(select(Document).where(Document.external_id == doc.external_id))
            if existing is not None:
                if existing.content_hash != digest:
                    raise DocumentConflictError(f"external_id {doc.external_id!r} already names a document with another text")
                ids.append(existing.id)
                continue
        row = Document(text=doc.text, external_id=doc.external_id, language=doc.language, source=doc.source,
                       content_hash=digest, status=DocumentStatus.PENDING)
        session.add(row)
        session.flush()
        if doc.external_id is not None:
            seen[doc.external_id] = row
        ids.append(row.id)
    return ids


def create_job(session: Session, document_ids: Sequence[int], model_version: str, decoder: str = DEFAULT_DECODER) -> Job:
    """A queued job over the (deduplicated) documents; raises ``ValueError`` for no documents or an
    unknown decoder and :class:`UnknownDocumentsError` for ids that do not exist."""
    if decoder not in STRATEGIES:
        raise ValueError(f"unknown decoder {decoder!r}; choose one of {', '.join(STRATEGIES)}")
    unique = list(dict.fromkeys(document_ids))
    if not unique:
        raise ValueError("a job needs at least one document")
    found = set(session.scalars(select(Document.id).where(Document.id.in_(unique))))
    missing = [i for i in unique if i not in found]
    if missing:
        raise UnknownDocumentsError(missing)
    job = Job(status=JobStatus.QUEUED, total=len(unique), processed=0, failed=0, model_version=model_version, decoder=decoder)
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


def _extract(engine, texts: list[str], decoder: str) -> list[list[Any] | Exception]:
    """Entities per text; when the batch fails, each text alone so that one bad text fails alone."""
    try:
        return [result.entities for result in engine.extract(texts, strategy=decoder)]
    except Exception:  # noqa: BLE001 - isolate the failing text below
        outcomes: list[list[Any] | Exception] = []
        for text in texts:
            try:
                outcomes.append(engine.extract([text], strategy=decoder)[0].entities)
            except Exception as error:  # noqa: BLE001 - stored as the document's error
                outcomes.append(error)
        return outcomes


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


def process_chunk(sessions: sessionmaker[Session], router: EngineRouter, job_id: int, document_ids: Sequence[int]) -> ChunkOutcome:
    """Run the chunk's still-pending documents of a job through the engine of each document's
    language and record each document in its own transaction, under that engine's model
    version. Safe to call again with the same arguments (redelivery): finished documents are skipped."""
    outcome = ChunkOutcome()
    with sessions.begin() as session:
        # the write comes first so that SQLite takes its write lock before any read
        session.execute(
            update(Job).where(Job.id == job_id, Job.status == JobStatus.QUEUED).values(status=JobStatus.RUNNING, started_at=utcnow(), updated_at=utcnow())
        )
        job = session.get(Job, job_id)
        if job is None:
            raise UnknownJobError(f"no job {job_id}")
        if job.status not in JobStatus.ACTIVE:
            return outcome
        decoder = job.decoder
        rows = session.execute(
            select(Document.id, Document.text, Document.language)
            .join(JobDocument, JobDocument.document_id == Document.id)
            .where(JobDocument.job_id == job_id, JobDocument.status == DocumentStatus.PENDING, Document.id.in_(list(document_ids)))
            .order_by(Document.id)
        ).all()
    results: dict[int, tuple[str, Sequence[Any]] | str] = {}  # (results version, entities) or an error
    by_model: dict[str, list[Any]] = {}
    for row in rows:
        try:
            by_model.setdefault(router.model_for(row.language), []).append(row)
        except ModelNotFoundError as error:
            results[row.id] = str(error)
    for model, model_rows in by_model.items():
        key = results_version(router.version(model), decoder)
        with sessions() as session:
            done = set(session.scalars(select(DocumentResult.document_id).where(
                DocumentResult.model_version == key, DocumentResult.document_id.in_([r.id for r in model_rows]))))
        to_run = []
        for row in model_rows:
            if row.id in done:
                results[row.id] = (key, ())  # stored earlier under this version: only the job's count moves
            elif problem := text_problem(row.text):
                results[row.id] = problem
            else:
                to_run.append(row)
        if to_run:
            for row, entities in zip(to_run, _extract(router.engine(model), [r.text for r in to_run], decoder)):
                results[row.id] = f"{type(entities).__name__}: {entities}" if isinstance(entities, Exception) else (key, entities)
    for row in rows:
        value = results[row.id]
        with sessions.begin() as session:
            if isinstance(value, str):
                outcome.failed += record_failure(session, job_id, row.id, value)
            else:
                outcome.processed += record_result(session, job_id, row.id, *value)
    return outcome


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


def job_status(session: Session, job_id: int) -> dict[str, Any]:
    """The job's status and progress as a JSON-ready dict; raises :class:`UnknownJobError`."""
    job = session.get(Job, job_id)
    if job is None:
        raise UnknownJobError(f"no job {job_id}")
    return _job_dict(job)


def recent_jobs(session: Session, limit: int = 20) -> list[dict[str, Any]]:
    """The latest jobs, newest first."""
    return [_job_dict(job) for job in session.scalars(select(Job).order_by(Job.id.desc()).limit(limit))]


def _job_dict(job: Job) -> dict[str, Any]:
    def iso(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    return {
        "id": job.id, "status": job.status, "total": job.total, "processed": job.processed, "failed": job.failed,
        "progress": round((job.processed + job.failed) / job.total, 4) if job.total else 1.0,
        "model_version": job.model_version, "decoder": job.decoder, "created_at": iso(job.created_at),
        "started_at": iso(job.started_at), "finished_at": iso(job.finished_at), "error": job.error,
    }


def document_entities(session: Session, document_id: int, version: str | None = None) -> dict[str, Any] | None:
    """A document's entities for ``version`` (default: its latest results), or ``None`` if the document does not exist."""
    document = session.get(Document, document_id)
    if document is None:
        return None
    if version is None:
        version = session.scalar(select(DocumentResult.model_version).where(DocumentResult.document_id == document_id)
                                 .order_by(DocumentResult.created_at.desc()).limit(1))
    entities = session.scalars(select(EntityRow).where(EntityRow.document_id == document_id, EntityRow.model_version == version)
                               .order_by(EntityRow.start, EntityRow.end, EntityRow.label)) if version else []
    return {
        "document_id": document.id, "external_id": document.external_id, "status": document.status, "error": document.error,
        "model_version": version,
        "entities": [{"start": e.start, "end": e.end, "label": e.label, "text": e.text, "score": e.score} for e in entities],
    }

