"""Lua scripts in as few Redis round trips as the callers allow.

A decided event's bookkeeping is a few small scripts on different keys (the breaker, the
rate limit, the budget, the stream's ack). Each alone is a round trip, and on the gateway's
hot path a round trip costs more CPU than the script. ``run_scripts`` sends the scripts of
one caller, and those every other caller asked for in the same turn of the event loop, in
one non-transactional pipeline, as ``EVALSHA`` (redis-py's own pipelined scripts first ask
``SCRIPT EXISTS``, one more round trip each time). Each caller gets its own replies, or its
first error reply raised, after every script of the pipeline has run; a connection error
fails every caller of that pipeline. A script Redis does not know (after a restart or a
``SCRIPT FLUSH``) is run again on its own, which loads it; the others are not run twice.
On a Redis Cluster the pipeline sends each script to its key's node.
"""

from __future__ import annotations

import asyncio
import weakref
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
    if not calls:
        return []
    client = calls[0].script.registered_client
    if any(call.script.registered_client is not client for call in calls):
        return [await call.run() for call in calls]
    loop = asyncio.get_running_loop()
    batchers = _BATCHERS.setdefault(client, weakref.WeakKeyDictionary())
    batcher = batchers.get(loop)
    if batcher is None:
        batcher = batchers[loop] = _Turn()
    return await batcher.run(calls)


Waiting = list[tuple[Sequence[ScriptCall], "asyncio.Future[list[Any]]"]]


class _Turn:
    """The scripts asked for on one client in one turn of the event loop."""

    def __init__(self) -> None:
        # No reference to the client (the registry above is weak on it): each call names it.
        self.waiting: Waiting = []
        self.sending: set[asyncio.Task[None]] = set()

    async def run(self, calls: Sequence[ScriptCall]) -> list[Any]:
        loop = asyncio.get_running_loop()
        replies: asyncio.Future[list[Any]] = loop.create_future()
        replies.add_done_callback(_retrieved)  # a caller that stopped waiting reads nothing
        if not self.waiting:
            loop.call_soon(self._send_turn)
        self.waiting.append((calls, replies))
        # A caller cancelled does not cancel the others' scripts.
        return await asyncio.shield(replies)

    def _send_turn(self) -> None:
        turn, self.waiting = self.waiting, []
        task = asyncio.get_running_loop().create_task(self._send(turn))
        self.sending.add(task)
        task.add_done_callback(lambda done: self._sent(done, turn))

    async def _send(self, turn: Waiting) -> None:
        calls = [call for mine, _ in turn for call in mine]
        client = calls[0].script.registered_client
        async with client.pipeline(transaction=False) as pipe:
            for call in calls:
                # Not ``pipe.evalsha``: a cluster pipeline refuses that method, not the command.
                pipe.execute_command(
                    "EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args
                )
            replies = await pipe.execute(raise_on_error=False)
        at = 0
        for mine, done in turn:
            results = []
            for call, reply in zip(mine, replies[at : at + len(mine)], strict=True):
                if isinstance(reply, NoScriptError):
                    try:
                        reply = await call.run()  # loads the script, then runs it
                    except Exception as exc:  # noqa: BLE001 - this caller's, raised there
                        reply = exc
                results.append(reply)
            at += len(mine)
            errors = [reply for reply in results if isinstance(reply, Exception)]
            if done.done():
                continue
            if errors:
                done.set_exception(errors[0])
            else:
                done.set_result(results)

    def _sent(self, task: asyncio.Task[None], turn: Waiting) -> None:
        """No caller is left waiting, whatever ended the pipeline (a connection error fails
        every caller of it)."""
        self.sending.discard(task)
        failure = None if task.cancelled() else task.exception()
        for _, done in turn:
            if done.done():
                continue
            if failure is None:
                done.cancel()
            else:
                done.set_exception(failure)


def _retrieved(done: asyncio.Future[list[Any]]) -> None:
    if not done.cancelled():
        done.exception()


_BATCHERS: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, _Turn]] = (
    weakref.WeakKeyDictionary()
)
