"""batch_requests: events decided through the Message Batches API; llm_calls.batch_id

Revision ID: 0012_batch_requests
Revises: 0011_windows
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0012_batch_requests"
down_revision = "0011_windows"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "batch_requests",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("pipeline", sa.String(64), nullable=False),
        sa.Column("group_key", sa.String(512), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("batch_id", sa.String(100), nullable=True),
        sa.Column("llm_call_id", sa.String(64), nullable=True),
        sa.Column("reply", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("event_id", "generation", name="uq_batch_requests_event"),
    )
    op.create_index("ix_batch_requests_status", "batch_requests", ["status"])
    op.create_index("ix_batch_requests_key", "batch_requests", ["pipeline", "group_key", "id"])
    op.create_index("ix_batch_requests_batch_id", "batch_requests", ["batch_id"])
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.add_column(sa.Column("batch_id", sa.String(100), nullable=True))
        batch_op.create_index("ix_llm_calls_batch_id", ["batch_id"])


def downgrade() -> None:
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.drop_index("ix_llm_calls_batch_id")
        batch_op.drop_column("batch_id")
    op.drop_index("ix_batch_requests_batch_id", table_name="batch_requests")
    op.drop_index("ix_batch_requests_key", table_name="batch_requests")
    op.drop_index("ix_batch_requests_status", table_name="batch_requests")
    op.drop_table("batch_requests")
