"""Request and response bodies of the batch-job routes (also their OpenAPI schema), and the
JSON shape of a job and of a document's entities wherever the pipeline reports them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from ner_service.api.schemas import unicode_problem
from ner_service.settings import get_settings

MAX_DOCUMENTS_PER_REQUEST = 10_000
Name = Annotated[str, StringConstraints(min_length=1, max_length=64)]


def text_problem(text: str) -> str | None:
    """Why a document's ``text`` cannot be processed (empty, longer than NER_MAX_TEXT_CHARS, NUL
    characters, an unpaired surrogate), or ``None``: checked at the door (the jobs route, ingest)
    and again when a job runs."""
    if not text.strip():
        return "empty text"
    limit = get_settings().ner_max_text_chars
    if len(text) > limit:
        return f"text has {len(text)} characters, more than NER_MAX_TEXT_CHARS={limit}"
    if "\x00" in text:
        return "text contains NUL characters"
    return unicode_problem(text)


class DocumentIn(BaseModel):
    """A document submitted inline."""

    model_config = ConfigDict(extra="forbid")

    text: str
    external_id: str | None = Field(default=None, min_length=1, max_length=255)
    language: str | None = Field(default=None, min_length=1, max_length=16)

    @field_validator("text")
    @classmethod
    def _text_fits(cls, text: str) -> str:
        problem = text_problem(text)
        if problem is not None:
            raise ValueError(problem)
        return text


class JobRequest(BaseModel):
    """Documents inline or by id (exactly one of the two), and the extraction strategy
    (``decoder``, its old name, is still read)."""

    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] | None = Field(default=None, min_length=1, max_length=MAX_DOCUMENTS_PER_REQUEST)
    document_ids: list[UUID] | None = Field(default=None, min_length=1, max_length=MAX_DOCUMENTS_PER_REQUEST,
                                            description="ids of documents stored before (the `document_ids` of an earlier job)")
    strategy: Name | None = Field(default=None, description="how the model is asked: padellm (default), ar or fast_dllm")
    decoder: Name | None = Field(default=None, deprecated=True, description="the old name of `strategy`")

    @model_validator(mode="after")
    def _one_source(self) -> "JobRequest":
        if (self.documents is None) == (self.document_ids is None):
            raise ValueError('give either "documents" or "document_ids"')
        return self


class JobAccepted(BaseModel):
    """The answer to a submitted job: its id and the ids of its documents (in the order given)."""

    job_id: str
    document_ids: list[str]
    status: str
    total: int
    model_version: str
    strategy: str
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
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None


class EntityOut(BaseModel):
    """A stored entity: ``text`` is the document's text from ``start`` to ``end``."""

    model_config = ConfigDict(from_attributes=True)

    start: int
    end: int
    label: str
    text: str
    score: float | None


class DocumentEntitiesOut(BaseModel):
    """A document's entities for one model version (its latest results unless one is asked)."""

    document_id: str
    external_id: str | None
    status: str
    error: str | None
    model_version: str | None
    entities: list[EntityOut]
