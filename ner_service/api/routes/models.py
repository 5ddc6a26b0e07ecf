"""``GET /v1/models``: the shipped models, described from their ``ner_model.json`` without loading them."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ner_service.api.schemas import ErrorResponse, ModelInfo, ModelsResponse
from ner_service.api.state import AuthenticatedRoute, StateDep
from ner_service.engine.ner_model import SELF_CONTAINED

router = APIRouter(prefix="/v1", tags=["models"], route_class=AuthenticatedRoute)


def dev_f1(metrics: dict[str, Any]) -> float | None:
    """The PaDeLLM dev micro-F1 recorded in a model's metrics (a final ``dev`` evaluation, else the training one)."""
    for key in ("dev", "dev_during_training"):
        f1 = ((metrics.get(key) or {}).get("padellm") or {}).get("micro_f1")
        if isinstance(f1, (int, float)):
            return float(f1)
    return None


@router.get("/models", response_model=ModelsResponse,
            responses={401: {"model": ErrorResponse}, 429: {"model": ErrorResponse}})
async def list_models(state: StateDep) -> ModelsResponse:
    """Every model a request may name, with its labels and dev F1."""
    pool = state.pool
    models = []
    for name in pool.names():
        config = pool.config(name)
        models.append(ModelInfo(
            name=name, language=config.language, labels=config.labels, base=config.base,
            adapter=config.base != SELF_CONTAINED, dev_f1=dev_f1(config.metrics),
            default=name == pool.default, loaded=pool.is_loaded(name),
        ))
    return ModelsResponse(default=pool.default, models=models)
