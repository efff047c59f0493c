"""Time limits for body reads: one timer for all the reads of a process, not one per request.

``asyncio.timeout`` arms and cancels a timer per use (about 5 µs a request on uvloop, several
percent of ingest's CPU), while nearly every webhook's body has arrived with its head and
is read without waiting. Here a read only registers its task and deadline (``start``) and
forgets them (``finish``). Every read gets the same number of seconds, so the registry,
in insertion order, is in deadline order: one timer, armed for the oldest read's deadline
and re-armed only when it fires, cancels the reads whose time is up (``cut``); the read
turns that cancellation into its timeout. A completed read never touches the timer.
"""

from __future__ import annotations

import asyncio
from typing import Any


class ReadDeadlines:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._reads: dict[asyncio.Task[Any], float] = {}  # oldest first = soonest first
        self._cut: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> asyncio.Task[Any]:
        """Register the current task's read; ``finish`` it whatever happens."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a body read runs in a task")
        loop = task.get_loop()
        if loop is not self._loop:  # a new event loop (tests): the old one's timer is gone
            self._loop, self._timer = loop, None
            self._reads.clear()
            self._cut.clear()
        deadline = loop.time() + self.seconds
        self._reads[task] = deadline
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._check)
        return task

    def finish(self, task: asyncio.Task[Any]) -> None:
        self._reads.pop(task, None)
        self._cut.discard(task)

    def timed_out(self, task: asyncio.Task[Any]) -> bool:
        """Whether the ``CancelledError`` a read caught is its deadline's and nothing else's:
        then the cancellation is taken back. A cancel from elsewhere too (shutdown) stays."""
        if task not in self._cut:
            return False
        self._cut.discard(task)
        return task.uncancel() == 0

    def _check(self) -> None:
        self._timer = None
        loop = self._loop
        if loop is None:
            return
        now = loop.time()
        for task, deadline in self._reads.items():
            if deadline > now:
                self._timer = loop.call_at(deadline, self._check)
                return
            if task not in self._cut:
                self._cut.add(task)
                task.cancel()
        # Every read left is cut (each finishes at its next step); a later read re-arms.

    @property
    def pending(self) -> int:
        """Reads registered and not finished (tests)."""
        return len(self._reads)
