"""The consumer loop: partition streams → key-ordered dispatcher → processor → ack.

An entry is acked only after ``process`` returned, i.e. after its outcome was committed.
On start the worker first takes back entries left pending by an earlier run (crash or
restart), so they are dispatched before anything newer of the same key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog
from pydantic import ValidationError
from redis.exceptions import RedisError

from app.ingest.schemas import Event
from app.observability.metrics import DEAD_LETTERS
from app.queue.dispatcher import KeyOrderedDispatcher
from app.queue.streams import EventQueue, StreamEntry

log = structlog.get_logger(__name__)


class QueueWorker:
    def __init__(
        self,
        *,
        queue: EventQueue,
        process: Callable[[Event], Awaitable[None]],
        consumer: str,
        concurrency: int,
        reclaim_idle_ms: int,
        max_buffered: int | None = None,
    ) -> None:
        self.queue = queue
        self.process = process
        self.consumer = consumer
        self.reclaim_idle_ms = reclaim_idle_ms
        self.partitions = list(range(queue.partitions))
        self.dispatcher: KeyOrderedDispatcher[tuple[StreamEntry, Event]] = KeyOrderedDispatcher(
            self._handle,
            concurrency=concurrency,
            max_buffered=max_buffered or concurrency * 4,
        )
        self._stopping = asyncio.Event()
        # Entries handed to the dispatcher and not yet acked: a reclaim must not add them twice.
        self._held: set[tuple[int, bytes]] = set()

    async def run(self) -> None:
        self.dispatcher.start()
        try:
            await self._wait_for_redis()
            await self._reclaim(min_idle_ms=self.reclaim_idle_ms)
            last_reclaim = asyncio.get_running_loop().time()
            while not self._stopping.is_set():
                now = asyncio.get_running_loop().time()
                if now - last_reclaim > self.reclaim_idle_ms / 1000:
                    await self._reclaim(min_idle_ms=self.reclaim_idle_ms)
                    last_reclaim = now
                await self._read_once()
        finally:
            await self.dispatcher.stop()

    def stop(self) -> None:
        self._stopping.set()

    async def _wait_for_redis(self) -> None:
        delay = 0.5
        while True:
            try:
                await self.queue.ensure_groups(self.partitions)
                return
            except (RedisError, OSError) as exc:
                log.warning("queue_unreachable", error=type(exc).__name__, retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10)

    async def _read_once(self) -> None:
        room = self.dispatcher.free_slots()
        if room == 0:
            await asyncio.sleep(0.05)
            return
        try:
            entries = await self.queue.read_new(
                consumer=self.consumer, partitions=self.partitions, count=room, block_ms=1000
            )
        except (RedisError, OSError) as exc:
            log.warning("queue_read_failed", error=type(exc).__name__)
            await asyncio.sleep(1)
            await self._wait_for_redis()
            return
        for entry in entries:
            await self._submit(entry)

    async def _reclaim(self, *, min_idle_ms: int) -> None:
        for partition in self.partitions:
            try:
                entries = await self.queue.claim_pending(
                    consumer=self.consumer, partition=partition, min_idle_ms=min_idle_ms
                )
            except (RedisError, OSError) as exc:
                log.warning("queue_reclaim_failed", partition=partition, error=type(exc).__name__)
                return
            for entry in entries:
                log.info("entry_reclaimed", partition=partition, entry=entry.entry_id.decode())
                await self._submit(entry)

    async def _submit(self, entry: StreamEntry) -> None:
        try:
            event = Event.from_bytes(entry.data)
        except (ValidationError, ValueError):
            # Only ingest writes these entries; an unreadable one cannot be processed, ever.
            log.error("entry_unreadable", partition=entry.partition, entry=entry.entry_id.decode())
            DEAD_LETTERS.labels(stage="queue").inc()
            await self.queue.ack(entry)
            return
        if (entry.partition, entry.entry_id) in self._held:
            return
        self._held.add((entry.partition, entry.entry_id))
        await self.dispatcher.submit(event.group_key, (entry, event))

    async def _handle(self, item: tuple[StreamEntry, Event]) -> None:
        entry, event = item
        with structlog.contextvars.bound_contextvars(
            event_id=event.id, source=event.source, partition=entry.partition
        ):
            await self.process(event)
        await self.queue.ack(entry, event.id)
        self._held.discard((entry.partition, entry.entry_id))
