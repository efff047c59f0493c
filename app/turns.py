"""Requests made during one turn of the event loop, handled together.

Callers that reach the same kind of round trip at about the same moment (the events of one
read reach their calls, and end, together) share it: ``Turn.submit`` queues the item, and
at the next turn of the loop every item queued meanwhile goes to ``handle`` at once, in one
task. ``handle`` resolves each item's future (a result, or that caller's error); whatever
ends that task, no caller is left waiting. A caller cancelled does not cancel the others:
their items are handled all the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class Turn(Generic[Item, Result]):
    def __init__(
        self,
        handle: Callable[[list[tuple[Item, asyncio.Future[Result]]]], Coroutine[Any, Any, None]],
    ) -> None:
        self.handle = handle
        # Per event loop: a loop that stopped before its turn's handling must not keep the
        # callers of another loop (a thread's, or the next ``asyncio.run``) from theirs.
        self._waiting: dict[asyncio.AbstractEventLoop, list[tuple[Item, asyncio.Future[Result]]]]
        self._waiting = {}
        self._handling: set[asyncio.Task[None]] = set()

    async def submit(self, item: Item) -> Result:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Result] = loop.create_future()
        done.add_done_callback(_retrieved)  # a caller that stopped waiting reads nothing
        waiting = self._waiting.get(loop)
        if waiting is None:
            waiting = self._waiting[loop] = []
            loop.call_soon(self._start, loop)
        waiting.append((item, done))
        return await asyncio.shield(done)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        batch = self._waiting.pop(loop, [])
        task = loop.create_task(self.handle(batch))
        self._handling.add(task)
        task.add_done_callback(lambda ended: self._ended(ended, batch))

    def _ended(
        self, task: asyncio.Task[None], batch: list[tuple[Item, asyncio.Future[Result]]]
    ) -> None:
        self._handling.discard(task)
        failure = None if task.cancelled() else task.exception()
        for _, done in batch:
            if done.done():
                continue
            if task.cancelled():  # the loop is shutting down
                done.cancel()
            else:
                done.set_exception(failure or RuntimeError("handled without an answer for it"))


def _retrieved(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()
