"""Schemathesis over the app's own OpenAPI schema: no generated request, valid or not, gets a 5xx.

The schema is the app's ``openapi()``; the requests go to the app under uvicorn (tiny model) with a
fresh SQLite database for the batch-job routes and a private Redis, so that generated jobs land
nowhere else.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from padellm_ner.asgi import create_app
from tests.api.conftest import tiny_settings
from tests.local_services import PrivateRedis, free_port, live_server

MAX_EXAMPLES = 25


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server of our own on a free port (no persistence); its URL."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(free_port(), tmp_path_factory.mktemp("redis") / "redis.log")
    server.start()
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, private_redis: str) -> Iterator[str]:
    """A live tiny-model app (bounded texts so that every call is quick); its base URL."""
    from pipeline.db import upgrade

    folder = tmp_path_factory.mktemp("schemathesis")
    database = f"sqlite:///{folder / 'pipeline.db'}"
    upgrade(database)
    env = {
        "NER_MODEL": "tiny-conll03", "NER_API_KEYS": "", "NER_RATE_LIMIT_PER_MINUTE": "1000000",
        "NER_MAX_TEXT_CHARS": "400", "NER_MAX_TEXTS": "8", "DATABASE_URL": database, "REDIS_URL": private_redis,
    }
    with live_server(env, folder / "uvicorn.log") as url:
        yield url


# built from the app itself at collection (schemathesis' lazy fixture loader does not work with pytest 9)
schema = schemathesis.openapi.from_dict(create_app(tiny_settings()).openapi())


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_generated_request_gets_a_server_error(case: schemathesis.Case, server: str) -> None:
    case.call_and_validate(base_url=server, checks=[not_a_server_error])


@pytest.mark.parametrize("path", ["/v1/jobs/3807038778499636658176", "/v1/documents/2147483648/entities", "/v1/jobs/1"])
def test_ids_are_uuids_and_anything_else_is_422(client, path: str) -> None:
    """Row numbers beyond the database integer once reached the database and came back as a 500;
    now ids are UUIDs, and a number is a 422 before any query."""
    response = client.get(path)
    assert response.status_code == 422 and "UUID" in response.text
