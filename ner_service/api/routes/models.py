"""``GET /v1/models``: the shipped models, described from their ``ner_model.json`` without loading them."""

from __future__ import annotations

from fastapi import APIRouter

from ner_service.api.schemas import ErrorResponse, ModelInfo, ModelsResponse
from ner_service.api.state import AuthenticatedRoute, StateDep
from ner_service.engine.model_metrics import dev_f1
from ner_service.engine.ner_model import SELF_CONTAINED

router = APIRouter(prefix="/v1", tags=["models"], route_class=AuthenticatedRoute)


@router.get("/models", response_model=ModelsResponse,
            responses={401: {"model": ErrorResponse}, 429: {"model": ErrorResponse}})
async def list_models(state: StateDep) -> ModelsResponse:
    """Every model a request may name, with its labels and dev F1."""
    pool = state.pool
    models = []
    for name in pool.names():
        config = pool.config(name)
        models.append(ModelInfo(
            name=name, language=config.language, labels=config.labels, open_labels=config.open_labels,
            trained_names=config.trained_names, base=config.base,
            adapter=config.base != SELF_CONTAINED, dev_f1=dev_f1(config.metrics),
            default=name == pool.default, loaded=pool.is_loaded(name),
        ))
    return ModelsResponse(default=pool.default, models=models)
