"""Jobs keep whether their entities may overlap (``flat_ner``; true: never, the default), the
option ``POST /v1/entities`` takes under the same name.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("flat_ner", sa.Boolean(), nullable=False, server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("flat_ner")
