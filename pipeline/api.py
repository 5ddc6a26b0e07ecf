"""REST endpoints of the batch pipeline, as a self-contained FastAPI router (the service mounts
it next to the engine's API: ``padellm_ner.asgi``): submit a job, follow it, read a document's
entities."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated
from uuid import UUID

import sqlalchemy.exc
from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import StringConstraints
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ner_service.api.core.echo import ECHO_MAX, clipped, quoted
from ner_service.api.core.security import key_id
from ner_service.api.schemas import ACCEPTABLE
from ner_service.api.state import AuthenticatedRoute, CallerDep
from ner_service.engine import EnginePool, InvalidOptionsError, ModelNotFoundError
from pipeline import crud, routing
from pipeline.db import session_factory
from pipeline.dispatch import Dispatcher, get_dispatcher
from pipeline.models import LOCAL_OWNER, IdempotencyKey, Job
from pipeline.schemas import DocumentEntitiesOut, JobAccepted, JobOut, JobRequest

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["batch jobs"], route_class=AuthenticatedRoute)


def get_session() -> Iterator[Session]:
    """A database session for one request (``DATABASE_URL``)."""
    with session_factory()() as session:
        yield session


def get_owner(caller: CallerDep) -> str:
    """Whose documents and jobs a request sees: its API key's (everything stored without a key
    belongs to ``local``, the owner an API without keys acts as)."""
    return key_id(caller) or LOCAL_OWNER


SessionDep = Annotated[Session, Depends(get_session)]
OwnerDep = Annotated[str, Depends(get_owner)]
DispatcherDep = Annotated[Dispatcher, Depends(get_dispatcher)]
IdempotencyKeyHeader = Annotated[str | None, Header(
    min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$",
    description="any printable ASCII without spaces (a UUID, say), new for each new job: the same key and body again "
                "(from the same API key) answer the job the first request created instead of storing a copy")]
RETRY_AFTER_S = 5


async def database_unavailable(request: Request, error: Exception) -> JSONResponse:
    """503 for a database that failed or did not answer within its timeouts
    (``DATABASE_CONNECT_TIMEOUT_S``, ``DATABASE_STATEMENT_TIMEOUT_S``): the request's transaction
    was rolled back, so retrying (``POST /v1/jobs``: with the same ``Idempotency-Key``) is safe."""
    log.warning("database unavailable: %s", type(error).__name__, exc_info=error)
    return JSONResponse({"detail": "the database is unavailable; nothing was stored, retry later"},
                        status.HTTP_503_SERVICE_UNAVAILABLE, headers={"Retry-After": str(RETRY_AFTER_S)})


#: The errors :func:`database_unavailable` answers (``TimeoutError``: no pooled connection in time).
DATABASE_UNAVAILABLE = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.TimeoutError)


@dataclass(frozen=True)
class Submission:
    """A stored job and the public ids of its documents in the order given; ``replayed``: an
    earlier request with the same ``Idempotency-Key`` created it."""

    job: Job
    document_ids: list[str]
    replayed: bool


@router.post("/jobs", status_code=status.HTTP_202_ACCEPTED, response_model=JobAccepted, responses={
    200: {"model": JobAccepted, "description": "an earlier request with this Idempotency-Key created the job (header `Idempotent-Replayed: true`)"},
    422: {"description": "an invalid request, or an Idempotency-Key sent before with another body"},
    503: {"description": "the database did not answer: nothing was stored (retry, with the same Idempotency-Key)"}})
async def submit_job(request: JobRequest, session: SessionDep, owner: OwnerDep, dispatcher: DispatcherDep, response: Response,
                     idempotency_key: IdempotencyKeyHeader = None) -> JobAccepted:
    """Store inline documents (an existing ``external_id`` of the caller with the same text is
    reused), create a job and hand it to the workers. Documents and jobs belong to the caller's
    API key: another key sees none of them. A stored job is answered 202 whether or not Redis
    takes it within ``REDIS_TIMEOUT_S``: what it does not take, beat enqueues after
    ``PIPELINE_ENQUEUE_RETRY_S``. The same ``Idempotency-Key`` and body again (per API key)
    answer the first job with 200 instead of storing a copy."""
    submission = await run_in_threadpool(_store, request, session, owner, idempotency_key)
    job = submission.job
    if submission.replayed:
        response.status_code = status.HTTP_200_OK
        response.headers["Idempotent-Replayed"] = "true"
    else:
        await dispatcher.dispatch(job.id)  # bounded; a job it does not hand over is left to beat's sweep
    url = f"{router.prefix}/jobs/{job.public_id}"
    response.headers["Location"] = url
    return JobAccepted(job_id=job.public_id, document_ids=submission.document_ids, status=job.status, total=job.total,
                       model_version=job.model_version, strategy=job.strategy, decoder=job.decoder, labels=job.labels,
                       flat_ner=job.flat_ner, unfamiliar_labels=_unfamiliar(job.labels), status_url=url)


def _unfamiliar(labels: list | None) -> list[str]:
    """The job's labels that the server's model, if open, never trained on (:func:`ner_service.engine.labels.unfamiliar_names`)."""
    from pipeline.tasks import get_pool

    if not labels:
        return []
    pool = get_pool()
    try:
        return pool.options(pool.default, labels=labels).unfamiliar_labels(pool.config(pool.default))
    except (ModelNotFoundError, InvalidOptionsError):  # a replayed job's labels, checked when it was stored
        return []


def _store(request: JobRequest, session: Session, owner: str, key: str | None) -> Submission:
    """Check the request against the models, then store its documents, the job and its key in
    one transaction (or find the job an earlier request with ``key`` stored)."""
    fingerprint = request.fingerprint()
    if key is not None and (earlier := crud.idempotency_key(session, owner, key)) is not None:
        return _replay(session, earlier, fingerprint)
    pool, strategy = _checked(request)
    try:
        if request.documents is not None:
            ids = crud.add_documents(session, [crud.NewDocument(d.text, d.external_id, d.language, "api", owner) for d in request.documents])
        else:
            ids = crud.owned_document_ids(session, owner, [str(i) for i in request.document_ids or []])
        job = crud.create_job(session, ids, routing.versions_for(pool, crud.languages_of(session, ids)), strategy, owner,
                              request.label_entries(), request.decoder, request.flat_ner)
        public_ids = crud.public_ids_of(session, ids)
        if key is not None:
            crud.add_idempotency_key(session, owner, key, fingerprint, job.id, public_ids)
        session.commit()
    except crud.UnknownDocumentsError as error:
        session.rollback()
        missing = error.missing  # up to 10,000 ids: the answer lists a few and counts them
        raise HTTPException(status.HTTP_404_NOT_FOUND, {"message": f"{len(missing)} unknown document ids: {quoted(missing)}",
                                                        "missing": missing[:ECHO_MAX], "missing_count": len(missing)}) from None
    except crud.DocumentConflictError as error:
        session.rollback()
        raise HTTPException(status.HTTP_409_CONFLICT, str(error)) from None
    except IntegrityError:  # a concurrent request with the same key committed first
        session.rollback()
        earlier = None if key is None else crud.idempotency_key(session, owner, key)
        if earlier is None:
            raise
        return _replay(session, earlier, fingerprint)
    return Submission(job, public_ids, replayed=False)


def _replay(session: Session, earlier: IdempotencyKey, fingerprint: str) -> Submission:
    """The job of an earlier request with the same key, if it had the same body (else 422)."""
    if earlier.request_hash != fingerprint:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            f"Idempotency-Key {clipped(earlier.key)!r} was sent before with another request body: "
                            "send a new key for a new request")
    return Submission(session.get(Job, earlier.job_id), earlier.document_ids, replayed=True)


def _checked(request: JobRequest) -> tuple[EnginePool, str]:
    """The engine pool and the strategy of the request (validated as every extraction's options
    are), once every model the job will use runs it and takes its labels (503 when ``NER_MODEL``
    names no model, 422 for a strategy, labels or language no model serves)."""
    from pipeline.tasks import get_pool

    pool = get_pool()
    try:
        pool.config(pool.default)
    except ModelNotFoundError as error:  # NER_MODEL names nothing: the server is misconfigured
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(error)) from None
    try:
        models = [pool.default, *{pool.model_for(d.language) for d in request.documents or []}]
        # the strategy and the labels run on every model of the job
        options = [pool.options(model, labels=request.label_entries(), strategy=request.strategy, decoder=request.decoder,
                                flat_ner=request.flat_ner) for model in models]
    except (ModelNotFoundError, InvalidOptionsError) as error:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(error)) from None
    return pool, str(options[0].strategy)


@router.get("/jobs/{job_id}", response_model=JobOut)
def get_job(job_id: UUID, session: SessionDep, owner: OwnerDep) -> JobOut:
    """A job's status and progress (``processed`` + ``failed`` of ``total``)."""
    try:
        return JobOut.of(crud.find_job(session, str(job_id), owner))
    except crud.UnknownJobError:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id}") from None


@router.get("/documents/{document_id}/entities", response_model=DocumentEntitiesOut)
def get_document_entities(document_id: UUID, session: SessionDep, owner: OwnerDep,
                          model_version: Annotated[Annotated[str, StringConstraints(max_length=128), ACCEPTABLE] | None, Query()] = None,
                          ) -> DocumentEntitiesOut:
    """A document's entities for ``model_version`` (default: its latest results)."""
    found = crud.document_entities(session, str(document_id), model_version, owner)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no document {document_id}")
    return DocumentEntitiesOut.of(found)
