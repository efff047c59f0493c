"""Replays across partitions (``app/queue/replays.py``) on the real Redis: what a claim left
pending, a failed enqueue and identical requests in one batch are answered — on one Redis
(the source-wide key checked and set by the enqueue script) and as in a Redis Cluster
(``cluster=True``: claimed first, in a round trip of its own), the ``cluster_too`` ones on a
real cluster as well."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from app.queue.batching import EnqueueBatcher
from app.queue.replays import Claim, ReplayClaims, ReplayInFlight
from app.queue.streams import ENQUEUE, EnqueueResult, EventQueue, NewEntry


def _entry(event_id: str, group_key: str, *, replay: str = "sig-a") -> NewEntry:
    return NewEntry(
        event_id=event_id,
        source="github",
        delivery_id=f"d-{event_id}",
        group_key=group_key,
        data=orjson.dumps({"id": event_id}),
        dedup_window_ms=60_000,
        replay_id=replay,
    )


@pytest.fixture(params=[False, True], ids=["one-redis", "cluster-mode"])
def queue(redis: Redis, redis_prefix: str, request: pytest.FixtureRequest) -> EventQueue:
    return EventQueue(redis, prefix=redis_prefix, partitions=16, cluster=request.param)


@pytest.fixture
def cluster_queue(redis: Redis, redis_prefix: str) -> EventQueue:
    """Claims taken before the partition's script runs (what a claim left pending means)."""
    return EventQueue(redis, prefix=redis_prefix, partitions=16, cluster=True)


@pytest.mark.parametrize("batched", [True, False])
async def test_a_replay_into_another_partition_is_a_duplicate(
    queue: EventQueue, batched: bool
) -> None:
    enqueuer = EnqueueBatcher(queue) if batched else queue
    assert queue.partition_of("acme/api") != queue.partition_of("octocat")
    first = await enqueuer.enqueue(_entry("evt_1", "acme/api"))
    replay = await enqueuer.enqueue(_entry("evt_2", "octocat"))
    assert (first, replay) == (EnqueueResult("evt_1", True), EnqueueResult("evt_1", False))
    assert (await queue.backlog())[0] == 1


async def test_identical_requests_in_one_batch_get_one_event(queue: EventQueue) -> None:
    batcher = EnqueueBatcher(queue)
    answers = await asyncio.gather(
        *(batcher.enqueue(_entry(f"evt_{n}", f"key-{n}")) for n in range(5))
    )
    assert batcher.round_trips == 1  # one flush: the partitions' scripts in one round trip
    assert answers[0] == EnqueueResult("evt_0", True)
    assert answers[1:] == [EnqueueResult("evt_0", False)] * 4
    assert (await queue.backlog())[0] == 1


@pytest.mark.cluster_too
async def test_a_concurrent_identical_request_waits_and_is_a_duplicate(
    cluster_queue: EventQueue, redis: Redis
) -> None:
    queue = cluster_queue
    claim = queue.claim_of(_entry("evt_1", "acme/api"))
    assert claim is not None
    await redis.set(claim.key, claim.value, px=5_000)  # evt_1 is being queued

    async def queued_soon() -> None:
        await asyncio.sleep(0.05)
        await redis.set(claim.proof_key, "evt_1", px=5_000)  # what its script sets

    queueing = asyncio.create_task(queued_soon())
    assert await queue.enqueue(_entry("evt_2", "octocat")) == EnqueueResult("evt_1", False)
    await queueing
    assert (await queue.backlog())[0] == 0


@pytest.mark.cluster_too
async def test_a_claim_whose_event_never_got_queued_is_taken_over(
    cluster_queue: EventQueue, redis: Redis
) -> None:
    """Its process died between the claim and the enqueue: the sender's retry waits about
    0.2 s, then is queued."""
    queue = cluster_queue
    claim = queue.claim_of(_entry("evt_1", "acme/api"))
    assert claim is not None
    await redis.set(claim.key, claim.value, px=60_000)
    assert await queue.enqueue(_entry("evt_2", "acme/api")) == EnqueueResult("evt_2", True)
    assert await queue.enqueue(_entry("evt_3", "octocat")) == EnqueueResult("evt_2", False)


class FailingQueue(EventQueue):
    """The partition's script fails, as a dropped connection makes it fail."""

    fail = True

    def __init__(self, redis: Redis, *, prefix: str, partitions: int, cluster: bool) -> None:
        super().__init__(redis, prefix=prefix, partitions=partitions, cluster=cluster)
        script = self._enqueue

        async def enqueue(**kwargs: Any) -> Any:
            if self.fail:
                raise RedisConnectionError("Connection reset by peer")
            return await script(**kwargs)

        self._enqueue = enqueue  # type: ignore[assignment]


@pytest.mark.parametrize("cluster", [False, True], ids=["one-redis", "cluster-mode"])
async def test_a_failed_enqueue_gives_its_claim_back(
    redis: Redis, redis_prefix: str, cluster: bool
) -> None:
    queue = FailingQueue(redis, prefix=redis_prefix, partitions=16, cluster=cluster)
    with pytest.raises(RedisConnectionError):
        await queue.enqueue(_entry("evt_1", "acme/api"))
    assert await redis.get(queue.replays.claim_key("github", "sig-a")) is None
    queue.fail = False
    # The sender's retry is queued at once, not refused as in flight.
    assert await queue.enqueue(_entry("evt_2", "acme/api")) == EnqueueResult("evt_2", True)


def _relabelled(event_id: str, group_key: str, *, delivery_id: str) -> NewEntry:
    """The same signed body (same replay id) sent with another, unsigned delivery id."""
    entry = _entry(event_id, group_key)
    return dataclasses.replace(entry, delivery_id=delivery_id)


async def test_a_copy_refused_by_an_old_delivery_id_does_not_take_the_genuine_request_down(
    queue: EventQueue,
) -> None:
    """In one batch, a copy of a genuine request relabelled with an old delivery id is a
    duplicate of that old event; the genuine request (same body, its own delivery id) is not
    a duplicate of the old event, and is queued."""
    old = NewEntry(
        event_id="evt_old",
        source="github",
        delivery_id="d-old",
        group_key="acme/api",
        data=b"{}",
        dedup_window_ms=60_000,
        replay_id="another-body",
    )
    batcher = EnqueueBatcher(queue)
    assert await batcher.enqueue(old) == EnqueueResult("evt_old", True)
    copy, genuine = await asyncio.gather(
        batcher.enqueue(_relabelled("evt_copy", "acme/api", delivery_id="d-old")),
        batcher.enqueue(_entry("evt_real", "acme/api")),
    )
    assert copy == EnqueueResult("evt_old", False)
    assert genuine == EnqueueResult("evt_real", True)
    assert (await queue.backlog())[0] == 2


class FirstLandsLate(ReplayClaims):
    """The first request's script runs right after a second one has taken its claim over
    (it was slower than the wait, not dead)."""

    def __init__(self, queue: EventQueue) -> None:
        super().__init__(queue.redis, prefix=queue.prefix)
        self.queue = queue

    async def take(self, claims: Sequence[Claim]) -> list[str | ReplayInFlight | None]:
        answers = await super().take(claims)
        first = _entry("evt_1", "acme/api")
        keys = self.queue.enqueue_keys(self.queue.partition_of(first.group_key), first)
        await self.redis.eval(ENQUEUE, 4, *keys, "evt_1", 60_000, b"{}")
        return answers


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.cluster_too
async def test_a_claim_taken_over_keeps_naming_the_queued_event(
    cluster_queue: EventQueue, redis: Redis, batched: bool
) -> None:
    """The first request was slower than the wait: a second one took its claim over, then
    found it queued in the same partition (a duplicate). The claim must go on naming the
    queued event, so a later copy into another partition is still a duplicate."""
    queue = cluster_queue
    slow = queue.claim_of(_entry("evt_1", "acme/api"))
    assert slow is not None
    await redis.set(slow.key, slow.value, px=60_000)  # evt_1 claimed, its script not run yet
    queue.replays = FirstLandsLate(queue)
    enqueuer = EnqueueBatcher(queue) if batched else queue
    second = await enqueuer.enqueue(_relabelled("evt_2", "acme/api", delivery_id="d-2"))
    assert second == EnqueueResult("evt_1", False)
    queue.replays = ReplayClaims(redis, prefix=queue.prefix)
    assert await enqueuer.enqueue(_entry("evt_3", "octocat")) == EnqueueResult("evt_1", False)
    assert (await queue.backlog())[0] == 1


class StalledBatcher(EnqueueBatcher):
    """Its partitions' round trip never comes back (the flusher is cancelled meanwhile)."""

    async def _send(self, groups: list[Any]) -> list[Any]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_cancelled_round_still_answers_identical_requests(queue: EventQueue) -> None:
    """Two identical requests in one batch, the round cancelled (the process stopping): the
    follower was answered only after the round, so its caller waited for ever."""
    batcher = StalledBatcher(queue)
    leader = asyncio.create_task(batcher.enqueue(_entry("evt_1", "acme/api")))
    follower = asyncio.create_task(batcher.enqueue(_entry("evt_2", "acme/api")))
    await asyncio.sleep(0.2)  # claimed, then stalled in the partitions' round trip
    assert batcher._flusher is not None
    batcher._flusher.cancel()
    done, _ = await asyncio.wait([leader, follower], timeout=2)
    assert done == {leader, follower}, "a caller is still waiting"


class CountingBatcher(EnqueueBatcher):
    """Records how many script calls each round trip carries."""

    calls: list[int]

    async def _send(self, groups: list[Any]) -> list[Any]:
        self.calls = [*getattr(self, "calls", []), len(groups)]
        return await super()._send(groups)


async def test_on_one_redis_a_batch_is_one_script_call_claims_included(
    redis: Redis, redis_prefix: str
) -> None:
    """Signed events of several partitions, two of them one request relabelled: one round
    trip carrying one script call; nothing claimed apart."""
    queue = EventQueue(redis, prefix=redis_prefix, partitions=16)
    batcher = CountingBatcher(queue)
    keys = [f"repo/{n}" for n in range(6)]
    assert len({queue.partition_of(key) for key in keys}) > 1
    answers = await asyncio.gather(
        *(
            batcher.enqueue(_entry(f"evt_{n}", key, replay=f"sig-{n}"))
            for n, key in enumerate(keys)
        ),
        batcher.enqueue(_entry("evt_copy", "octocat", replay="sig-0")),
    )
    assert batcher.calls == [1]
    assert answers[:6] == [EnqueueResult(f"evt_{n}", True) for n in range(6)]
    assert answers[6] == EnqueueResult("evt_0", False)
