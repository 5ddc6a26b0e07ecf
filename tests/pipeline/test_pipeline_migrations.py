"""Alembic migrations on SQLite and PostgreSQL: upgrade, agreement with the models, downgrade."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from pipeline.db import get_engine, upgrade
from pipeline.models import Base

REPO = Path(__file__).resolve().parents[2]
TABLES = {"documents", "jobs", "job_documents", "document_results", "entities", "idempotency_keys"}


def test_upgrade_matches_models_and_downgrade_removes_everything(database_url: str) -> None:
    upgrade(database_url)
    engine = get_engine(database_url)
    with engine.connect() as connection:
        assert TABLES <= set(inspect(connection).get_table_names())
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    upgrade(database_url)  # idempotent
    from alembic import command

    from pipeline.db import alembic_config

    command.downgrade(alembic_config(database_url), "base")
    with engine.connect() as connection:
        assert not TABLES & set(inspect(connection).get_table_names())


def test_alembic_command_line_reads_database_url(sqlite_url: str) -> None:
    env = {"DATABASE_URL": sqlite_url, "PATH": str(Path(sys.executable).parent)}
    for args in (["upgrade", "head"], ["current"], ["downgrade", "base"]):
        done = subprocess.run([sys.executable, "-m", "alembic", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        if args == ["current"]:
            assert "0007 (head)" in done.stdout


def test_the_strategy_rename_keeps_every_jobs_strategy(database_url: str) -> None:
    """0002 renames ``jobs.decoder`` to ``jobs.strategy``: a job stored before keeps its value,
    and the downgrade gives it back under the old name."""
    from alembic import command
    from sqlalchemy import text

    from pipeline.db import alembic_config

    config = alembic_config(database_url)
    command.upgrade(config, "0001")
    engine = get_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("INSERT INTO jobs (id, status, total, processed, failed, model_version, decoder, created_at, updated_at) "
                                "VALUES (7, 'completed', 0, 0, 0, 'v', 'ar', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
    command.upgrade(config, "0002")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT strategy FROM jobs WHERE id = 7")).scalar() == "ar"
    command.downgrade(config, "0001")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT decoder FROM jobs WHERE id = 7")).scalar() == "ar"
    command.downgrade(config, "base")


def test_owners_and_public_ids_are_given_to_existing_rows(database_url: str) -> None:
    """0003: every document and job stored before gets the owner ``local`` and its own random
    public id; afterwards an ``external_id`` is unique per owner, not across owners."""
    import uuid

    import pytest
    from alembic import command
    from sqlalchemy import text
    from sqlalchemy.exc import IntegrityError

    from pipeline.db import alembic_config

    config = alembic_config(database_url)
    command.upgrade(config, "0002")
    engine = get_engine(database_url)
    insert = ("INSERT INTO documents (id, external_id, text, status, content_hash, created_at) "
              "VALUES (:id, :external_id, 't', 'pending', 'h', CURRENT_TIMESTAMP)")
    with engine.begin() as connection:
        for row_id in (1, 2):
            connection.execute(text(insert), {"id": row_id, "external_id": f"doc-{row_id}"})
        connection.execute(text("INSERT INTO jobs (id, status, total, processed, failed, model_version, strategy, created_at, updated_at) "
                                "VALUES (3, 'completed', 0, 0, 0, 'v', 'ar', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
    command.upgrade(config, "head")
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT public_id, owner FROM documents UNION ALL SELECT public_id, owner FROM jobs")).all()
    assert {owner for _, owner in rows} == {"local"}
    assert len({uuid.UUID(public_id) for public_id, _ in rows}) == 3
    insert_owned = ("INSERT INTO documents (id, public_id, owner, external_id, text, status, content_hash, created_at) "
                    "VALUES (:id, :public_id, :owner, 'doc-1', 't', 'pending', 'h', CURRENT_TIMESTAMP)")
    with engine.begin() as connection:
        connection.execute(text(insert_owned), {"id": 4, "public_id": str(uuid.uuid4()), "owner": "key:other"})
    with pytest.raises(IntegrityError), engine.begin() as connection:
        connection.execute(text(insert_owned), {"id": 5, "public_id": str(uuid.uuid4()), "owner": "local"})
    with engine.begin() as connection:  # the downgrade makes external_id unique across owners again
        connection.execute(text("DELETE FROM documents WHERE id = 4"))
    command.downgrade(config, "base")


def test_jobs_stored_before_dispatch_tracking_count_as_handed_over(database_url: str) -> None:
    """0004: a job stored before it counts as handed to Redis when it was created (beat's sweep of
    jobs never enqueued leaves it alone); an ``Idempotency-Key`` is unique per owner."""
    import pytest
    from alembic import command
    from sqlalchemy import text
    from sqlalchemy.exc import IntegrityError

    config, engine = _a_job_stored_at(database_url, "0003", 3, "ar")
    command.upgrade(config, "0004")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT dispatched_at = created_at FROM jobs WHERE id = 3")).scalar()
    insert = ("INSERT INTO idempotency_keys (owner, key, request_hash, job_id, document_ids, created_at) "
              "VALUES (:owner, 'k', 'h', 3, '[]', CURRENT_TIMESTAMP)")
    with engine.begin() as connection:
        connection.execute(text(insert), {"owner": "local"})
        connection.execute(text(insert), {"owner": "key:other"})
    with pytest.raises(IntegrityError), engine.begin() as connection:
        connection.execute(text(insert), {"owner": "local"})
    command.downgrade(config, "base")


def test_jobs_stored_before_flat_ner_keep_flat_entities(database_url: str) -> None:
    """0007: a job stored before ``flat_ner`` existed runs as it was asked, its entities never overlapping."""
    from alembic import command
    from sqlalchemy import text

    config, engine = _a_job_stored_at(database_url, "0006", 4, "padellm")
    command.upgrade(config, "0007")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT flat_ner FROM jobs WHERE id = 4")).scalar() in (True, 1)
    command.downgrade(config, "base")


def _a_job_stored_at(database_url: str, revision: str, job_id: int, strategy: str):
    """The database at ``revision`` holding one queued job ``job_id``: alembic's config and the engine."""
    from alembic import command
    from sqlalchemy import text

    from pipeline.db import alembic_config

    config = alembic_config(database_url)
    command.upgrade(config, revision)
    engine = get_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("INSERT INTO jobs (id, public_id, owner, status, total, processed, failed, model_version, strategy, "
                                "created_at, updated_at) VALUES (:id, 'p', 'local', 'queued', 1, 0, 0, 'v', :strategy, CURRENT_TIMESTAMP, "
                                "CURRENT_TIMESTAMP)"), {"id": job_id, "strategy": strategy})
    return config, engine
