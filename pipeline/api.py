"""REST endpoints of the batch pipeline, as a self-contained FastAPI router
(``app.include_router(pipeline.api.router)``): submit a job, follow it, read a document's entities."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Annotated, Literal

import redis.exceptions
from annotated_types import Ge, Le
from fastapi import APIRouter, Depends, HTTPException, Response, status
from kombu.exceptions import OperationalError as BrokerError
from pydantic import BaseModel, Field, field_validator, model_validator
from sqlalchemy.orm import Session

from ner_service.engine import ModelNotFoundError
from ner_service.settings import get_settings
from pipeline import service
from pipeline.db import session_factory
from pipeline.model_version import DEFAULT_DECODER
from pipeline.routing import EngineRouter

log = logging.getLogger(__name__)
MAX_DOCUMENTS_PER_REQUEST = 10_000
#: A row id as the database stores it (a 32-bit INTEGER): larger numbers are a 422, not a database error.
RowId = Annotated[int, Ge(1), Le(2**31 - 1)]

router = APIRouter(prefix="/v1", tags=["batch jobs"])


def get_session() -> Iterator[Session]:
    """A database session for one request (``DATABASE_URL``)."""
    with session_factory()() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


class DocumentIn(BaseModel):
    """A document submitted inline."""

    text: str
    external_id: str | None = Field(default=None, min_length=1, max_length=255)
    language: str | None = Field(default=None, min_length=1, max_length=16)

    @field_validator("text")
    @classmethod
    def _text_fits(cls, text: str) -> str:
        limit = get_settings().ner_max_text_chars
        if len(text) > limit:
            raise ValueError(f"text has {len(text)} characters, more than the limit of {limit}")
        if "\x00" in text:
            raise ValueError("text contains NUL characters")
        return text


class JobRequest(BaseModel):
    """Documents inline or by id (exactly one of the two), and the decoding strategy."""

    documents: list[DocumentIn] | None = Field(default=None, min_length=1, max_length=MAX_DOCUMENTS_PER_REQUEST)
    document_ids: list[RowId] | None = Field(default=None, min_length=1, max_length=MAX_DOCUMENTS_PER_REQUEST)
    decoder: Literal["padellm", "ar", "fast_dllm"] = DEFAULT_DECODER

    @model_validator(mode="after")
    def _one_source(self) -> "JobRequest":
        if (self.documents is None) == (self.document_ids is None):
            raise ValueError('give either "documents" or "document_ids"')
        return self


class JobAccepted(BaseModel):
    """The answer to a submitted job."""

    job_id: int
    status: str
    total: int
    model_version: str
    decoder: str
    status_url: str


@router.post("/jobs", status_code=status.HTTP_202_ACCEPTED, response_model=JobAccepted)
def submit_job(request: JobRequest, session: SessionDep, response: Response) -> JobAccepted:
    """Store inline documents (an existing ``external_id`` with the same text is reused), create
    a job and hand it to the workers."""
    from pipeline.tasks import enqueue_job

    engines = EngineRouter.configured()
    try:
        engines.version(engines.default)
    except ModelNotFoundError as error:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(error)) from None
    for language in {d.language for d in request.documents or []}:
        try:
            engines.model_for(language)
        except ModelNotFoundError as error:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(error)) from None
    try:
        if request.documents is not None:
            ids = service.add_documents(session, [service.NewDocument(d.text, d.external_id, d.language, "api") for d in request.documents])
        else:
            ids = request.document_ids or []
        job = service.create_job(session, ids, engines.versions_for(service.languages_of(session, ids)), request.decoder)
        session.commit()
    except service.UnknownDocumentsError as error:
        session.rollback()
        raise HTTPException(status.HTTP_404_NOT_FOUND, {"message": str(error), "missing": error.missing}) from None
    except service.DocumentConflictError as error:
        session.rollback()
        raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from None
    try:
        enqueue_job(job.id)
    except (BrokerError, redis.exceptions.RedisError):
        # the job is stored; the stalled-job sweep of celery beat enqueues it once Redis is back
        log.warning("job %s stored but not enqueued: Redis is unreachable", job.id, exc_info=True)
    url = f"{router.prefix}/jobs/{job.id}"
    response.headers["Location"] = url
    return JobAccepted(job_id=job.id, status=job.status, total=job.total, model_version=job.model_version, decoder=job.decoder, status_url=url)


@router.get("/jobs/{job_id}")
def get_job(job_id: RowId, session: SessionDep) -> dict:
    """A job's status and progress (``processed`` + ``failed`` of ``total``)."""
    try:
        return service.job_status(session, job_id)
    except service.UnknownJobError:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id}") from None


@router.get("/documents/{document_id}/entities")
def get_document_entities(document_id: RowId, session: SessionDep, model_version: str | None = None) -> dict:
    """A document's entities for ``model_version`` (default: its latest results)."""
    found = service.document_entities(session, document_id, model_version)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no document {document_id}")
    return found
