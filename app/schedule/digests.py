"""Scheduled digests: a pipeline with ``schedule`` (cron, UTC) and ``over: {source, hours}``
decides, once per tick, one event that summarises the stored events of that period.

    pipelines:
      daily:
        schedule: "0 9 * * *"
        over: {source: alerts, hours: 24}
        model: claude-sonnet-4-6
        system: Write the on-call digest of the last day's alerts.
        tools: [publishNotification]

Invariants:
- Exactly one digest per tick, however many processes run the schedule: every process
  builds the same digest event at the tick (its id and delivery id derived from the
  pipeline and the tick) and enqueues it; the queue's delivery dedup (kept a week) lets one
  in and answers the others ``duplicate``. A process that dies at the tick leaves it to the
  others; with none running at a tick, that tick is skipped (no catch-up).
- The digest is an event like any other from there on: queued durably, decided with the
  guarded caller, audited, its tool calls published with ids derived from its id, so a
  retried digest never publishes twice.
- It stays bounded: at most ``max_events`` events are listed (the newest), one short line
  each, the rest counted by type; the prompt budget then applies as to any payload.
- An enqueue that meets Redis or the database down is retried until the next tick; any
  other failure ends the loop, which the supervisor logs and restarts.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from croniter import croniter
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import GatewayConfig, PipelineConfig
from app.decide.prompts import one_line, summarize
from app.events import Event, make_event
from app.faults import dependency_unavailable
from app.queue.streams import EventQueue, NewEntry
from app.store.models import EventRow

log = structlog.get_logger(__name__)
DEDUP_WINDOW_MS = 7 * 86_400_000
POLL_SECONDS = 1.0
RETRY_SECONDS = 5.0
LINE_CAP = 300
DIGEST_SOURCE = "digest"  # the source of every digest event (not a configured source)


def next_tick(schedule: str, after: datetime) -> datetime:
    found: datetime = croniter(schedule, after).get_next(datetime)
    return found.astimezone(UTC)


def digest_id(pipeline: str, tick: datetime) -> str:
    digest = hashlib.sha256(f"{pipeline}\0{tick.isoformat()}".encode()).hexdigest()
    return f"dg_{digest[:32]}"


async def digest_payload(
    session: AsyncSession, config: GatewayConfig, pipeline: PipelineConfig, tick: datetime
) -> dict[str, Any]:
    assert pipeline.over is not None
    over = pipeline.over
    since = tick - timedelta(hours=over.hours)
    window = [
        EventRow.received_at >= since,
        EventRow.received_at < tick,
        EventRow.source != DIGEST_SOURCE,  # earlier digests are not events of the period
    ]
    if over.source is not None:
        window.append(EventRow.source == over.source)
    total = int(
        await session.scalar(select(func.count()).select_from(EventRow).where(*window)) or 0
    )
    counts = (
        await session.execute(
            select(EventRow.type, func.count()).where(*window).group_by(EventRow.type)
        )
    ).all()
    rows = (
        await session.scalars(
            select(EventRow)
            .where(*window)
            .order_by(EventRow.received_at.desc(), EventRow.id.desc())
            .limit(over.max_events)
        )
    ).all()
    lines = []
    for row in reversed(rows):
        source = config.sources.get(row.source)
        summary = "; ".join(
            f"{label}: {value}"
            for label, value in summarize(source.type if source else None, row.type, row.payload)
        )
        text = f"{row.received_at.isoformat()} {row.type} [{row.group_key}] {row.status}"
        lines.append(one_line(f"{text}: {summary}" if summary else text, cap=LINE_CAP))
    return {
        "period": {"from": since.isoformat(), "to": tick.isoformat()},
        "source": over.source or "every source",
        "events": total,
        "by_type": dict(sorted(Counter({str(t): int(n) for t, n in counts}).items())),
        "listed": len(lines),
        "events_listed_oldest_first": lines,
    }


class DigestScheduler:
    def __init__(
        self,
        *,
        config: GatewayConfig,
        queue: EventQueue,
        sessions: async_sessionmaker[AsyncSession],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self.queue = queue
        self.sessions = sessions
        self.clock = clock
        self.sleep = sleep
        self.pipelines = {name: p for name, p in config.pipelines.items() if p.schedule is not None}

    async def run(self) -> None:
        now = self.clock()
        due = {name: next_tick(str(p.schedule), now) for name, p in self.pipelines.items()}
        while True:
            now = self.clock()
            for name, tick in list(due.items()):
                if tick <= now:
                    following = next_tick(str(self.pipelines[name].schedule), tick)
                    await self._fire(name, tick, until=following)
                    due[name] = next_tick(str(self.pipelines[name].schedule), self.clock())
            await self.sleep(POLL_SECONDS)

    async def _fire(self, name: str, tick: datetime, *, until: datetime) -> None:
        """Enqueue the tick's digest, retrying while Redis or the database is down, up to
        the next tick."""
        while True:
            try:
                status = await self.enqueue(name, tick)
                log.info("digest_enqueued", pipeline=name, tick=tick.isoformat(), status=status)
                return
            except Exception as exc:
                if not dependency_unavailable(exc):
                    raise  # the supervisor logs it and restarts the loop
                if self.clock() + timedelta(seconds=RETRY_SECONDS) >= until:
                    log.error(
                        "digest_skipped", pipeline=name, tick=tick.isoformat(), error=str(exc)
                    )
                    return
                log.warning("digest_retry", pipeline=name, error=type(exc).__name__)
                await self.sleep(RETRY_SECONDS)

    async def enqueue(self, name: str, tick: datetime) -> str:
        pipeline = self.pipelines[name]
        assert pipeline.over is not None
        async with self.sessions() as session:
            payload = await digest_payload(session, self.config, pipeline, tick)
        source = DIGEST_SOURCE
        event: Event = make_event(
            id=digest_id(name, tick),
            source=source,
            config=None,
            type="digest",
            group_key=f"digest/{name}",
            delivery_id=f"digest:{name}:{tick.isoformat()}",
            pipeline=name,
            received_at=tick,
            payload=payload,
        )
        result = await self.queue.enqueue(
            NewEntry(
                event_id=event.id,
                source=source,
                delivery_id=event.delivery_id,
                group_key=event.group_key,
                data=event.to_bytes(),
                dedup_window_ms=DEDUP_WINDOW_MS,
            )
        )
        return "queued" if result.created else "duplicate"
