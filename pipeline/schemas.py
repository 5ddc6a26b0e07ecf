"""Request and response bodies of the batch-job routes (also their OpenAPI schema), and the
JSON shape of a job and of a document's entities wherever the pipeline reports them."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from ner_service.api.schemas import ACCEPTABLE, EntityOut, Name, RequestLabels, Str, label_entries, string_problem
from ner_service.engine.option_errors import refuse_renamed
from ner_service.settings import get_settings

if TYPE_CHECKING:
    from pipeline.crud import DocumentEntities
    from pipeline.models import Job

MAX_DOCUMENTS_PER_REQUEST = 10_000


def text_problem(text: str) -> str | None:
    """Why a document's ``text`` cannot be processed (empty, longer than NER_MAX_TEXT_CHARS, a
    :func:`string_problem`: a NUL character, an unpaired surrogate), or ``None``: checked at the
    door (the jobs route, ingest) and again when a job runs."""
    if not text.strip():
        return "empty text"
    limit = get_settings().ner_max_text_chars
    if len(text) > limit:
        return f"text has {len(text)} characters, more than NER_MAX_TEXT_CHARS={limit}"
    problem = string_problem(text)
    return None if problem is None else f"text {problem}"


class DocumentIn(BaseModel):
    """A document submitted inline."""

    model_config = ConfigDict(extra="forbid")

    text: Str  # NUL or an unpaired surrogate: the 422 of /v1/entities, word for word
    external_id: Annotated[str, StringConstraints(min_length=1, max_length=255), ACCEPTABLE] | None = None
    language: Annotated[str, StringConstraints(min_length=1, max_length=16), ACCEPTABLE] | None = None

    @field_validator("text")
    @classmethod
    def _text_fits(cls, text: str) -> str:
        problem = text_problem(text)
        if problem is not None:
            raise ValueError(problem)
        return text


class JobRequest(BaseModel):
    """Documents inline or by id (exactly one of the two), and the extraction strategy."""

    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] | None = Field(default=None, min_length=1, max_length=MAX_DOCUMENTS_PER_REQUEST)
    document_ids: list[UUID] | None = Field(default=None, min_length=1, max_length=MAX_DOCUMENTS_PER_REQUEST,
                                            description="ids of documents stored before (the `document_ids` of an earlier job)")
    strategy: Name | None = Field(default=None, description="how the model is asked: padellm (default), ar or fast_dllm")
    decoder: Name | None = Field(default=None, description="how the answers' tokens are produced, as in POST /v1/entities (default copy)")
    labels: RequestLabels | None = Field(
        default=None,
        description="the labels to find, as in POST /v1/entities (default: each model's); an open-label model takes any names")
    flat_ner: bool = Field(default=True, description="false: every label's entities, overlaps kept, as in POST /v1/entities (default true)")

    @model_validator(mode="before")
    @classmethod
    def _no_renamed_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            refuse_renamed(data, where=" in a job")  # the option names of POST /v1/entities: `backend` is now `decoder`
        return data

    @field_validator("document_ids")
    @classmethod
    def _each_id_once(cls, ids: list[UUID] | None) -> list[UUID] | None:
        """A job holds a document once: an id listed twice is a mistake to say, not to fold away."""
        twice = next((i for n, i in enumerate(ids or []) if i in ids[:n]), None)
        if twice is not None:
            raise ValueError(f"document id {twice} is listed more than once")
        return ids

    @model_validator(mode="after")
    def _one_source(self) -> "JobRequest":
        if (self.documents is None) == (self.document_ids is None):
            raise ValueError('give either "documents" or "document_ids"')
        return self

    def label_entries(self) -> list[str | dict[str, str | None]] | None:
        return label_entries(self.labels)

    def fingerprint(self) -> str:
        """SHA-256 of the request as parsed (canonical JSON): tells a retry from another request
        sent under the same ``Idempotency-Key``."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()


class JobAccepted(BaseModel):
    """The answer to a submitted job: its id and the ids of its documents (in the order given)."""

    job_id: str
    document_ids: list[str]
    status: str
    total: int
    model_version: str
    strategy: str
    decoder: str | None = None
    labels: list[str | dict[str, str | None]] | None = None
    flat_ner: bool = True
    unfamiliar_labels: list[str] = Field(default_factory=list, description="labels the server's open model never trained on, asked "
                                                                          "without a description: found far less often (POST /v1/entities)")
    status_url: str


class JobOut(BaseModel):
    """A job's status and progress (``processed`` + ``failed`` of ``total``)."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    status: str
    total: int
    processed: int
    failed: int
    progress: float
    model_version: str
    strategy: str
    decoder: str | None = None
    labels: list[str | dict[str, str | None]] | None = None
    flat_ner: bool = True
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None

    @classmethod
    def of(cls, job: "Job") -> "JobOut":
        """A stored job as the API and the command line show it (its public id, its progress)."""
        progress = round((job.processed + job.failed) / job.total, 4) if job.total else 1.0
        fields = {name: getattr(job, name) for name in cls.model_fields if name not in ("id", "progress")}
        return cls.model_validate({**fields, "id": job.public_id, "progress": progress})


class DocumentEntitiesOut(BaseModel):
    """A document's entities for one model version (its latest results unless one is asked)."""

    document_id: str
    external_id: str | None
    status: str
    error: str | None
    model_version: str | None
    entities: list[EntityOut]

    @classmethod
    def of(cls, found: "DocumentEntities") -> "DocumentEntitiesOut":
        """A document and its stored entities (:func:`pipeline.crud.document_entities`)."""
        document = found.document
        return cls(document_id=document.public_id, external_id=document.external_id, status=document.status, error=document.error,
                   model_version=found.model_version, entities=[EntityOut.model_validate(e) for e in found.entities])
