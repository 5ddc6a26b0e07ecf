"""The ASGI app uvicorn serves: the engine's API with the batch jobs' routes mounted behind the
same keys and rate limit (``uvicorn padellm_ner.asgi:create_app --factory``). The database is
brought to the schema the jobs routes need before the app exists (``PIPELINE_MIGRATE_ON_START``),
or the app refuses to start saying what to run. ``/readyz`` also asks the job broker, and a
database that fails or times out is a 503."""

from __future__ import annotations

from fastapi import FastAPI

from ner_service.api.app import create_app as create_api
from ner_service.settings import Settings, get_settings
from pipeline.api import DATABASE_UNAVAILABLE, database_unavailable
from pipeline.api import router as jobs_router
from pipeline.db import ensure_schema
from pipeline.dispatch import broker_problem


def create_app(settings: Settings | None = None) -> FastAPI:
    """The whole REST service from ``settings`` (default: the environment)."""
    settings = settings or get_settings()
    ensure_schema(settings.database_url, migrate=settings.pipeline_migrate_on_start)
    app = create_api(settings, routers=[jobs_router])
    app.state.api.readiness_checks.append(broker_problem)
    for error in DATABASE_UNAVAILABLE:
        app.add_exception_handler(error, database_unavailable)
    return app
