"""The consumer loop: leased partition streams → key-ordered dispatcher → processor → ack.

- Only partitions this process holds a lease on are read. On acquiring one, the entries its
  previous owner left pending are claimed and dispatched before anything newer from it. A
  previous owner that wakes up after its lease moved (a stalled process) may still take
  entries with a read it had already sent; after every read, entries of the partitions read
  that are pending with another consumer (older than what was just read) are claimed and
  dispatched first, so a key's events keep their order across a takeover.
- An entry is acked only after ``process`` returned (its outcome is committed), and the ack
  is fenced by the lease token. Processing gets a ``LeaseGuard``: it checks the lease before
  calling Claude, and the store refuses a write from an older tenure than the latest one that
  started the event. After losing a lease this process skips the partition's buffered entries.
- A failure of an unavailable dependency (Redis, the database) is retried in place and never
  counts against the event. Any other failure is counted in Redis (per entry, across
  restarts); at ``max_failures`` the event is handed to ``give_up`` (dead-lettered) and acked.
- The read loop, the lease keeper and the dispatch runners are supervised loops.
  ``shutdown`` stops reading, lets in-flight events finish within the grace period, then
  gives the leases back so other processes take over at once instead of after the TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable

import structlog
from pydantic import ValidationError

from app.events import Event
from app.faults import REDIS_ERRORS, LeaseLost, dependency_unavailable
from app.observability.metrics import DEAD_LETTERS
from app.queue.dispatcher import KeyOrderedDispatcher
from app.queue.leases import LeaseGuard, PartitionLeases
from app.queue.streams import EventQueue, StreamEntry
from app.supervision import Supervised, Supervisor

log = structlog.get_logger(__name__)
Process = Callable[[Event, LeaseGuard], Awaitable[None]]
GiveUp = Callable[[Event, str], Awaitable[None]]


class QueueWorker:
    def __init__(
        self,
        *,
        queue: EventQueue,
        leases: PartitionLeases,
        process: Process,
        give_up: GiveUp,
        consumer: str,
        concurrency: int,
        grace_seconds: float,
        max_failures: int = 5,
        max_buffered: int | None = None,
        supervisor: Supervisor | None = None,
        retry_delay: float = 1.0,
        max_retry_delay: float = 30.0,
    ) -> None:
        self.queue = queue
        self.leases = leases
        self.process = process
        self.give_up = give_up
        self.consumer = consumer
        self.grace_seconds = grace_seconds
        self.max_failures = max_failures
        self.supervisor = supervisor or Supervisor()
        self.tick_seconds = leases.ttl_ms / 4000
        self.dispatcher: KeyOrderedDispatcher[tuple[StreamEntry, Event]] = KeyOrderedDispatcher(
            self._handle,
            concurrency=concurrency,
            max_buffered=max_buffered or concurrency * 4,
            retry_delay=retry_delay,
            max_retry_delay=max_retry_delay,
        )
        self.reading: set[int] = set()
        self._stopping = asyncio.Event()
        # Entries handed to the dispatcher and not yet done, and how many per partition.
        self._held: set[tuple[int, bytes]] = set()
        self._in_flight: Counter[int] = Counter()
        self._to_claim: list[int] = []
        # Partitions whose pending entries are taken again before the next read (_resync).
        self._resync_partitions: set[int] = set()
        self._next_orphan_check = 0.0
        self._reader: Supervised | None = None
        self._keeper: Supervised | None = None

    @property
    def in_flight(self) -> int:
        """Entries handed to the dispatcher and not done yet."""
        return len(self._held)

    def start(self) -> None:
        self.dispatcher.start(self.supervisor)
        # Leases are kept by their own loop: the read loop may wait for buffer room for as
        # long as processing is slow, and a lease must not expire meanwhile.
        self._keeper = self.supervisor.start("lease-keeper", self._keep_leases)
        self._reader = self.supervisor.start(
            "read-loop", self._read_loop, until=self._stopping.is_set
        )

    async def run(self) -> None:
        """Start, work until ``stop()``, then shut down."""
        self.start()
        await self._stopping.wait()
        await self.shutdown()

    def stop(self) -> None:
        self._stopping.set()

    async def shutdown(self) -> None:
        """Stop reading; in-flight events get the grace period; then give the leases back."""
        self._stopping.set()
        if self._reader is not None:
            try:
                async with asyncio.timeout(5):  # the read in progress ends within 0.5 s
                    await self._reader.wait()
            except TimeoutError:
                await self._reader.stop()
        # The keeper goes on renewing (without taking new partitions) while in-flight events
        # finish, so their acks are not fenced off by an expired lease.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.grace_seconds):
                await self.dispatcher.wait_idle()
        if self._keeper is not None:
            await self._keeper.stop()
        await self.dispatcher.stop()
        with contextlib.suppress(*REDIS_ERRORS):
            await self.leases.release_all()
        log.info("worker_stopped", unfinished=len(self._held))

    async def _read_loop(self) -> None:
        # Started again by the supervisor after a failure: what the failed run had read but
        # not handed on is pending with this consumer, taken again before new reads.
        self._resync_partitions.update(self.reading)
        await self._wait_for_redis()
        while not self._stopping.is_set():
            await self._give_back_extras()
            await self._claim_acquired()
            await self._reclaim_orphans()
            await self._read_once(block_ms=500)

    async def _wait_for_redis(self) -> None:
        delay = 0.5
        while not self._stopping.is_set():
            try:
                await self.queue.check_layout()  # a mismatch ends the loop: /readyz 503
                await self.queue.ensure_groups(list(range(self.queue.partitions)))
                return
            except REDIS_ERRORS as exc:
                log.warning("queue_unreachable", error=type(exc).__name__, retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10)

    async def _keep_leases(self) -> None:
        while True:
            busy = {p for p, n in self._in_flight.items() if n > 0}
            try:
                # No lease under another partition count than the queue's: a mismatch
                # ends the loop (/readyz 503), before any partition is taken.
                await self.queue.check_layout()
                # Giving partitions back is left to the read loop, between two reads: a
                # partition released while a blocking read still lists it could hand an
                # entry to this process after the next owner already claimed what was pending.
                changes = await self.leases.tick(
                    busy=busy, acquire=not self._stopping.is_set(), give_back=False
                )
            except REDIS_ERRORS as exc:
                log.warning("lease_tick_failed", error=type(exc).__name__)
            else:
                self.reading.difference_update(changes.lost)
                self._to_claim.extend(changes.acquired)
            await asyncio.sleep(self.tick_seconds)

    async def _give_back_extras(self) -> None:
        busy = {p for p, n in self._in_flight.items() if n > 0}
        try:
            released = await self.leases.give_back_extras(busy=busy)
        except REDIS_ERRORS as exc:
            log.warning("lease_release_failed", error=type(exc).__name__)
            return
        if released:
            self.reading.difference_update(released)
            log.info("leases_given_back", partitions=released)

    async def _reclaim_orphans(self) -> None:
        """Safety net: entries of owned partitions left pending by a process that lost its
        lease mid-read (its lease expired: a stall or a Redis outage) are taken over."""
        loop = asyncio.get_running_loop()
        if loop.time() < self._next_orphan_check:
            return
        self._next_orphan_check = loop.time() + self.tick_seconds * 4
        for partition in sorted(self.reading):
            try:
                orphans = await self.queue.claim_pending(
                    consumer=self.consumer,
                    partition=partition,
                    min_idle_ms=self.leases.ttl_ms * 3,
                )
            except REDIS_ERRORS as exc:
                log.warning("orphan_claim_failed", partition=partition, error=type(exc).__name__)
                return
            for entry in orphans:
                if (entry.partition, entry.entry_id) not in self._held:
                    log.warning(
                        "orphan_entry_claimed", partition=partition, entry=entry.entry_id.decode()
                    )
                await self._submit(entry)

    async def _claim_acquired(self) -> None:
        """Dispatch what a partition's previous owner left pending, then start reading it."""
        while self._to_claim:
            partition = self._to_claim.pop(0)
            if partition not in self.leases.tokens:
                continue  # lost again before it was claimed
            try:
                await self.queue.ensure_groups([partition])
                pending = await self.queue.claim_pending(
                    consumer=self.consumer, partition=partition, min_idle_ms=0
                )
                await self.queue.forget_idle_consumers(partition=partition, keep=self.consumer)
            except REDIS_ERRORS as exc:
                log.warning("claim_failed", partition=partition, error=type(exc).__name__)
                with contextlib.suppress(*REDIS_ERRORS):
                    await self.leases.release(partition)
                continue
            if pending:
                log.info("pending_claimed", partition=partition, entries=len(pending))
            for entry in pending:
                await self._submit(entry)
            self.reading.add(partition)

    async def _resync(self) -> bool:
        """After a failed read, what that read took may be pending with this consumer (read,
        then the next call failed; or the reply was lost with the connection), where neither
        a next read (``>``: new entries only) nor the stale-owner claim looks. Every pending
        entry of those partitions is taken again, in order, before anything new is read:
        otherwise a later event of the key would go first. False while Redis still fails."""
        while self._resync_partitions:
            partition = min(self._resync_partitions)
            if partition in self.reading:
                try:
                    pending = await self.queue.claim_pending(
                        consumer=self.consumer, partition=partition, min_idle_ms=0
                    )
                except REDIS_ERRORS as exc:
                    log.warning("resync_failed", partition=partition, error=type(exc).__name__)
                    return False
                for entry in pending:
                    await self._submit(entry)  # skips what is held (in flight here)
            self._resync_partitions.discard(partition)
        return True

    async def _read_once(self, *, block_ms: int) -> None:
        if self._resync_partitions and not await self._resync():
            await asyncio.sleep(1)
            return
        room = self.dispatcher.free_slots()
        if room == 0 or not self.reading:
            await asyncio.sleep(min(block_ms, 200) / 1000)
            return
        try:
            entries = await self.queue.read_new(
                consumer=self.consumer,
                partitions=sorted(self.reading),
                # COUNT applies per stream: share the room out, so one read holds at most
                # about the buffer's room (plus one per partition), not partitions x room.
                count=-(-room // len(self.reading)),
                block_ms=block_ms,
            )
            stale = await self.queue.claim_foreign_pending(
                consumer=self.consumer, partitions=sorted({e.partition for e in entries})
            )
        except REDIS_ERRORS as exc:
            log.warning("queue_read_failed", error=type(exc).__name__)
            self._resync_partitions.update(self.reading)
            await asyncio.sleep(1)
            await self._wait_for_redis()
            return
        if stale:
            log.warning("stale_owner_entries_claimed", entries=len(stale))
        # What a stale owner took was delivered before what this read got: it goes first.
        for entry in [*stale, *entries]:
            await self._submit(entry)

    async def _submit(self, entry: StreamEntry) -> None:
        if (entry.partition, entry.entry_id) in self._held:
            return
        try:
            event = Event.from_bytes(entry.data)
        except (ValidationError, ValueError):
            # Only ingest writes entries; one that cannot be read will never be processable.
            log.error("entry_unreadable", partition=entry.partition, entry=entry.entry_id.decode())
            DEAD_LETTERS.labels(stage="queue").inc()
            await self.queue.ack(entry, "", token=self.leases.tokens.get(entry.partition))
            return
        self._held.add((entry.partition, entry.entry_id))
        self._in_flight[entry.partition] += 1
        await self.dispatcher.submit(event.group_key, (entry, event))

    async def _handle(self, item: tuple[StreamEntry, Event]) -> None:
        """Raising leaves the item in place: the dispatcher retries it before its key moves on."""
        entry, event = item
        with structlog.contextvars.bound_contextvars(
            event_id=event.id, source=event.source, partition=entry.partition
        ):
            while True:
                guard = self.leases.guard(entry.partition)
                if guard is not None and await guard.holds():
                    with contextlib.suppress(LeaseLost):
                        await self._process(entry, event, guard)
                        if not await self.queue.ack(entry, event.id, token=self._token(guard)):
                            log.warning("ack_fenced")
                        self._done(entry)
                        return
                if entry.partition not in self.leases.tokens:
                    # Not ours now: the next owner claims it (this process too, if it takes
                    # the partition back: the entry is no longer held then, so it is claimed).
                    log.info("entry_skipped_lease_lost")
                    self._done(entry)
                    return
                # Ours again, in a newer tenure that skipped it as held: go on with it here.
                await asyncio.sleep(self.tick_seconds / 4)

    async def _process(self, entry: StreamEntry, event: Event, guard: LeaseGuard) -> None:
        try:
            await self.process(event, guard)
        except LeaseLost:
            raise
        except Exception as exc:
            if dependency_unavailable(exc):
                raise  # not the event's fault: retried in place, not counted
            failures = await self.queue.record_failure(entry)
            if failures < self.max_failures:
                raise
            log.error("event_gave_up", failures=failures, exc_info=exc)
            await self.give_up(
                event, f"processing failed {failures} times; last: {type(exc).__name__}: {exc}"
            )

    def _token(self, guard: LeaseGuard) -> str:
        return self.leases.tokens.get(guard.partition, "")

    def _done(self, entry: StreamEntry) -> None:
        self._held.discard((entry.partition, entry.entry_id))
        self._in_flight[entry.partition] -= 1
