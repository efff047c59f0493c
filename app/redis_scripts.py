"""Several Lua scripts in one Redis round trip.

A decided event's bookkeeping is a few small scripts on different keys (the rate limit, the
breaker, the budget). Each alone is a round trip, and on the gateway's hot path a round trip
costs more CPU than the script. ``run_scripts`` sends them in one non-transactional
pipeline, as ``EVALSHA``: redis-py's own pipelined scripts first ask ``SCRIPT EXISTS``, one
more round trip each time. A script Redis does not know (after a restart or a
``SCRIPT FLUSH``) is run again on its own, which loads it; the others are not run twice.
On a Redis Cluster the pipeline sends each script to its key's node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError


@dataclass(frozen=True, slots=True)
class ScriptCall:
    script: AsyncScript
    keys: Sequence[str]
    args: Sequence[Any]

    async def run(self) -> Any:
        return await self.script(keys=list(self.keys), args=list(self.args))


async def run_scripts(calls: Sequence[ScriptCall]) -> list[Any]:
    """Each call's reply, in order. An error reply raises (the first one), after every
    other script has run."""
    if len(calls) == 1:
        return [await calls[0].run()]
    client = calls[0].script.registered_client
    if any(call.script.registered_client is not client for call in calls):
        return [await call.run() for call in calls]
    async with client.pipeline(transaction=False) as pipe:
        for call in calls:
            # Not ``pipe.evalsha``: a cluster pipeline refuses that method, not the command.
            pipe.execute_command("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
        replies = await pipe.execute(raise_on_error=False)
    results: list[Any] = []
    for call, reply in zip(calls, replies, strict=True):
        if isinstance(reply, NoScriptError):
            reply = await call.run()  # loads the script, then runs it
        results.append(reply)
    for reply in results:
        if isinstance(reply, Exception):
            raise reply
    return results
