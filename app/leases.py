"""Leases held in Redis, and the names of their keys: one place for both.

A lease is a key whose value names its holder: taken with ``SET NX PX``, renewed by its holder
only (compare-and-extend), given back by its holder only (compare-and-delete), and gone on
its own ``ttl`` after the last renewal when its holder dies. Partition leases
(``app/queue/leases.py``) and the relay lease (``app/publish/coordination.py``) both use
these scripts; the relay's shard leases (``app/publish/shards.py``) follow the same rules in
scripts of their own. Partition keys carry the partition's hash tag (``{p7}``), so the queue's
scripts that read a lease touch one Redis Cluster slot.
"""

from __future__ import annotations

from redis.asyncio import Redis

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class LeaseScripts:
    def __init__(self, redis: Redis) -> None:
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)

    async def renew(self, key: str, *, holder: str, ttl_ms: int) -> bool:
        """Extend the lease while ``holder`` holds it; False when it does not (any more)."""
        return bool(await self._renew(keys=[key], args=[holder, ttl_ms]))

    async def release(self, key: str, *, holder: str) -> None:
        """Give the lease back, only if ``holder`` still holds it."""
        await self._release(keys=[key], args=[holder])


def partition_lease_key(prefix: str, partition: int) -> str:
    return f"{prefix}:{{p{partition}}}:lease"


def partition_epoch_key(prefix: str, partition: int) -> str:
    return f"{prefix}:{{p{partition}}}:epoch"


def members_key(prefix: str) -> str:
    """The processes taking part in the partition leases, with their last heartbeat."""
    return f"{prefix}:members"


def relay_lease_key(prefix: str) -> str:
    return f"{prefix}:relay-lease"


# The sharded relays' keys share the ``{relay}`` hash tag: their scripts touch one Cluster slot.
def relay_members_key(prefix: str) -> str:
    """The relay processes taking part in the shard leases, with their last heartbeat."""
    return f"{prefix}:{{relay}}:members"


def relay_layout_key(prefix: str) -> str:
    """The shard count the live relays use."""
    return f"{prefix}:{{relay}}:shards"


def relay_shard_key(prefix: str, shard: int) -> str:
    return f"{prefix}:{{relay}}:shard:{shard}"
