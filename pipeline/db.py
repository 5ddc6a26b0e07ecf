"""Engines, sessions and schema upgrades for the database named by ``DATABASE_URL``
(SQLite by default, with foreign keys and WAL; PostgreSQL through psycopg 3). Every call is
bounded: ``DATABASE_CONNECT_TIMEOUT_S`` to connect (and to wait for a pooled connection),
``DATABASE_STATEMENT_TIMEOUT_S`` for a PostgreSQL statement or a SQLite lock."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker

from ner_service.settings import get_settings

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def normalize_url(url: str) -> str:
    """Use the psycopg 3 driver for plain ``postgresql://`` / ``postgres://`` URLs."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def get_engine(url: str | None = None) -> Engine:
    """The (cached) SQLAlchemy engine for ``url`` (default: ``DATABASE_URL``; the URL and the
    timeouts are read on each call)."""
    settings = get_settings()
    return _engine_for(normalize_url(url or settings.database_url), settings.database_connect_timeout_s,
                       settings.database_statement_timeout_s)


@lru_cache(maxsize=8)
def _engine_for(url: str, connect_timeout_s: float, statement_timeout_s: float) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": statement_timeout_s, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    bounds = {"connect_timeout": max(2, round(connect_timeout_s)),  # libpq's unit is whole seconds, 2 at least
              "options": f"-c statement_timeout={round(statement_timeout_s * 1000)}"}
    given = make_url(url).query  # what the URL itself sets wins
    connect_args = {name: value for name, value in bounds.items() if name not in given}
    return create_engine(url, pool_pre_ping=True, pool_timeout=connect_timeout_s, connect_args=connect_args)


def session_factory(url: str | None = None) -> sessionmaker[Session]:
    """A session factory bound to :func:`get_engine` (``expire_on_commit=False``)."""
    return sessionmaker(get_engine(url), expire_on_commit=False)


def alembic_config(url: str | None = None):
    """An Alembic config for ``url`` that works from any directory (and from an installed package)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", normalize_url(url or get_settings().database_url).replace("%", "%%"))
    return config


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Run the migrations up to ``revision`` (what ``alembic upgrade head`` does)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


class SchemaNotReadyError(RuntimeError):
    """The database is not at the revision this code needs, and may not be migrated from here."""


def ensure_schema(url: str | None = None, migrate: bool = True) -> None:
    """Bring the database to the head revision (``migrate``), or raise :class:`SchemaNotReadyError`
    saying which revision it is at and what to run."""
    from alembic.migration import MigrationContext
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    with get_engine(url).connect() as connection:
        current = MigrationContext.configure(connection).get_current_revision()
    if current == head:
        return
    if not migrate:
        raise SchemaNotReadyError(f"the database is at revision {current or 'none (empty)'}, this code needs {head}: "
                                  "run `alembic upgrade head` (or start with PIPELINE_MIGRATE_ON_START=true)")
    upgrade(url)
