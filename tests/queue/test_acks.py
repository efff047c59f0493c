"""``ReplicaAck.verdict``: what the replies of WAIT and WAITAOF mean, without a server (the
WAIT path runs against a real replica in ``tests/ingest/test_replica_ack.py``; WAITAOF needs
Redis 7.2, which this machine does not have)."""

from __future__ import annotations

from redis.exceptions import ResponseError

from app.queue.acks import ReplicaAck


def test_enough_replicas_and_an_fsynced_aof_are_reached() -> None:
    assert ReplicaAck(replicas=2, timeout_ms=100).verdict([2]) is None
    assert ReplicaAck(replicas=1, timeout_ms=100, aof=True).verdict([3, [1, 0]]) is None
    assert ReplicaAck(replicas=0, timeout_ms=100, aof=True).verdict([[1, 0]]) is None


def test_too_few_replicas_or_no_fsync_is_a_shortfall_that_says_which() -> None:
    short = ReplicaAck(replicas=2, timeout_ms=100).verdict([1])
    assert short is not None and "1 of 2 replicas" in str(short)

    unsynced = ReplicaAck(replicas=1, timeout_ms=100, aof=True).verdict([1, [0, 0]])
    assert unsynced is not None and "did not fsync" in str(unsynced)
    assert "replicas" not in str(unsynced)


def test_a_wait_that_failed_is_a_shortfall_too() -> None:
    unknown = ResponseError("ERR unknown command 'WAITAOF'")
    failed = ReplicaAck(replicas=1, timeout_ms=100, aof=True).verdict([1, unknown])
    assert failed is not None and "unknown command" in str(failed)
