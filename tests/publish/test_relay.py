"""The outbox relay against moto's SNS (and a failing publisher passed in where a fault is
needed): order per group, retries without reordering, dead letters, published-id memory."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import aioboto3
import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.publish.coordination import PublishedMemory, RelayLease
from app.publish.ids import deduplication_id, message_group_id
from app.publish.relay import OutboxRelay
from app.publish.sns import OutgoingMessage, Published, PublishError, SnsPublisher
from app.queue.connection import connect_redis
from app.store.models import DeadLetterRow, EventRow, OutboxRow
from tests.support import SnsFixture

Sessions = async_sessionmaker[AsyncSession]


@pytest.fixture
async def sns_client(sns: SnsFixture, moto_endpoint: str) -> AsyncIterator[object]:
    async with aioboto3.Session().client(
        "sns", region_name="us-east-1", endpoint_url=moto_endpoint
    ) as client:
        yield client


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = connect_redis(redis_url)
    yield client
    await client.aclose()


async def _add_event(
    sessions: Sessions, event_id: str, group_key: str, tool_calls: int, topic_arn: str
) -> None:
    async with sessions() as session:
        session.add(
            EventRow(
                id=event_id,
                source="github",
                type="issues.opened",
                group_key=group_key,
                delivery_id=event_id,
                pipeline="triage",
                status="processing",
                payload={},
                received_at=datetime.now(UTC),
                deliveries=1,
            )
        )
        await session.flush()
        for seq in range(tool_calls):
            body = {
                "tool": "publishAlert",
                "input": {"n": seq},
                "event": {
                    "id": event_id,
                    "source": "github",
                    "type": "issues.opened",
                    "group_key": group_key,
                    "received_at": "2026-01-01T00:00:00Z",
                },
                "llm_call_id": "llm_x",
                "model": "m",
                "sequence": seq,
            }
            session.add(
                OutboxRow(
                    event_id=event_id,
                    seq=seq,
                    llm_call_id="llm_x",
                    tool="publishAlert",
                    topic_arn=topic_arn,
                    group_id=message_group_id(group_key),
                    dedup_id=deduplication_id(event_id, seq),
                    body=orjson.dumps(body).decode(),
                )
            )
        await session.commit()


class RecordingPublisher:
    """Wraps a real publisher; fails chosen (dedup id → remaining failures) publishes."""

    def __init__(self, inner: SnsPublisher, failures: dict[str, tuple[int, bool]]) -> None:
        self.inner = inner
        self.failures = failures
        self.calls: list[OutgoingMessage] = []
        self.batch_sizes: list[int] = []

    async def publish_batch(
        self, messages: list[OutgoingMessage]
    ) -> list[Published | PublishError]:
        self.calls += messages
        self.batch_sizes.append(len(messages))
        passed: list[int] = []
        results: dict[int, Published | PublishError] = {}
        for index, message in enumerate(messages):
            remaining, retryable = self.failures.get(message.dedup_id, (0, True))
            if remaining:
                self.failures[message.dedup_id] = (remaining - 1, retryable)
                code = "Throttling" if retryable else "InvalidParameter"
                results[index] = PublishError("injected", code=code, retryable=retryable)
            else:
                passed.append(index)
        if passed:
            sent = await self.inner.publish_batch([messages[i] for i in passed])
            results.update(zip(passed, sent, strict=True))
        return [results[i] for i in range(len(messages))]


def _relay(
    sessions: Sessions,
    publisher: object,
    memory: PublishedMemory | None = None,
) -> OutboxRelay:
    return OutboxRelay(
        sessions=sessions,
        publisher=publisher,  # type: ignore[arg-type]
        lease=None,
        memory=memory,
        poll_seconds=0.1,
        max_backoff=0.0,
    )


async def test_rows_publish_in_order_per_group_with_the_designed_message(
    sessions: Sessions, sns: SnsFixture, sns_client: object
) -> None:
    for n in range(3):
        await _add_event(sessions, f"evt_a{n}", "acme/api", 2, sns.topic_arn)
        await _add_event(sessions, f"evt_b{n}", "acme/web", 1, sns.topic_arn)
    relay = _relay(sessions, SnsPublisher(sns_client))
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
    sessions: Sessions, sns: SnsFixture, sns_client: object
) -> None:
    await _add_event(sessions, "evt_a0", "acme/api", 1, sns.topic_arn)
    await _add_event(sessions, "evt_a1", "acme/api", 1, sns.topic_arn)
    await _add_event(sessions, "evt_b0", "acme/web", 1, sns.topic_arn)
    publisher = RecordingPublisher(
        SnsPublisher(sns_client), {deduplication_id("evt_a0", 0): (2, True)}
    )
    relay = _relay(sessions, publisher)
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
    sessions: Sessions, sns: SnsFixture, sns_client: object
) -> None:
    missing_topic = sns.topic_arn.replace(".fifo", "-gone.fifo")
    await _add_event(sessions, "evt_bad", "acme/api", 1, missing_topic)
    await _add_event(sessions, "evt_ok", "acme/api", 1, sns.topic_arn)
    relay = _relay(sessions, SnsPublisher(sns_client))
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
    sessions: Sessions, sns: SnsFixture, sns_client: object, redis: Redis, redis_prefix: str
) -> None:
    await _add_event(sessions, "evt_seen", "acme/api", 1, sns.topic_arn)
    memory = PublishedMemory(redis, prefix=redis_prefix, window_seconds=60)
    await memory.remember_many([(deduplication_id("evt_seen", 0), "msg-from-before-the-crash")])
    publisher = RecordingPublisher(SnsPublisher(sns_client), {})
    assert await _relay(sessions, publisher, memory).publish_pending() == 1
    assert publisher.calls == []
    async with sessions() as session:
        row = (await session.scalars(select(OutboxRow))).one()
    assert row.sns_message_id == "msg-from-before-the-crash"
    await redis.delete(f"{redis_prefix}:published:{deduplication_id('evt_seen', 0)}")


async def test_only_one_relay_holds_the_lease(redis: Redis, redis_prefix: str) -> None:
    key = f"{redis_prefix}:relay-lease"
    first = RelayLease(redis, key=key, owner="one", ttl_ms=5000)
    second = RelayLease(redis, key=key, owner="two", ttl_ms=5000)
    assert await first.hold()
    assert not await second.hold()
    assert await first.hold()  # renewal
    await first.release()
    assert await second.hold()
    await second.release()


async def test_heads_of_many_groups_go_out_in_batches_of_ten(
    sessions: Sessions, sns: SnsFixture, sns_client: object
) -> None:
    for group in range(23):
        for n in range(2):
            await _add_event(sessions, f"evt_{group}_{n}", f"acme/r{group}", 1, sns.topic_arn)
    publisher = RecordingPublisher(SnsPublisher(sns_client), {})
    assert await _relay(sessions, publisher).publish_pending() == 46
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
    sessions: Sessions, sns: SnsFixture, sns_client: object
) -> None:
    await _add_event(sessions, "evt_x", "acme/x", 1, sns.topic_arn)
    await _add_event(sessions, "evt_y", "acme/y", 1, sns.topic_arn)
    publisher = RecordingPublisher(
        SnsPublisher(sns_client), {deduplication_id("evt_x", 0): (1, False)}
    )
    assert await _relay(sessions, publisher).publish_pending() == 2
    async with sessions() as session:
        x = await session.get(EventRow, "evt_x")
        y = await session.get(EventRow, "evt_y")
    assert x is not None and x.status == "dead_lettered"
    assert y is not None and y.status == "published"


async def test_relay_stops_publishing_once_another_holds_the_lease(
    sessions: Sessions, sns: SnsFixture, sns_client: object, redis: Redis, redis_prefix: str
) -> None:
    await _add_event(sessions, "evt_l", "acme/l", 1, sns.topic_arn)
    key = f"{redis_prefix}:relay-lease"
    await redis.set(key, "someone-else", px=5000)
    publisher = RecordingPublisher(SnsPublisher(sns_client), {})
    relay = OutboxRelay(
        sessions=sessions,
        publisher=publisher,
        lease=RelayLease(redis, key=key, owner="me"),
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
