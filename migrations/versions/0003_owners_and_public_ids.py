"""Documents and jobs get an owner (the id of the API key that stored them; ``local`` for what
the command line and the nightly jobs store, and for every row before this revision) and an
unguessable public id for URLs; ``external_id`` becomes unique per owner.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TABLES = ("documents", "jobs")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("public_id", sa.String(length=36), nullable=True))
            batch.add_column(sa.Column("owner", sa.String(length=64), nullable=False, server_default="local"))
        rows = sa.table(table, sa.column("id", sa.Integer), sa.column("public_id", sa.String))
        connection = op.get_bind()
        for (row_id,) in connection.execute(sa.select(rows.c.id).where(rows.c.public_id.is_(None))).all():
            connection.execute(sa.update(rows).where(rows.c.id == row_id).values(public_id=str(uuid.uuid4())))
        with op.batch_alter_table(table) as batch:
            batch.alter_column("public_id", existing_type=sa.String(length=36), nullable=False)
            batch.alter_column("owner", existing_type=sa.String(length=64), server_default=None)
            batch.create_unique_constraint(f"uq_{table}_public_id", ["public_id"])
            batch.create_index(f"ix_{table}_owner", ["owner"])
    with op.batch_alter_table("documents") as batch:
        batch.drop_constraint("uq_documents_external_id", type_="unique")
        batch.create_unique_constraint("uq_documents_owner_external_id", ["owner", "external_id"])


def downgrade() -> None:
    with op.batch_alter_table("documents") as batch:
        batch.drop_constraint("uq_documents_owner_external_id", type_="unique")
        batch.create_unique_constraint("uq_documents_external_id", ["external_id"])
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_index(f"ix_{table}_owner")
            batch.drop_constraint(f"uq_{table}_public_id", type_="unique")
            batch.drop_column("owner")
            batch.drop_column("public_id")
