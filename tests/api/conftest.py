"""Fixtures of the API tests: apps built from explicit settings on the tiny model, and clients on them."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from padellm_ner.asgi import create_app
from ner_service.settings import Settings
from tests.local_services import PrivateRedis, free_port

TINY = "tiny-conll03"


#: The jobs routes' database of the API tests (the app brings it to the head revision when created).
DATABASE = Path(tempfile.mkdtemp(prefix="padellm-api-tests-")) / "pipeline.db"


def tiny_settings(**overrides: object) -> Settings:
    """Settings on the tiny model; ``overrides`` by field name."""
    fields: dict[str, object] = {"ner_model": TINY, "ner_api_keys": "", "ner_rate_limit_per_minute": 10_000,
                                 "database_url": f"sqlite:///{DATABASE}"}
    return Settings(**(fields | overrides))


def wait_ready(client: TestClient, timeout_s: float = 120.0) -> None:
    """Poll /readyz until the default model is loaded."""
    deadline = time.monotonic() + timeout_s
    while client.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline, "the default model did not load"
        time.sleep(0.05)


@pytest.fixture
def make_client() -> Iterator[Callable[..., TestClient]]:
    """Build a started app from settings overrides; its client is closed (lifespan ended) after the test."""
    clients: list[TestClient] = []

    def make(ready: bool = True, **overrides: object) -> TestClient:
        client = TestClient(create_app(tiny_settings(**overrides)), raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        if ready:
            wait_ready(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    """A ready client of the default tiny-model app (no API keys), shared by a module's tests."""
    with TestClient(create_app(tiny_settings()), raise_server_exceptions=False) as client:
        wait_ready(client)
        yield client


@pytest.fixture
def app_factory() -> Callable[..., FastAPI]:
    return lambda **overrides: create_app(tiny_settings(**overrides))


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis of the test module's own (its tests may stop or flush it)."""
    server = PrivateRedis(free_port(), tmp_path_factory.mktemp("redis") / "redis.log")
    server.start()
    yield server.url
    server.stop()
