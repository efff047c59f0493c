"""A slow SNS delays publishing, it never stops it while the relay holds its lease.

The relay abandons a publish its lease no longer covers (``test_stalled_relay.py``). Time
that is not the publish's own must not count against it: waiting for one of the relay's
batch slots comes before the lease is counted on. The lease is real (Redis, a short ttl);
SNS is a publisher passed to the relay that takes its time over every call.
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from sqlalchemy import select

from app.publish.coordination import PublishedMemory, RelayLease
from app.publish.relay import OutboxRelay
from app.publish.sns import OutgoingMessage, Published, PublishError
from app.store.models import OutboxRow
from tests.publish.support import Sessions, add_event

TOPIC = "arn:aws:sns:us-east-1:123456789012:slow.fifo"
OTHER_TOPIC = "arn:aws:sns:us-east-1:123456789012:slow-too.fifo"
TTL_MS = 600
TTL = TTL_MS / 1000


class SlowPublisher:
    """Answers every call after ``seconds``, accepting every message."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls = 0
        self.sent: list[OutgoingMessage] = []  # answered, in the order they were answered

    async def publish_batch(
        self, messages: list[OutgoingMessage]
    ) -> list[Published | PublishError]:
        self.calls += 1
        await asyncio.sleep(self.seconds)
        self.sent += messages
        return [Published(f"mid-{m.dedup_id[:12]}", None) for m in messages]


def _relay(
    sessions: Sessions,
    redis: Redis,
    prefix: str,
    publisher: SlowPublisher,
    *,
    batch_concurrency: int = 4,
) -> OutboxRelay:
    return OutboxRelay(
        sessions=sessions,
        publisher=publisher,
        lease=RelayLease(redis, prefix=prefix, owner="me", ttl_ms=TTL_MS),
        memory=PublishedMemory(redis, prefix=prefix, window_seconds=60),
        poll_seconds=0.1,
        batch_concurrency=batch_concurrency,
        max_backoff=0.0,
    )


async def _statuses(sessions: Sessions) -> list[str]:
    async with sessions() as session:
        rows = (await session.scalars(select(OutboxRow).order_by(OutboxRow.id))).all()
    return [row.status for row in rows]


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
