"""lease fence on events

events.fence is the lease epoch of the latest worker tenure that started processing the event:
a worker of an older tenure (a stalled process that lost its lease) is refused when it tries to
store a decision.

Revision ID: 0004_fence
Revises: 0003_ops
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0004_fence"
down_revision = "0003_ops"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("fence", sa.BigInteger(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_column("fence")
