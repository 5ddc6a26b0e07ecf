"""The FastAPI application of the engine: :func:`create_app` builds it; routers of other parts
(the batch jobs) are mounted by whoever assembles the service (``padellm_ner.asgi``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.middleware.body_limit import RequestBodyLimitMiddleware

from ner_service.api.core.admission import Admission, ServiceRate
from ner_service.api.core.batching import MicroBatcher
from ner_service.api.core.echo import ECHO_MAX, clipped
from ner_service.api.core.logging import RequestContextMiddleware, configure_logging
from ner_service.api.core.metrics import Metrics, MetricsMiddleware
from ner_service.api.core.proxies import TrustedProxies
from ner_service.api.core.security import ApiKeys, Guard, RateLimiter
from ner_service.api.core.work import Reading
from ner_service.api.routes import entities, health, models, page
from ner_service.api.routes.api_docs import mount_docs
from ner_service.api.state import ApiState, AuthenticatedRoute
from ner_service.engine import EnginePool, Entity, ExtractOptions, Extraction
from ner_service.settings import Settings, get_settings

logger = logging.getLogger(__name__)
#: Bytes of JSON per character in the worst case (a ``\\uXXXX`` escape), for the body-size limit.
JSON_BYTES_PER_CHAR = 6


async def _load_default_model(state: ApiState) -> None:
    """Load NER_MODEL in the loader thread; ``/readyz`` answers 200 once it is there."""
    try:
        await state.batcher.load(ExtractOptions(state.pool.default))
    except Exception as error:  # reported by /readyz, which then stays 503
        state.load_error = str(error)
        logger.exception("the default model could not be loaded")


def _is_json(content_type: str) -> bool:
    """Whether a Content-Type header names JSON (``application/json``, ``application/*+json``)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    """422 listing where and why, without echoing the input back (it may be huge or not encodable):
    the first few errors, their locations and messages clipped (a key of the body is part of a
    location), then one that counts the rest. A body that is not JSON is not a wrong value: 400
    when it does not parse, 415 when it is sent as another content type (which the body names)."""
    errors = error.errors()
    content_type = request.headers.get("content-type", "")
    if any(e.get("loc", ())[:1] == ("body",) for e in errors) and content_type and not _is_json(content_type):
        return JSONResponse({"detail": f"the body is sent as {clipped(content_type)!r}; send it as JSON, with the header "
                                       "Content-Type: application/json"}, status.HTTP_415_UNSUPPORTED_MEDIA_TYPE)
    broken = next((e for e in errors if e.get("type") == "json_invalid"), None)
    if broken is not None:
        where = broken.get("loc", ())[1:2]
        return JSONResponse({"detail": f"the body is not valid JSON ({clipped(broken.get('ctx', {}).get('error', 'JSON decode error'))}"
                                       + (f" at character {where[0]})" if where else ")")}, status.HTTP_400_BAD_REQUEST)
    detail = [{"loc": [clipped(part) if isinstance(part, str) else part for part in e.get("loc", ())],
               "msg": clipped(e.get("msg", "")), "type": e.get("type", "")} for e in errors[:ECHO_MAX]]
    if len(errors) > ECHO_MAX:
        detail.append({"loc": [], "msg": f"and {len(errors) - ECHO_MAX} more errors", "type": "more_errors"})
    return JSONResponse({"detail": detail}, status.HTTP_422_UNPROCESSABLE_CONTENT)


def create_app(settings: Settings | None = None, routers: Sequence[APIRouter] = ()) -> FastAPI:
    """Build the API from ``settings`` (default: the environment), with ``routers`` mounted behind
    the same keys and rate limit (their ``route_class`` is :class:`AuthenticatedRoute`). The
    default model loads at startup."""
    settings = settings or get_settings()
    configure_logging(settings.log_level)
    metrics = Metrics()
    pool = EnginePool(settings.ner_model, settings.ner_dtype, settings.ner_device, settings.ner_batch_max_texts,
                      allowed=settings.served_models(), memory_budget_mb=settings.ner_model_memory_mb)

    def run(options: ExtractOptions, texts: list[str]) -> list[Extraction]:
        return pool.extract(options, texts)

    def load(options: ExtractOptions) -> None:
        pool.ner_model(options.model)

    def loaded(options: ExtractOptions) -> bool:
        return pool.is_loaded(options.model)

    def reading(options: ExtractOptions) -> Reading:
        return Reading.of(options, pool.config(options.model))

    def text_entities(options: ExtractOptions, text: str, found: list[Entity]) -> list[Entity]:
        return pool.engine(options.model).text_entities(text, found, options.strategy, options.flat_ner)

    rate = ServiceRate.fixed(settings.ner_fixed_ms_per_token) if settings.ner_fixed_ms_per_token > 0 \
        else ServiceRate(settings.ner_prior_ms_per_token)
    metrics.seconds_per_token.set_function(lambda: rate.seconds_per_token)
    metrics.model_weights_bytes.set_function(pool.resident_bytes)
    admission = Admission(rate, settings.ner_request_timeout_s * settings.ner_admission_fraction,
                          settings.ner_max_request_tokens, settings.ner_queue_max)
    batcher = MicroBatcher(
        run, metrics, admission, load=load, loaded=loaded, text_entities=text_entities, reading=reading, enabled=settings.ner_microbatch,
        wait_ms=settings.ner_batch_wait_ms, wait_fraction=settings.ner_batch_wait_fraction, wait_max_ms=settings.ner_batch_wait_max_ms,
        max_texts=settings.ner_batch_max_texts, piece_tokens=settings.ner_piece_tokens,
        long_text_tokens=settings.ner_long_text_tokens, split_tokens=settings.ner_batch_split_tokens,
    )
    guard = Guard(ApiKeys(settings.ner_api_keys), RateLimiter(settings.ner_rate_limit_per_minute),
                  RateLimiter(settings.ner_auth_failures_per_minute), TrustedProxies.parse(settings.ner_trusted_proxies))
    state = ApiState(settings, pool, batcher, metrics, guard)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        loading = asyncio.create_task(_load_default_model(state))
        logger.info("API started", extra={"model": pool.default, "microbatch": settings.ner_microbatch})
        yield
        await batcher.stop()
        await asyncio.gather(loading, return_exceptions=True)

    app = FastAPI(
        title="padellm-ner",
        summary="Named-entity recognition by parallel decoding of LLMs (PaDeLLM-NER).",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,  # served offline by mount_docs
        redoc_url=None,
    )
    app.state.api = state
    app.add_exception_handler(RequestValidationError, _validation_error)
    # the body limit as a middleware of ours, not FastAPI's max_body_size (which sits outside them): its 413 is counted and has the request id
    app.add_middleware(RequestBodyLimitMiddleware,
                       max_body_size=settings.ner_max_texts * settings.ner_max_text_chars * JSON_BYTES_PER_CHAR + 64 * 1024)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(RequestContextMiddleware)  # outermost: every log line and response has the request id, a 500 too
    for router in (entities.router, models.router, health.router, page.router):
        app.include_router(router)
    mount_docs(app)
    for router in routers:
        unguarded = [route.path for route in router.routes if not isinstance(route, AuthenticatedRoute)]
        if unguarded:
            raise TypeError(f"mounted routes must authenticate (route_class=AuthenticatedRoute): {unguarded}")
        app.include_router(router)
    return app
