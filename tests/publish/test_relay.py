"""The outbox relay against moto's SNS (and a failing publisher passed in where a fault is
needed): order per group, retries without reordering, dead letters, published-id memory."""

from __future__ import annotations

import asyncio
import contextlib

import orjson
from redis.asyncio import Redis
from sqlalchemy import select

from app.leases import relay_lease_key
from app.publish.coordination import PublishedMemory, RelayLease
from app.publish.ids import deduplication_id
from app.publish.relay import OutboxRelay
from app.publish.sns import SnsPublisher
from app.store.driver import DriverPool
from app.store.models import DeadLetterRow, EventRow, OutboxRow
from tests.publish.support import RecordingPublisher, Sessions, add_event, make_relay
from tests.support import SnsFixture


async def test_rows_publish_in_order_per_group_with_the_designed_message(
    sessions: Sessions, sns: SnsFixture, sns_client: object, round_writes: DriverPool | None
) -> None:
    for n in range(3):
        await add_event(sessions, f"evt_a{n}", "acme/api", 2, sns.topic_arn)
        await add_event(sessions, f"evt_b{n}", "acme/web", 1, sns.topic_arn)
    relay = make_relay(sessions, SnsPublisher(sns_client), driver=round_writes)
    assert await relay.publish_pending() == 9
    messages = sns.receive(sns.fifo_url, expected=9)
    by_group: dict[str, list[tuple[str, int]]] = {}
    for message in messages:
        body = orjson.loads(message["Body"])
        by_group.setdefault(message["Attributes"]["MessageGroupId"], []).append(
            (body["event"]["id"], body["sequence"])
        )
        assert message["Attributes"]["MessageDeduplicationId"] == deduplication_id(
            body["event"]["id"], body["sequence"]
        )
    assert by_group == {
        "acme/api": [(f"evt_a{n}", s) for n in range(3) for s in range(2)],
        "acme/web": [(f"evt_b{n}", 0) for n in range(3)],
    }
    async with sessions() as session:
        events = (await session.scalars(select(EventRow))).all()
        rows = (await session.scalars(select(OutboxRow))).all()
    assert {e.status for e in events} == {"published"}
    assert all(r.status == "published" and r.sns_message_id for r in rows)
    assert await relay.publish_pending() == 0  # nothing is published twice


async def test_retryable_failure_holds_its_group_and_keeps_order(
    sessions: Sessions, sns: SnsFixture, sns_client: object, round_writes: DriverPool | None
) -> None:
    await add_event(sessions, "evt_a0", "acme/api", 1, sns.topic_arn)
    await add_event(sessions, "evt_a1", "acme/api", 1, sns.topic_arn)
    await add_event(sessions, "evt_b0", "acme/web", 1, sns.topic_arn)
    publisher = RecordingPublisher(
        SnsPublisher(sns_client), {deduplication_id("evt_a0", 0): (2, True)}
    )
    relay = make_relay(sessions, publisher, driver=round_writes)
    assert await relay.publish_pending() == 1  # only acme/web got through
    assert await relay.publish_pending() == 0  # acme/api fails again, a1 never tried
    assert [c.dedup_id for c in publisher.calls if c.group_id == "acme/api"] == [
        deduplication_id("evt_a0", 0)
    ] * 2
    assert await relay.publish_pending() == 2
    api = [
        orjson.loads(m["Body"])["event"]["id"]
        for m in sns.receive(sns.fifo_url, expected=3)
        if m["Attributes"]["MessageGroupId"] == "acme/api"
    ]
    assert api == ["evt_a0", "evt_a1"]
    async with sessions() as session:
        row = (await session.scalars(select(OutboxRow).where(OutboxRow.event_id == "evt_a0"))).one()
    assert row.attempts == 3
    assert row.last_error is None


async def test_permanent_failure_dead_letters_and_the_group_moves_on(
    sessions: Sessions, sns: SnsFixture, sns_client: object, round_writes: DriverPool | None
) -> None:
    missing_topic = sns.topic_arn.replace(".fifo", "-gone.fifo")
    await add_event(sessions, "evt_bad", "acme/api", 1, missing_topic)
    await add_event(sessions, "evt_ok", "acme/api", 1, sns.topic_arn)
    relay = make_relay(sessions, SnsPublisher(sns_client), driver=round_writes)
    assert await relay.publish_pending() == 2  # one dead-lettered, one published
    async with sessions() as session:
        bad = await session.get(EventRow, "evt_bad")
        ok = await session.get(EventRow, "evt_ok")
        letters = (await session.scalars(select(DeadLetterRow))).all()
    assert bad is not None and bad.status == "dead_lettered"
    assert ok is not None and ok.status == "published"
    assert [(d.event_id, d.stage) for d in letters] == [("evt_bad", "publish")]
    assert "NotFound" in letters[0].reason
    assert len(sns.receive(sns.fifo_url, expected=1)) == 1


async def test_remembered_dedup_id_is_marked_not_republished(
    sessions: Sessions,
    sns: SnsFixture,
    sns_client: object,
    redis: Redis,
    redis_prefix: str,
    round_writes: DriverPool | None,
) -> None:
    await add_event(sessions, "evt_seen", "acme/api", 1, sns.topic_arn)
    memory = PublishedMemory(redis, prefix=redis_prefix, window_seconds=60)
    await memory.remember_many([(deduplication_id("evt_seen", 0), "msg-from-before-the-crash")])
    publisher = RecordingPublisher(SnsPublisher(sns_client), {})
    assert await make_relay(sessions, publisher, memory, driver=round_writes).publish_pending() == 1
    assert publisher.calls == []
    async with sessions() as session:
        row = (await session.scalars(select(OutboxRow))).one()
    assert row.sns_message_id == "msg-from-before-the-crash"
    await redis.delete(f"{redis_prefix}:published:{deduplication_id('evt_seen', 0)}")


async def test_only_one_relay_holds_the_lease(redis: Redis, redis_prefix: str) -> None:
    first = RelayLease(redis, prefix=redis_prefix, owner="one", ttl_ms=5000)
    second = RelayLease(redis, prefix=redis_prefix, owner="two", ttl_ms=5000)
    assert await first.hold()
    assert not await second.hold()
    assert await first.hold()  # renewal
    await first.release()
    assert await second.hold()
    await second.release()


async def test_heads_of_many_groups_go_out_in_batches_of_ten(
    sessions: Sessions, sns: SnsFixture, sns_client: object, round_writes: DriverPool | None
) -> None:
    for group in range(23):
        for n in range(2):
            await add_event(sessions, f"evt_{group}_{n}", f"acme/r{group}", 1, sns.topic_arn)
    publisher = RecordingPublisher(SnsPublisher(sns_client), {})
    assert await make_relay(sessions, publisher, driver=round_writes).publish_pending() == 46
    # Round 1: the 23 heads (10 + 10 + 3); round 2: the 23 second rows. Never two rows of
    # one group in the same round.
    assert sorted(publisher.batch_sizes) == [3, 3, 10, 10, 10, 10]
    first_round = publisher.calls[:23]
    assert len({m.group_id for m in first_round}) == 23
    received = sns.receive(sns.fifo_url, expected=46)
    order: dict[str, list[str]] = {}
    for message in received:
        body = orjson.loads(message["Body"])
        order.setdefault(body["event"]["group_key"], []).append(body["event"]["id"])
    assert all(
        ids == [f"evt_{g}_0", f"evt_{g}_1"]
        for g, ids in ((int(k[6:]), v) for k, v in order.items())
    )


async def test_permanent_entry_failure_in_a_batch_dead_letters_only_that_row(
    sessions: Sessions, sns: SnsFixture, sns_client: object, round_writes: DriverPool | None
) -> None:
    await add_event(sessions, "evt_x", "acme/x", 1, sns.topic_arn)
    await add_event(sessions, "evt_y", "acme/y", 1, sns.topic_arn)
    publisher = RecordingPublisher(
        SnsPublisher(sns_client), {deduplication_id("evt_x", 0): (1, False)}
    )
    assert await make_relay(sessions, publisher, driver=round_writes).publish_pending() == 2
    async with sessions() as session:
        x = await session.get(EventRow, "evt_x")
        y = await session.get(EventRow, "evt_y")
    assert x is not None and x.status == "dead_lettered"
    assert y is not None and y.status == "published"


async def test_relay_stops_publishing_once_another_holds_the_lease(
    sessions: Sessions, sns: SnsFixture, sns_client: object, redis: Redis, redis_prefix: str
) -> None:
    await add_event(sessions, "evt_l", "acme/l", 1, sns.topic_arn)
    key = relay_lease_key(redis_prefix)
    await redis.set(key, "someone-else", px=5000)
    publisher = RecordingPublisher(SnsPublisher(sns_client), {})
    relay = OutboxRelay(
        sessions=sessions,
        publisher=publisher,
        lease=RelayLease(redis, prefix=redis_prefix, owner="me"),
        memory=None,
        poll_seconds=0.05,
    )
    task = asyncio.create_task(relay.run())
    await asyncio.sleep(0.3)
    assert publisher.calls == []  # not the holder: publishes nothing
    await redis.delete(key)
    for _ in range(50):
        if publisher.calls:
            break
        await asyncio.sleep(0.05)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert [m.dedup_id for m in publisher.calls] == [deduplication_id("evt_l", 0)]
    assert await redis.get(key) is None  # released on the way out
