"""Request and response bodies of the batch-job routes (also their OpenAPI schema), and the
JSON shape of a job and of a document's entities wherever the pipeline reports them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from annotated_types import Ge, Le
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from ner_service.settings import get_settings

MAX_DOCUMENTS_PER_REQUEST = 10_000
#: A row id as the database stores it (a 32-bit INTEGER): larger numbers are a 422, not a database error.
RowId = Annotated[int, Ge(1), Le(2**31 - 1)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class DocumentIn(BaseModel):
    """A document submitted inline."""

    model_config = ConfigDict(extra="forbid")

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
    """Documents inline or by id (exactly one of the two), and the extraction strategy
    (``decoder``, its old name, is still read)."""

    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] | None = Field(default=None, min_length=1, max_length=MAX_DOCUMENTS_PER_REQUEST)
    document_ids: list[RowId] | None = Field(default=None, min_length=1, max_length=MAX_DOCUMENTS_PER_REQUEST)
    strategy: Name | None = Field(default=None, description="how the model is asked: padellm (default), ar or fast_dllm")
    decoder: Name | None = Field(default=None, deprecated=True, description="the old name of `strategy`")

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
    strategy: str
    status_url: str


class JobOut(BaseModel):
    """A job's status and progress (``processed`` + ``failed`` of ``total``)."""

    model_config = ConfigDict(from_attributes=True)

    id: int
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

    document_id: int
    external_id: str | None
    status: str
    error: str | None
    model_version: str | None
    entities: list[EntityOut]
