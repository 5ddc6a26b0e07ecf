"""``POST /v1/entities``: the entities of one or several texts, micro-batched into the engine."""

from __future__ import annotations

import asyncio
import logging
import math
import time

from fastapi import APIRouter, HTTPException, Request, status

from ner_service.api.core.admission import Overloaded, TooMuchWork
from ner_service.api.schemas import EntitiesRequest, EntitiesResponse, EntityOut, ErrorResponse, StatsOut, TextResult
from ner_service.api.state import ApiState, AuthenticatedRoute, CallerDep, StateDep
from ner_service.engine import ExtractOptions, Extraction, InvalidOptionsError, ModelLoadError, ModelNotFoundError

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["entities"], route_class=AuthenticatedRoute)
#: How often a waiting request checks that its client is still there.
DISCONNECT_POLL_S = 0.25

ERRORS = {
    code: {"model": ErrorResponse, "description": description}
    for code, description in {
        400: "the body is not valid UTF-8 JSON",
        401: "missing or invalid API key",
        413: "too many texts, a text too long, a body too large, or more work than one request may ever hold "
             "(NER_MAX_REQUEST_TOKENS, NER_QUEUE_MAX, the timeout at NER_FIXED_MS_PER_TOKEN or at the fastest rate measured): "
             "long texts go to a batch job, POST /v1/jobs",
        422: "invalid request: wrong types; an unknown model, label, strategy or decoder, or one the model cannot run",
        429: "rate limit exceeded (it counts texts), too many failed authentications, or the server at capacity or too slow "
             "now for the request's work (see Retry-After)",
        503: "the model could not be loaded, or no answer came within the request timeout (NER_REQUEST_TIMEOUT_S; see Retry-After)",
    }.items()
}


def _check_limits(texts: list[str], state: ApiState) -> None:
    settings = state.settings
    if len(texts) > settings.ner_max_texts:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, f"{len(texts)} texts in one request; at most {settings.ner_max_texts} (NER_MAX_TEXTS)")
    for index, text in enumerate(texts):
        if len(text) > settings.ner_max_entities_text_chars:
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE,
                                f"text {index} has {len(text)} characters; at most {settings.ner_max_entities_text_chars} "
                                "(NER_MAX_ENTITIES_TEXT_CHARS): send longer texts as a batch job (POST /v1/jobs)")


async def _client_gone(request: Request) -> None:
    """Return once the client has closed the connection."""
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)


async def _extract(request: Request, state: ApiState, options: ExtractOptions, texts: list[str], caller: str) -> list[Extraction]:
    """The batcher's answer, or an HTTP error; the work is cancelled when the request times out
    or its client goes away."""
    timeout = state.settings.ner_request_timeout_s
    work = asyncio.ensure_future(state.batcher.submit(options, texts, caller))
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        done, _ = await asyncio.wait({work, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
    if work not in done:
        await asyncio.gather(work, return_exceptions=True)
        if gone in done:
            logger.info("client gone: its work is cancelled")
            raise HTTPException(499, "client closed the request")
        # an answer late for its client is no answer: a 503 it can retry on, within the time it was promised one
        retry = max(1, math.ceil(state.batcher.admission.rate.seconds_for(state.batcher.pending_tokens)))  # the queue done
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"no answer within {timeout} s (NER_REQUEST_TIMEOUT_S): the "
                            "engine is slower now than admission measured it; retry later", headers={"Retry-After": str(retry)})
    try:
        return work.result()
    except TooMuchWork as error:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, str(error)) from None
    except Overloaded as error:
        state.metrics.shed.inc()
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, str(error), headers={"Retry-After": str(error.retry_after_s)}) from None
    except ModelLoadError as error:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(error)) from None


@router.post("/entities", response_model=EntitiesResponse, responses=ERRORS)
async def extract_entities(body: EntitiesRequest, request: Request, state: StateDep, caller: CallerDep) -> EntitiesResponse:
    """Entities (character offsets, label, score) of every text, with the engine's timing and forward passes."""
    began = time.perf_counter()
    texts = body.all_texts()
    _check_limits(texts, state)
    state.guard.charge(caller, len(texts) - 1)
    try:
        options = state.pool.options(body.model, body.language, body.label_entries(), body.strategy, body.decoder, body.flat_ner)
    except (InvalidOptionsError, ModelNotFoundError) as error:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(error)) from None
    extractions = await _extract(request, state, options, texts, caller)
    return EntitiesResponse(
        model=options.model,
        labels=list(options.labels or ()),
        strategy=options.strategy,
        decoder=options.decoder,
        decoders_used=list(dict.fromkeys(name for extraction in extractions for name in extraction.stats.decoders)),
        results=[
            TextResult(entities=[EntityOut(**entity.to_dict()) for entity in extraction.above(body.threshold).entities],
                       stats=StatsOut(**extraction.stats.to_dict()))
            for extraction in extractions
        ],
        unfamiliar_labels=options.unfamiliar_labels(state.pool.config(options.model)),
        elapsed_ms=(time.perf_counter() - began) * 1000,
    )
