"""Build the decide stage from settings and config: the guarded Claude client (the shared
limiter, breaker and budgets, all in the gateway's Redis) and the event processor."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import cast

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import GatewayConfig, ModelConfig
from app.decide.audit import AuditRecorder, AuditTrail
from app.decide.audit_text import TextMode
from app.decide.cache import ResponseCache
from app.decide.processor import EventProcessor
from app.llm.breaker import BreakerPolicy, CircuitBreaker
from app.llm.budget import BudgetLedger
from app.llm.caller import GuardedCaller, RetryPolicy
from app.llm.client import ClaudeClient
from app.llm.health import LlmHealth
from app.llm.pricing import PriceTable
from app.llm.ratelimit import ModelLimits, RateLimiter, YieldingRateLimiter
from app.settings import Settings
from app.store.db import session_factory
from app.store.driver import DriverPool


def wants_bedrock(config: GatewayConfig) -> bool:
    return any(p.provider == "bedrock" for p in config.pipelines.values())


def bedrock_client(settings: Settings) -> ClaudeClient:
    region = settings.llm_bedrock_region or settings.aws_region
    return ClaudeClient.bedrock(region=region, timeout=settings.llm_timeout_seconds)


def model_limits(settings: Settings, config: GatewayConfig) -> Callable[[str], ModelLimits]:
    """Each model's limits, worked out once (the limiter asks for every call)."""
    known: dict[str, ModelLimits] = {}

    def limits(model: str) -> ModelLimits:
        found = known.get(model)
        if found is not None:
            return found
        own = config.models.get(model) or ModelConfig()
        found = ModelLimits(
            requests=_either(own.requests_per_minute, settings.llm_requests_per_minute),
            input_tokens=_either(own.input_tokens_per_minute, settings.llm_input_tokens_per_minute),
            output_tokens=_either(
                own.output_tokens_per_minute, settings.llm_output_tokens_per_minute
            ),
        )
        if len(known) < 1024:  # models named by the configuration and its replies: few
            known[model] = found
        return found

    return limits


def _either(value: int | None, default: int) -> int:
    return default if value is None else value


def retry_policy(settings: Settings) -> RetryPolicy:
    return RetryPolicy(
        base_seconds=settings.llm_retry_base_seconds,
        cap_seconds=settings.llm_retry_cap_seconds,
        retry_after_max_seconds=settings.llm_retry_after_max_seconds,
        call_timeout_seconds=settings.llm_timeout_seconds,
        event_deadline_seconds=settings.llm_event_deadline_seconds,
        poll_seconds=min(1.0, settings.llm_breaker_cooldown_seconds / 4),
        budget_poll_seconds=settings.llm_budget_poll_seconds,
    )


def breaker_policy(settings: Settings) -> BreakerPolicy:
    return BreakerPolicy(
        window_seconds=settings.llm_breaker_window_seconds,
        min_calls=settings.llm_breaker_min_calls,
        failure_ratio=settings.llm_breaker_failure_ratio,
        cooldown_seconds=settings.llm_breaker_cooldown_seconds,
        consecutive_failures=settings.llm_breaker_consecutive_failures,
        probe_ttl_seconds=settings.llm_timeout_seconds + 5,
    )


def build_processor(
    *,
    settings: Settings,
    config: GatewayConfig,
    redis: Redis,
    engine: AsyncEngine,
    clients: Mapping[str, ClaudeClient],
    health: LlmHealth,
    on_stored: Callable[[], None],
    budget_prefix: str | None = None,
    rate_reserve: float = 0.0,
    driver: DriverPool | None = None,
) -> EventProcessor:
    """The decide stage over Claude through ``clients`` (by provider), with the limiter,
    breaker and budgets shared in ``redis`` and the audit log and outbox in ``engine``.
    For runs that publish nothing: ``budget_prefix`` counts the daily budgets apart, and
    ``rate_reserve`` leaves that share of every rate limit to live events."""
    prefix = settings.redis_prefix
    limits = model_limits(settings, config)
    limiter = (
        YieldingRateLimiter(redis, reserve=rate_reserve, prefix=prefix, limits=limits)
        if rate_reserve > 0
        else RateLimiter(redis, prefix=prefix, limits=limits)
    )
    prices = PriceTable.from_config(config)
    audit = AuditRecorder(prices=prices, text_mode=cast(TextMode, settings.llm_audit_text))
    trail = AuditTrail(engine=engine, recorder=audit, driver=driver)
    caller = GuardedCaller(
        config=config,
        clients=clients,
        limiter=limiter,
        breaker=CircuitBreaker(redis, prefix=prefix, policy=breaker_policy(settings)),
        budgets=BudgetLedger(redis, prefix=budget_prefix or prefix),
        health=health,
        prices=prices,
        slots=asyncio.Semaphore(settings.llm_max_concurrency),
        retry=retry_policy(settings),
    )
    return EventProcessor(
        config=config,
        engine=engine,
        sessions=session_factory(engine),
        caller=caller,
        trail=trail,
        max_deliveries=settings.max_deliveries,
        on_stored=on_stored,
        cache=ResponseCache(redis, prefix=prefix),
        driver=driver,
    )
