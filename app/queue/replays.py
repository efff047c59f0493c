"""A signed request's identity, claimed across partitions before it is queued.

An event's dedup keys live in its partition (one hash tag with the stream, so one Lua call
checks them and queues the event). But the partition follows the group key, and where an
unsigned header picks the group key (GitHub's ``X-GitHub-Event``, a binary CloudEvent's
``ce-subject``) a captured signed request, relabelled, lands in another partition whose keys
never saw it. So an event with a ``replay_id`` (a digest of what its signature covers) is
also remembered source-wide, for the dedup window, in ``{prefix}:replays:<digest>``. On one
Redis that key is simply the enqueue script's second dedup key (``streams.ENQUEUE``): checked
and set in its atomic step. In a Redis Cluster a script may touch one slot only, so the key
(its own slot) is a claim taken first, with ``SET NX``, naming the event and the partition
key that will prove it queued (the partition's own replay key, which its enqueue script
sets):

- claimed → the partition's enqueue script runs as before (its own dedup keys included);
- held, and the holder's proof key names the holder → a duplicate of that event;
- held, no proof yet → the holder is being queued right now: wait for it (about 0.2 s at
  most); still no proof → it never was queued (its enqueue failed, or found a duplicate by
  delivery id, or its process died): take the claim over (compare-and-set) and go on.

No second round trip to confirm a claim: one pipelined ``SET NX`` per batch is the whole cost
on the common path. An enqueue that fails, or finds a duplicate by delivery id, gives its
claim back at once (rare); one that finds this very request already queued in its partition
(a slow first request whose claim it took over) makes the claim name that event. If two
identical requests race and the first one's enqueue takes longer than the wait, both may be
queued, each in its partition (the sender's own retries land in the same partition, where
its dedup keys catch them).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
from redis.asyncio import Redis

from app.faults import REDIS_ERRORS

log = structlog.get_logger(__name__)
# How long a request waits for an identical one being queued before taking its claim over.
WAIT_ROUNDS = 10
WAIT_SECONDS = 0.02

# Compare-and-set / compare-and-delete of one claim (one key: one slot).
_SWAP = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then return redis.call('DEL', KEYS[1]) end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""


class ReplayInFlight(Exception):
    """An identical signed request holds the claim and could not be waited for."""


@dataclass(frozen=True, slots=True)
class Claim:
    key: str
    event_id: str
    window_ms: int
    proof_key: str  # the partition's replay key: it names the event once queued

    @property
    def value(self) -> str:
        return f"{self.event_id} {self.proof_key}"


class ReplayClaims:
    def __init__(self, redis: Redis, *, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix
        self._swap = redis.register_script(_SWAP)

    def claim_key(self, source: str, replay_id: str) -> str:
        digest = hashlib.sha256(f"{source}\0{replay_id}".encode()).hexdigest()[:32]
        return f"{self.prefix}:replays:{digest}"

    async def take(self, claims: Sequence[Claim]) -> list[str | ReplayInFlight | None]:
        """One pipelined round trip (more only when some are held). Per claim: None when it
        is now ours; the event id of the request that holds it (a duplicate); or
        ``ReplayInFlight`` when the claim moved under us while taking it over."""
        if not claims:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for claim in claims:
                pipe.set(claim.key, claim.value, nx=True, px=claim.window_ms)
            taken = await pipe.execute()
        out: list[str | ReplayInFlight | None] = [None] * len(claims)
        held = [i for i, ok in enumerate(taken) if not ok]
        if held:
            for i, answer in zip(held, await self._held([claims[i] for i in held]), strict=True):
                out[i] = answer
        return out

    async def _held(self, claims: list[Claim]) -> list[str | ReplayInFlight | None]:
        answers: list[str | ReplayInFlight | None] = [None] * len(claims)
        holders: list[str | None] = [None] * len(claims)
        waiting = list(range(len(claims)))
        for attempt in range(WAIT_ROUNDS):
            if attempt:
                await asyncio.sleep(WAIT_SECONDS)
            async with self.redis.pipeline(transaction=False) as pipe:
                for i in waiting:
                    pipe.get(claims[i].key)
                values = await pipe.execute()
            proofs: list[tuple[int, str, str]] = []
            for i, value in zip(waiting, values, strict=True):
                text = value.decode() if isinstance(value, bytes) else value
                holders[i] = text
                if text is not None:
                    holder, _, proof_key = text.partition(" ")
                    proofs.append((i, holder, proof_key))
            async with self.redis.pipeline(transaction=False) as pipe:
                for _, _, proof_key in proofs:
                    pipe.get(proof_key)
                proven = await pipe.execute() if proofs else []
            settled = set()
            for (i, holder, _), proof in zip(proofs, proven, strict=True):
                if (proof.decode() if isinstance(proof, bytes) else proof) == holder:
                    answers[i] = holder  # queued: this one is its duplicate
                    settled.add(i)
            waiting = [i for i in waiting if i not in settled]
            if not waiting:
                return answers
        # Never proven queued: take the claims over, unless they moved meanwhile.
        for i in waiting:
            claim = claims[i]
            expected = holders[i]
            if expected is None:
                ok = await self.redis.set(claim.key, claim.value, nx=True, px=claim.window_ms)
            else:
                ok = await self._swap(
                    keys=[claim.key], args=[expected, claim.value, claim.window_ms]
                )
            if not ok:
                answers[i] = ReplayInFlight("an identical signed request is being queued now")
        return answers

    async def settle(self, claims: Sequence[tuple[Claim, str | None]]) -> None:
        """Claims whose events were not queued, if still theirs: given back (None: the
        enqueue failed, or found a duplicate by delivery id), or made to name the event that
        their partition already holds for this request (its proof key names it), so later
        copies are its duplicates. Never raises: a claim left behind is taken over by the
        next identical request after its short wait."""
        try:
            for claim, queued_as in claims:
                if queued_as is None:
                    await self._swap(keys=[claim.key], args=[claim.value, "", 0])
                else:
                    named = f"{queued_as} {claim.proof_key}"
                    await self._swap(keys=[claim.key], args=[claim.value, named, claim.window_ms])
        except REDIS_ERRORS as exc:
            log.warning("replay_claims_not_settled", claims=len(claims), error=type(exc).__name__)
