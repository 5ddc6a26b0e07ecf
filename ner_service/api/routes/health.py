"""Probes and metrics: ``/healthz`` (liveness), ``/readyz`` (default model loaded), ``/metrics`` (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response, status
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from ner_service.api.schemas import HealthResponse, ReadyResponse
from ner_service.api.state import ApiState, api_state

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=HealthResponse)
async def healthz() -> HealthResponse:
    """Liveness: the process answers."""
    return HealthResponse(status="ok")


@router.get("/readyz", response_model=ReadyResponse, responses={503: {"model": ReadyResponse, "description": "the default model is not loaded yet"}})
async def readyz(state: ApiState = Depends(api_state)) -> ReadyResponse | JSONResponse:
    """Readiness: the default model (NER_MODEL) is loaded."""
    model = state.pool.default
    if state.pool.is_loaded(model):
        return ReadyResponse(status="ready", model=model)
    body = ReadyResponse(status="failed" if state.load_error else "loading", model=model, detail=state.load_error)
    return JSONResponse(body.model_dump(), status_code=status.HTTP_503_SERVICE_UNAVAILABLE)


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus metrics"}})
async def metrics(state: ApiState = Depends(api_state)) -> Response:
    """Prometheus metrics of this process."""
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
