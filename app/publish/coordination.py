"""Redis-side helpers of the relay: the lease rules every publishing right follows
(``CoveredLease``), the single relay lease, and the memory of dedup ids already published
(SNS FIFO itself forgets after 5 minutes). Relays that split the slots: ``shards.py``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from redis.asyncio import Redis

from app.faults import REDIS_ERRORS, LeaseLost
from app.leases import LeaseScripts, relay_lease_key

# Of the lease's ttl, the part a holder counts on: Redis may see the renewal a little later
# than it was sent, and clocks drift.
SAFE_FRACTION = 0.8


class PublishLease(Protocol):
    """What the relay needs of its right to publish: which relay slots it covers (None: all),
    a renewal between rounds, a block it may publish in, and giving it back."""

    @property
    def slots(self) -> frozenset[int] | None: ...

    async def hold(self) -> bool: ...

    def covering(self) -> contextlib.AbstractAsyncContextManager[None]: ...

    async def release(self) -> None: ...


class CoveredLease:
    """``covering()`` for a lease of ``ttl_ms`` whose holder counts on it until
    ``valid_until`` (event-loop time) and renews it with ``_extend()``; ``sleep`` is waited
    between the renewals."""

    ttl_ms: int
    valid_until: float
    sleep: Callable[[float], Awaitable[None]]

    async def _extend(self) -> bool:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def covering(self) -> AsyncIterator[None]:
        """The block runs only while this relay counts on the lease; ``LeaseLost`` otherwise.

        Less than half a ttl left of what this holder counts on, the lease is renewed on
        entry, so whatever came before (waiting for a batch slot) does not count; more, the
        first renewal (a third of the ttl in) comes in time anyway, and the block starts
        without a round trip. Then it is renewed every third of the ttl, and each renewal
        moves the block's deadline on. Renewals only extend, never take the lease again: a
        lease that lapsed is a gap in which another relay may have published. The block is
        cancelled (``LeaseLost``) as soon as a renewal finds the lease another relay's or
        lapsed, and at ``valid_until`` when renewals do not get through (Redis unreachable,
        this process stalled). The renewing task never outlives the block; if it fails, the
        block is cancelled and its exception raised from here.
        """
        if self.valid_until - asyncio.get_running_loop().time() <= self.ttl_ms / 2000:
            try:
                extended = await self._extend()
            except REDIS_ERRORS:
                extended = False  # nothing is sent on a lease not confirmed
            if not extended:
                raise LeaseLost("the relay lease is not this relay's any more")
        deadline = asyncio.timeout_at(self.valid_until)
        try:
            async with deadline:
                keeper = asyncio.create_task(self._keep(deadline), name="relay-lease-keeper")
                try:
                    yield
                finally:
                    keeper.cancel()
                    await asyncio.wait([keeper])
                    if not keeper.cancelled() and (failure := keeper.exception()) is not None:
                        raise failure
        except TimeoutError:
            if not deadline.expired():
                raise  # the block's own
            raise LeaseLost("the relay lease ran out before the block finished") from None

    async def _keep(self, deadline: asyncio.Timeout) -> None:
        """Renew every third of the ttl for ``covering()``, moving ``deadline`` with each
        renewal; a renewal Redis does not answer leaves it where the last one put it."""
        try:
            while True:
                await self.sleep(self.ttl_ms / 1000 / 3)
                try:
                    extended = await self._extend()
                except REDIS_ERRORS:
                    continue
                if deadline.expired():
                    return
                # A lost lease has valid_until 0.0: the block is cancelled at once.
                deadline.reschedule(self.valid_until)
                if not extended:
                    return
        except Exception:
            # Without renewals the deadline would still hold, but a broken keeper is a bug
            # to see now, not at the next stall.
            if not deadline.expired():
                deadline.reschedule(asyncio.get_running_loop().time())
            raise


class RelayLease(CoveredLease):
    """One relay publishes at a time across all gateway processes.

    ``valid_until`` (event-loop time) is when this holder stops counting on the lease:
    ``SAFE_FRACTION`` of the ttl after the start of its last renewal. A publish runs inside
    ``covering()``, which keeps renewing the lease, so a slow SNS only delays it; it is
    abandoned (``app/publish/relay.py``) once a renewal finds the lease another relay's, or
    at ``valid_until`` when no renewal got through in time, so a relay that stalled (SIGSTOP,
    a suspended VM, a long pause) cannot send an old row after the next holder has moved the
    group on.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str,
        owner: str,
        ttl_ms: int = 15_000,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.redis = redis
        self.key = relay_lease_key(prefix)
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.valid_until = 0.0
        self.sleep = sleep  # between the renewals of ``covering()``
        self._scripts = LeaseScripts(redis)

    @property
    def slots(self) -> frozenset[int] | None:
        return None  # one relay publishes every group

    async def hold(self) -> bool:
        started = asyncio.get_running_loop().time()
        try:
            held = await self._scripts.renew(
                self.key, holder=self.owner, ttl_ms=self.ttl_ms
            ) or bool(await self.redis.set(self.key, self.owner, nx=True, px=self.ttl_ms))
        except REDIS_ERRORS:
            held = False
        self.valid_until = started + self.ttl_ms / 1000 * SAFE_FRACTION if held else 0.0
        return held

    async def _extend(self) -> bool:
        """Renew the lease if it is still this holder's. ``valid_until`` moves on when it
        is, and becomes 0.0 when it is not; Redis errors are raised, leaving it as it was."""
        started = asyncio.get_running_loop().time()
        extended = await self._scripts.renew(self.key, holder=self.owner, ttl_ms=self.ttl_ms)
        self.valid_until = started + self.ttl_ms / 1000 * SAFE_FRACTION if extended else 0.0
        return extended

    async def release(self) -> None:
        with contextlib.suppress(*REDIS_ERRORS):  # it expires by itself
            await self._scripts.release(self.key, holder=self.owner)


class PublishedMemory:
    """Dedup ids published in the last ``window_seconds``.

    A relay that crashed after SNS accepted a message but before the row was marked finds the
    id here and marks the row instead of publishing it a second time.
    """

    def __init__(self, redis: Redis, *, prefix: str, window_seconds: int) -> None:
        self.redis = redis
        self.prefix = prefix
        self.window_seconds = window_seconds

    def _key(self, dedup_id: str) -> str:
        return f"{self.prefix}:published:{dedup_id}"

    async def recall_many(self, dedup_ids: list[str]) -> list[str | None]:
        """The message id each dedup id was published as; None when unknown — or when Redis
        cannot say (SNS's own 5-minute dedup remains)."""
        if not dedup_ids:
            return []
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for dedup_id in dedup_ids:
                    pipe.get(self._key(dedup_id))
                values = await pipe.execute()
        except REDIS_ERRORS:
            return [None] * len(dedup_ids)
        return [v.decode() if isinstance(v, bytes) else v for v in values]

    async def remember_many(self, published: list[tuple[str, str]]) -> None:
        if not published:
            return
        with contextlib.suppress(*REDIS_ERRORS):
            async with self.redis.pipeline(transaction=False) as pipe:
                for dedup_id, message_id in published:
                    pipe.set(self._key(dedup_id), message_id, ex=self.window_seconds)
                await pipe.execute()
