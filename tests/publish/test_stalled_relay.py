"""A bad day: a relay that stalls between its memory check and its publish.

The relay lease (Redis, 15 s) lets one relay publish at a time, and the memory of published
dedup ids (Redis, 24 h) stops re-publishes after SNS FIFO's own 5-minute dedup has forgotten
them. A relay frozen between the check and the send (SIGSTOP, a suspended VM, a long GC
pause) used to wake up and send the head row it had read, although another relay had taken
the lease, published that row and the group's later rows meanwhile: past 5 minutes, the
subscriber got the group's first message again after the later ones. A publish is now
abandoned once its relay no longer counts on the lease. The test records what each relay
hands to SNS (the ``Publisher`` protocol is the relay's edge) with the real leases and
memory in Redis and the real outbox. A frozen process renews nothing: the stalled relay's
lease sleeps between renewals until it thaws (a publish merely slow keeps its lease,
``test_slow_sns.py``).
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from sqlalchemy import select

from app.publish.coordination import PublishedMemory, RelayLease
from app.publish.ids import deduplication_id
from app.publish.relay import OutboxRelay
from app.publish.sns import OutgoingMessage, Published, PublishError
from app.store.models import OutboxRow
from app.store.repository import OutboxRepository
from tests.publish.support import Sessions, add_event

TOPIC = "arn:aws:sns:us-east-1:123456789012:attack.fifo"


class Wire:
    """What reaches SNS, in order, from every relay."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []  # (relay, dedup id)


class FreezingPublisher:
    """Publishes onto the wire; the first call waits for ``thaw`` (the process is frozen
    with the request about to go out). ``sleep`` is its relay lease's: frozen too."""

    def __init__(self, name: str, wire: Wire, *, freeze: bool) -> None:
        self.name, self.wire = name, wire
        self.frozen = asyncio.Event()
        self.thaw = asyncio.Event()
        self.freeze = freeze

    async def publish_batch(
        self, messages: list[OutgoingMessage]
    ) -> list[Published | PublishError]:
        if self.freeze:
            self.freeze = False
            self.frozen.set()
            await self.thaw.wait()
        self.wire.sent += [(self.name, m.dedup_id) for m in messages]
        return [Published(f"mid-{self.name}-{m.dedup_id[:8]}", None) for m in messages]

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        if self.frozen.is_set():
            await self.thaw.wait()


def _relay(
    sessions: Sessions, redis: Redis, prefix: str, name: str, publisher: FreezingPublisher
) -> OutboxRelay:
    return OutboxRelay(
        sessions=sessions,
        publisher=publisher,
        lease=RelayLease(redis, prefix=prefix, owner=name, ttl_ms=300, sleep=publisher.sleep),
        memory=PublishedMemory(redis, prefix=prefix, window_seconds=86_400),
        poll_seconds=0.1,
    )


async def test_a_relay_waking_after_its_lease_moved_does_not_resend_older_rows(
    sessions: Sessions, redis: Redis, redis_prefix: str
) -> None:
    await add_event(sessions, "evt_a0", "acme/api", 2, TOPIC)  # rows 0 and 1 of one group
    first, second = deduplication_id("evt_a0", 0), deduplication_id("evt_a0", 1)
    wire = Wire()
    stalled = FreezingPublisher("A", wire, freeze=True)
    relay_a = _relay(sessions, redis, redis_prefix, "A", stalled)
    relay_b = _relay(sessions, redis, redis_prefix, "B", FreezingPublisher("B", wire, freeze=False))

    running_a = asyncio.create_task(relay_a.publish_pending())
    await asyncio.wait_for(stalled.frozen.wait(), 10)  # A checked the memory, then froze
    await asyncio.sleep(0.5)  # past A's lease
    assert await relay_b.publish_pending() == 2  # B took the lease and published both rows
    stalled.thaw.set()  # A wakes up
    await asyncio.wait_for(running_a, 10)

    order = [dedup for _, dedup in wire.sent]
    assert order[:2] == [first, second]
    assert order == [first, second], (
        f"after the group's later row, relay A sent its first row again: {wire.sent}"
    )
    async with sessions() as session:
        rows = (await session.scalars(select(OutboxRow).order_by(OutboxRow.seq))).all()
    assert [r.status for r in rows] == ["published"] * 2


async def test_a_relay_that_lost_its_lease_does_not_mark_a_published_row(
    sessions: Sessions,
) -> None:
    await add_event(sessions, "evt_b0", "acme/api", 1, TOPIC)
    async with sessions() as session:
        row = (await session.scalars(select(OutboxRow))).one()
        await OutboxRepository(session).mark_published([(row.id, "mid-1", None)])
        await OutboxRepository(session).mark_failed(row.id, error="late", dead=True)
        await session.commit()
    async with sessions() as session:
        row = (await session.scalars(select(OutboxRow))).one()
    assert (row.status, row.last_error) == ("published", None)
