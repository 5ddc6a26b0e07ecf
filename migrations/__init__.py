"""Alembic migrations of the pipeline database (``alembic upgrade head``)."""
