"""Supervised background loops: none of them stops silently.

A loop (the worker's read loop, the lease keeper, a dispatch runner, the relay, retention, the
backlog refresher) runs under ``Supervisor.start``. Each run is its own asyncio task, so any end
the supervisor did not ask for is seen the same way: an exception (logged with its traceback),
a normal return while the loop's ``until`` condition is false, or a cancel that came from below
(a library that cancelled or swallowed the wrong thing). The loop is then marked down, which
``/readyz`` reports as 503, and restarted after a backoff (doubling, capped); it is marked up
again as soon as it runs.

Stopping is explicit: ``Supervised.stop()`` cancels the current run and waits for it; a loop
whose ``until()`` is true may also end by returning.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from app.observability.metrics import TASK_RESTARTS, TASK_UP

log = structlog.get_logger(__name__)
Loop = Callable[[], Awaitable[None]]


@dataclass(eq=False)
class Supervised:
    """One supervised loop; ``current`` is the task of its current run."""

    name: str
    keeper: asyncio.Task[None] | None = None
    current: asyncio.Task[None] | None = None
    restarts: int = 0
    down_reason: str | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def stop(self) -> None:
        """Cancel the loop (its current run included) and wait until it has ended."""
        if self.keeper is not None and not self.keeper.done():
            self.keeper.cancel()
            await asyncio.wait({self.keeper})
        self.ended.set()

    async def wait(self) -> None:
        """Wait until the loop has ended on its own (``until()`` true) or was stopped."""
        await self.ended.wait()


class Supervisor:
    def __init__(
        self,
        *,
        restart_seconds: float = 1.0,
        max_restart_seconds: float = 30.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.restart_seconds = restart_seconds
        self.max_restart_seconds = max_restart_seconds
        self.sleep = sleep
        self.loops: dict[str, Supervised] = {}

    def start(self, name: str, run: Loop, *, until: Callable[[], bool] | None = None) -> Supervised:
        """Run ``run()`` for ever (or until it returns while ``until()`` is true)."""
        if name in self.loops and not self.loops[name].ended.is_set():
            raise ValueError(f"a loop named {name!r} is already running")
        handle = Supervised(name)
        self.loops[name] = handle
        handle.keeper = asyncio.create_task(self._keep(handle, run, until), name=f"{name}:keeper")
        return handle

    def down(self) -> dict[str, str]:
        """Loops that ended unexpectedly and are waiting to be restarted: name → why."""
        return {
            name: handle.down_reason
            for name, handle in self.loops.items()
            if handle.down_reason is not None
        }

    async def stop_all(self) -> None:
        await asyncio.gather(*(handle.stop() for handle in list(self.loops.values())))

    async def _keep(self, handle: Supervised, run: Loop, until: Callable[[], bool] | None) -> None:
        loop = asyncio.get_running_loop()
        delay = self.restart_seconds
        try:
            while True:
                current = asyncio.create_task(_as_coroutine(run), name=handle.name)
                handle.current = current
                handle.down_reason = None
                TASK_UP.labels(task=handle.name).set(1)
                started = loop.time()
                try:
                    await asyncio.wait({current})
                except asyncio.CancelledError:
                    await _cancel_until_done(current)
                    raise
                reason = self._why_ended(handle.name, current)
                if reason is None:
                    if until is not None and until():
                        return
                    reason = "returned while it should still run"
                if loop.time() - started > self.max_restart_seconds:
                    delay = self.restart_seconds  # it ran well for a while: start over
                handle.down_reason = reason
                handle.restarts += 1
                TASK_UP.labels(task=handle.name).set(0)
                TASK_RESTARTS.labels(task=handle.name).inc()
                log.error(
                    "task_restarting", task=handle.name, reason=reason, retry_in=round(delay, 2)
                )
                await self.sleep(delay)
                delay = min(delay * 2, self.max_restart_seconds)
        finally:
            TASK_UP.labels(task=handle.name).set(0)
            handle.down_reason = None  # stopped on purpose: not down
            handle.ended.set()

    @staticmethod
    def _why_ended(name: str, task: asyncio.Task[None]) -> str | None:
        """None for a normal return; else why the run ended (logged with its traceback)."""
        if task.cancelled():
            log.error("task_cancelled_from_below", task=name)
            return "cancelled by something other than the supervisor"
        exc = task.exception()
        if exc is None:
            return None
        log.error("task_crashed", task=name, exc_info=exc)
        return f"{type(exc).__name__}: {exc}"[:300]


async def _as_coroutine(run: Loop) -> None:
    await run()


async def _cancel_until_done(task: asyncio.Task[None]) -> None:
    """Cancel again until it ends: a library below may swallow one cancel (Python 3.11's
    ``wait_for`` can, when its inner call finishes at the same moment)."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
