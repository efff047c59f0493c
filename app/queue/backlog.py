"""Backpressure: ingest refuses (503 + Retry-After) while the backlog is too deep or too old,
instead of letting the queue grow without bound. Measured once a second, not per request."""

from __future__ import annotations

import asyncio

import structlog

from app.errors import QueueUnavailable
from app.faults import REDIS_ERRORS
from app.observability.metrics import QUEUE_DEPTH, QUEUE_OLDEST_AGE
from app.queue.streams import EventQueue

log = structlog.get_logger(__name__)


class BacklogMonitor:
    def __init__(
        self, queue: EventQueue, *, max_depth: int, max_age_seconds: float, interval: float = 1.0
    ) -> None:
        self.queue = queue
        self.max_depth = max_depth
        self.max_age_seconds = max_age_seconds
        self.interval = interval
        self.depth = 0
        self.oldest_age = 0.0

    @property
    def overloaded(self) -> str | None:
        if self.max_depth and self.depth >= self.max_depth:
            return f"backlog of {self.depth} events is at the limit of {self.max_depth}"
        if self.max_age_seconds and self.oldest_age >= self.max_age_seconds:
            return (
                f"oldest queued event is {self.oldest_age:.0f}s old "
                f"(limit {self.max_age_seconds:.0f}s)"
            )
        return None

    def record_enqueued(self, count: int = 1) -> None:
        """Count this process's own enqueues between refreshes, so the limit holds tightly."""
        self.depth += count

    def check(self) -> None:
        reason = self.overloaded
        if reason is not None:
            raise QueueUnavailable(f"queue is full: {reason}; retry later", retry_after=30)

    async def refresh(self) -> None:
        self.depth, self.oldest_age = await self.queue.backlog()
        QUEUE_DEPTH.set(self.depth)
        QUEUE_OLDEST_AGE.set(self.oldest_age)

    async def run(self) -> None:
        while True:
            try:
                await self.refresh()
            except REDIS_ERRORS as exc:
                log.warning("backlog_refresh_failed", error=type(exc).__name__)
            await asyncio.sleep(self.interval)
