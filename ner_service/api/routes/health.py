"""Probes and metrics: ``/healthz`` (liveness), ``/readyz`` (default model loaded, the parts it needs answer), ``/metrics`` (Prometheus)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response, status
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from ner_service.api.schemas import HealthResponse, ReadyResponse
from ner_service.api.state import StateDep

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=HealthResponse)
async def healthz() -> HealthResponse:
    """Liveness: the process answers."""
    return HealthResponse(status="ok")


@router.get("/readyz", response_model=ReadyResponse,
            responses={503: {"model": ReadyResponse, "description": "the default model is not loaded yet, or a part the service needs does not answer"}})
async def readyz(state: StateDep) -> ReadyResponse | JSONResponse:
    """Readiness: the default model (NER_MODEL) is loaded and every readiness check passes (the
    assembled service: the job broker answers)."""
    model = state.pool.default
    if not state.pool.is_loaded(model):
        body = ReadyResponse(status="failed" if state.load_error else "loading", model=model, detail=state.load_error)
        return JSONResponse(body.model_dump(), status_code=status.HTTP_503_SERVICE_UNAVAILABLE)
    problems = [problem for problem in await asyncio.gather(*(check() for check in state.readiness_checks)) if problem]
    if problems:
        body = ReadyResponse(status="unavailable", model=model, detail="; ".join(problems))
        return JSONResponse(body.model_dump(), status_code=status.HTTP_503_SERVICE_UNAVAILABLE)
    return ReadyResponse(status="ready", model=model)


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus metrics"}})
async def metrics(state: StateDep) -> Response:
    """Prometheus metrics of this process."""
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
