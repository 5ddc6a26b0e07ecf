"""``POST /v1/entities``: the entities of one or several texts, micro-batched into the engine."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Depends, HTTPException, status

from ner_service.api.core.batching import QueueFullError
from ner_service.api.schemas import EntitiesRequest, EntitiesResponse, EntityOut, ErrorResponse, StatsOut, TextResult
from ner_service.api.state import ApiState, api_state, authorize
from ner_service.engine import InvalidOptionsError, ModelLoadError, ModelNotFoundError

router = APIRouter(prefix="/v1", tags=["entities"], dependencies=[Depends(authorize)])

ERRORS = {
    code: {"model": ErrorResponse, "description": description}
    for code, description in {
        400: "the body is not valid UTF-8 JSON",
        401: "missing or invalid API key",
        413: "too many texts, a text too long, or a body too large",
        422: "invalid request: wrong types; an unknown model, label, strategy or decoder, or one the model cannot run",
        429: "rate limit exceeded or queue full (see Retry-After)",
        503: "the model could not be loaded",
        504: "the request timed out (NER_REQUEST_TIMEOUT_S)",
    }.items()
}


def _check_limits(texts: list[str], state: ApiState) -> None:
    settings = state.settings
    if len(texts) > settings.ner_max_texts:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"{len(texts)} texts in one request; at most {settings.ner_max_texts} (NER_MAX_TEXTS)")
    for index, text in enumerate(texts):
        if len(text) > settings.ner_max_text_chars:
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE,
                                f"text {index} has {len(text)} characters; at most {settings.ner_max_text_chars} (NER_MAX_TEXT_CHARS)")


@router.post("/entities", response_model=EntitiesResponse, responses=ERRORS)
async def extract_entities(body: EntitiesRequest, state: ApiState = Depends(api_state)) -> EntitiesResponse:
    """Entities (character offsets, label, score) of every text, with the engine's timing and forward passes."""
    began = time.perf_counter()
    texts = body.all_texts()
    _check_limits(texts, state)
    try:
        options = state.pool.options(body.model, body.language, body.labels, body.strategy, body.decoder, body.backend)
    except (InvalidOptionsError, ModelNotFoundError) as error:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(error)) from None
    try:
        extractions = await asyncio.wait_for(state.batcher.submit(options, texts), state.settings.ner_request_timeout_s)
    except QueueFullError as error:
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, str(error), headers={"Retry-After": str(error.retry_after_s)}) from None
    except TimeoutError:
        raise HTTPException(status.HTTP_504_GATEWAY_TIMEOUT,
                            f"no answer within {state.settings.ner_request_timeout_s} s (NER_REQUEST_TIMEOUT_S)") from None
    except ModelLoadError as error:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(error)) from None
    return EntitiesResponse(
        model=options.model,
        labels=list(options.labels or state.pool.config(options.model).labels),
        strategy=options.strategy,
        decoder=options.decoder,
        results=[
            TextResult(entities=[EntityOut(**entity.to_dict()) for entity in extraction.entities], stats=StatsOut(**extraction.stats.to_dict()))
            for extraction in extractions
        ],
        elapsed_ms=(time.perf_counter() - began) * 1000,
    )
