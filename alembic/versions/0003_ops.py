"""replay generations and retention index

events.replays counts operator replays; outbox.generation tags each row with the replay it
belongs to, so a replayed event's tool calls sit beside the earlier ones (unique per
event, generation and seq). events.updated_at is indexed for the retention job.

Revision ID: 0003_ops
Revises: 0002_llm_audit
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0003_ops"
down_revision = "0002_llm_audit"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("replays", sa.Integer(), server_default="0", nullable=False))
        batch_op.create_index(batch_op.f("ix_events_updated_at"), ["updated_at"], unique=False)

    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("generation", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.drop_constraint("uq_outbox_event_seq", type_="unique")
        batch_op.create_unique_constraint(
            "uq_outbox_event_generation_seq", ["event_id", "generation", "seq"]
        )


def downgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_constraint("uq_outbox_event_generation_seq", type_="unique")
        batch_op.create_unique_constraint("uq_outbox_event_seq", ["event_id", "seq"])
        batch_op.drop_column("generation")

    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_events_updated_at"))
        batch_op.drop_column("replays")
