"""A signed request's identity, claimed across partitions before it is queued.

An event's dedup keys live in its partition (one hash tag with the stream, so one Lua call
checks them and queues the event). But the partition follows the group key, and where an
unsigned header picks the group key (GitHub's ``X-GitHub-Event``, a binary CloudEvent's
``ce-subject``) a captured signed request, relabelled, lands in another partition whose keys
never saw it. So an event with a ``replay_id`` (a digest of what its signature covers) first
claims ``{prefix}:replays:<digest>``, a key of its own (its own slot in a Redis Cluster):

1. claim: ``SET NX`` the key to ``pending:<event id>`` for a short while. Held by an event id
   → a duplicate of that event, answered without queueing. Held by ``pending:...`` → an
   identical request is being queued right now: wait for it (about 0.2 s at most), then
   ``ReplayInFlight`` (503, retry).
2. the partition's enqueue script runs as before (its own dedup keys included);
3. settle: the key is set to the event id the partition queued, for the dedup window; if
   the enqueue failed, or the partition found a duplicate (by delivery id: then this body is
   not what got queued), the pending claim is given back (only if still ours).

A process that dies between 1 and 3 leaves the pending claim for ``PENDING_MS``: the
sender's retries get 503 until then, and after it a replay into the same partition is still
caught there. Events without a ``replay_id`` skip all this (no extra round trip).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

log = structlog.get_logger(__name__)
PENDING = "pending:"
PENDING_MS = 10_000
# How long a request waits for an identical one being queued before answering 503.
WAIT_ROUNDS = 10
WAIT_SECONDS = 0.02

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class ReplayInFlight(Exception):
    """An identical signed request is being queued at this moment; retry shortly."""


@dataclass(frozen=True, slots=True)
class Claim:
    key: str
    event_id: str
    window_ms: int


class ReplayClaims:
    def __init__(self, redis: Redis, *, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix
        self._release = redis.register_script(_RELEASE)

    def claim_for(self, source: str, replay_id: str, event_id: str, window_ms: int) -> Claim:
        digest = hashlib.sha256(f"{source}\0{replay_id}".encode()).hexdigest()[:32]
        return Claim(f"{self.prefix}:replays:{digest}", event_id, window_ms)

    async def take(self, claims: Sequence[Claim]) -> list[str | ReplayInFlight | None]:
        """One pipelined round trip (more only when some are held). Per claim: None when it
        is now ours; the event id of the request that holds it; or ``ReplayInFlight`` when
        an identical request is still being queued after a short wait (it usually takes one
        round trip: a concurrent redelivery is then answered as its duplicate)."""
        if not claims:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for claim in claims:
                pipe.set(claim.key, PENDING + claim.event_id, nx=True, px=PENDING_MS)
            taken = await pipe.execute()
        out: list[str | ReplayInFlight | None] = [None] * len(claims)
        waiting = [i for i, ok in enumerate(taken) if not ok]
        for attempt in range(WAIT_ROUNDS):
            if attempt:
                await asyncio.sleep(WAIT_SECONDS)
            async with self.redis.pipeline(transaction=False) as pipe:
                for i in waiting:
                    pipe.get(claims[i].key)
                values = await pipe.execute()
            still = []
            for i, value in zip(waiting, values, strict=True):
                text = value.decode() if isinstance(value, bytes) else value
                if text is None or text.startswith(PENDING):
                    still.append(i)  # being queued (or given back a moment ago)
                else:
                    out[i] = text
            waiting = still
            if not waiting:
                break
        for i in waiting:
            out[i] = ReplayInFlight("an identical signed request is being queued now")
        return out

    async def settle(self, settled: Sequence[tuple[Claim, str | None]]) -> None:
        """For each claim taken: the event id it was queued as, or None when it was not
        queued (the claim is given back if still ours).

        Never raises: the events are queued (or were refused) whatever happens here. A claim
        that could not be settled stays pending until ``PENDING_MS``."""
        if not settled:
            return
        try:
            queued = [(claim, event_id) for claim, event_id in settled if event_id is not None]
            if queued:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for claim, queued_as in queued:
                        pipe.set(claim.key, queued_as, px=claim.window_ms)
                    await pipe.execute()
            for claim, event_id in settled:  # failures only: rare, one call each
                if event_id is None:
                    await self._release(keys=[claim.key], args=[PENDING + claim.event_id])
        except (RedisError, OSError) as exc:
            log.warning("replay_claims_unsettled", claims=len(settled), error=type(exc).__name__)
