"""App factory and lifespan: build every client into ``AppState``, start the roles' loops,
close everything on exit."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Literal

import aioboto3
import structlog
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.admin.router import router as admin_router
from app.config import GatewayConfig, load_config
from app.decide.wiring import bedrock_client, build_processor, wants_bedrock
from app.errors import install_error_handlers
from app.ingest.budget import BodyBudget
from app.ingest.collapse import AlertCollapser
from app.ingest.router import WebhookFastPath
from app.ingest.router import router as ingest_router
from app.ingest.service import IngestService
from app.llm.client import ClaudeClient
from app.observability.logging import configure_logging
from app.observability.router import router as health_router
from app.publish.coordination import PublishedMemory, RelayLease
from app.publish.relay import OutboxRelay
from app.publish.sns import SnsPublisher
from app.queue.backlog import BacklogMonitor
from app.queue.batching import EnqueueBatcher
from app.queue.connection import connect_redis
from app.queue.leases import PartitionLeases
from app.queue.streams import EventQueue
from app.queue.worker import QueueWorker
from app.settings import Settings
from app.sources.base import AdapterDeps
from app.state import AppState
from app.store.db import create_engine, session_factory
from app.store.migrate import upgrade_head
from app.store.retention import RetentionJob
from app.supervision import Supervisor

Role = Literal["serve", "api", "worker"]
log = structlog.get_logger(__name__)
GC_YOUNG_THRESHOLD = 20_000
DISPOSE_TIMEOUT_SECONDS = 5.0


def create_app(
    settings: Settings | None = None,
    config: GatewayConfig | None = None,
    *,
    role: Role = "serve",
    adapter_deps: AdapterDeps | None = None,
) -> FastAPI:
    """``adapter_deps`` replaces the adapters' network edges (tests: SNS certificates)."""
    settings = settings or Settings()
    config = config or load_config(settings.config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            state = await _build_state(settings, config, role, stack, adapter_deps)
            app.state.gateway = state
            _start_loops(state)
            # Everything built so far lives as long as the process: keep it out of the cyclic
            # GC's scans (full collections over it were the ingest p99 tail).
            gc.freeze()
            # Young-generation collections every 700 net allocations (the default) were about
            # 13% of ingest CPU per request; the objects of a request are freed by reference
            # counting, so collecting less often frees the same memory later, not never.
            gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)
            log.info(
                "eventgate_started",
                role=role,
                sources=sorted(config.sources),
                redis=settings.redis_url.split("@")[-1],
                llm_configured=state.claude is not None,
                builtin_config=settings.config is None,
            )
            try:
                yield
            finally:
                await _stop_loops(state)

    app = FastAPI(
        title="eventgate",
        version="0.1.0",
        description="Verified webhooks in; Claude's tool calls out to SNS FIFO, in order, "
        "once; every LLM call audited.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    if role in ("serve", "api"):
        app.add_middleware(WebhookFastPath)
    app.include_router(health_router)
    if role in ("serve", "api"):
        app.include_router(ingest_router)
        app.include_router(admin_router)
    return app


async def _build_state(
    settings: Settings,
    config: GatewayConfig,
    role: Role,
    stack: AsyncExitStack,
    adapter_deps: AdapterDeps | None = None,
) -> AppState:
    configure_logging(fmt=settings.log_format, level=settings.log_level)
    if settings.auto_migrate:
        await asyncio.to_thread(upgrade_head, settings.database_url)
    engine = create_engine(settings.database_url, pool_size=settings.database_pool_size)
    stack.push_async_callback(_dispose, engine)
    redis = connect_redis(settings.redis_url)
    stack.push_async_callback(redis.aclose)
    queue = EventQueue(redis, prefix=settings.redis_prefix, partitions=settings.partitions)
    state = AppState(
        settings=settings,
        config=config,
        role=role,
        engine=engine,
        sessions=session_factory(engine),
        redis=redis,
        queue=queue,
        backlog=BacklogMonitor(
            queue,
            max_depth=settings.backlog_max_depth,
            max_age_seconds=settings.backlog_max_age_seconds,
        ),
        body_budget=BodyBudget(settings.ingest_buffer_bytes),
        ingest=IngestService(
            config=config,
            queue=EnqueueBatcher(queue) if settings.ingest_batching else queue,
            collapser=AlertCollapser(redis, prefix=settings.redis_prefix),
            max_body_bytes=settings.max_body_bytes,
            dedup_window_seconds=settings.dedup_window_seconds,
            redact_payloads=settings.payload_redaction == "on",
            deps=adapter_deps,
        ),
    )
    if settings.anthropic_api_key or os.environ.get("ANTHROPIC_BASE_URL"):
        state.claude = ClaudeClient.from_env(
            api_key=settings.anthropic_api_key or "unset", timeout=settings.llm_timeout_seconds
        )
        stack.push_async_callback(state.claude.close)
    if wants_bedrock(config):
        state.bedrock = bedrock_client(settings)
        stack.push_async_callback(state.bedrock.close)
    if any(tool.topic_arn for tool in config.tools.values()):
        sns = await stack.enter_async_context(
            aioboto3.Session().client("sns", region_name=settings.aws_region)
        )
        state.publisher = SnsPublisher(sns)
    state.supervisor = Supervisor(restart_seconds=settings.task_restart_seconds)
    if role in ("serve", "worker"):
        _build_worker(state)
    return state


def _build_worker(state: AppState) -> None:
    settings = state.settings
    owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    if state.publisher is not None:
        state.relay = OutboxRelay(
            sessions=state.sessions,
            publisher=state.publisher,
            lease=RelayLease(state.redis, key=f"{settings.redis_prefix}:relay-lease", owner=owner),
            memory=PublishedMemory(
                state.redis,
                prefix=settings.redis_prefix,
                window_seconds=settings.publish_dedup_window_seconds,
            ),
            poll_seconds=settings.relay_poll_seconds,
            batch_concurrency=settings.relay_batch_concurrency,
        )
    relay = state.relay
    clients = {c.provider: c for c in (state.claude, state.bedrock) if c is not None}
    if not clients:
        log.warning("llm_not_configured", detail="set ANTHROPIC_API_KEY; events stay queued")
        return
    processor = build_processor(
        settings=settings,
        config=state.config,
        redis=state.redis,
        engine=state.engine,
        clients=clients,
        health=state.llm_health,
        on_stored=relay.wake if relay is not None else lambda: None,
    )
    state.worker = QueueWorker(
        queue=state.queue,
        leases=PartitionLeases(
            state.redis,
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
        supervisor=state.supervisor,
    )


def _start_loops(state: AppState) -> None:
    """Every background loop runs under the supervisor (``/readyz`` reports one that is down)."""
    supervisor = state.supervisor
    supervisor.start("backlog", state.backlog.run)
    if state.worker is not None:
        state.worker.start()
    if state.relay is not None:
        supervisor.start("relay", state.relay.run)
    if state.role != "api" and state.settings.retention_seconds > 0:
        retention = RetentionJob(
            sessions=state.sessions,
            max_age_seconds=state.settings.retention_seconds,
            interval_seconds=state.settings.retention_interval_seconds,
        )
        supervisor.start("retention", retention.run)


async def _dispose(engine: AsyncEngine) -> None:
    """Close the pool, but not for ever: closing a connection waits for the server's goodbye,
    which a database behind a silent network (packets dropped) never sends. The process is
    exiting; the operating system closes what is left."""
    try:
        await asyncio.wait_for(engine.dispose(), DISPOSE_TIMEOUT_SECONDS)
    except TimeoutError:
        log.warning("database_close_timed_out", seconds=DISPOSE_TIMEOUT_SECONDS)


async def _stop_loops(state: AppState) -> None:
    """Stop taking work; give in-flight events the grace period; then stop every loop."""
    if state.worker is not None:
        grace = state.settings.shutdown_grace_seconds + 5
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.worker.shutdown(), grace)
    await state.supervisor.stop_all()
