"""llm audit: provider, retry reason, cost, breaker state, prompt hash and texts

Revision ID: 0002_llm_audit
Revises: 0001
Create Date: 2026-11-29 23:00:00
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0002_llm_audit"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("provider", sa.String(length=32), nullable=False, server_default="anthropic")
        )
        batch_op.add_column(sa.Column("retry_reason", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("cost_usd", sa.Float(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("breaker_state", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("prompt_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("prompt_text", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("response_text", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        for name in (
            "response_text",
            "prompt_text",
            "prompt_hash",
            "breaker_state",
            "cost_usd",
            "retry_reason",
            "provider",
        ):
            batch_op.drop_column(name)
