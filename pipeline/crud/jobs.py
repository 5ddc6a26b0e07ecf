"""Jobs: creating them, finding them and their documents' results, the sweeps of beat
(stalled and never-dispatched jobs), and the ``Idempotency-Key`` of a submission."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ner_service.engine.defaults import DEFAULT_STRATEGY
from pipeline.crud.documents import DocumentEntities, UnknownDocumentsError, document_entities
from pipeline.models import LOCAL_OWNER, Document, DocumentResult, DocumentStatus, IdempotencyKey, Job, JobDocument, JobStatus, utcnow


class UnknownJobError(LookupError):
    """No job has this id."""


def create_job(session: Session, document_ids: Sequence[int], model_version: str, strategy: str = DEFAULT_STRATEGY,
               owner: str = LOCAL_OWNER, labels: list | None = None, decoder: str | None = None, flat_ner: bool = True) -> Job:
    """A queued job of ``owner`` over the (deduplicated) documents, with a ``strategy``, a
    ``decoder`` (None: the default), ``labels`` (None: each model's own) and ``flat_ner`` its caller validated
    (:meth:`~ner_service.engine.EnginePool.options`); raises ``ValueError`` for no documents and
    :class:`UnknownDocumentsError` for ids that do not exist."""
    unique = list(dict.fromkeys(document_ids))
    if not unique:
        raise ValueError("a job needs at least one document")
    found = set(session.scalars(select(Document.id).where(Document.id.in_(unique))))
    missing = [i for i in unique if i not in found]
    if missing:
        raise UnknownDocumentsError(missing)
    job = Job(status=JobStatus.QUEUED, total=len(unique), processed=0, failed=0, model_version=model_version, strategy=strategy,
              owner=owner, labels=labels, decoder=decoder, flat_ner=flat_ner)
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


def find_job(session: Session, job_id: int | str, owner: str | None = None) -> Job:
    """A job by row id or public id (with ``owner``, only among that owner's jobs); raises
    :class:`UnknownJobError`."""
    found = select(Job).where(Job.id == job_id if isinstance(job_id, int) else Job.public_id == job_id)
    job = session.scalar(found if owner is None else found.where(Job.owner == owner))
    if job is None:
        raise UnknownJobError(f"no job {job_id}")
    return job


def recent_jobs(session: Session, limit: int = 20) -> list[Job]:
    """The latest jobs, newest first."""
    return list(session.scalars(select(Job).order_by(Job.id.desc()).limit(limit)))


def job_results(session: Session, job_id: int | str) -> list[DocumentEntities]:
    """Each document of a job (by row id or public id), in id order, with the entities the job's
    model version found (none for a document the job has not processed); raises
    :class:`UnknownJobError`."""
    job = find_job(session, job_id)
    in_job = select(JobDocument.document_id).where(JobDocument.job_id == job.id)
    version_of = dict(session.execute(select(DocumentResult.document_id, DocumentResult.model_version).where(
        DocumentResult.document_id.in_(in_job), DocumentResult.model_version.in_(job.model_version.split(",")))).all())
    found = (document_entities(session, document_id, version_of.get(document_id, job.model_version))
             for document_id in session.scalars(in_job.order_by(JobDocument.document_id)).all())
    return [entities for entities in found if entities is not None]


def stalled_jobs(session: Session, older_than: datetime) -> list[int]:
    """Active jobs without progress since ``older_than``; they are touched (``updated_at`` = now)
    so that the next sweep leaves them alone unless they stall again."""
    ids = list(session.scalars(select(Job.id).where(Job.status.in_(JobStatus.ACTIVE), Job.updated_at < older_than).order_by(Job.id)))
    if ids:
        session.execute(update(Job).where(Job.id.in_(ids)).values(updated_at=utcnow()))
    return ids


def mark_dispatched(session: Session, job_id: int) -> None:
    """Record that the job was handed to Redis (or to the process that runs it)."""
    session.execute(update(Job).where(Job.id == job_id).values(dispatched_at=utcnow()))


def undispatched_jobs(session: Session, created_before: datetime) -> list[int]:
    """Active jobs created before ``created_before`` and never handed to Redis (it failed, or the
    API stopped in between)."""
    return list(session.scalars(select(Job.id).where(Job.status.in_(JobStatus.ACTIVE), Job.dispatched_at.is_(None),
                                                     Job.created_at < created_before).order_by(Job.id)))


def idempotency_key(session: Session, owner: str, key: str) -> IdempotencyKey | None:
    """What ``owner``'s submission with this ``Idempotency-Key`` created, if there was one."""
    return session.scalar(select(IdempotencyKey).where(IdempotencyKey.owner == owner, IdempotencyKey.key == key))


def add_idempotency_key(session: Session, owner: str, key: str, request_hash: str, job_id: int, document_ids: list[str]) -> None:
    """Remember the job a keyed submission created; a concurrent one with the same key fails here
    with ``IntegrityError`` (the unique constraint on owner and key)."""
    session.add(IdempotencyKey(owner=owner, key=key, request_hash=request_hash, job_id=job_id, document_ids=document_ids))
    session.flush()
