"""The ASGI app uvicorn serves: the engine's API with the batch jobs' routes mounted behind the
same keys and rate limit (``uvicorn padellm_ner.asgi:create_app --factory``)."""

from __future__ import annotations

from fastapi import FastAPI

from ner_service.api.app import create_app as create_api
from ner_service.settings import Settings
from pipeline.api import router as jobs_router


def create_app(settings: Settings | None = None) -> FastAPI:
    """The whole REST service from ``settings`` (default: the environment)."""
    return create_api(settings, routers=[jobs_router])
