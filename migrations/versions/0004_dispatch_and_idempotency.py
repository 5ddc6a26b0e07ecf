"""Jobs record when they were handed to Redis (``dispatched_at``; NULL: beat's sweep enqueues
them, every job stored before this revision counts as handed over when it was created), and
``idempotency_keys`` holds the ``Idempotency-Key`` of a submission, unique per owner.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True))
    jobs = sa.table("jobs", sa.column("dispatched_at", sa.DateTime(timezone=True)), sa.column("created_at", sa.DateTime(timezone=True)))
    op.execute(sa.update(jobs).values(dispatched_at=jobs.c.created_at))
    op.create_table(
        "idempotency_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("document_ids", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_idempotency_keys_job_id_jobs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_idempotency_keys"),
        sa.UniqueConstraint("owner", "key", name="uq_idempotency_keys_owner_key"),
    )


def downgrade() -> None:
    op.drop_table("idempotency_keys")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("dispatched_at")
