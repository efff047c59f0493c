"""Key-ordered concurrency: a FIFO lane per key, at most one in-flight item per key.

Different keys run in parallel up to ``concurrency``; a key waits only for its own earlier
items (Confluent Parallel Consumer's KEY mode). A key is on the ready queue at most once, so
no two runners ever hold the same key. A failing item is retried in place after a pause: its
lane does not move on, which is what keeps per-key order when processing fails.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import structlog

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
        self._room = asyncio.Semaphore(max_buffered)
        self._idle = asyncio.Event()
        self._idle.set()
        self._buffered = 0
        self._retry_delay = retry_delay
        self._max_retry_delay = max_retry_delay
        self._runners: list[asyncio.Task[None]] = []

    @property
    def buffered(self) -> int:
        return self._buffered

    def start(self) -> None:
        self._runners = [
            asyncio.create_task(self._run(), name=f"dispatch-{i}") for i in range(self._concurrency)
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
        return self._room._value

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def stop(self) -> None:
        for task in self._runners:
            task.cancel()
        await asyncio.gather(*self._runners, return_exceptions=True)
        self._runners = []

    async def _run(self) -> None:
        while True:
            key = await self._ready.get()
            lane = self._lanes[key]
            await self._handle(key, lane[0])
            lane.popleft()
            self._buffered -= 1
            self._room.release()
            if lane:
                self._ready.put_nowait(key)
            else:
                del self._lanes[key]
                if not self._lanes:
                    self._idle.set()

    async def _handle(self, key: str, item: T) -> None:
        failures = 0
        while True:
            try:
                await self._handler(item)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                delay = random.uniform(
                    0, min(self._max_retry_delay, self._retry_delay * 2**failures)
                )
                log.exception(
                    "dispatch_failed", key=key, failures=failures, retry_in=round(delay, 2)
                )
                await asyncio.sleep(delay)
