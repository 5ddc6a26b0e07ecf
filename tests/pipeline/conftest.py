"""Fixtures of the pipeline tests: a throwaway SQLite file or PostgreSQL database (created
through the ``postgres`` maintenance database and dropped afterwards), Redis db 13, and a
private redis-server for the tests that stop it."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.local_services import PrivateRedis, free_port


PG_ADMIN = os.environ.get("PADELLM_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_TEST_URL = os.environ["REDIS_URL"]


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    from ner_service.settings import get_settings

    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _admin():
    import psycopg

    return psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5)


@contextmanager
def new_postgresql_database() -> Iterator[str]:
    """A new, empty PostgreSQL database (its URL); dropped afterwards. Skips when PostgreSQL is not
    reachable."""
    try:
        admin = _admin()
    except Exception as error:  # noqa: BLE001
        pytest.skip(f"PostgreSQL is not reachable at {PG_ADMIN}: {error}")
    name = f"padellm_test_{secrets.token_hex(4)}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN.rsplit("/", 1)[0]
    url = f"{base}/{name}".replace("postgresql://", "postgresql+psycopg://", 1)
    yield url
    from pipeline.db import get_engine

    get_engine(url).dispose()
    with _admin() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def postgresql_url() -> Iterator[str]:
    """A new, empty PostgreSQL database; dropped after the test."""
    with new_postgresql_database() as url:
        yield url


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def module_database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An empty database of each kind for the tests of one module (a server they share)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'pipeline.db'}"
        return
    with new_postgresql_database() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'pipeline.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> str:
    """An empty database of each kind (the fixtures above)."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def migrated(database_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``database_url`` made the ``DATABASE_URL`` of the test (before anything reads the settings)
and upgraded to head."""
    from ner_service.settings import get_settings
    from pipeline.db import upgrade

    monkeypatch.setenv("DATABASE_URL", database_url)
    get_settings.cache_clear()
    upgrade(database_url)
    return database_url


@pytest.fixture
def sessions(migrated: str):
    from pipeline.db import session_factory

    return session_factory(migrated)


@pytest.fixture
def redis_db13() -> Iterator[str]:
    """Redis db 13 on the shared server, flushed before and after."""
    import redis

    client = redis.Redis.from_url(REDIS_TEST_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as error:
        pytest.skip(f"Redis is not reachable at {REDIS_TEST_URL}: {error}")
    client.flushdb()
    yield REDIS_TEST_URL
    client.flushdb()
    client.close()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(free_port(), tmp_path / "redis.log")
    server.start()
    yield server
    server.stop()
