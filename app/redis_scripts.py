"""Lua scripts in as few Redis round trips as the callers allow.

A decided event's bookkeeping is a few small scripts on different keys (the breaker, the
rate limit, the budget, the stream's ack). Each alone is a round trip, and on the gateway's
hot path a round trip costs more CPU than the script. ``run_scripts`` sends the scripts of
one caller, and those every other caller asked for in the same turn of the event loop, in
one non-transactional pipeline, as ``EVALSHA`` (redis-py's own pipelined scripts first ask
``SCRIPT EXISTS``, one more round trip each time). On a Redis Cluster each caller's scripts
go in a pipeline of their own (a turn's would span the nodes, and fail for every caller of
it while one master is down). Each caller gets its own replies, or its
first error reply raised, after every script of the pipeline has run; a connection error
fails every caller of that pipeline. A script Redis does not know (after a restart or a
``SCRIPT FLUSH``) is run again on its own, which loads it; the others are not run twice.
A cluster pipeline sends each script to its key's node.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from app.turns import Turn


@dataclass(frozen=True, slots=True)
class ScriptCall:
    script: AsyncScript
    keys: Sequence[str]
    args: Sequence[Any]

    async def run(self) -> Any:
        return await self.script(keys=list(self.keys), args=list(self.args))


async def run_scripts(calls: Sequence[ScriptCall], *, raise_on_error: bool = True) -> list[Any]:
    """Each call's reply, in order. An error reply raises (the first one), after every
    other script has run; with ``raise_on_error=False`` it is returned in its place, so a
    caller knows what the scripts that did run took."""
    replies = await _replies(calls)
    return _raised(replies) if raise_on_error else replies


async def _replies(calls: Sequence[ScriptCall]) -> list[Any]:
    if not calls:
        return []
    client = calls[0].script.registered_client
    if any(call.script.registered_client is not client for call in calls):
        return [await _run(call) for call in calls]
    if isinstance(client, RedisCluster):
        # One pipeline per caller: a turn's pipeline spans nodes, and one master down would
        # fail it for every caller of the turn, those whose keys live elsewhere too.
        return await _pipelined(calls)
    loop = asyncio.get_running_loop()
    turns = _TURNS.setdefault(client, weakref.WeakKeyDictionary())
    turn: Turn[Sequence[ScriptCall], list[Any]] | None = turns.get(loop)
    if turn is None:
        turn = turns[loop] = Turn(_send)
    return await turn.submit(calls)


async def _send(turn: list[tuple[Sequence[ScriptCall], asyncio.Future[list[Any]]]]) -> None:
    """One turn's scripts (all on one client) in one pipeline; each caller its replies."""
    replies = await _pipelined([call for mine, _ in turn for call in mine])
    at = 0
    for mine, done in turn:
        results = replies[at : at + len(mine)]
        at += len(mine)
        if not done.done():
            done.set_result(results)  # error replies in place: ``run_scripts`` raises them


async def _pipelined(calls: Sequence[ScriptCall]) -> list[Any]:
    """The replies (error replies as exceptions) of ``calls``, all on one client, sent in one
    pipeline; a script Redis did not know is loaded and run again on its own."""
    client = calls[0].script.registered_client
    async with client.pipeline(transaction=False) as pipe:
        for call in calls:
            # Not ``pipe.evalsha``: a cluster pipeline refuses that method, not the command.
            pipe.execute_command("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
        replies = await pipe.execute(raise_on_error=False)
    results: list[Any] = []
    for call, reply in zip(calls, replies, strict=True):
        if isinstance(reply, NoScriptError):
            reply = await _run(call)  # loads the script, then runs it
        results.append(reply)
    return results


async def _run(call: ScriptCall) -> Any:
    """The call's reply, or its error."""
    try:
        return await call.run()
    except Exception as exc:  # noqa: BLE001 - its caller's, raised there
        return exc


def _raised(replies: list[Any]) -> list[Any]:
    """The replies, or the first error among them raised."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


# Per client (weakly: no client is kept alive by it) and per event loop.
_TURNS: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, Turn[Any, Any]]] = (
    weakref.WeakKeyDictionary()
)
