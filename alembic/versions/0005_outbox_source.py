"""outbox.source: the event's source, a message attribute the relay no longer reads from the
message body

Revision ID: 0005_outbox_source
Revises: 0004_fence
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0005_outbox_source"
down_revision = "0004_fence"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("source", sa.String(length=64), nullable=True))
    op.execute(
        "UPDATE outbox SET source = (SELECT events.source FROM events"
        " WHERE events.id = outbox.event_id)"
    )
    op.execute("UPDATE outbox SET source = '' WHERE source IS NULL")
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.alter_column("source", existing_type=sa.String(length=64), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_column("source")
