"""Shadow candidates: pipelines that also decide a share of another pipeline's live events,
publishing nothing, so a prompt or model change is measured on real traffic before it is
promoted.

    pipelines:
      triage:
        shadow: [{pipeline: triage-v2, sample: 0.25}]

Invariants:
- A candidate runs only after the live decision is stored, in a task of its own: the live
  path hands over the event and returns (``after_decided`` never waits and never raises),
  so the live event, and its key's next one, are never held up by a candidate.
- A candidate never publishes: it decides through ``Rerunner`` (no outbox row, no status).
- Its calls go through a guarded caller of their own (so they never take the live calls'
  concurrency slots), under the same rate limits, breaker and budgets in Redis as live
  calls; each candidate has its own concurrency (its pipeline's ``max_concurrency``, else
  ``DEFAULT_CONCURRENCY``) and budget (its pipeline's), takes from a shared rate limit only
  while half of it stays free for live calls, and starts only while no live call
  of this process waits for the rate limit and its event loop is not running late (the
  process has room): live calls have priority.
- The sample is chosen by event id, so every process shadows the same events; at most
  ``MAX_PENDING`` shadow decisions wait per process, beyond that an event is skipped and
  counted (``eventgate_shadow_decisions_total{agreement="skipped"}``). Pending shadow
  decisions are not durable: a process that stops or dies drops its own (they are
  measurements, and the live decisions are already stored).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Sequence

import orjson
import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.config import GatewayConfig
from app.decide.processor import Answer
from app.evaluate.agreement import Agreement, Decision
from app.evaluate.rerun import Rerunner
from app.events import Event
from app.llm.caller import GuardedCaller
from app.observability.metrics import SHADOW_DECISIONS
from app.store.models import OutboxRow, ShadowDecisionRow

log = structlog.get_logger(__name__)
DEFAULT_CONCURRENCY = 2
MAX_PENDING = 1000
LIVE_WAIT_POLL_SECONDS = 0.2
# A candidate starts only while a short sleep of the event loop ends less than this late.
LAG_PROBE_SECONDS = 0.01
MAX_LOOP_LAG_SECONDS = 0.005


def sampled(event_id: str, candidate: str, share: float) -> bool:
    """Whether ``candidate`` sees ``event_id``: the same answer on every process."""
    if share >= 1.0:
        return True
    digest = hashlib.sha256(f"{candidate}\0{event_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def live_decision(rows: Sequence[OutboxRow]) -> Decision:
    return Decision(tuple((row.tool, dict(orjson.loads(row.body)["input"])) for row in rows))


def agreement_of(live: Decision, candidate: Decision | None) -> str:
    if candidate is None:
        return "error"
    found = Agreement({})
    if found.add("", live, candidate):
        return "exact"
    return "action" if live.tools == candidate.tools else "none"


class ShadowRunner:
    def __init__(
        self,
        *,
        config: GatewayConfig,
        rerunner: Rerunner,
        sessions: async_sessionmaker[AsyncSession],
        live_caller: GuardedCaller,
        max_pending: int = MAX_PENDING,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self.rerunner = rerunner
        self.sessions = sessions
        self.live_caller = live_caller
        self.max_pending = max_pending
        self.sleep = sleep
        candidates = {s.pipeline for p in config.pipelines.values() for s in p.shadow}
        self.slots = {
            name: asyncio.Semaphore(config.pipelines[name].max_concurrency or DEFAULT_CONCURRENCY)
            for name in candidates
        }
        self.tasks: set[asyncio.Task[None]] = set()

    def after_decided(self, event: Event, rows: Sequence[OutboxRow], result: Answer) -> None:
        """The live decision of ``event`` is stored: start its sampled candidates."""
        shadows = self.config.pipelines[event.pipeline].shadow
        chosen = [s.pipeline for s in shadows if sampled(event.id, s.pipeline, s.sample)]
        if not chosen:
            return
        live = live_decision(rows)
        for candidate in chosen:
            if len(self.tasks) >= self.max_pending:
                SHADOW_DECISIONS.labels(candidate=candidate, agreement="skipped").inc()
                continue
            task = asyncio.get_running_loop().create_task(
                self._decide(event, candidate, live, result),
                name=f"shadow-{candidate}-{event.id}",
            )
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _decide(self, event: Event, candidate: str, live: Decision, result: Answer) -> None:
        try:
            async with self.slots[candidate]:
                await self._room()
                rerun = await self.rerunner.decide(event, candidate)
            agreement = agreement_of(live, rerun.decision)
            row = ShadowDecisionRow(
                event_id=event.id,
                baseline=event.pipeline,
                candidate=candidate,
                baseline_calls=live.shown(),
                candidate_calls=rerun.decision.shown() if rerun.decision is not None else None,
                agreement=agreement,
                baseline_cost_usd=result.cost_usd,
                candidate_cost_usd=rerun.cost_usd,
                baseline_latency_ms=result.reply.latency_ms,
                candidate_latency_ms=rerun.latency_ms,
                error=rerun.error,
            )
            async with self.sessions() as session:
                session.add(row)
                await session.commit()
            SHADOW_DECISIONS.labels(candidate=candidate, agreement=agreement).inc()
        except Exception:  # a failed shadow is counted and logged, never retried
            SHADOW_DECISIONS.labels(candidate=candidate, agreement="error").inc()
            log.exception("shadow_decision_failed", event_id=event.id, candidate=candidate)

    async def _room(self) -> None:
        """Wait while live work needs the process: a live call waits for the rate limit, or
        the event loop runs late (the process is busy: a candidate's call would slow the
        live ones down)."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self.sleep(LAG_PROBE_SECONDS)
            late = loop.time() - started - LAG_PROBE_SECONDS
            if not self.live_caller.waiting_for_limit and late < MAX_LOOP_LAG_SECONDS:
                return
            await self.sleep(LIVE_WAIT_POLL_SECONDS)

    async def close(self, grace_seconds: float) -> None:
        """Give pending shadow decisions ``grace_seconds``, then cancel the rest."""
        if not self.tasks:
            return
        pending = set(self.tasks)
        _, left = await asyncio.wait(pending, timeout=grace_seconds)
        for task in left:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*left, return_exceptions=True)
        if left:
            log.warning("shadow_decisions_dropped", count=len(left))
