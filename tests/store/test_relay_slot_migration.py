"""Migration 0010 on a database with pending tool calls: they get their group's relay slot,
and the relays' per-slot fetch finds each exactly once, in order per group. Rows written
without a slot (by a process older than the migration, during an upgrade) are fetched by the
relay of their group's slot, before the group's later rows."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import inspect, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from alembic import command
from app.store.db import create_engine, session_factory
from app.store.migrate import alembic_config
from app.store.models import RELAY_SLOTS, OutboxRow, PendingRow, slot_of
from app.store.repository import OutboxRepository
from tests.conftest import HAVE_POSTGRES, PG_ADMIN_URL

GROUPS = [f"acme/repo-{n}" for n in range(12)]
TOPIC = "arn:aws:sns:us-east-1:123456789012:alerts.fifo"
SHARDS = 8


def shard_slots(shard: int) -> frozenset[int]:
    return frozenset(slot for slot in range(RELAY_SLOTS) if slot % SHARDS == shard)


async def _admin(sql: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def before_0010(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new database migrated up to 0005 (the schema without relay slots)."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'upgrade.db'}"
    elif not HAVE_POSTGRES:
        pytest.skip("PostgreSQL is not reachable here (SQLite was tested)")
    else:
        name = f"eventgate_test_slot_{uuid.uuid4().hex[:10]}"
        asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
        base = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://")
        url = f"{base}/{name}"
    command.upgrade(alembic_config(url), "0009_llm_call_cache_hit")
    yield url
    if request.param == "postgresql":
        asyncio.run(_admin(f'DROP DATABASE "{name}" WITH (FORCE)'))


async def _upgrade_head(url: str) -> None:
    # Alembic's env runs its own event loop: from a thread.
    await asyncio.to_thread(command.upgrade, alembic_config(url), "head")


async def _write_as_0005(engine: AsyncEngine, *, first_event: int, status: str) -> None:
    """Three events per group, two tool calls each, written as a 0005 process writes them."""
    async with engine.begin() as connection:
        for n, group in enumerate(GROUPS * 3, start=first_event):
            await connection.execute(
                text(
                    "INSERT INTO events (id, source, type, group_key, delivery_id, pipeline,"
                    " status, payload, received_at, updated_at, deliveries, error, replays, fence)"
                    " VALUES (:id, 'github', 'push', :group, :id, 'triage', 'processing', '{}',"
                    " :now, :now, 1, NULL, 0, 0)"
                ),
                {"id": f"evt_{n}", "group": group, "now": datetime.now(UTC)},
            )
            for seq in range(2):
                await connection.execute(
                    text(
                        "INSERT INTO outbox (event_id, source, seq, generation, llm_call_id,"
                        " tool, topic_arn, group_id, dedup_id, body, status, attempts,"
                        " created_at) VALUES (:event, 'github', :seq, 0, 'llm', 'publishAlert',"
                        " :topic, :group, :dedup, '{}', :status, 0, :now)"
                    ),
                    {
                        "event": f"evt_{n}",
                        "seq": seq,
                        "topic": TOPIC,
                        "group": group,
                        "dedup": f"d{n}-{seq}",
                        "status": status,
                        "now": datetime.now(UTC),
                    },
                )


async def test_pending_rows_get_their_groups_slot_and_each_shard_fetches_its_own(
    before_0010: str,
) -> None:
    engine = create_engine(before_0010)
    await _write_as_0005(engine, first_event=0, status="published")
    await _write_as_0005(engine, first_event=100, status="pending")
    await engine.dispose()

    await _upgrade_head(before_0010)

    engine = create_engine(before_0010)
    sessions = session_factory(engine)
    async with sessions() as session:
        rows = (await session.scalars(select(OutboxRow).order_by(OutboxRow.id))).all()
    pending = [r for r in rows if r.status == "pending"]
    assert len(pending) == len(GROUPS) * 3 * 2
    assert all(r.relay_slot == slot_of(r.group_id) for r in pending)
    assert {r.relay_slot for r in rows if r.status == "published"} == {None}  # never read again
    async with engine.connect() as connection:
        indexes = await connection.run_sync(lambda c: inspect(c).get_indexes("outbox"))
    assert {"name": "ix_outbox_status_slot_id", "columns": ["status", "relay_slot", "id"]} in [
        {"name": i["name"], "columns": i["column_names"]} for i in indexes
    ]

    fetched: list[PendingRow] = []
    async with sessions() as session:
        for shard in range(SHARDS):
            fetched += await OutboxRepository(session).pending(
                limit=1000, per_group=100, slots=shard_slots(shard)
            )
    assert sorted(r.id for r in fetched) == [r.id for r in pending]  # each once, all of them
    for group in GROUPS:
        ids = [r.id for r in fetched if r.group_id == group]
        assert ids == sorted(ids)
    await engine.dispose()


async def test_a_row_without_a_slot_is_fetched_by_its_groups_shard_before_later_rows(
    before_0010: str,
) -> None:
    await _upgrade_head(before_0010)
    engine = create_engine(before_0010)
    await _write_as_0005(engine, first_event=0, status="pending")  # an old worker, after 0006
    sessions = session_factory(engine)
    async with sessions() as session:  # then a new worker: rows with a slot
        session.add_all(
            OutboxRow(
                event_id=f"evt_{n}",
                source="github",
                seq=5,
                llm_call_id="llm",
                tool="publishAlert",
                topic_arn=TOPIC,
                group_id=group,
                dedup_id=f"new-{n}",
                body="{}",
            )
            for n, group in enumerate(GROUPS)
        )
        await session.commit()
    async with sessions() as session:
        rows = (await session.scalars(select(OutboxRow).order_by(OutboxRow.id))).all()
    assert sum(r.relay_slot is None for r in rows) == len(GROUPS) * 3 * 2
    assert all(r.relay_slot == slot_of(r.group_id) for r in rows if r.relay_slot is not None)

    by_shard: dict[int, list[PendingRow]] = {}
    async with sessions() as session:
        for shard in range(SHARDS):
            by_shard[shard] = list(
                await OutboxRepository(session).pending(
                    limit=1000, per_group=100, slots=shard_slots(shard)
                )
            )
    for shard, fetched in by_shard.items():
        assert all(slot_of(r.group_id) % SHARDS == shard for r in fetched)
    every = [r for fetched in by_shard.values() for r in fetched]
    assert sorted(r.id for r in every) == [r.id for r in rows]
    for group in GROUPS:
        # The group's heads first: its rows without a slot (older) before the new one.
        heads = [r for r in every if r.group_id == group]
        assert [r.dedup_id.startswith("new-") for r in heads] == [False] * 6 + [True]
    await engine.dispose()
