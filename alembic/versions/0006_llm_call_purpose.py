"""llm_calls.purpose: live, or the run that is not (shadow, replay, consistency, eval)

Revision ID: 0006_llm_call_purpose
Revises: 0005_outbox_source
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0006_llm_call_purpose"
down_revision = "0005_outbox_source"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("purpose", sa.String(length=16), nullable=False, server_default="live")
        )
        batch_op.create_index("ix_llm_calls_purpose", ["purpose"])


def downgrade() -> None:
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.drop_index("ix_llm_calls_purpose")
        batch_op.drop_column("purpose")
