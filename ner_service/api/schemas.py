"""Request and response bodies of the API (they are also its OpenAPI schema)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from ner_service.engine import DEFAULT_DECODER, DEFAULT_STRATEGY

#: A name (label, strategy, decoder): short, so that no field carries an unbounded string.
Name = Annotated[str, StringConstraints(min_length=1, max_length=64)]


def unicode_problem(text: str) -> str | None:
    """Why ``text`` cannot be encoded (an unpaired surrogate, which JSON can carry), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"text is not valid Unicode (unpaired surrogate at character {error.start})"
    return None


def _valid_unicode(text: str) -> str:
    problem = unicode_problem(text)
    if problem is not None:
        raise ValueError(problem)
    return text


class EntitiesRequest(BaseModel):
    """Texts to analyse: exactly one of ``text`` and ``texts``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"text": "Angela Merkel visited Paris .", "labels": ["PER", "LOC"]}]},
    )

    text: str | None = Field(None, description="one text")
    texts: list[str] | None = Field(None, min_length=1, description="several texts, answered in order")
    labels: list[Name] | None = Field(None, min_length=1, max_length=64, description="a subset of the model's labels (default: all)")
    strategy: Name | None = Field(None, description=f"how the model is asked: `padellm` (label-wise parallel decoding, the default), `ar` (the autoregressive baseline) or `fast_dllm` (a masked-diffusion model); default {DEFAULT_STRATEGY}")
    decoder: Name | None = Field(None, description=f"how the answers' tokens are produced: a registered decoder (default {DEFAULT_DECODER}); a strategy's name here is read as `strategy` (its old name)")
    backend: Name | None = Field(None, deprecated=True, description="the old name of `decoder`")
    model: Annotated[str, StringConstraints(min_length=1, max_length=255)] | None = Field(None, description="a shipped model name (default: the model of `language`, else the server's NER_MODEL)")
    language: str | None = Field(None, min_length=2, max_length=16, description="the texts' language ('en', 'zh'): picks its default model when `model` is not given")

    @field_validator("text")
    @classmethod
    def _text_is_unicode(cls, text: str | None) -> str | None:
        return None if text is None else _valid_unicode(text)

    @field_validator("texts")
    @classmethod
    def _texts_are_unicode(cls, texts: list[str] | None) -> list[str] | None:
        return None if texts is None else [_valid_unicode(text) for text in texts]

    @model_validator(mode="after")
    def _exactly_one_input(self) -> "EntitiesRequest":
        if (self.text is None) == (self.texts is None):
            raise ValueError("send exactly one of 'text' (a string) and 'texts' (a list of strings)")
        return self

    def all_texts(self) -> list[str]:
        return [self.text] if self.text is not None else list(self.texts or [])


class EntityOut(BaseModel):
    """One entity: ``text == input[start:end]`` (character offsets)."""

    start: int
    end: int
    text: str
    label: str
    score: float = Field(description="probability of the mention (exp of its sequence log-probability)")


class StatsOut(BaseModel):
    """Cost of the engine batch the text was processed in (shared by the texts of that batch)."""

    forward_passes: int
    generated_tokens: int
    unmatched_mentions: int
    latency_ms: float
    batch_texts: int


class TextResult(BaseModel):
    """The entities of one text."""

    entities: list[EntityOut]
    stats: StatsOut


class EntitiesResponse(BaseModel):
    """One result per input text, in order."""

    model: str
    labels: list[str]
    strategy: str
    decoder: str
    results: list[TextResult]
    elapsed_ms: float = Field(description="time spent in the server, queueing included")


class ModelInfo(BaseModel):
    """A shipped model, described from its ``ner_model.json``."""

    name: str
    language: str
    labels: list[str]
    base: str
    adapter: bool = Field(description="a LoRA adapter on ``base`` (else a self-contained model)")
    dev_f1: float | None = Field(description="PaDeLLM micro-F1 on the dev set, when recorded")
    default: bool
    loaded: bool


class ModelsResponse(BaseModel):
    default: str
    models: list[ModelInfo]


class HealthResponse(BaseModel):
    status: str


class ReadyResponse(BaseModel):
    status: str
    model: str
    detail: str | None = None


class ErrorResponse(BaseModel):
    """The body of every 4xx/5xx answer."""

    detail: str | list[dict[str, object]]
