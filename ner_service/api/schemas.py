"""Request and response bodies of the API (they are also its OpenAPI schema)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from ner_service.engine.defaults import DEFAULT_DECODER, DEFAULT_STRATEGY
from ner_service.engine.labels import MAX_DESCRIPTION_CHARS, MAX_NAME_CHARS, MAX_OPEN_LABELS, MAX_REQUEST_LABEL_CHARS
from ner_service.engine.option_errors import refuse_renamed


def string_problem(value: str) -> str | None:
    """Why a string may not enter the service, or None: a NUL character (PostgreSQL cannot store
    one, so no route takes one, whatever the database) or an unpaired surrogate (JSON can carry
    one, UTF-8 cannot)."""
    if (nul := value.find("\x00")) >= 0:
        return f"contains a NUL character (\\u0000) at character {nul}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"is not valid Unicode (unpaired surrogate at character {error.start})"
    return None


def _acceptable(value: str) -> str:
    problem = string_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


#: The rule of every request string (texts, names, ids), after its length constraints:
#: a :func:`string_problem` is a 422.
ACCEPTABLE = AfterValidator(_acceptable)
Str = Annotated[str, ACCEPTABLE]
#: A name (label, strategy, decoder): short, so that no field carries an unbounded string.
Name = Annotated[str, StringConstraints(min_length=1, max_length=64), ACCEPTABLE]


LabelName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS), ACCEPTABLE]


class LabelIn(BaseModel):
    """A label an open-label model is asked for, with what it means."""

    model_config = ConfigDict(extra="forbid")

    name: LabelName
    description: Annotated[str, StringConstraints(min_length=1, max_length=MAX_DESCRIPTION_CHARS), ACCEPTABLE] | None = None


def _within_request_label_chars(labels: list[str | LabelIn]) -> list[str | LabelIn]:
    total = sum(len(label) if isinstance(label, str) else len(label.name) + len(label.description or "") for label in labels)
    if total > MAX_REQUEST_LABEL_CHARS:
        raise ValueError(f"the labels' names and descriptions hold {total:,} characters in all; at most "
                         f"{MAX_REQUEST_LABEL_CHARS:,} in one request (every window of every text is asked every label)")
    return labels


#: The labels of a request or a job: names or :class:`LabelIn`, at most ``MAX_OPEN_LABELS`` and
#: ``MAX_REQUEST_LABEL_CHARS`` characters of names and descriptions in all.
RequestLabels = Annotated[list[LabelName | LabelIn], Field(min_length=1, max_length=MAX_OPEN_LABELS),
                          AfterValidator(_within_request_label_chars)]


def label_entries(labels: list[str | LabelIn] | None) -> list[str | dict[str, str | None]] | None:
    """A request's labels as the engine's options take them (names, or name and description)."""
    return None if labels is None else [label if isinstance(label, str) else label.model_dump() for label in labels]


class EntitiesRequest(BaseModel):
    """Texts to analyse: exactly one of ``text`` and ``texts``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"text": "Angela Merkel visited Paris .", "labels": ["PER", "LOC"]}]},
    )

    text: Str | None = Field(None, description="one text")
    texts: list[Str] | None = Field(None, min_length=1, description="several texts, answered in order")
    labels: RequestLabels | None = Field(
        None,
        description="a subset of the model's labels (default: all); an open-label model takes any names, each a string or "
                    "`{\"name\", \"description\"}` (default: the labels its card names); names come back as given")
    strategy: Name | None = Field(None, description=f"how the model is asked: `padellm` (label-wise parallel decoding, the default), `ar` (the autoregressive baseline) or `fast_dllm` (a masked-diffusion model); default {DEFAULT_STRATEGY}")
    decoder: Name | None = Field(None, description=f"how the answers' tokens are produced: a registered decoder (default {DEFAULT_DECODER})")
    model: Annotated[str, StringConstraints(min_length=1, max_length=255), ACCEPTABLE] | None = Field(None, description="a shipped model name (default: the model of `language`, else the server's NER_MODEL)")
    language: Annotated[str, StringConstraints(min_length=2, max_length=16), ACCEPTABLE] | None = Field(None, description="the texts' language ('en', 'zh'): picks its default model when `model` is not given")
    threshold: float = Field(0.0, ge=0.0, le=1.0, description="drop the entities whose score (the probability the model gave them) is below this (default 0: every entity)")
    flat_ner: bool = Field(True, description="true (default): entities never overlap; false: every label's entities, as GLiNER's "
                                             "`flat_ner`: spans may nest and one span may carry several labels")

    @model_validator(mode="before")
    @classmethod
    def _no_renamed_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            refuse_renamed(data)  # `backend` is now `decoder`
        return data

    @model_validator(mode="after")
    def _exactly_one_input(self) -> "EntitiesRequest":
        if (self.text is None) == (self.texts is None):
            raise ValueError("send exactly one of 'text' (a string) and 'texts' (a list of strings)")
        return self

    def all_texts(self) -> list[str]:
        return [self.text] if self.text is not None else list(self.texts or [])

    def label_entries(self) -> list[str | dict[str, str | None]] | None:
        return label_entries(self.labels)


class EntityOut(BaseModel):
    """One entity: ``text == input[start:end]`` (character offsets); the API's answers and the
    batch pipeline's stored entities alike."""

    model_config = ConfigDict(from_attributes=True)

    start: int
    end: int
    text: str
    label: str
    score: float = Field(description="probability of the mention: its answer's tokens (under padellm times the probability, by its label's count, that the label holds a k-th mention)")


class StatsOut(BaseModel):
    """Cost of the engine batch the text was processed in (shared by the texts of that batch)."""

    forward_passes: int
    generated_tokens: int
    unmatched_mentions: int
    latency_ms: float
    batch_texts: int
    decoders: list[str] = Field(description="the token decoders that produced the batch's answers (none for `fast_dllm`)")


class TextResult(BaseModel):
    """The entities of one text."""

    entities: list[EntityOut]
    stats: StatsOut


class EntitiesResponse(BaseModel):
    """One result per input text, in order."""

    model: str
    labels: list[str]
    strategy: str
    decoder: str | None = Field(description="the decoder asked for (or the default; none for `fast_dllm`, which runs none); "
                                            "`decoders_used` says which ran")
    decoders_used: list[str] = Field(description="the token decoders that ran, over every result: the one asked for, greedy for a "
                                                 "constrained re-ask of a decoder that shares the cache, copy for answers restricted to "
                                                 "the text's spans; none for `fast_dllm`")
    results: list[TextResult]
    unfamiliar_labels: list[str] = Field(description="labels asked of an open model by a name it never trained on, without a "
                                                     "description: it finds such types far less often; a description or a name it "
                                                     "knows helps (`trained_names` of `GET /v1/models`)")
    elapsed_ms: float = Field(description="time spent in the server, queueing included")


class ModelInfo(BaseModel):
    """A shipped model, described from its ``ner_model.json``."""

    name: str
    language: str
    labels: list[str] = Field(description="the labels answered when a request names none")
    open_labels: bool = Field(description="takes any label names at call time (an open-label model); else only its `labels`")
    trained_names: list[str] = Field(description="an open model: the label names it trained on (lower-cased), those it finds best")
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
