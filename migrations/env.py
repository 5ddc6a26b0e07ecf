"""Alembic environment: the database is ``sqlalchemy.url`` when set (``pipeline.db.upgrade``),
else ``DATABASE_URL`` from the settings."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from ner_service.settings import get_settings
from pipeline.db import get_engine, normalize_url
from pipeline.models import Base

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata
url = normalize_url(config.get_main_option("sqlalchemy.url") or get_settings().database_url)


def run_migrations_offline() -> None:
    """Emit SQL without a connection (``alembic upgrade head --sql``)."""
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True, render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on a connection of the pipeline's engine."""
    with get_engine(url).connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=connection.dialect.name == "sqlite")
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
