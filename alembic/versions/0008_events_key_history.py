"""events (group_key, received_at): a key's earlier events, for the prompt's history

Revision ID: 0008_events_key_history
Revises: 0007_shadow_decisions
"""

from __future__ import annotations

from alembic import op

revision = "0008_events_key_history"
down_revision = "0007_shadow_decisions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_events_group_key_received", "events", ["group_key", "received_at"])


def downgrade() -> None:
    op.drop_index("ix_events_group_key_received", table_name="events")
