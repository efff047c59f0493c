"""The app factory: one ``Gateway`` (a FastAPI app) per process, built for its role.

Roles: ``api`` (webhooks, admin API), ``worker`` (the queue consumer that decides with Claude,
the relay that publishes, retention), ``serve`` (both). The lifespan builds what the role runs
(``app/roles.py``), starts its background loops under one supervisor, and on exit lets
in-flight events finish within the grace period, stops the loops and closes every client.

Where a webhook enters: ``Gateway.__call__`` hands ``POST /v1/webhooks/{source}`` to the
``WebhookEntry`` the lifespan built, before FastAPI's middleware and routing; the FastAPI
route of the same path (which the OpenAPI schema documents) calls the same entry.

``/docs`` and ``/redoc`` serve their scripts and styles from the installed package
(``app/api_docs.py``), not from a CDN; ``/console`` is the operators' console
(``app/console/``), in the roles that serve the admin API.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Literal

import structlog
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from app.admin.router import router as admin_router
from app.api_docs import install_offline_docs
from app.config import GatewayConfig, load_config
from app.console.router import router as console_router
from app.errors import install_error_handlers
from app.ingest.router import WebhookEntry, webhook_source
from app.ingest.router import router as ingest_router
from app.observability.router import router as health_router
from app.roles import build, start, stop
from app.settings import Settings
from app.sources.base import AdapterDeps

Role = Literal["serve", "api", "worker"]
log = structlog.get_logger(__name__)


class Gateway(FastAPI):
    """``direct_webhooks=False`` sends webhooks through FastAPI's routing too (tests compare
    the two ways in)."""

    webhook_entry: WebhookEntry | None = None
    direct_webhooks: bool = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        entry = self.webhook_entry
        if entry is not None and self.direct_webhooks and scope["type"] == "http":
            source = webhook_source(scope["path"]) if scope["method"] == "POST" else None
            if source is not None:
                await entry(scope, receive, send, source)
                return
        await super().__call__(scope, receive, send)


def create_app(
    settings: Settings | None = None,
    config: GatewayConfig | None = None,
    *,
    role: Role = "serve",
    adapter_deps: AdapterDeps | None = None,
    after_startup: Callable[[], None] | None = None,
) -> Gateway:
    """``adapter_deps`` replaces the adapters' network edges (tests: SNS certificates);
    ``after_startup`` runs once everything is built (the CLI tunes the GC there)."""
    settings = settings or Settings()
    config = config or load_config(settings.config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        assert isinstance(app, Gateway)
        async with AsyncExitStack() as stack:
            running = await build(settings, config, role=role, stack=stack, deps=adapter_deps)
            app.state.running = running
            app.state.health = running.shared.health
            if running.api is not None:
                app.state.webhooks = app.webhook_entry = running.api.webhooks
                app.state.admin = running.api.admin
                app.state.console = running.api.console
            start(running)
            if after_startup is not None:
                after_startup()
            processing = running.worker.processing if running.worker is not None else None
            log.info(
                "eventgate_started",
                role=role,
                sources=sorted(config.sources),
                redis=settings.redis_url.split("@")[-1],
                redis_cluster=running.shared.queue.cluster,
                llm_configured=processing is not None,
                builtin_config=settings.config is None,
            )
            try:
                yield
            finally:
                await stop(running)

    app = Gateway(
        title="eventgate",
        version="0.1.0",
        description="Verified webhooks in; Claude's tool calls out to SNS FIFO, in order, "
        "once; every LLM call audited.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    install_offline_docs(app)
    install_error_handlers(app)
    app.include_router(health_router)
    if role in ("serve", "api"):
        app.include_router(ingest_router)
        app.include_router(admin_router)
        app.include_router(console_router)
    return app
