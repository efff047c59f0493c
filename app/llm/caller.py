"""One guarded Claude call for one event: budget → breaker → rate limit → slots → call.

Retries belong here (the SDK's are off): 408, 409, 429, 5xx, 529, timeouts and connection
errors are retried with exponential backoff and full jitter, at least the (clamped)
``retry-after``, until the event's deadline; anything else raises ``CallAbandoned`` and the
event is dead-lettered.

Waiting is never failing: while the model's breaker is open (and no fallback model is
allowed), while the rate limiter or a ``wait`` budget says no, the call waits and the event
stays queued. An event gives up only on failures made while the breaker was closed, once its
failing attempts and backoff exceed the event deadline (default two hours: an overloaded API's
bad hour is ridden out), and only if the breaker is still closed then; otherwise the outage
is the breaker's to handle and the event's count starts again. 429s and half-open probes
never count.

Each attempt's audit row is written before the call (outcome unknown) and completed after
it; the lease is checked just before, so a process that lost its lease does not pay for a
call whose result it could not store. An attempt's Redis bookkeeping (rate-limit settle,
breaker, budget) runs beside the database write of its outcome, never before it: Redis
failing after Claude answered must not lose the outcome of a call that was made.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace

import structlog

from app.config import GatewayConfig, PipelineConfig
from app.faults import Fence
from app.llm.attempts import Attempt, AttemptLog, usage_of
from app.llm.breaker import BreakerState, CircuitBreaker, Permit
from app.llm.budget import BudgetLedger
from app.llm.client import ClaudeClient, ClaudeError, ClaudeReply, ClaudeRequest
from app.llm.health import LlmHealth
from app.llm.pricing import PriceTable
from app.llm.ratelimit import RateLimiter, Reservation, estimate_input_tokens
from app.observability.metrics import LLM_COST, LLM_DURATION, LLM_REQUESTS, LLM_TOKENS, labelled
from app.redis_scripts import run_scripts

log = structlog.get_logger(__name__)
AUTH_STATUSES = frozenset({401, 403})


class CallAbandoned(Exception):
    """The event cannot get a decision from Claude; dead-letter it with this reason."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    base_seconds: float = 1.0
    cap_seconds: float = 30.0
    retry_after_max_seconds: float = 60.0
    call_timeout_seconds: float = 60.0
    event_deadline_seconds: float = 7200.0
    # Longest single sleep while waiting for a breaker or budget (then ask again).
    poll_seconds: float = 1.0
    budget_poll_seconds: float = 30.0

    def backoff(self, retries: int, retry_after: float | None) -> float:
        delay = random.uniform(0, min(self.cap_seconds, self.base_seconds * 2**retries))
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.retry_after_max_seconds))
        return delay


@dataclass(frozen=True, slots=True)
class CallResult:
    """A successful call. Its Redis bookkeeping is not done yet: ``GuardedCaller.account``
    does it, beside the database write of the outcome (``run_together``)."""

    reply: ClaudeReply
    attempt: Attempt
    call_id: str  # its audit row, written before the call, completed by the pipeline
    cost_usd: float
    pipeline: str
    permit: Permit
    reservation: Reservation


async def run_together(*steps: Awaitable[object]) -> None:
    """Run ``steps`` concurrently, wait for every one of them, then raise the first failure.

    Waiting for all matters: a step that fails must not return control (and so let the
    dispatcher retry the event) while another step is still writing.
    """
    outcomes = await asyncio.gather(*steps, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


class GuardedCaller:
    def __init__(
        self,
        *,
        config: GatewayConfig,
        clients: Mapping[str, ClaudeClient],
        limiter: RateLimiter,
        breaker: CircuitBreaker,
        budgets: BudgetLedger,
        health: LlmHealth,
        prices: PriceTable,
        slots: asyncio.Semaphore,
        retry: RetryPolicy,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self.clients = clients
        self.limiter = limiter
        self.breaker = breaker
        self.budgets = budgets
        self.health = health
        self.prices = prices
        self.slots = slots
        self.retry = retry
        self.sleep = sleep
        # Calls waiting for the rate limit right now: shadow runs wait while any live one does.
        self.waiting_for_limit = 0
        self.pipeline_slots = {
            name: asyncio.Semaphore(p.max_concurrency)
            for name, p in config.pipelines.items()
            if p.max_concurrency is not None
        }

    async def call(
        self,
        request: ClaudeRequest,
        *,
        pipeline_name: str,
        record: AttemptLog,
        attempt: int,
        reason: str | None,
        fence: Fence | None = None,
    ) -> CallResult:
        """Claude's reply to ``request`` for ``pipeline_name``, each attempt recorded in ``record``
        (its row before the call, a failure after it)."""
        pipeline = self.config.pipelines[pipeline_name]
        client = self.clients.get(pipeline.provider)
        if client is None:
            raise CallAbandoned(f"provider {pipeline.provider!r} is not configured")
        retries, spent = 0, 0.0
        while True:
            await self._admit_budget(pipeline_name, pipeline)
            model, permit, reservation = await self._permit_and_reserve(pipeline, request)
            this = Attempt(
                attempt, pipeline.provider, replace(request, model=model), permit.state, reason
            )
            call_id = await self._begin(record, this, reservation, fence)
            try:
                reply = await self._attempt(pipeline_name, client, this.request, spent=spent)
            except ClaudeError as exc:
                await self._after_failure(record, call_id, this, permit, reservation, exc)
                if not exc.retryable:
                    raise CallAbandoned(f"{exc.error_type}: {exc}") from exc
                # A 429 is the limiter's to pace, an open breaker's failures the outage's:
                # neither counts against the event.
                counts = exc.status != 429 and permit.state is BreakerState.CLOSED
                spent += exc.latency_ms / 1000 if counts else 0.0
                if spent >= self.retry.event_deadline_seconds:
                    if await self.breaker.state(pipeline.provider, model) is BreakerState.CLOSED:
                        raise CallAbandoned(
                            f"gave up after {spent:.0f}s of failing attempts (deadline "
                            f"{self.retry.event_deadline_seconds:.0f}s): {exc.error_type}: {exc}"
                        ) from exc
                    spent = 0.0  # an outage: the breaker is handling it
                retries += 1
                delay = self.retry.backoff(retries, exc.retry_after)
                spent += delay if counts else 0.0
                log.warning(
                    "llm_retry",
                    attempt=attempt,
                    model=model,
                    error=exc.error_type,
                    status=exc.status,
                    retry_in=round(delay, 2),
                )
                await self.sleep(delay)
                attempt += 1
                reason = f"{exc.error_type} {exc.status or ''}".strip()
                continue
            result = CallResult(
                reply=reply,
                attempt=this,
                call_id=call_id,
                cost_usd=self.prices.cost_usd(reply.model, usage_of(reply)),
                pipeline=pipeline_name,
                permit=permit,
                reservation=reservation,
            )
            self._count_success(result)
            return result

    async def _begin(
        self, record: AttemptLog, this: Attempt, reservation: Reservation, fence: Fence | None
    ) -> str:
        """Check the lease, then write the attempt's row; on failure give the reservation back
        (no call is made, so none may go unaudited)."""
        try:
            if fence is not None:
                await fence.check()
            return await record.begin(this)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.limiter.settle(reservation, input_tokens=0, output_tokens=0, headers={})
            raise

    async def _permit_and_reserve(
        self, pipeline: PipelineConfig, request: ClaudeRequest
    ) -> tuple[str, Permit, Reservation]:
        """The model to call, its breaker permit and its rate-limit reservation. Both are asked
        for in one round trip first; only when one says wait is it the two steps below (a
        refused permit gives the reservation back, a granted one is kept: it may be the
        half-open probe, which a second ask would not get)."""
        estimate = estimate_input_tokens(request.as_api())
        wanted = self.limiter.acquire_call(
            request.model, input_tokens=estimate, output_tokens=request.max_tokens
        )
        if wanted is None:
            model, permit = await self._permit(pipeline, preferred=request.model)
            return model, permit, await self._reserve(replace(request, model=model))
        ask = self.breaker.allow_call(pipeline.provider, request.model)
        # Errors in place: one script failing must not hide what the other took.
        allow_reply, wait = await run_scripts([ask, wanted], raise_on_error=False)
        taken = not isinstance(wait, Exception) and float(wait) <= 0
        reservation = Reservation(request.model, estimate, request.max_tokens)
        if isinstance(allow_reply, Exception):
            if taken:
                with contextlib.suppress(Exception):
                    await self.limiter.release(reservation)
            raise allow_reply
        permit = self.breaker.allowed(request.model, allow_reply)
        if isinstance(wait, Exception):
            raise wait
        if permit.allowed:
            return request.model, permit, reservation if taken else await self._reserve(request)
        if taken:
            await self.limiter.release(reservation)
        model, permit = await self._permit(pipeline, preferred=request.model)
        return model, permit, await self._reserve(replace(request, model=model))

    async def _reserve(self, request: ClaudeRequest) -> Reservation:
        """Wait for the rate limit; a success's reservation is settled by ``account``, a
        failure's by ``_record_failure``."""
        estimate = estimate_input_tokens(request.as_api())
        self.waiting_for_limit += 1
        try:
            return await self.limiter.acquire(
                request.model, input_tokens=estimate, output_tokens=request.max_tokens
            )
        finally:
            self.waiting_for_limit -= 1

    async def _attempt(
        self, pipeline: str, client: ClaudeClient, request: ClaudeRequest, *, spent: float
    ) -> ClaudeReply:
        """The call itself, within the concurrency slots."""
        left = self.retry.event_deadline_seconds - spent
        timeout = max(1.0, min(self.retry.call_timeout_seconds, left))
        async with self._slots(pipeline):
            return await client.create(request, call_timeout=timeout)

    @contextlib.asynccontextmanager
    async def _slots(self, pipeline: str) -> AsyncIterator[None]:
        own = self.pipeline_slots.get(pipeline)
        async with contextlib.AsyncExitStack() as stack:
            if own is not None:
                await stack.enter_async_context(own)
            await stack.enter_async_context(self.slots)
            yield

    async def _permit(self, pipeline: PipelineConfig, *, preferred: str) -> tuple[str, Permit]:
        """Wait until the preferred model (or, while it is refused, the fallback) may be called."""
        waited = False
        while True:
            permit = await self.breaker.allow(pipeline.provider, preferred)
            if permit.allowed:
                return preferred, permit
            fallback = pipeline.fallback_model
            if fallback and fallback != preferred:
                other = await self.breaker.allow(pipeline.provider, fallback)
                if other.allowed:
                    return fallback, other
            if not waited:
                log.warning(
                    "llm_waiting_for_breaker",
                    model=preferred,
                    state=permit.state,
                    wait=round(permit.wait, 2),
                )
                waited = True
            await self.sleep(max(0.01, min(permit.wait, self.retry.poll_seconds)))

    async def _admit_budget(self, name: str, pipeline: PipelineConfig) -> None:
        budget = pipeline.budget
        while budget is not None:
            status = await self.budgets.status(name, budget)
            if not status.exhausted:
                return
            if budget.on_exhausted == "dead_letter":
                raise CallAbandoned(
                    f"daily budget of pipeline {name!r} exhausted: {status.describe()}"
                )
            log.warning("llm_budget_exhausted", pipeline=name, detail=status.describe())
            await self.sleep(
                min(self.retry.budget_poll_seconds, self.budgets.seconds_to_next_day())
            )

    async def _after_failure(
        self,
        record: AttemptLog,
        call_id: str,
        this: Attempt,
        permit: Permit,
        reservation: Reservation,
        exc: ClaudeError,
    ) -> None:
        """The attempt's audit row and the breaker and rate-limit updates, side by side: a
        Redis failure here must not cost the attempt its audit row."""
        if exc.status in AUTH_STATUSES:
            self.health.auth_failed(provider=this.provider, status=exc.status)
        LLM_REQUESTS.labels(
            model=this.request.model, outcome="retry" if exc.retryable else "error"
        ).inc()
        LLM_DURATION.observe(exc.latency_ms / 1000)
        await run_together(
            self._record_failure(this, permit, reservation, exc),
            record.failed(call_id, this, exc),
        )

    async def _record_failure(
        self, this: Attempt, permit: Permit, reservation: Reservation, exc: ClaudeError
    ) -> None:
        model, provider = this.request.model, this.provider
        upstream_unwell = exc.retryable and exc.status != 429
        await asyncio.gather(
            # A failed call used a request but (as far as we can know) no tokens.
            self.limiter.settle(reservation, input_tokens=0, output_tokens=0, headers={}),
            self.breaker.record(provider, model, ok=not upstream_unwell, permit=permit),
        )
        if exc.status == 429:
            await self.limiter.hold(model, exc.retry_after if exc.retry_after is not None else 1.0)

    async def account(self, result: CallResult) -> None:
        """Settle the rate limit, close the breaker's books and charge the budget: Redis updates
        that do not depend on each other, in one round trip (``run_scripts``). The pipeline runs
        this beside its database write, so a Redis failure cannot lose the audit row of a paid
        call."""
        reply, this = result.reply, result.attempt
        usage = usage_of(reply)
        settle = self.limiter.settle_call(
            result.reservation,
            # Cache reads do not count towards the input-tokens-per-minute limit.
            input_tokens=reply.input_tokens + reply.cache_creation_input_tokens,
            output_tokens=reply.output_tokens,
            headers=reply.headers,
        )
        provider, model = this.provider, this.request.model
        calls = [
            self.breaker.record_call(provider, model, ok=True, permit=result.permit),
            self.budgets.charge_call(result.pipeline, tokens=usage.total, cost_usd=result.cost_usd),
        ]
        recorded, charged, *_ = await run_scripts([*calls, *([settle] if settle else [])])
        self.breaker.recorded(provider, model, recorded)
        spend = BudgetLedger.charged(charged)
        budget = self.config.pipelines[result.pipeline].budget
        if budget is not None:
            BudgetLedger.evaluate(result.pipeline, budget, spend)

    def _count_success(self, result: CallResult) -> None:
        reply = result.reply
        usage = usage_of(reply)
        self.health.call_succeeded()
        labelled(LLM_REQUESTS, reply.model, "ok").inc()
        LLM_DURATION.observe(reply.latency_ms / 1000)
        for kind, value in (
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
            ("cache_creation", usage.cache_creation_input_tokens),
            ("cache_read", usage.cache_read_input_tokens),
        ):
            labelled(LLM_TOKENS, reply.model, kind).inc(value)
        labelled(LLM_COST, result.pipeline).inc(result.cost_usd)
