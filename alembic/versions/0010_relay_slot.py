"""outbox.relay_slot: the relay slot of the row's message group, so relays split publishing

crc32(group_id) % 256, as ``app.store.models.slot_of`` computes it. Pending rows are filled in
here; rows already published or dead-lettered are never read by a relay again and stay NULL
(as would a row written by a process older than this migration during an upgrade: the relay
reads NULL as the slot computed from the group).

Revision ID: 0010_relay_slot
Revises: 0009_llm_call_cache_hit
"""

from __future__ import annotations

import zlib

import sqlalchemy as sa
from alembic import op


revision = "0010_relay_slot"
down_revision = "0009_llm_call_cache_hit"
branch_labels = None
depends_on = None

BATCH = 1000


def upgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.add_column(sa.Column("relay_slot", sa.SmallInteger(), nullable=True))
    connection = op.get_bind()
    last = 0
    while True:
        rows = connection.execute(
            sa.text(
                "SELECT id, group_id FROM outbox WHERE status = 'pending' AND id > :last"
                " ORDER BY id LIMIT :batch"
            ),
            {"last": last, "batch": BATCH},
        ).all()
        if not rows:
            break
        connection.execute(
            sa.text("UPDATE outbox SET relay_slot = :slot WHERE id = :id"),
            [{"id": id_, "slot": zlib.crc32(group.encode()) % 256} for id_, group in rows],
        )
        last = rows[-1][0]
    op.create_index("ix_outbox_status_slot_id", "outbox", ["status", "relay_slot", "id"])


def downgrade() -> None:
    op.drop_index("ix_outbox_status_slot_id", table_name="outbox")
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.drop_column("relay_slot")
