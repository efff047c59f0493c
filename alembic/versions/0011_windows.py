"""windows: a pipeline's key's events decided together; events.window_id, window_position

Revision ID: 0011_windows
Revises: 0010_relay_slot
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0011_windows"
down_revision = "0010_relay_slot"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "windows",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("pipeline", sa.String(64), nullable=False),
        sa.Column("group_key", sa.String(512), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("events", sa.Integer(), nullable=False),
        sa.Column("first_event_id", sa.String(64), nullable=True),
        sa.Column("last_event_id", sa.String(64), nullable=True),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closes_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("closed_by", sa.String(16), nullable=True),
        sa.Column("event_id", sa.String(64), nullable=True),
    )
    op.create_index(
        "uq_windows_open",
        "windows",
        ["pipeline", "group_key"],
        unique=True,
        postgresql_where=sa.text("status = 'open'"),
        sqlite_where=sa.text("status = 'open'"),
    )
    op.create_index("ix_windows_status_closes", "windows", ["status", "closes_at"])
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("window_id", ID, nullable=True))
        batch_op.add_column(sa.Column("window_position", sa.Integer(), nullable=True))
        batch_op.create_index("ix_events_window_id", ["window_id"])


def downgrade() -> None:
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index("ix_events_window_id")
        batch_op.drop_column("window_position")
        batch_op.drop_column("window_id")
    op.drop_index("ix_windows_status_closes", table_name="windows")
    op.drop_index("uq_windows_open", table_name="windows")
    op.drop_table("windows")
