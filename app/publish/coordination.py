"""Redis-side helpers of the relay: one active relay across processes, and the memory of
dedup ids already published (SNS FIFO itself forgets after 5 minutes)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from redis.asyncio import Redis
from redis.exceptions import RedisError

from app.faults import LeaseLost
from app.leases import LeaseScripts, relay_lease_key

# Of the lease's ttl, the part a holder counts on: Redis may see the renewal a little later
# than it was sent, and clocks drift.
SAFE_FRACTION = 0.8


class RelayLease:
    """One relay publishes at a time across all gateway processes.

    ``valid_until`` (event-loop time) is when this holder stops counting on the lease: a
    publish still unanswered then is abandoned (``app/publish/relay.py``), so a relay that
    stalled (SIGSTOP, a suspended VM, a long pause) cannot send an old row after the next
    holder has moved the group on.
    """

    def __init__(self, redis: Redis, *, prefix: str, owner: str, ttl_ms: int = 15_000) -> None:
        self.redis = redis
        self.key = relay_lease_key(prefix)
        self.owner = owner
        self.ttl_ms = ttl_ms
        self.valid_until = 0.0
        self._scripts = LeaseScripts(redis)

    async def hold(self) -> bool:
        started = asyncio.get_running_loop().time()
        try:
            held = await self._scripts.renew(
                self.key, holder=self.owner, ttl_ms=self.ttl_ms
            ) or bool(await self.redis.set(self.key, self.owner, nx=True, px=self.ttl_ms))
        except (RedisError, OSError):
            held = False
        self.valid_until = started + self.ttl_ms / 1000 * SAFE_FRACTION if held else 0.0
        return held

    @contextlib.asynccontextmanager
    async def covering(self) -> AsyncIterator[None]:
        """The block runs only while this relay counts on the lease; ``LeaseLost`` otherwise.

        The lease is renewed on entry, so whatever came before (waiting for a batch slot)
        does not count, and only extended, never taken again: a lease that lapsed is a gap
        in which another relay may have published. The block is cancelled (``LeaseLost``)
        at ``valid_until``.
        """
        if not await self._extend():
            raise LeaseLost("the relay lease is not this relay's any more")
        deadline = asyncio.timeout_at(self.valid_until)
        try:
            async with deadline:
                yield
        except TimeoutError:
            if not deadline.expired():
                raise  # the block's own
            raise LeaseLost("the relay lease ran out before the block finished") from None

    async def _extend(self) -> bool:
        """Renew the lease if it is still this holder's; a Redis that does not answer is
        a lease not renewed."""
        started = asyncio.get_running_loop().time()
        try:
            extended = await self._scripts.renew(self.key, holder=self.owner, ttl_ms=self.ttl_ms)
        except (RedisError, OSError):
            extended = False
        self.valid_until = started + self.ttl_ms / 1000 * SAFE_FRACTION if extended else 0.0
        return extended

    async def release(self) -> None:
        with contextlib.suppress(RedisError, OSError):  # it expires by itself
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
        except (RedisError, OSError):
            return [None] * len(dedup_ids)
        return [v.decode() if isinstance(v, bytes) else v for v in values]

    async def remember_many(self, published: list[tuple[str, str]]) -> None:
        if not published:
            return
        with contextlib.suppress(RedisError, OSError):
            async with self.redis.pipeline(transaction=False) as pipe:
                for dedup_id, message_id in published:
                    pipe.set(self._key(dedup_id), message_id, ex=self.window_seconds)
                await pipe.execute()
