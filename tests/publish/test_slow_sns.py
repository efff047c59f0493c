"""A slow SNS delays publishing, it never stops it while the relay holds its lease.

The relay abandons a publish its lease no longer covers (``test_stalled_relay.py``). An SNS
that takes longer over every call than the lease's safe part used to have every publish
abandoned, for ever; the lease is now renewed while a publish is in flight, and a publish is
abandoned only once a renewal finds the lease another relay's. Time that is not the
publish's own must not count against it either: waiting for one of the relay's batch slots
comes before the lease is counted on. The lease is real (Redis, a short ttl); SNS is a
publisher passed to the relay that takes its time over every call.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from sqlalchemy import select

from app.leases import relay_lease_key
from app.publish.coordination import PublishedMemory, RelayLease
from app.publish.ids import deduplication_id
from app.publish.relay import OutboxRelay
from app.publish.sns import OutgoingMessage, Published, PublishError
from app.store.models import OutboxRow
from tests.publish.support import Sessions, add_event

TOPIC = "arn:aws:sns:us-east-1:123456789012:slow.fifo"
OTHER_TOPIC = "arn:aws:sns:us-east-1:123456789012:slow-too.fifo"
TTL_MS = 600
TTL = TTL_MS / 1000


class SlowPublisher:
    """Answers every call after ``seconds`` (never, when None), accepting every message."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.calls = 0
        self.in_flight = asyncio.Event()
        self.sent: list[OutgoingMessage] = []  # answered, in the order they were answered

    async def publish_batch(
        self, messages: list[OutgoingMessage]
    ) -> list[Published | PublishError]:
        self.calls += 1
        self.in_flight.set()
        if self.seconds is None:
            await asyncio.Event().wait()
        else:
            await asyncio.sleep(self.seconds)
        self.sent += messages
        return [Published(f"mid-{m.dedup_id[:12]}", None) for m in messages]


class KeeperSleep:
    """The lease's ``sleep`` between renewals: counts the sleeps still running, so a test
    sees whether the renewing task outlived its publish."""

    def __init__(self) -> None:
        self.started = 0
        self.running = 0

    async def __call__(self, seconds: float) -> None:
        self.started += 1
        self.running += 1
        try:
            await asyncio.sleep(seconds)
        finally:
            self.running -= 1


async def broken_sleep(seconds: float) -> None:
    raise RuntimeError("the lease keeper broke")


def _relay(
    sessions: Sessions,
    redis: Redis,
    prefix: str,
    publisher: SlowPublisher,
    *,
    batch_concurrency: int = 4,
    lease: RelayLease | None = None,
) -> OutboxRelay:
    return OutboxRelay(
        sessions=sessions,
        publisher=publisher,
        lease=lease or RelayLease(redis, prefix=prefix, owner="me", ttl_ms=TTL_MS),
        memory=PublishedMemory(redis, prefix=prefix, window_seconds=60),
        poll_seconds=0.1,
        batch_concurrency=batch_concurrency,
        max_backoff=0.0,
    )


async def _statuses(sessions: Sessions) -> list[str]:
    async with sessions() as session:
        rows = (await session.scalars(select(OutboxRow).order_by(OutboxRow.id))).all()
    return [row.status for row in rows]


async def _rows(sessions: Sessions) -> list[OutboxRow]:
    async with sessions() as session:
        return list((await session.scalars(select(OutboxRow).order_by(OutboxRow.id))).all())


async def test_a_publisher_slower_than_the_lease_gets_every_row_published_in_order(
    sessions: Sessions, redis: Redis, redis_prefix: str
) -> None:
    await add_event(sessions, "evt_s0", "acme/api", 2, TOPIC)
    await add_event(sessions, "evt_s1", "acme/web", 2, TOPIC)
    publisher = SlowPublisher(0.85 * TTL)  # each call outlasts the lease's safe part (0.8)
    sleep = KeeperSleep()
    lease = RelayLease(redis, prefix=redis_prefix, owner="me", ttl_ms=TTL_MS, sleep=sleep)
    relay = _relay(sessions, redis, redis_prefix, publisher, lease=lease)

    assert await relay.publish_pending() == 4
    assert publisher.calls == 2  # both heads, then both second rows
    for event_id in ("evt_s0", "evt_s1"):
        ids = [deduplication_id(event_id, seq) for seq in (0, 1)]
        assert [m.dedup_id for m in publisher.sent if m.dedup_id in ids] == ids
    assert await _statuses(sessions) == ["published"] * 4
    assert await redis.get(relay_lease_key(redis_prefix)) == b"me"  # held throughout
    assert sleep.started > 0, "the lease was never renewed during a publish"
    assert sleep.running == 0, "the task renewing the lease outlived its publish"


@pytest.mark.parametrize("holder", ["another-process", None], ids=["taken", "lapsed"])
async def test_a_publish_in_flight_is_abandoned_once_the_lease_is_not_ours(
    sessions: Sessions, redis: Redis, redis_prefix: str, holder: str | None
) -> None:
    """Taken: another process holds the lease (we were slow, say). Lapsed: nobody does (it
    expired while we stalled, or Redis lost it): someone may have held it meanwhile, so
    taking it again would not cover the publish begun before."""
    await add_event(sessions, "evt_t0", "acme/api", 1, TOPIC)
    # SNS answers before the deadline the publish started with: only a renewal that finds
    # the lease not ours can stop it in time.
    publisher = SlowPublisher(0.6 * TTL)
    relay = _relay(sessions, redis, redis_prefix, publisher)
    running = asyncio.create_task(relay.publish_pending())
    await asyncio.wait_for(publisher.in_flight.wait(), 10)
    key = relay_lease_key(redis_prefix)
    if holder is None:
        await redis.delete(key)
    else:
        await redis.set(key, holder, px=60_000)

    assert await asyncio.wait_for(running, 10) == 0
    assert publisher.sent == [], "published although the lease was not this relay's"
    [row] = await _rows(sessions)
    assert (row.status, (row.last_error or "").split(":")[0]) == ("pending", "LeaseExpired")
    assert await redis.get(key) == (holder.encode() if holder else None)


async def test_a_failure_of_the_lease_keeper_abandons_the_publish_and_surfaces(
    sessions: Sessions, redis: Redis, redis_prefix: str
) -> None:
    await add_event(sessions, "evt_k0", "acme/api", 1, TOPIC)
    publisher = SlowPublisher(None)  # never answers: only the keeper's failure ends it
    lease = RelayLease(redis, prefix=redis_prefix, owner="me", ttl_ms=60_000, sleep=broken_sleep)
    relay = _relay(sessions, redis, redis_prefix, publisher, lease=lease)

    with pytest.raises(RuntimeError, match="the lease keeper broke"):
        await asyncio.wait_for(relay.publish_pending(), 10)
    assert publisher.calls == 1
    assert publisher.sent == []
    assert await _statuses(sessions) == ["pending"]


async def test_waiting_for_a_batch_slot_does_not_count_against_the_lease(
    sessions: Sessions, redis: Redis, redis_prefix: str
) -> None:
    # Two topics: two batches in one round, sent one after the other through a single slot.
    # Each call alone takes well under the lease's safe part; the second one's slot wait
    # and its call together do not.
    await add_event(sessions, "evt_q0", "acme/api", 1, TOPIC)
    await add_event(sessions, "evt_q1", "acme/web", 1, OTHER_TOPIC)
    publisher = SlowPublisher(0.5 * TTL)
    relay = _relay(sessions, redis, redis_prefix, publisher, batch_concurrency=1)

    assert await relay.publish_pending() == 2
    assert publisher.calls == 2
    assert await _statuses(sessions) == ["published", "published"]
