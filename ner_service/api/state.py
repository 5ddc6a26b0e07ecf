"""What the routes share: settings, the engine pool, the micro-batcher, metrics and the security guard."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from ner_service.api.core.batching import MicroBatcher
from ner_service.api.core.metrics import Metrics
from ner_service.api.core.security import Guard
from ner_service.engine import EnginePool
from ner_service.settings import Settings


@dataclass
class ApiState:
    """Created once per app by :func:`ner_service.api.app.create_app`."""

    settings: Settings
    pool: EnginePool
    batcher: MicroBatcher
    metrics: Metrics
    guard: Guard
    load_error: str | None = None


def api_state(request: Request) -> ApiState:
    """FastAPI dependency: the app's :class:`ApiState`."""
    return request.app.state.api


def authorize(request: Request) -> str:
    """FastAPI dependency of the ``/v1`` routes: the authenticated, rate-limited caller."""
    return api_state(request).guard(request)
