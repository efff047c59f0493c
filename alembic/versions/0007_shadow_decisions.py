"""shadow_decisions: a shadow candidate's decision of a live event, beside the live one

Revision ID: 0007_shadow_decisions
Revises: 0006_llm_call_purpose
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0007_shadow_decisions"
down_revision = "0006_llm_call_purpose"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "shadow_decisions",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("event_id", sa.String(length=64), nullable=False),
        sa.Column("baseline", sa.String(length=64), nullable=False),
        sa.Column("candidate", sa.String(length=64), nullable=False),
        sa.Column("baseline_calls", sa.JSON(), nullable=False),
        sa.Column("candidate_calls", sa.JSON(), nullable=True),
        sa.Column("agreement", sa.String(length=16), nullable=False),
        sa.Column("baseline_cost_usd", sa.Float(), nullable=False),
        sa.Column("candidate_cost_usd", sa.Float(), nullable=False),
        sa.Column("baseline_latency_ms", sa.Float(), nullable=False),
        sa.Column("candidate_latency_ms", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_shadow_decisions_event_id", "shadow_decisions", ["event_id"])
    op.create_index("ix_shadow_decisions_created_at", "shadow_decisions", ["created_at"])
    op.create_index(
        "ix_shadow_decisions_candidate_created", "shadow_decisions", ["candidate", "created_at"]
    )


def downgrade() -> None:
    op.drop_table("shadow_decisions")
