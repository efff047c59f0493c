"""llm_calls.cache_hit: the decision came from the response cache (no call, no cost)

Revision ID: 0009_llm_call_cache_hit
Revises: 0008_events_key_history
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0009_llm_call_cache_hit"
down_revision = "0008_events_key_history"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("cache_hit", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.drop_column("cache_hit")
