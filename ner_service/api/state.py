"""What the routes share: settings, the engine pool, the micro-batcher, metrics and the security guard."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request, Response
from fastapi.routing import APIRoute

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
    #: What else ``/readyz`` asks, each saying why the service is not ready or ``None`` (the
    #: assembled service adds the job broker's): bounded, as a probe must be.
    readiness_checks: list[Callable[[], Awaitable[str | None]]] = field(default_factory=list)


def api_state(request: Request) -> ApiState:
    """FastAPI dependency: the app's :class:`ApiState`."""
    return request.app.state.api


class AuthenticatedRoute(APIRoute):
    """A route that authenticates and rate-limits its caller before anything reads the body
    (FastAPI reads and parses it before it solves dependencies): a request without a valid key is
    answered 401 or 429 whatever its body, and costs no parsing. The ``route_class`` of every
    router under ``/v1``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def authenticated(request: Request) -> Response:
            request.state.caller = api_state(request).guard(request)
            return await handler(request)

        return authenticated


def authorize(request: Request) -> str:
    """FastAPI dependency: the caller that :class:`AuthenticatedRoute` authenticated."""
    return request.state.caller


#: The dependencies of the routes, as ``Annotated`` parameter types.
StateDep = Annotated[ApiState, Depends(api_state)]
CallerDep = Annotated[str, Depends(authorize)]
