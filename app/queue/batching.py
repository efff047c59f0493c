"""Group commit for ingest: the dedup + enqueue of concurrent requests in one round trip.

Each request calls ``enqueue`` and awaits its own ``EnqueueResult``. Whatever arrived while
the previous round trip was in flight (or in the same event-loop turn) goes out together. The
Lua script keeps the single-event guarantees per event — dedup check (a signed request's
digest included), XADD, dedup keys and queued set in one atomic step (it is
``streams.ENQUEUE``, the script ``EventQueue.enqueue`` runs for one event). On one Redis the
whole batch is one call of it. In a Redis Cluster (``EventQueue.cluster``) a call may only
touch keys of one partition (one hash tag): one call per partition touched, all sent at once
(concurrently: the cluster client runs no scripts in a pipeline), and an event with a second
identity first claims it across partitions (``app/queue/replays.py``), all of a batch's
claims in one more round trip.

Invariants:
- At most one batch is in flight, and a batch holds events in call order, so events of one
  group key are XADDed in the order their ``enqueue`` calls were made.
- A caller's future resolves only after Redis answered for its partition. A Redis error
  (or anything else going wrong in the round trip) is raised to every caller of that
  partition's call — ingest turns it into 503, never a 2xx.
- With ``ack`` (``acks.py``) the round trip's pipeline ends with its waits, and a caller's
  future resolves only once they answered: ``NotReplicated`` when they fell short.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis.exceptions import NoScriptError

from app.queue.acks import ReplicaAck
from app.queue.connection import is_cluster
from app.queue.replays import Claim, ReplayInFlight
from app.queue.streams import (
    BY_REPLAY,
    CREATED,
    ENQUEUE,
    EnqueueResult,
    EventQueue,
    NewEntry,
    pack_entry,
)


class EventEnqueuer(Protocol):
    """What ingest needs from the queue: ``EventQueue`` itself, or an ``EnqueueBatcher``."""

    async def enqueue(self, entry: NewEntry) -> EnqueueResult: ...


@dataclass(slots=True)
class _Pending:
    partition: int
    keys: tuple[str, str, str, str]
    args: tuple[str, int, bytes]
    claim: Claim | None
    future: asyncio.Future[EnqueueResult] = field(repr=False)
    # Answered as a duplicate of this very request (by its claim or its partition's replay
    # key), not only of its delivery id.
    same_request: bool = False


class EnqueueBatcher:
    def __init__(
        self, queue: EventQueue, *, max_batch: int = 256, ack: ReplicaAck | None = None
    ) -> None:
        if ack is not None and queue.cluster:
            # WAIT answers for one node's replicas, and a cluster round trip writes to many.
            raise ValueError("a replica acknowledgement needs one Redis, not a cluster")
        self.queue = queue
        self.max_batch = max_batch
        self.ack = ack
        self.round_trips = 0  # batches sent; read by tests and the benchmarks
        self._sha = hashlib.sha1(ENQUEUE.encode(), usedforsecurity=False).hexdigest()
        self._pending: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None

    async def enqueue(self, entry: NewEntry) -> EnqueueResult:
        queue = self.queue
        partition = queue.partition_of(entry.group_key)
        future: asyncio.Future[EnqueueResult] = asyncio.get_running_loop().create_future()
        self._pending.append(
            _Pending(
                partition=partition,
                keys=queue.enqueue_keys(partition, entry),
                args=(entry.event_id, entry.dedup_window_ms, pack_entry(entry.data)),
                claim=queue.claim_of(entry),
                future=future,
            )
        )
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_all(), name="enqueue-batcher")
        # A caller that goes away (client disconnect) must not cancel the shared round trip.
        return await asyncio.shield(future)

    async def _flush_all(self) -> None:
        while self._pending:
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            try:
                await self.queue.check_layout()  # once per process (a GET), then a flag
            except BaseException as exc:  # noqa: BLE001 (a cancel is re-raised by _fail_all)
                _fail_all(batch, exc)
                continue
            await self._flush(batch)

    async def _flush(self, batch: list[_Pending]) -> None:
        """In a cluster, replay claims first (``replays.py``: one round trip, only when some
        events have a second identity), then the partitions' scripts. An event whose claim
        an earlier event of the same batch takes is that event's duplicate — unless that
        event was refused for its delivery id alone (a copy relabelled with an old one):
        then it goes on its own, in one more round."""
        leaders: dict[str, _Pending] = {}
        followers: list[tuple[_Pending, _Pending]] = []
        for item in batch:
            if item.claim is not None:
                leader = leaders.setdefault(item.claim.key, item)
                if leader is not item:
                    followers.append((item, leader))
        if not leaders:  # on one Redis, or no event with a second identity
            await self._enqueue(batch)
            return
        claimed = list(leaders.values())
        try:
            held = await self.queue.replays.take([item.claim for item in claimed if item.claim])
        except BaseException as exc:  # noqa: BLE001 (a cancel is re-raised by _fail_all)
            _fail_all(batch, exc)
            return
        answered = {id(follower) for follower, _ in followers}
        for item, answer in zip(claimed, held, strict=True):
            if answer is None:
                continue
            answered.add(id(item))
            if isinstance(answer, ReplayInFlight):
                _fail(item.future, answer)
            elif not item.future.done():
                item.same_request = True
                item.future.set_result(EnqueueResult(answer, created=False))
        going = [item for item in batch if id(item) not in answered]
        try:
            await self._enqueue(going)
        finally:
            not_queued = [
                (item.claim, _created_as(item.future) if item.same_request else None)
                for item in going
                if item.claim is not None and not _queued(item.future)
            ]
            if not_queued:
                await self.queue.replays.settle(not_queued)  # rare
            # Here, so that a failed or cancelled round still answers every follower.
            alone = [follower for follower, leader in followers if not _follow(follower, leader)]
        if alone:
            await self._flush(alone)

    async def _enqueue(self, batch: list[_Pending]) -> None:
        if not batch:
            return
        if self.queue.cluster:
            by_partition: dict[int, list[_Pending]] = {}
            for item in batch:
                by_partition.setdefault(item.partition, []).append(item)
            groups = list(by_partition.values())
        else:
            groups = [batch]
        try:
            replies = await self._send(groups)
            lost = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
            if lost:
                # Redis lost its script cache (restart, SCRIPT FLUSH): nothing ran for these
                # partitions; load the script and send just them again.
                await self.queue.redis.script_load(ENQUEUE)
                again = await self._send([groups[i] for i in lost])
                for i, reply in zip(lost, again, strict=True):
                    replies[i] = reply
        except BaseException as exc:  # noqa: BLE001 (a cancel is re-raised by _fail_all)
            _fail_all(batch, exc)
            return
        for group, reply in zip(groups, replies, strict=True):
            if isinstance(reply, BaseException):
                for item in group:
                    _fail(item.future, reply)
            else:
                _resolve(group, reply)

    async def _send(self, groups: list[list[_Pending]]) -> list[Any]:
        """One round trip: EVALSHA per group, pipelined (one connection), then the waits of
        ``ack``; errors come back as values, a shortfall of the waits as every group's. The
        cluster client refuses scripts in a pipeline: there the calls go out concurrently
        (and a replica acknowledgement is refused at start)."""
        self.round_trips += 1
        ack = self.ack
        redis = self.queue.redis
        if is_cluster(redis):
            calls = [_keys_and_args(group) for group in groups]
            return await asyncio.gather(
                *(redis.evalsha(self._sha, len(keys), *keys, *args) for keys, args in calls),
                return_exceptions=True,
            )
        async with redis.pipeline(transaction=False) as pipe:
            for group in groups:
                keys, args = _keys_and_args(group)
                pipe.evalsha(self._sha, len(keys), *keys, *args)
            if ack is not None:
                ack.request(pipe)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        if ack is None:
            return replies
        replies, waits = replies[: len(groups)], replies[len(groups) :]
        short = ack.verdict(waits)
        if short is None:
            return replies
        return [reply if isinstance(reply, BaseException) else short for reply in replies]


def _keys_and_args(group: Sequence[_Pending]) -> tuple[list[str], list[str | int | bytes]]:
    keys = [key for item in group for key in item.keys]
    args = [arg for item in group for arg in item.args]
    return keys, args


def _resolve(group: Sequence[_Pending], reply: Sequence[Any]) -> None:
    for index, item in enumerate(group):
        code, stored_id = reply[2 * index], reply[2 * index + 1]
        if not item.future.done():
            event_id = stored_id.decode() if isinstance(stored_id, bytes) else str(stored_id)
            item.same_request = code == BY_REPLAY
            item.future.set_result(EnqueueResult(event_id, code == CREATED))


def _queued(future: asyncio.Future[EnqueueResult]) -> bool:
    """True when the enqueue queued its event (not failed, never run, nor a duplicate)."""
    if not future.done() or future.cancelled() or future.exception() is not None:
        return False
    return future.result().created


def _created_as(future: asyncio.Future[EnqueueResult]) -> str | None:
    """The event an enqueue was answered with, None when it failed or never ran."""
    if not future.done() or future.cancelled() or future.exception() is not None:
        return None
    return future.result().event_id


def _follow(follower: _Pending, leader: _Pending) -> bool:
    """An identical request answered like its leader: a duplicate of the event the leader
    was queued as or found queued for the same request, or the leader's error. False when
    the leader was refused for its delivery id alone: that says nothing of this request."""
    future = follower.future
    if future.done():
        return True
    if not leader.future.done() or leader.future.cancelled():
        future.cancel()
    elif (exc := leader.future.exception()) is not None:
        future.set_exception(exc)
    else:
        result = leader.future.result()
        if not (result.created or leader.same_request):
            return False
        follower.same_request = True
        future.set_result(EnqueueResult(result.event_id, created=False))
    return True


def _fail_all(batch: Sequence[_Pending], exc: BaseException) -> None:
    """Every caller of the batch gets ``exc``; a cancel goes on up (re-raised)."""
    for item in batch:
        _fail(item.future, exc)
    if isinstance(exc, asyncio.CancelledError):
        raise exc


def _fail(future: asyncio.Future[EnqueueResult], exc: BaseException) -> None:
    if future.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(exc)
