"""Key-ordered concurrency: a FIFO lane per key, at most one in-flight item per key.

Different keys run in parallel up to ``concurrency``; a key waits only for its own earlier
items (Confluent Parallel Consumer's KEY mode). A key is on the ready queue at most once, so
no two runners ever hold the same key.

A failing item stays at the head of its lane (that is what keeps per-key order when
processing fails) and is tried again after a backoff, but its runner does not sleep: it lets
the key go and takes other keys meanwhile, so failing keys never hold the concurrency that
healthy keys need. A runner that dies holding a key (its supervisor restarts it) puts the key
back on the ready queue first.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import structlog

from app.supervision import Supervised, Supervisor

T = TypeVar("T")
log = structlog.get_logger(__name__)


class KeyOrderedDispatcher(Generic[T]):
    def __init__(
        self,
        handler: Callable[[T], Awaitable[None]],
        *,
        concurrency: int,
        max_buffered: int,
        retry_delay: float = 1.0,
        max_retry_delay: float = 30.0,
    ) -> None:
        self._handler = handler
        self._concurrency = concurrency
        self._lanes: dict[str, deque[T]] = {}
        self._ready: asyncio.Queue[str] = asyncio.Queue()
        self._max_buffered = max_buffered
        self._room = asyncio.Semaphore(max_buffered)
        self._idle = asyncio.Event()
        self._idle.set()
        self._buffered = 0
        self._retry_delay = retry_delay
        self._max_retry_delay = max_retry_delay
        # key → failures of its head item in a row; timers that put a failed key back.
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._runners: list[Supervised] = []

    @property
    def buffered(self) -> int:
        return self._buffered

    def start(self, supervisor: Supervisor) -> None:
        self._runners = [
            supervisor.start(f"dispatch-{i}", self._run) for i in range(self._concurrency)
        ]

    async def submit(self, key: str, item: T) -> None:
        """Queue ``item`` behind earlier items of ``key``; waits while the buffer is full."""
        await self._room.acquire()
        self._buffered += 1
        self._idle.clear()
        lane = self._lanes.get(key)
        if lane is None:
            self._lanes[key] = deque([item])
            self._ready.put_nowait(key)
        else:
            lane.append(item)

    def free_slots(self) -> int:
        return self._max_buffered - self._buffered

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def stop(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        await asyncio.gather(*(runner.stop() for runner in self._runners))
        self._runners = []

    async def _run(self) -> None:
        while True:
            key = await self._ready.get()
            lane = self._lanes[key]
            try:
                done = await self._attempt(key, lane[0])
            except BaseException:
                self._ready.put_nowait(key)  # the item stays first in its lane, for another runner
                raise
            if not done:
                continue  # a timer puts the key back on the ready queue
            lane.popleft()
            self._buffered -= 1
            self._room.release()
            if lane:
                self._ready.put_nowait(key)
            else:
                del self._lanes[key]
                if not self._lanes:
                    self._idle.set()

    async def _attempt(self, key: str, item: T) -> bool:
        """True when the item is done; False when it failed and waits for its retry."""
        try:
            await self._handler(item)
        except asyncio.CancelledError:
            raise
        except Exception:
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
            delay = random.uniform(0, min(self._max_retry_delay, self._retry_delay * 2**failures))
            log.exception("dispatch_failed", key=key, failures=failures, retry_in=round(delay, 2))
            self._timers[key] = asyncio.get_running_loop().call_later(delay, self._retry, key)
            return False
        self._failures.pop(key, None)
        return True

    def _retry(self, key: str) -> None:
        self._timers.pop(key, None)
        if key in self._lanes:
            self._ready.put_nowait(key)
