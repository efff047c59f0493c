"""Relays that split the outbox by shard (real Redis leases, the real outbox): two relays
share the shards and both publish; a relay that dies has its shards taken over after the
ttl, with nothing lost, doubled or reordered at the SQS FIFO subscriber (moto); a stalled
holder that wakes after its lease sends nothing; a joining relay gets its share; a relay
never publishes a shard it gave back; an old single-lease relay and a sharded one never
publish at once; rows without a slot are published once, in order."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable

import orjson
from redis.asyncio import Redis
from sqlalchemy import update

from app.leases import relay_lease_key
from app.publish.coordination import PublishedMemory, PublishLease, RelayLease
from app.publish.ids import deduplication_id
from app.publish.relay import OutboxRelay
from app.publish.shards import SHARDED, RelayShards
from app.publish.sns import OutgoingMessage, Published, Publisher, PublishError, SnsPublisher
from app.store.models import OutboxRow, slot_of
from tests.publish.support import MemoryPublisher, Sessions, add_event
from tests.support import SnsFixture

SHARDS = 8
# Long enough that moto's answers (its first ones load botocore models, blocking the event
# loop) stay inside a lease; a short one where the publisher is in memory.
TTL_MS = 2000
SHORT_TTL_MS = 600
GROUPS = [f"acme/repo-{n}" for n in range(24)]
TOPIC = "arn:aws:sns:us-east-1:123456789012:shards.fifo"


def _shards(
    redis: Redis,
    prefix: str,
    owner: str,
    *,
    ttl_ms: int = TTL_MS,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> RelayShards:
    return RelayShards(redis, prefix=prefix, owner=owner, shards=SHARDS, ttl_ms=ttl_ms, sleep=sleep)


def _relay(
    sessions: Sessions,
    publisher: Publisher,
    lease: PublishLease,
    memory: PublishedMemory | None = None,
    **options: object,
) -> OutboxRelay:
    return OutboxRelay(
        sessions=sessions,
        publisher=publisher,
        lease=lease,
        memory=memory,
        poll_seconds=0.05,
        max_backoff=0.0,
        **options,  # type: ignore[arg-type]
    )


async def _fill(sessions: Sessions, topic: str, *, events: int, first: int = 0) -> None:
    for n in range(first, first + events):
        await add_event(sessions, f"evt_{n}", GROUPS[n % len(GROUPS)], 1, topic)


async def _split(first: RelayShards, second: RelayShards) -> None:
    """``first`` alone takes every shard; ``second`` joins; ``first`` gives half back."""
    assert await first.hold()
    assert len(first.held) == SHARDS
    assert not await second.hold()  # its share is 4, but none is free yet
    assert await first.hold()  # gives back beyond its share
    assert await second.hold()  # takes them
    assert await first.hold()


def _in_order(messages: Iterable[dict[str, object]]) -> dict[str, list[int]]:
    """Event numbers per group, in the order the SQS FIFO subscriber got them."""
    order: dict[str, list[int]] = {}
    for message in messages:
        body = orjson.loads(str(message["Body"]))
        order.setdefault(body["event"]["group_key"], []).append(int(body["event"]["id"][4:]))
    return order


class Recording:
    """Wraps a publisher; records which groups it was asked to send."""

    def __init__(self, inner: Publisher) -> None:
        self.inner = inner
        self.groups: list[str] = []

    async def publish_batch(
        self, messages: list[OutgoingMessage]
    ) -> list[Published | PublishError]:
        self.groups += [m.group_id for m in messages]
        return await self.inner.publish_batch(messages)


async def test_two_relays_split_the_shards_and_both_publish_in_order(
    sessions: Sessions, sns: SnsFixture, sns_client: object, redis: Redis, redis_prefix: str
) -> None:
    await _fill(sessions, sns.topic_arn, events=72)  # 3 events in each of 24 groups
    lease_a, lease_b = _shards(redis, redis_prefix, "A"), _shards(redis, redis_prefix, "B")
    await _split(lease_a, lease_b)
    assert len(lease_a.held) == len(lease_b.held) == SHARDS // 2
    assert set(lease_a.held).isdisjoint(lease_b.held)
    publisher_a = Recording(SnsPublisher(sns_client))
    publisher_b = Recording(SnsPublisher(sns_client))
    relay_a, relay_b = (
        _relay(sessions, publisher_a, lease_a),
        _relay(sessions, publisher_b, lease_b),
    )

    settled = await asyncio.gather(relay_a.publish_pending(), relay_b.publish_pending())

    assert sum(settled) == 72
    assert min(settled) > 0  # both published
    assert {slot_of(g) % SHARDS for g in publisher_a.groups} <= set(lease_a.held)
    assert {slot_of(g) % SHARDS for g in publisher_b.groups} <= set(lease_b.held)
    assert set(publisher_a.groups).isdisjoint(publisher_b.groups)
    order = _in_order(sns.receive(sns.fifo_url, expected=72))
    assert order == {g: [n, n + 24, n + 48] for n, g in enumerate(GROUPS)}


class DyingPublisher:
    """Publishes its first call for real, then its process dies: nothing after the send runs
    (no memory of the ids, no marking), and the leases are neither renewed nor released."""

    def __init__(self, inner: Publisher) -> None:
        self.inner = inner
        self.sent: list[str] = []
        self.process: asyncio.Task[int] | None = None

    async def publish_batch(
        self, messages: list[OutgoingMessage]
    ) -> list[Published | PublishError]:
        await self.inner.publish_batch(messages)
        self.sent += [m.dedup_id for m in messages]
        assert self.process is not None
        self.process.cancel()
        await asyncio.Event().wait()
        raise AssertionError("a dead process answers nothing")


async def test_a_dead_relays_shards_are_taken_over_after_the_ttl_nothing_lost_or_doubled(
    sessions: Sessions, sns: SnsFixture, sns_client: object, redis: Redis, redis_prefix: str
) -> None:
    await _fill(sessions, sns.topic_arn, events=72)
    memory = PublishedMemory(redis, prefix=redis_prefix, window_seconds=60)
    lease_a, lease_b = _shards(redis, redis_prefix, "A"), _shards(redis, redis_prefix, "B")
    await _split(lease_a, lease_b)
    dying = DyingPublisher(SnsPublisher(sns_client))
    relay_a = _relay(sessions, dying, lease_a, memory, batch_concurrency=1)
    relay_b = _relay(sessions, SnsPublisher(sns_client), lease_b, memory)
    dying.process = asyncio.create_task(relay_a.publish_pending())
    with contextlib.suppress(asyncio.CancelledError):
        await dying.process  # A dies after SNS took its first batch
    assert dying.sent

    assert 0 < await relay_b.publish_pending() < 72  # B publishes its own shards only
    await asyncio.sleep(TTL_MS / 1000 * 1.5)  # A's member entry and shards expire
    assert await lease_b.hold()
    assert len(lease_b.held) == SHARDS
    while await relay_b.publish_pending():
        pass

    # A's batch reached SNS before it died; B sent it again with the same dedup ids, which
    # the FIFO queue drops (SNS FIFO does the same within 5 minutes).
    received = sns.receive(sns.fifo_url, expected=72)
    assert sorted(str(m["Attributes"]["MessageDeduplicationId"]) for m in received) == sorted(
        deduplication_id(f"evt_{n}", 0) for n in range(72)
    )
    assert _in_order(received) == {g: [n, n + 24, n + 48] for n, g in enumerate(GROUPS)}


class FreezingPublisher:
    """The first call waits for ``thaw`` with its request about to go out (the process is
    frozen); ``sleep`` is its lease's, frozen too. Sends onto a shared ``wire``."""

    def __init__(self, name: str, wire: list[tuple[str, str]], *, freeze: bool) -> None:
        self.name, self.wire, self.freeze = name, wire, freeze
        self.frozen, self.thaw = asyncio.Event(), asyncio.Event()

    async def publish_batch(
        self, messages: list[OutgoingMessage]
    ) -> list[Published | PublishError]:
        if self.freeze:
            self.freeze = False
            self.frozen.set()
            await self.thaw.wait()
        self.wire.extend((self.name, m.dedup_id) for m in messages)
        return [Published(f"mid-{self.name}-{m.dedup_id[:8]}", None) for m in messages]

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        if self.frozen.is_set():
            await self.thaw.wait()


async def test_a_stalled_holder_waking_after_its_lease_sends_nothing(
    sessions: Sessions, redis: Redis, redis_prefix: str
) -> None:
    await add_event(sessions, "evt_0", "acme/api", 2, TOPIC)  # two rows of one group
    first, second = deduplication_id("evt_0", 0), deduplication_id("evt_0", 1)
    wire: list[tuple[str, str]] = []
    stalled = FreezingPublisher("A", wire, freeze=True)
    lease_a = _shards(redis, redis_prefix, "A", sleep=stalled.sleep, ttl_ms=SHORT_TTL_MS)
    relay_a = _relay(sessions, stalled, lease_a)
    publisher_b = FreezingPublisher("B", wire, freeze=False)
    relay_b = _relay(sessions, publisher_b, _shards(redis, redis_prefix, "B", ttl_ms=SHORT_TTL_MS))

    running_a = asyncio.create_task(relay_a.publish_pending())
    await asyncio.wait_for(stalled.frozen.wait(), 10)  # A holds every shard, then froze
    await asyncio.sleep(SHORT_TTL_MS / 1000 * 1.5)  # past A's leases
    assert await relay_b.publish_pending() == 2  # B took the shards and published both
    stalled.thaw.set()
    await asyncio.wait_for(running_a, 10)

    assert wire == [("B", first), ("B", second)], f"A sent after B took over: {wire}"


async def test_a_joining_relay_gets_its_share_and_a_leaving_one_gives_it_back(
    sessions: Sessions, redis: Redis, redis_prefix: str
) -> None:
    lease_a, lease_b = _shards(redis, redis_prefix, "A"), _shards(redis, redis_prefix, "B")
    relay_a = _relay(sessions, MemoryPublisher(), lease_a)
    relay_b = _relay(sessions, MemoryPublisher(), lease_b)
    running_a = asyncio.create_task(relay_a.run())
    await _until(lambda: len(lease_a.held) == SHARDS)
    running_b = asyncio.create_task(relay_b.run())  # joins
    await _until(lambda: len(lease_a.held) == len(lease_b.held) == SHARDS // 2)
    assert set(lease_a.held).isdisjoint(lease_b.held)

    running_b.cancel()  # leaves: gives its shards back on the way out
    with contextlib.suppress(asyncio.CancelledError):
        await running_b
    await _until(lambda: len(lease_a.held) == SHARDS, seconds=TTL_MS / 1000 / 2)
    running_a.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running_a


async def _until(condition: object, *, seconds: float = 5.0) -> None:
    assert callable(condition)
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the condition did not hold in time")


class JoinDuringRound:
    """Accepts everything; on the first call another relay joins, so the caller's next hold
    gives shards back. Records each sent group with the caller's slots at the time."""

    def __init__(self, joining: RelayShards, lease: RelayShards) -> None:
        self.joining, self.lease = joining, lease
        self.sends: list[tuple[str, frozenset[int]]] = []

    async def publish_batch(
        self, messages: list[OutgoingMessage]
    ) -> list[Published | PublishError]:
        if not self.sends:
            await self.joining.hold()
        self.sends += [(m.group_id, self.lease.slots) for m in messages]
        return [Published(f"mid-{m.dedup_id[:8]}", None) for m in messages]


async def test_a_relay_stops_publishing_a_shard_it_gave_back_within_its_round(
    sessions: Sessions, redis: Redis, redis_prefix: str
) -> None:
    await _fill(sessions, TOPIC, events=72)  # 3 rounds: each group's rows one per round
    lease_a, lease_b = _shards(redis, redis_prefix, "A"), _shards(redis, redis_prefix, "B")
    publisher = JoinDuringRound(lease_b, lease_a)
    settled = await _relay(sessions, publisher, lease_a).publish_pending()

    assert len(lease_a.held) == SHARDS // 2  # gave half back after its first round
    assert 24 < settled < 72
    assert all(slot_of(group) in slots for group, slots in publisher.sends)
    assert await lease_b.hold() and set(lease_b.held).isdisjoint(lease_a.held)


async def test_an_old_single_lease_relay_and_a_sharded_one_never_publish_together(
    sessions: Sessions, redis: Redis, redis_prefix: str
) -> None:
    await _fill(sessions, TOPIC, events=24)
    old = RelayLease(redis, prefix=redis_prefix, owner="old", ttl_ms=TTL_MS)
    new = _shards(redis, redis_prefix, "new")
    old_publisher, new_publisher = MemoryPublisher(), MemoryPublisher()
    old_relay, new_relay = (
        _relay(sessions, old_publisher, old),
        _relay(sessions, new_publisher, new),
    )

    assert await old.hold()
    assert await new_relay.publish_pending() == 0  # the old relay holds the single lease
    assert new_publisher.batches == []
    assert await old_relay.publish_pending() == 24
    await old.release()  # the old relay stops

    await _fill(sessions, TOPIC, events=24, first=24)
    assert await new_relay.publish_pending() == 24
    assert await redis.get(relay_lease_key(redis_prefix)) == SHARDED.encode()
    assert not await old.hold()  # an old relay started again cannot take it back
    assert await old_relay.publish_pending() == 0


async def test_a_relay_with_another_shard_count_holds_nothing_while_the_others_run(
    redis: Redis, redis_prefix: str
) -> None:
    eight = _shards(redis, redis_prefix, "eight")
    four = RelayShards(redis, prefix=redis_prefix, owner="four", shards=4, ttl_ms=TTL_MS)
    assert await eight.hold()
    assert not await four.hold()
    assert four.held == () and four.slots == frozenset()
    assert await eight.hold() and len(eight.held) == SHARDS  # "four" is no member
    await eight.release()
    assert await four.hold() and len(four.held) == 4  # alone now: its count is the count


async def test_rows_without_a_slot_are_published_once_in_order_by_two_relays(
    sessions: Sessions, redis: Redis, redis_prefix: str
) -> None:
    await _fill(sessions, TOPIC, events=48)
    async with sessions() as session:  # the first half as a process older than 0006 wrote it
        await session.execute(update(OutboxRow).where(OutboxRow.id <= 24).values(relay_slot=None))
        await session.commit()
    lease_a, lease_b = _shards(redis, redis_prefix, "A"), _shards(redis, redis_prefix, "B")
    await _split(lease_a, lease_b)
    publisher_a, publisher_b = MemoryPublisher(), MemoryPublisher()
    relay_a, relay_b = (
        _relay(sessions, publisher_a, lease_a),
        _relay(sessions, publisher_b, lease_b),
    )

    assert sum(await asyncio.gather(relay_a.publish_pending(), relay_b.publish_pending())) == 48

    sent = publisher_a.sent + publisher_b.sent
    assert sorted(m.dedup_id for m in sent) == sorted(
        deduplication_id(f"evt_{n}", 0) for n in range(48)
    )
    for publisher, lease in ((publisher_a, lease_a), (publisher_b, lease_b)):
        assert {slot_of(m.group_id) % SHARDS for m in publisher.sent} <= set(lease.held)
        for group in GROUPS:
            events = [m.attributes["event_id"] for m in publisher.sent if m.group_id == group]
            assert events in ([], [f"evt_{GROUPS.index(group)}", f"evt_{GROUPS.index(group) + 24}"])
