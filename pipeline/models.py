"""The pipeline's tables as typed SQLAlchemy 2 models (Alembic's revisions in ``migrations/`` create them)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, MetaData, String, Text, UniqueConstraint, true
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ner_service.engine.defaults import DEFAULT_STRATEGY

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


#: The owner of what the command line, the nightly jobs and an API without keys store.
LOCAL_OWNER = "local"


def utcnow() -> datetime:
    """The current time in UTC (timezone-aware)."""
    return datetime.now(UTC)


def new_public_id() -> str:
    """An unguessable id for URLs (a random UUID), so that ids do not tell how many rows exist."""
    return str(uuid.uuid4())


class Base(DeclarativeBase):
    """Declarative base with named constraints (so migrations name them the same on every database)."""

    metadata = MetaData(naming_convention=NAMING)


class DocumentStatus:
    """Values of ``documents.status``: the outcome of the document's latest processing."""

    PENDING = "pending"
    PROCESSED = "processed"
    FAILED = "failed"


class JobStatus:
    """Values of ``jobs.status``."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"  # every document processed or failed (see the counts)
    FAILED = "failed"  # the job itself failed (e.g. the model could not be loaded)
    ACTIVE = (QUEUED, RUNNING)


class Document(Base):
    """A text to tag, owned by the API key (its id) that stored it; ``external_id`` is unique per owner."""

    __tablename__ = "documents"
    __table_args__ = (UniqueConstraint("owner", "external_id", name="uq_documents_owner_external_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    public_id: Mapped[str] = mapped_column(String(36), unique=True, default=new_public_id)
    owner: Mapped[str] = mapped_column(String(64), index=True, default=LOCAL_OWNER)
    external_id: Mapped[str | None] = mapped_column(String(255))
    text: Mapped[str] = mapped_column(Text)
    source: Mapped[str | None] = mapped_column(String(255))
    language: Mapped[str | None] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default=DocumentStatus.PENDING, index=True)
    content_hash: Mapped[str] = mapped_column(String(64))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Job(Base):
    """A batch of documents processed by one model version, strategy and label list, owned like its documents."""

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    public_id: Mapped[str] = mapped_column(String(36), unique=True, default=new_public_id)
    owner: Mapped[str] = mapped_column(String(64), index=True, default=LOCAL_OWNER)
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED, index=True)
    total: Mapped[int] = mapped_column(Integer, default=0)
    processed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    model_version: Mapped[str] = mapped_column(String(128))
    strategy: Mapped[str] = mapped_column(String(16), default=DEFAULT_STRATEGY)
    labels: Mapped[list | None] = mapped_column(JSON)  # as the request named them (None: each model's own); see results_version
    decoder: Mapped[str | None] = mapped_column(String(16))  # as the request named it (None: the default); see results_version
    flat_ner: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())  # false: entities may overlap; see results_version
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)  # last progress
    # when the job was handed to Redis (or to the process running it); NULL: beat's sweep enqueues it
    dispatched_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    error: Mapped[str | None] = mapped_column(Text)


class IdempotencyKey(Base):
    """An ``Idempotency-Key`` an owner sent with ``POST /v1/jobs``: the job it created and what
    was answered, so that the same request sent again gets that job instead of a copy."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("owner", "key", name="uq_idempotency_keys_owner_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(String(255))
    request_hash: Mapped[str] = mapped_column(String(64))  # SHA-256 of the request body (canonical JSON)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    document_ids: Mapped[list[str]] = mapped_column(JSON)  # the public ids answered, in the order given
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class JobDocument(Base):
    """A document of a job and its state in that job (``pending``, ``processed`` or ``failed``)."""

    __tablename__ = "job_documents"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    document_id: Mapped[int] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"), primary_key=True, index=True)
    status: Mapped[str] = mapped_column(String(16), default=DocumentStatus.PENDING)


class DocumentResult(Base):
    """Marks a document as processed by a model version: inserted once, with its entities."""

    __tablename__ = "document_results"

    document_id: Mapped[int] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"), primary_key=True)
    model_version: Mapped[str] = mapped_column(String(128), primary_key=True, index=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    entity_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class EntityRow(Base):
    """An entity found in a document by a model version (character offsets into the text)."""

    __tablename__ = "entities"
    __table_args__ = (
        UniqueConstraint("document_id", "model_version", "start", "end", "label", name="uq_entities_span"),
        Index("ix_entities_document_version", "document_id", "model_version"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    document_id: Mapped[int] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"))
    model_version: Mapped[str] = mapped_column(String(128))
    start: Mapped[int] = mapped_column(Integer)
    end: Mapped[int] = mapped_column(Integer)
    label: Mapped[str] = mapped_column(String(64))
    text: Mapped[str] = mapped_column(Text)
    score: Mapped[float | None] = mapped_column(Float)
