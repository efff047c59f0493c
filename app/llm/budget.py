"""Per-pipeline daily budgets (UTC day) in tokens and/or USD, counted in Redis.

Spend is charged after each successful call (all four token kinds, and the priced cost), so
every process sees the same total. Admission checks the total before a call: calls already
in flight when the budget runs out still finish, so the overshoot is bounded by the
pipeline's concurrency times one call's usage.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis

from app.config import BudgetConfig
from app.observability.metrics import LLM_BUDGET_REMAINING
from app.redis_scripts import ScriptCall

_DAY = 86_400

# KEYS: the day's hash. ARGV: tokens, cost in USD, TTL. Returns the day's totals.
_CHARGE = """
local tokens = redis.call('HINCRBY', KEYS[1], 'tokens', ARGV[1])
local cost = redis.call('HINCRBYFLOAT', KEYS[1], 'cost_usd', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {tokens, cost}
"""


@dataclass(frozen=True, slots=True)
class Spend:
    tokens: int = 0
    cost_usd: float = 0.0


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    spend: Spend
    tokens_left: int | None
    cost_left_usd: float | None

    @property
    def exhausted(self) -> bool:
        return (self.tokens_left is not None and self.tokens_left <= 0) or (
            self.cost_left_usd is not None and self.cost_left_usd <= 0
        )

    def describe(self) -> str:
        return f"spent {self.spend.tokens} tokens and ${self.spend.cost_usd:.4f} today (UTC)"


class BudgetLedger:
    def __init__(
        self, redis: Redis, *, prefix: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.clock = clock
        self._charge = redis.register_script(_CHARGE)

    def key(self, pipeline: str) -> str:
        day = datetime.fromtimestamp(self.clock(), UTC).strftime("%Y-%m-%d")
        return f"{self.prefix}:{{budget:{pipeline}}}:{day}"

    def seconds_to_next_day(self) -> float:
        now = self.clock()
        return _DAY - now % _DAY

    async def spent(self, pipeline: str) -> Spend:
        tokens, cost = await self.redis.hmget(self.key(pipeline), ["tokens", "cost_usd"])
        return Spend(int(tokens or 0), float(cost or 0.0))

    async def charge(self, pipeline: str, *, tokens: int, cost_usd: float) -> Spend:
        return self.charged(
            await self.charge_call(pipeline, tokens=tokens, cost_usd=cost_usd).run()
        )

    def charge_call(self, pipeline: str, *, tokens: int, cost_usd: float) -> ScriptCall:
        """The charge, for ``run_scripts`` (its reply read by ``charged``)."""
        return ScriptCall(self._charge, [self.key(pipeline)], [tokens, repr(cost_usd), 2 * _DAY])

    @staticmethod
    def charged(reply: Any) -> Spend:
        """The day's totals after a charge."""
        tokens, cost = reply
        return Spend(int(tokens), float(cost.decode() if isinstance(cost, bytes) else cost))

    async def status(self, pipeline: str, budget: BudgetConfig) -> BudgetStatus:
        return self.evaluate(pipeline, budget, await self.spent(pipeline))

    @staticmethod
    def evaluate(pipeline: str, budget: BudgetConfig, spend: Spend) -> BudgetStatus:
        """The remaining budget, also exported as ``eventgate_llm_budget_remaining``."""
        tokens_left = cost_left = None
        if budget.daily_tokens is not None:
            tokens_left = budget.daily_tokens - spend.tokens
            LLM_BUDGET_REMAINING.labels(pipeline=pipeline, unit="tokens").set(max(tokens_left, 0))
        if budget.daily_cost_usd is not None:
            cost_left = round(budget.daily_cost_usd - spend.cost_usd, 8)
            LLM_BUDGET_REMAINING.labels(pipeline=pipeline, unit="usd").set(max(cost_left, 0.0))
        return BudgetStatus(spend, tokens_left, cost_left)
