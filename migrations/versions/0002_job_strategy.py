"""Jobs name the extraction strategy ``strategy`` (it was ``decoder``, a word now kept for the
token decoder); the values are kept.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("decoder", new_column_name="strategy")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("strategy", new_column_name="decoder")
