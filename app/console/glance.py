"""The console's health page, read from what the app factory built: readiness answers, the
backlog monitor's last reading, the outbox's pending tool calls, each configured model's
circuit breaker and rate-limit buckets, each pipeline's spend today, and who holds the
partition and relay leases (all shared in Redis, so any process shows the whole gateway).

Every figure is read on its own, within ``READ_SECONDS``: one that fails is listed as
unavailable with the exception's name, and the page still shows the others.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from redis.asyncio import Redis

from app.admin.service import AdminService
from app.config import GatewayConfig
from app.leases import members_key, partition_lease_key, relay_lease_key
from app.llm.breaker import CircuitBreaker
from app.llm.budget import BudgetLedger
from app.llm.ratelimit import Headroom, RateLimiter
from app.observability.health import Health
from app.queue.backlog import BacklogMonitor

READ_SECONDS = 2.0
OUTBOX_COUNT_CAP = 10_000
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ModelFigures:
    provider: str
    model: str
    breaker: str | None
    headroom: Headroom | None


@dataclass(frozen=True, slots=True)
class PipelineSpend:
    pipeline: str
    tokens: int
    cost_usd: float
    tokens_left: int | None
    cost_left_usd: float | None


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    name: str
    owner: str | None


@dataclass
class Glance:
    ready: bool = False
    checks: dict[str, str] = field(default_factory=dict)
    backlog_depth: int = 0
    backlog_oldest_age: float = 0.0
    backlog_overloaded: str | None = None
    outbox_pending: int | None = None
    outbox_oldest: datetime | None = None
    models: list[ModelFigures] = field(default_factory=list)
    spend: list[PipelineSpend] = field(default_factory=list)
    partitions: list[LeaseHolder] = field(default_factory=list)
    relay: LeaseHolder | None = None
    # process name → seconds since its last lease heartbeat
    members: dict[str, float] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    outbox_cap: int = OUTBOX_COUNT_CAP


class HealthGlance:
    def __init__(
        self,
        *,
        health: Health,
        backlog: BacklogMonitor,
        redis: Redis,
        prefix: str,
        partitions: int,
        config: GatewayConfig,
        breaker: CircuitBreaker,
        limiter: RateLimiter,
        budgets: BudgetLedger,
        admin: AdminService,
    ) -> None:
        self.health = health
        self.backlog = backlog
        self.redis = redis
        self.prefix = prefix
        self.partitions = partitions
        self.config = config
        self.breaker = breaker
        self.limiter = limiter
        self.budgets = budgets
        self.admin = admin

    async def read(self) -> Glance:
        glance = Glance(
            backlog_depth=self.backlog.depth,
            backlog_oldest_age=self.backlog.oldest_age,
            backlog_overloaded=self.backlog.overloaded,
        )
        glance.ready, glance.checks = await self.health.readiness()
        pending = await _read(glance, "outbox", self.admin.outbox_pending(cap=OUTBOX_COUNT_CAP))
        if pending is not None:
            glance.outbox_pending, glance.outbox_oldest = pending
        for provider, model in self._models():
            state = await _read(glance, f"breaker {model}", self.breaker.state(provider, model))
            headroom = await _read(glance, f"rate limit {model}", self.limiter.headroom(model))
            glance.models.append(
                ModelFigures(
                    provider=provider,
                    model=model,
                    breaker=str(state) if state is not None else None,
                    headroom=headroom,
                )
            )
        for name, pipeline in sorted(self.config.pipelines.items()):
            spend = await _read(glance, f"spend {name}", self.budgets.spent(name))
            if spend is None:
                continue
            left = (
                BudgetLedger.evaluate(name, pipeline.budget, spend)
                if pipeline.budget is not None
                else None
            )
            glance.spend.append(
                PipelineSpend(
                    pipeline=name,
                    tokens=spend.tokens,
                    cost_usd=spend.cost_usd,
                    tokens_left=left.tokens_left if left else None,
                    cost_left_usd=left.cost_left_usd if left else None,
                )
            )
        await _read(glance, "leases", self._leases(glance))
        return glance

    def _models(self) -> list[tuple[str, str]]:
        models = set()
        for pipeline in self.config.pipelines.values():
            models.add((pipeline.provider, pipeline.model))
            if pipeline.fallback_model:
                models.add((pipeline.provider, pipeline.fallback_model))
        return sorted(models)

    async def _leases(self, glance: Glance) -> None:
        keys = [partition_lease_key(self.prefix, p) for p in range(self.partitions)]
        # GETs pipelined, not one MGET: the leases are in every partition's slot, and a
        # cluster refuses a command over several.
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in [*keys, relay_lease_key(self.prefix)]:
                pipe.get(key)
            values = await pipe.execute()
        owners = [_holder(v) for v in values]
        glance.partitions = [
            LeaseHolder(name=str(p), owner=owners[p]) for p in range(self.partitions)
        ]
        glance.relay = LeaseHolder(name="relay", owner=owners[-1])
        now_ms = time.time() * 1000
        beats = await self.redis.zrange(members_key(self.prefix), 0, -1, withscores=True)
        glance.members = {
            _text(beat[0]): (now_ms - float(beat[1])) / 1000
            for beat in beats
            if isinstance(beat, tuple | list)
        }


async def _read(glance: Glance, name: str, reading: Awaitable[T]) -> T | None:
    try:
        async with asyncio.timeout(READ_SECONDS):
            return await reading
    except Exception as exc:  # noqa: BLE001 - shown on the page by its name
        glance.unavailable[name] = type(exc).__name__
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _holder(value: bytes | str | None) -> str | None:
    """A lease value is ``<owner>:<epoch>`` (partitions) or the owner's name (the relay)."""
    if value is None:
        return None
    text = _text(value)
    owner, _, epoch = text.rpartition(":")
    return owner if owner and epoch.isdigit() else text
