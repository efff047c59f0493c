"""Partition leases on real Redis (fakeredis when none is reachable)."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from app.queue.leases import PartitionLeases
from app.queue.streams import EventQueue, NewEntry, StreamEntry


def _leases(redis: Redis, prefix: str, owner: str, ttl_ms: int = 600) -> PartitionLeases:
    return PartitionLeases(redis, prefix=prefix, partitions=8, owner=owner, ttl_ms=ttl_ms)


@pytest.mark.cluster_too
async def test_partitions_spread_over_live_members_and_never_overlap(
    redis: Redis, redis_prefix: str
) -> None:
    a, b = _leases(redis, redis_prefix, "a"), _leases(redis, redis_prefix, "b")
    await a.tick()
    assert a.owned() == list(range(8))  # alone: it takes everything
    await b.tick()  # b joins: sees 2 members, but all partitions are taken
    assert b.owned() == []
    await a.tick()  # a gives back what is over its share
    await b.tick()
    assert len(a.owned()) == 4
    assert len(b.owned()) == 4
    assert set(a.owned()).isdisjoint(b.owned())


@pytest.mark.cluster_too
async def test_busy_partitions_are_not_given_back(redis: Redis, redis_prefix: str) -> None:
    a, b = _leases(redis, redis_prefix, "a"), _leases(redis, redis_prefix, "b")
    await a.tick()
    await b.tick()
    await a.tick(busy=set(range(8)))
    assert len(a.owned()) == 8


@pytest.mark.cluster_too
async def test_dead_owner_partitions_are_taken_over_after_the_ttl(
    redis: Redis, redis_prefix: str
) -> None:
    a, b = _leases(redis, redis_prefix, "a"), _leases(redis, redis_prefix, "b")
    await a.tick()
    await b.tick()
    assert b.owned() == []
    # a dies: no more ticks. Until its leases expire, b cannot take them.
    await b.tick()
    assert b.owned() == []
    await asyncio.sleep(0.7)
    await b.tick()
    assert b.owned() == list(range(8))
    # The old tenure is over: a cannot renew and finds out on its next tick.
    assert not await a.still_owns(0)
    changes = await a.tick()
    assert sorted(changes.lost) == list(range(8))
    assert a.owned() == []


@pytest.mark.cluster_too
async def test_each_acquisition_is_a_new_epoch_and_release_all_leaves(
    redis: Redis, redis_prefix: str
) -> None:
    a = _leases(redis, redis_prefix, "a")
    await a.tick()
    first = a.tokens[0]
    await a.release_all()
    assert a.owned() == []
    assert await redis.zscore(a.members_key, "a") is None
    await a.tick()
    assert a.tokens[0] != first
    assert a.tokens[0].startswith("a:")


@pytest.mark.cluster_too
async def test_ack_is_fenced_by_the_lease_token(redis: Redis, redis_prefix: str) -> None:
    queue = EventQueue(redis, prefix=redis_prefix, partitions=8)
    a, b = _leases(redis, redis_prefix, "a"), _leases(redis, redis_prefix, "b")
    await queue.enqueue(
        NewEntry(
            event_id="e1",
            source="s",
            delivery_id="d1",
            group_key="k",
            data=b"{}",
            dedup_window_ms=60_000,
        )
    )
    partition = queue.partition_of("k")
    await queue.ensure_groups([partition])
    [entry] = await queue.read_new(consumer="a", partitions=[partition], count=10, block_ms=10)
    await a.tick()
    stale = a.tokens[partition]
    await redis.delete(a.lease_key(partition))  # a's tenure ends; b takes the partition
    await b.tick()
    assert partition in b.owned()
    assert not await queue.ack(entry, "e1", token=stale)
    assert await redis.xlen(queue.stream_key(partition)) == 1
    assert await queue.ack(entry, "e1", token=b.tokens[partition])
    assert await redis.xlen(queue.stream_key(partition)) == 0
    assert isinstance(entry, StreamEntry)


@pytest.mark.cluster_too
async def test_consumers_that_left_nothing_pending_are_forgotten(
    redis: Redis, redis_prefix: str
) -> None:
    queue = EventQueue(redis, prefix=redis_prefix, partitions=1)
    await queue.ensure_groups([0])
    for n in range(2):
        await queue.enqueue(
            NewEntry(
                event_id=f"e{n}",
                source="s",
                delivery_id=f"d{n}",
                group_key="k",
                data=b"{}",
                dedup_window_ms=60_000,
            )
        )
    [first] = await queue.read_new(consumer="gone-idle", partitions=[0], count=1, block_ms=10)
    await queue.ack(first, "e0")
    [second] = await queue.read_new(consumer="gone-busy", partitions=[0], count=1, block_ms=10)
    assert await queue.forget_idle_consumers(partition=0, keep="me") == 1
    names = {c["name"] for c in await redis.xinfo_consumers(queue.stream_key(0), "eventgate")}
    # The idle one is gone; one still holding an entry stays until its entry is claimed.
    decoded = {n.decode() if isinstance(n, bytes) else n for n in names}
    assert "gone-idle" not in decoded
    assert "gone-busy" in decoded
    assert second.entry_id


@pytest.mark.cluster_too
async def test_still_owns_trusts_a_fresh_renewal_and_asks_redis_once_it_is_old(
    redis: Redis, redis_prefix: str
) -> None:
    """Within half a TTL of the last renewal the key cannot have expired: no round trip.
    Past it (renewals stalled, the process was paused) Redis decides."""
    a = _leases(redis, redis_prefix, "a", ttl_ms=400)
    await a.tick()
    # Overwritten behind a's back (no process does that; it shows who answers).
    await redis.set(a.lease_key(0), "someone-else:99")
    assert await a.still_owns(0)  # answered locally: the renewal is fresh
    await asyncio.sleep(0.25)  # more than half the TTL, no renewal meanwhile
    assert not await a.still_owns(0)  # asked Redis
    assert await a.still_owns(1)  # still a's in Redis
    await a.tick()  # renewal fails for partition 0: lost; 1 is fresh again
    assert 0 not in a.tokens
    assert not await a.still_owns(0)
    await redis.delete(a.lease_key(1))
    assert await a.still_owns(1)  # fresh renewal: local answer


class _ReleaseDuringRenew(Redis):
    """A real client whose first lease renewal lets the read loop give a partition back while
    the renewal is on the wire: the interleaving that killed the lease keeper."""

    leases: PartitionLeases | None = None
    giving_back: asyncio.Task[list[int]] | None = None

    async def evalsha(self, sha: str, numkeys: int, *args: object) -> object:
        # A renewal is the one-key script called with (key, token, ttl).
        renewing = numkeys == 1 and len(args) == 3 and str(args[0]).endswith(":lease")
        if renewing and self.leases is not None and self.giving_back is None:
            # The read loop's task runs as far as it can while this renewal waits.
            self.giving_back = asyncio.create_task(self.leases.give_back_extras(busy=set()))
            await asyncio.sleep(0.05)
        return await super().evalsha(sha, numkeys, *args)  # type: ignore[arg-type]


async def test_a_partition_given_back_during_a_renewal_does_not_kill_the_tick(
    redis_url: str, redis_prefix: str
) -> None:
    if redis_url.startswith("memory://"):
        pytest.skip("needs a real Redis")
    client = _ReleaseDuringRenew.from_url(redis_url)
    assert isinstance(client, _ReleaseDuringRenew)
    try:
        leases = PartitionLeases(client, prefix=redis_prefix, partitions=4, owner="a", ttl_ms=2000)
        await leases.tick()
        assert leases.owned() == [0, 1, 2, 3]
        # Another member joined: two of the four partitions are extras.
        await client.zadd(leases.members_key, {"b": int(time.time() * 1000)})
        leases.share = 2
        client.leases = leases
        changes = await leases.tick(give_back=False)  # was: KeyError from the renew loop
        assert client.giving_back is not None
        assert sorted(await client.giving_back) == [2, 3]
        assert sorted(leases.owned()) == [0, 1]
        assert changes.lost == []  # given back on purpose, not lost
        for partition in (0, 1):
            assert await leases.still_owns(partition)
    finally:
        await client.aclose()
