"""How much an enqueue is acknowledged before ingest answers 2xx (``ReplicaAck``).

By default a 2xx means the event is in the primary's memory: with ``appendfsync everysec`` a
crash of the primary can still lose about the last second of them. With ``replicas`` > 0
each enqueue round trip ends with ``WAIT replicas timeout``, in the same pipeline, so on the
connection that wrote (WAIT counts the replicas that acknowledged *that connection's* writes);
with ``aof``, ``WAITAOF 1 0 timeout`` too (Redis 7.2+: fsynced to the primary's AOF).

Invariants:
- Fewer acknowledgements than asked within the timeout fail every caller of the round trip
  with ``NotReplicated``; their events stay queued on the primary (and will be processed),
  only the promise was not reached.
- A round trip whose events were all duplicates wrote nothing, and WAIT is documented for
  "the previous write commands"; it still covers their first copies, written by other
  connections: Redis records a connection's replication offset after every command, reads
  included, so the wait is for everything the primary had when the duplicate was found
  (``tests/ingest/test_replica_ack.py`` sends the retry through another process). A retry
  after a 503 is thus answered ``duplicate`` only once its event has the same promise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline


class NotReplicated(Exception):
    """An enqueue ran on the primary, but the acknowledgement asked for did not come."""


class AckUnsupported(Exception):
    """The acknowledgement asked for cannot be given here; the process refuses to start."""


@dataclass(frozen=True, slots=True)
class ReplicaAck:
    replicas: int
    timeout_ms: int
    aof: bool = False

    def request(self, pipe: Pipeline) -> None:
        """Append the waits, after the pipeline's enqueues."""
        if self.replicas > 0:
            pipe.wait(self.replicas, self.timeout_ms)
        if self.aof:
            pipe.waitaof(1, 0, self.timeout_ms)

    def verdict(self, replies: list[Any]) -> NotReplicated | None:
        """None when the replies of ``request`` show the acknowledgement reached."""
        missing: list[str] = []
        for reply in replies:
            if isinstance(reply, BaseException):
                missing.append(f"the wait failed ({reply})")
        if missing:
            return NotReplicated("; ".join(missing))
        waits = iter(replies)
        if self.replicas > 0 and (acked := int(next(waits))) < self.replicas:
            missing.append(
                f"{acked} of {self.replicas} replicas acknowledged it within {self.timeout_ms} ms"
            )
        if self.aof and int(next(waits)[0]) < 1:
            missing.append(f"the primary did not fsync its AOF within {self.timeout_ms} ms")
        return NotReplicated("; ".join(missing)) if missing else None


async def check_ack_support(redis: Redis, ack: ReplicaAck) -> None:
    """At start-up: ``AckUnsupported`` when the server cannot give ``ack.aof`` (no WAITAOF
    before Redis 7.2, or AOF off), rather than answering 2xx with less than promised."""
    if not ack.aof:
        return
    # "COMMAND INFO" as one word: redis-py's reply parser for COMMAND fails on an unknown one.
    (found,) = await redis.execute_command("COMMAND INFO", "WAITAOF")  # type: ignore[no-untyped-call]
    if not found:
        raise AckUnsupported(
            "EVENTGATE_REDIS_ACK_AOF needs WAITAOF (Redis 7.2 or later); this server has no"
            " such command: upgrade Redis or unset EVENTGATE_REDIS_ACK_AOF"
        )
    persistence = await redis.info("persistence")
    if not int(persistence.get("aof_enabled", 0)):
        raise AckUnsupported("EVENTGATE_REDIS_ACK_AOF needs the server's AOF on (appendonly yes)")


async def replicas_online(redis: Redis, wanted: int) -> str:
    """``/readyz``: "ok" while the primary has at least ``wanted`` replicas in sync."""
    info = await redis.info("replication")
    online = sum(
        1
        for key, value in info.items()
        if key.startswith("slave") and isinstance(value, dict) and value.get("state") == "online"
    )
    if online >= wanted:
        return "ok"
    return f"{online} of {wanted} replicas online: every webhook would be answered 503"
