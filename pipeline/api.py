"""REST endpoints of the batch pipeline, as a self-contained FastAPI router (the service mounts
it next to the engine's API: ``padellm_ner.asgi``): submit a job, follow it, read a document's
entities."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Annotated
from uuid import UUID

import redis.exceptions
from fastapi import APIRouter, Depends, HTTPException, Query, Response, status
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy.orm import Session

from ner_service.api.core.security import key_id
from ner_service.api.state import authorize
from ner_service.engine import InvalidOptionsError, ModelNotFoundError
from pipeline import crud, routing
from pipeline.db import session_factory
from pipeline.model_version import DEFAULT_STRATEGY
from pipeline.models import LOCAL_OWNER
from pipeline.schemas import DocumentEntitiesOut, JobAccepted, JobOut, JobRequest

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["batch jobs"])


def get_session() -> Iterator[Session]:
    """A database session for one request (``DATABASE_URL``)."""
    with session_factory()() as session:
        yield session


def get_owner(caller: Annotated[str, Depends(authorize)]) -> str:
    """Whose documents and jobs a request sees: its API key's (everything stored without a key
    belongs to ``local``, the owner an API without keys acts as)."""
    return key_id(caller) or LOCAL_OWNER


SessionDep = Annotated[Session, Depends(get_session)]
OwnerDep = Annotated[str, Depends(get_owner)]


@router.post("/jobs", status_code=status.HTTP_202_ACCEPTED, response_model=JobAccepted)
def submit_job(request: JobRequest, session: SessionDep, owner: OwnerDep, response: Response) -> JobAccepted:
    """Store inline documents (an existing ``external_id`` of the caller with the same text is
    reused), create a job and hand it to the workers. Documents and jobs belong to the caller's
    API key: another key sees none of them."""
    from pipeline.tasks import enqueue_job, get_pool

    pool = get_pool()
    try:
        pool.config(pool.default)
    except ModelNotFoundError as error:  # NER_MODEL names nothing: the server is misconfigured
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(error)) from None
    if request.strategy and request.decoder and request.strategy != request.decoder:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            f"strategy {request.strategy!r} and decoder {request.decoder!r} (the old name of the strategy) disagree")
    strategy = request.strategy or request.decoder or DEFAULT_STRATEGY
    try:
        for model in {pool.model_for(d.language) for d in request.documents or []} | {pool.default}:
            pool.options(model, strategy=strategy)  # the strategy runs on every model the job will use
    except (ModelNotFoundError, InvalidOptionsError) as error:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(error)) from None
    try:
        if request.documents is not None:
            ids = crud.add_documents(session, [crud.NewDocument(d.text, d.external_id, d.language, "api", owner) for d in request.documents])
        else:
            ids = crud.owned_document_ids(session, owner, [str(i) for i in request.document_ids or []])
        job = crud.create_job(session, ids, routing.versions_for(pool, crud.languages_of(session, ids)), strategy, owner)
        public_ids = crud.public_ids_of(session, ids)
        session.commit()
    except crud.UnknownDocumentsError as error:
        session.rollback()
        raise HTTPException(status.HTTP_404_NOT_FOUND, {"message": str(error), "missing": error.missing}) from None
    except crud.DocumentConflictError as error:
        session.rollback()
        raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from None
    try:
        enqueue_job(job.id)
    except (BrokerError, redis.exceptions.RedisError):
        # the job is stored; the stalled-job sweep of celery beat enqueues it once Redis is back
        log.warning("job %s stored but not enqueued: Redis is unreachable", job.id, exc_info=True)
    url = f"{router.prefix}/jobs/{job.public_id}"
    response.headers["Location"] = url
    return JobAccepted(job_id=job.public_id, document_ids=public_ids, status=job.status, total=job.total,
                       model_version=job.model_version, strategy=job.strategy, status_url=url)


@router.get("/jobs/{job_id}", response_model=JobOut)
def get_job(job_id: UUID, session: SessionDep, owner: OwnerDep) -> dict:
    """A job's status and progress (``processed`` + ``failed`` of ``total``)."""
    try:
        return crud.job_status(session, str(job_id), owner)
    except crud.UnknownJobError:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id}") from None


@router.get("/documents/{document_id}/entities", response_model=DocumentEntitiesOut)
def get_document_entities(document_id: UUID, session: SessionDep, owner: OwnerDep,
                          model_version: Annotated[str | None, Query(max_length=128)] = None) -> dict:
    """A document's entities for ``model_version`` (default: its latest results)."""
    found = crud.document_entities(session, str(document_id), model_version, owner)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no document {document_id}")
    return found
