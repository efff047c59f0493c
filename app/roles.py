"""What each role builds, starts and stops. Every client is entered into the lifespan's exit
stack, so it is closed on the way out in reverse order of building; nothing connects at
import time.

- every role: the database engine (migrated first when ``EVENTGATE_AUTO_MIGRATE``), Redis, the
  queue, the backlog monitor, the supervisor, and readiness (Redis, database, loops);
- ``api``: the ingest service and its webhook entry (with the replica acknowledgement
  ``EVENTGATE_REDIS_ACK_*`` asks for, refused at start when the server cannot give it), the
  admin API and the console (its health page reads the breakers, rate limits and budgets
  that the workers share in Redis);
- ``worker``: when a Claude provider is configured, the decide stage and the queue worker;
  when a tool has a topic, the SNS client and the outbox relay; retention.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from contextlib import AsyncExitStack

import structlog
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.admin.deps import AdminAccess
from app.admin.service import AdminService
from app.config import GatewayConfig
from app.console.access import ConsoleAccess
from app.console.glance import HealthGlance
from app.decide.batch_lane import BatchLane
from app.decide.processor import EventProcessor
from app.decide.wiring import (
    bedrock_client,
    breaker_policy,
    build_processor,
    model_limits,
    wants_bedrock,
)
from app.evaluate.rerun import Rerunner
from app.evaluate.shadow import ShadowRunner
from app.faults import REDIS_ERRORS
from app.ingest.budget import BodyBudget
from app.ingest.collapse import AlertCollapser
from app.ingest.router import WebhookEntry
from app.ingest.service import IngestService
from app.llm.batches import BatchClient
from app.llm.breaker import CircuitBreaker
from app.llm.budget import BudgetLedger
from app.llm.client import ClaudeClient
from app.llm.health import LlmHealth
from app.llm.ratelimit import LIVE_RATE_RESERVE, RateLimiter
from app.observability.health import Health, succeeds
from app.observability.logging import configure_logging
from app.publish.coordination import PublishedMemory
from app.publish.relay import OutboxRelay
from app.publish.shards import RelayShards
from app.publish.sns import SnsPublisher
from app.publish.sns import open_client as open_sns_client
from app.queue.acks import AckUnsupported, ReplicaAck, check_ack_support, replicas_online
from app.queue.backlog import BacklogMonitor
from app.queue.batching import EnqueueBatcher
from app.queue.connection import open_redis
from app.queue.layout import PartitionCountMismatch
from app.queue.leases import PartitionLeases
from app.queue.streams import EventQueue
from app.queue.worker import QueueWorker
from app.schedule import windows as window_closing
from app.schedule.digests import DigestScheduler
from app.settings import Settings
from app.sources.base import AdapterDeps
from app.state import ApiParts, Processing, Running, Shared, WorkerParts
from app.store.db import create_engine, read_session_factory, session_factory
from app.store.driver import DriverPool
from app.store.migrate import upgrade_head
from app.store.models import CallPurpose
from app.store.retention import RetentionJob
from app.supervision import Supervisor

log = structlog.get_logger(__name__)
DISPOSE_TIMEOUT_SECONDS = 5.0
LAYOUT_CHECK_SECONDS = 5.0
NO_LLM = "not configured: set ANTHROPIC_API_KEY (events are accepted and stay queued)"


async def build(
    settings: Settings,
    config: GatewayConfig,
    *,
    role: str,
    stack: AsyncExitStack,
    deps: AdapterDeps | None,
) -> Running:
    shared = await _build_shared(settings, config, role=role, stack=stack)
    api = None
    if role in ("serve", "api"):
        api = _build_api(shared, deps, ack=await _replica_ack(shared))
    worker = await _build_worker(shared, stack) if role in ("serve", "worker") else None
    if worker is None:
        # Reported, not required: this role does not call Claude, but an operator reading
        # /readyz of an ingest-only process still learns whether the key is set.
        configured = _llm_configured(settings, config)

        async def llm() -> str:
            return "ok" if configured else NO_LLM

        shared.health.check("llm", llm, required=False)
    return Running(shared=shared, api=api, worker=worker)


async def _build_shared(
    settings: Settings, config: GatewayConfig, *, role: str, stack: AsyncExitStack
) -> Shared:
    configure_logging(fmt=settings.log_format, level=settings.log_level)
    if settings.auto_migrate:
        await asyncio.to_thread(upgrade_head, settings.database_url)
    engine = create_engine(settings.database_url, pool_size=settings.database_pool_size)
    stack.push_async_callback(_dispose, engine)
    redis = await open_redis(settings.redis_url, cluster=settings.redis_cluster)
    stack.push_async_callback(redis.aclose)
    queue = EventQueue(redis, prefix=settings.redis_prefix, partitions=settings.partitions)
    await _check_layout(queue)
    supervisor = Supervisor(restart_seconds=settings.task_restart_seconds)
    backlog = BacklogMonitor(
        queue,
        max_depth=settings.backlog_max_depth,
        max_age_seconds=settings.backlog_max_age_seconds,
    )
    health = Health(before_scrape=[backlog.refresh])
    health.check("redis", succeeds(queue.check_writable), required=True)
    health.check("database", succeeds(lambda: _ping(engine)), required=True)
    health.check("tasks", lambda: _loops(supervisor), required=True)
    return Shared(
        settings=settings,
        config=config,
        role=role,
        engine=engine,
        sessions=session_factory(engine),
        redis=redis,
        queue=queue,
        backlog=backlog,
        supervisor=supervisor,
        health=health,
    )


def _build_api(shared: Shared, deps: AdapterDeps | None, *, ack: ReplicaAck | None) -> ApiParts:
    settings, queue = shared.settings, shared.queue
    ingest = IngestService(
        config=shared.config,
        queue=EnqueueBatcher(queue, ack=ack) if settings.ingest_batching else queue,
        collapser=AlertCollapser(shared.redis, prefix=settings.redis_prefix),
        max_body_bytes=settings.max_body_bytes,
        dedup_window_seconds=settings.dedup_window_seconds,
        backlog=shared.backlog,
        redact_payloads=settings.payload_redaction == "on",
        deps=deps,
    )

    async def backlog() -> str:
        return shared.backlog.overloaded or "ok"

    shared.health.check("backlog", backlog, required=False)
    if ack is not None and ack.replicas > 0:
        wanted = ack.replicas
        shared.health.check(
            "replicas", lambda: replicas_online(shared.redis, wanted), required=True
        )
    config = shared.config
    admin = AdminService(
        sessions=shared.sessions,
        queue=queue,
        sources=config.sources,
        tool_schemas={name: tool.input_schema for name, tool in config.tools.items()},
        candidates=frozenset(s.pipeline for p in config.pipelines.values() for s in p.shadow),
    )
    access = AdminAccess(token=settings.admin_token, service=admin)
    return ApiParts(
        ingest=ingest,
        webhooks=WebhookEntry(
            service=ingest,
            budget=BodyBudget(settings.ingest_buffer_bytes),
            read_seconds=settings.body_read_timeout_seconds,
        ),
        admin=access,
        console=ConsoleAccess.build(admin=access, glance=_health_glance(shared, admin)),
    )


def _health_glance(shared: Shared, admin: AdminService) -> HealthGlance:
    """Readers of what the workers share in Redis (the same keys as theirs), for the
    console's health page; building them connects to nothing."""
    settings, redis, prefix = shared.settings, shared.redis, shared.settings.redis_prefix
    return HealthGlance(
        health=shared.health,
        backlog=shared.backlog,
        redis=redis,
        prefix=prefix,
        partitions=settings.partitions,
        config=shared.config,
        breaker=CircuitBreaker(redis, prefix=prefix, policy=breaker_policy(settings)),
        limiter=RateLimiter(redis, prefix=prefix, limits=model_limits(settings, shared.config)),
        budgets=BudgetLedger(redis, prefix=prefix),
        admin=admin,
    )


async def _build_worker(shared: Shared, stack: AsyncExitStack) -> WorkerParts:
    settings, config = shared.settings, shared.config
    owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    driver = await _driver_pool(shared, stack)
    relay = await _build_relay(shared, stack, owner=owner, driver=driver)
    clients = await _claude_clients(settings, config, stack)
    health = LlmHealth()
    processing = None
    if clients:
        processor = build_processor(
            settings=settings,
            config=config,
            redis=shared.redis,
            engine=shared.engine,
            clients=clients,
            health=health,
            on_stored=relay.wake if relay is not None else lambda: None,
            driver=driver,
        )
        shadow = _build_shadow(shared, clients, live=processor)
        worker = QueueWorker(
            queue=shared.queue,
            leases=PartitionLeases(
                shared.redis,
                prefix=settings.redis_prefix,
                partitions=settings.partitions,
                owner=owner,
                ttl_ms=settings.lease_ttl_ms,
            ),
            process=processor.process,
            give_up=processor.give_up,
            consumer=owner,
            concurrency=settings.worker_concurrency or 2 * settings.llm_max_concurrency,
            grace_seconds=settings.shutdown_grace_seconds,
            max_failures=settings.max_deliveries,
            supervisor=shared.supervisor,
        )
        lane = _build_batch_lane(shared, clients, processor)
        processing = Processing(processor=processor, worker=worker, shadow=shadow, lane=lane)
    else:
        log.warning("llm_not_configured", detail="set ANTHROPIC_API_KEY; events stay queued")
    configured = processing is not None

    async def llm() -> str:
        return health.describe() if configured else NO_LLM

    shared.health.check("llm", llm, required=True)
    return WorkerParts(llm_health=health, processing=processing, relay=relay)


async def _driver_pool(shared: Shared, stack: AsyncExitStack) -> DriverPool | None:
    """On PostgreSQL, the pool the worker's per-event statements and the relay's fetch and
    write each round run on (``driver.py``), sized like the engine's; its connections are
    opened as they are needed."""
    engine = shared.engine
    if engine.dialect.name != "postgresql":
        return None
    driver = await DriverPool.open(
        engine.url, engine.dialect, size=shared.settings.database_pool_size
    )
    stack.push_async_callback(_close_driver, driver)
    return driver


async def _close_driver(driver: DriverPool) -> None:
    """As ``_dispose``: a database behind a silent network never answers the goodbyes."""
    try:
        async with asyncio.timeout(DISPOSE_TIMEOUT_SECONDS):
            await driver.close()
    except TimeoutError:
        log.warning("database_driver_close_timed_out", seconds=DISPOSE_TIMEOUT_SECONDS)
        driver.terminate()


async def _build_relay(
    shared: Shared, stack: AsyncExitStack, *, owner: str, driver: DriverPool | None
) -> OutboxRelay | None:
    """The SNS client and the relay, when a tool has a topic (else tool calls stay in the
    outbox); readiness reports whether each topic answers, without requiring it (the outbox
    holds tool calls while SNS is down)."""
    settings = shared.settings
    topics = sorted({t.topic_arn for t in shared.config.tools.values() if t.topic_arn})
    if not topics:

        async def no_topics() -> str:
            return "no topics configured: tool calls stay in the outbox"

        shared.health.check("sns", no_topics, required=False)
        return None
    client = await stack.enter_async_context(open_sns_client(settings.aws_region))
    publisher = SnsPublisher(client)
    shared.health.check("sns", lambda: _topics(publisher, topics), required=False)
    return OutboxRelay(
        sessions=shared.sessions,
        reads=read_session_factory(shared.engine),
        driver=driver,
        publisher=publisher,
        lease=RelayShards(
            shared.redis,
            prefix=settings.redis_prefix,
            owner=owner,
            shards=settings.relay_shards,
        ),
        memory=PublishedMemory(
            shared.redis,
            prefix=settings.redis_prefix,
            window_seconds=settings.publish_dedup_window_seconds,
        ),
        poll_seconds=settings.relay_poll_seconds,
        batch_concurrency=settings.relay_batch_concurrency,
    )


def _build_batch_lane(
    shared: Shared, clients: dict[str, ClaudeClient], processor: EventProcessor
) -> BatchLane | None:
    """The batch lane, over the Anthropic client (the config refuses ``mode: batch`` on
    Bedrock). It runs without a ``mode: batch`` pipeline too (seldom): requests a former
    config parked are read, decided or given up."""
    claude = clients.get("anthropic")
    if claude is None:
        if any(p.mode == "batch" for p in shared.config.pipelines.values()):
            log.warning(
                "batch_lane_unavailable", detail="no Anthropic client: batch pipelines are live"
            )
        return None
    lane = BatchLane(
        config=shared.config,
        processor=processor,
        client=BatchClient.sharing(claude),
        sessions=shared.sessions,
    )
    processor.batch_lane = lane
    return lane


def _build_shadow(
    shared: Shared, clients: dict[str, ClaudeClient], *, live: EventProcessor
) -> ShadowRunner | None:
    """Shadow candidates, when a pipeline has any: their own guarded caller (so they never
    take the live calls' slots) over the same Redis limits, breaker and budgets."""
    config = shared.config
    if not any(pipeline.shadow for pipeline in config.pipelines.values()):
        return None
    candidates = build_processor(
        settings=shared.settings,
        config=config,
        redis=shared.redis,
        engine=shared.engine,
        clients=clients,
        health=LlmHealth(),
        on_stored=lambda: None,
        # A candidate's pipeline has its own budget; of every shared rate limit it leaves
        # half to live events.
        rate_reserve=LIVE_RATE_RESERVE,
    )
    runner = ShadowRunner(
        config=config,
        rerunner=Rerunner(candidates, purpose=CallPurpose.SHADOW),
        sessions=shared.sessions,
        live_caller=live.caller,
    )
    live.after_decided = runner.after_decided
    return runner


def _llm_configured(settings: Settings, config: GatewayConfig) -> bool:
    return bool(
        settings.anthropic_api_key or os.environ.get("ANTHROPIC_BASE_URL") or wants_bedrock(config)
    )


async def _claude_clients(
    settings: Settings, config: GatewayConfig, stack: AsyncExitStack
) -> dict[str, ClaudeClient]:
    clients: dict[str, ClaudeClient] = {}
    if settings.anthropic_api_key or os.environ.get("ANTHROPIC_BASE_URL"):
        claude = ClaudeClient.from_env(
            api_key=settings.anthropic_api_key or "unset", timeout=settings.llm_timeout_seconds
        )
        stack.push_async_callback(claude.close)
        clients[claude.provider] = claude
    if wants_bedrock(config):
        bedrock = bedrock_client(settings)
        stack.push_async_callback(bedrock.close)
        clients[bedrock.provider] = bedrock
    return clients


def start(running: Running) -> None:
    """Every background loop runs under the supervisor (``/readyz`` reports one that is down)."""
    shared, supervisor = running.shared, running.shared.supervisor
    supervisor.start("backlog", shared.backlog.run)
    if running.worker is None:
        return
    # Without a pipeline that has a window, the closer still runs (seldom): windows a former
    # config opened hold events already acked off the stream.
    windowed = any(p.window is not None for p in shared.config.pipelines.values())
    closer = window_closing.WindowCloser(
        queue=shared.queue,
        sessions=shared.sessions,
        poll_seconds=window_closing.POLL_SECONDS if windowed else window_closing.IDLE_POLL_SECONDS,
    )
    if running.worker.processing is not None:
        running.worker.processing.processor.window_closed = closer.flush
    supervisor.start("windows", closer.run)
    if running.worker.processing is not None:
        if running.worker.processing.lane is not None:
            supervisor.start("batch-lane", running.worker.processing.lane.run)
        running.worker.processing.worker.start()
    if running.worker.relay is not None:
        supervisor.start("relay", running.worker.relay.run)
    if any(p.schedule is not None for p in shared.config.pipelines.values()):
        digests = DigestScheduler(
            config=shared.config, queue=shared.queue, sessions=shared.sessions
        )
        supervisor.start("digests", digests.run)
    if shared.settings.retention_seconds > 0:
        retention = RetentionJob(
            sessions=shared.sessions,
            max_age_seconds=shared.settings.retention_seconds,
            interval_seconds=shared.settings.retention_interval_seconds,
        )
        supervisor.start("retention", retention.run)


async def stop(running: Running) -> None:
    """Stop taking work; give in-flight events the grace period; then stop every loop."""
    processing = running.worker.processing if running.worker is not None else None
    if processing is not None:
        grace = running.shared.settings.shutdown_grace_seconds + 5
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await processing.worker.shutdown()
        if processing.shadow is not None:
            await processing.shadow.close(running.shared.settings.shutdown_grace_seconds)
    await running.shared.supervisor.stop_all()
    await _warn_of_lost_events(running.shared)


async def _warn_of_lost_events(shared: Shared) -> None:
    """``memory://`` keeps the queue inside this process: whatever is still on it (queued,
    or started and not acked) is gone once the process exits."""
    if not shared.settings.redis_url.startswith("memory://"):
        return
    try:
        depth, _ = await shared.queue.backlog()
    except REDIS_ERRORS as exc:
        log.warning("queue_unmeasured_at_exit", error=type(exc).__name__)
        return
    if depth:
        log.warning(
            "queued_events_lost",
            events=depth,
            redis="memory://",
            detail=f"{depth} queued event(s) were not processed and are lost with this process;"
            " set EVENTGATE_REDIS_URL to a Redis server to keep them across restarts",
        )


async def _replica_ack(shared: Shared) -> ReplicaAck | None:
    """The acknowledgement ingest waits for, None for the primary's alone; ``AckUnsupported``
    when it cannot be given (``memory://`` has no replicas, the unbatched enqueue no waits,
    the server no WAITAOF). Redis not answering yet is no refusal: a wait that cannot be
    given fails every enqueue with 503, never a 2xx that promises less."""
    settings = shared.settings
    if settings.redis_ack_replicas == 0 and not settings.redis_ack_aof:
        return None
    ack = ReplicaAck(
        replicas=settings.redis_ack_replicas,
        timeout_ms=settings.redis_ack_timeout_ms,
        aof=settings.redis_ack_aof,
    )
    try:
        if settings.redis_url.startswith("memory://"):
            raise AckUnsupported("EVENTGATE_REDIS_ACK_* needs a Redis server, not memory://")
        if not settings.ingest_batching:
            raise AckUnsupported("EVENTGATE_REDIS_ACK_* needs EVENTGATE_INGEST_BATCHING on")
        async with asyncio.timeout(LAYOUT_CHECK_SECONDS):
            await check_ack_support(shared.redis, ack)
    except AckUnsupported as exc:
        log.error("redis_ack_unsupported", detail=str(exc))
        raise
    except REDIS_ERRORS as exc:
        log.warning("redis_ack_unchecked", error=type(exc).__name__)
    return ack


async def _check_layout(queue: EventQueue) -> None:
    """Refuse to start with another partition count than the queue's (``layout.py``). Redis
    not answering yet is no refusal: the first enqueue and the worker's loops check again."""
    try:
        async with asyncio.timeout(LAYOUT_CHECK_SECONDS):
            await queue.check_layout()
    except PartitionCountMismatch as exc:
        log.error("partition_count_mismatch", detail=str(exc))
        raise
    except REDIS_ERRORS as exc:  # asyncio.timeout raises TimeoutError, an OSError
        log.warning("partition_count_unchecked", error=type(exc).__name__)


async def _dispose(engine: AsyncEngine) -> None:
    """Close the pool, but not for ever: closing a connection waits for the server's goodbye,
    which a database behind a silent network (packets dropped) never sends. The process is
    exiting; the operating system closes what is left."""
    try:
        async with asyncio.timeout(DISPOSE_TIMEOUT_SECONDS):
            await engine.dispose()
    except TimeoutError:
        log.warning("database_close_timed_out", seconds=DISPOSE_TIMEOUT_SECONDS)


async def _ping(engine: AsyncEngine) -> None:
    async with engine.connect() as connection:
        await connection.execute(text("SELECT 1"))


async def _loops(supervisor: Supervisor) -> str:
    down = supervisor.down()
    if not down:
        return "ok"
    return "down: " + "; ".join(f"{name} ({why})" for name, why in sorted(down.items()))


async def _topics(publisher: SnsPublisher, topics: list[str]) -> str:
    bad = []
    for arn in topics:
        try:
            async with asyncio.timeout(2.0):
                await publisher.check(arn)
        except Exception as exc:  # noqa: BLE001 - reported with its name
            bad.append(f"{arn}: error: {type(exc).__name__}")
    return "ok" if not bad else "; ".join(bad)
