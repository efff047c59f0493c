"""``eventgate`` command line: serve, api, worker, migrate, check-config, events."""

from __future__ import annotations

import contextlib
import ctypes
import gc
from importlib import metadata
from pathlib import Path
from typing import Annotated, Literal

import structlog
import typer
import uvicorn

from app.client.commands import events
from app.config import ConfigError, GatewayConfig, load_config
from app.observability.logging import configure_logging
from app.ready import GatewayServer
from app.rerun_cli import consistency, eval_cases, replay
from app.secret_policy import development_keys, refusal
from app.serving import http_protocol
from app.settings import Settings

app = typer.Typer(
    help="eventgate: verified webhooks → Claude tool calls → SNS FIFO.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(events, name="events")
app.command()(replay)
app.command()(consistency)
app.command("eval")(eval_cases)


def _version(show: bool) -> None:
    if show:
        typer.echo(f"eventgate {metadata.version('eventgate')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="print the version"),
    ] = False,
) -> None:
    """eventgate: verified webhooks → Claude tool calls → SNS FIFO."""


ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        envvar="EVENTGATE_CONFIG",
        help="YAML config file (default: built-in example config).",
    ),
]
HostOpt = Annotated[str, typer.Option("--host", envvar="EVENTGATE_HOST")]
PortOpt = Annotated[int, typer.Option("--port", envvar="EVENTGATE_PORT")]


def _load(config: Path | None) -> tuple[Settings, GatewayConfig]:
    settings = Settings(config=config)
    try:
        return settings, load_config(settings.config)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


def _serve(
    role: Literal["serve", "api", "worker"], config: Path | None, host: str, port: int
) -> None:
    from app.main import create_app

    settings, gateway_config = _load(config)
    refused = refusal(config=gateway_config, settings=settings, host=host)
    if refused:
        typer.echo(refused, err=True)
        raise typer.Exit(2)
    # The app's lifespan configures logging the same way; the warning comes before it.
    configure_logging(fmt=settings.log_format, level=settings.log_level)
    keys = development_keys(gateway_config, settings.admin_token)
    if keys:
        structlog.get_logger(__name__).warning(
            "development_secrets_in_use",
            keys=keys,
            host=host,
            detail="these values are public: set real secrets before anything real",
        )
    pin_mmap_threshold()
    application = create_app(settings, gateway_config, role=role, after_startup=tune_gc)
    server = GatewayServer(
        uvicorn.Config(
            application,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=int(settings.shutdown_grace_seconds),
            # Limits on what a client can hold before any request is verified
            # (app/serving.py); the connection limit is the protocol's own (a JSON 503).
            http=http_protocol(settings),
            timeout_keep_alive=settings.keep_alive_seconds,
        ),
        role=role,
    )
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        raise typer.Exit(STARTUP_FAILURE)


# uvicorn.run's exit code when the app's startup or the bind failed.
STARTUP_FAILURE = 3


GC_YOUNG_THRESHOLD = 20_000


def tune_gc() -> None:
    """Once everything is built: it lives as long as the process, so it leaves the cyclic
    GC's scans (full collections over it were the ingest p99 tail); and the young generation
    is collected less often (every 700 net allocations, the default, was about 13% of ingest
    CPU per request; a request's objects are freed by reference counting, so collecting less
    often frees the same memory later, not never)."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)


M_MMAP_THRESHOLD = -3  # glibc's mallopt() parameter number
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's initial threshold


def pin_mmap_threshold() -> None:
    """Keep large blocks mapped on their own, so that growing a request-body buffer moves
    pages (mremap) instead of copying them, and freeing it gives them back to the OS.

    glibc maps blocks over a threshold on their own, but raises the threshold to the largest
    such block freed (up to 32 MiB); after one 5 MiB body, buffers of a few MiB lived on the
    heap, where growing copies them and freeing leaves holes: 40 concurrent 5 MiB bodies
    under a 16 MiB budget grew peak RSS by 32-36 MiB, by 22-25 MiB with the threshold
    pinned (``tests/hardening/test_memory_before_auth.py``). Without glibc's ``mallopt``
    (musl maps large blocks anyway) there is nothing to pin."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


@app.command()
def serve(config: ConfigOpt = None, host: HostOpt = "127.0.0.1", port: PortOpt = 8080) -> None:
    """API, worker and publisher in one process."""
    _serve("serve", config, host, port)


@app.command()
def api(config: ConfigOpt = None, host: HostOpt = "127.0.0.1", port: PortOpt = 8080) -> None:
    """Ingest and admin endpoints only (no worker)."""
    _serve("api", config, host, port)


@app.command()
def worker(config: ConfigOpt = None, host: HostOpt = "127.0.0.1", port: PortOpt = 8081) -> None:
    """Queue consumer, Claude calls and SNS publisher (plus /healthz, /readyz, /metrics)."""
    _serve("worker", config, host, port)


@app.command()
def migrate() -> None:
    """Apply database migrations (EVENTGATE_DATABASE_URL) and exit."""
    from app.store.migrate import upgrade_head

    upgrade_head(Settings().database_url)
    typer.echo("database is at the latest migration")


@app.command()
def repartition(
    partitions: Annotated[int, typer.Argument(min=1, help="the new partition count")],
) -> None:
    """Change the queue's partition count (EVENTGATE_REDIS_URL, EVENTGATE_REDIS_PREFIX).

    Refused unless every stream is empty and no worker is running: stop ingest, let the
    workers drain the queue, stop every process, run this, then start them all with
    EVENTGATE_PARTITIONS set to the new count."""
    import asyncio

    from app.queue.connection import is_cluster, open_redis
    from app.queue.layout import NotDrained
    from app.queue.layout import repartition as change

    settings = Settings()

    async def run() -> str:
        redis = await open_redis(settings.redis_url, cluster=settings.redis_cluster)
        try:
            done = await change(
                redis,
                prefix=settings.redis_prefix,
                partitions=partitions,
                source_wide_dedup=not is_cluster(redis),
            )
        finally:
            await redis.aclose()
        if done.before == done.after:
            return f"the queue already has {done.after} partitions"
        return (
            f"partitions: {done.before} → {done.after} ({done.streams_removed} empty streams "
            f"removed); start every process with EVENTGATE_PARTITIONS={done.after}"
        )

    try:
        typer.echo(asyncio.run(run()))
    except NotDrained as exc:
        typer.echo(f"refused: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command("check-config")
def check_config(config: ConfigOpt = None) -> None:
    """Validate the config and print its sources, pipelines and tools.

    Every error is printed, one per line (exit code 2); an unknown model is a warning."""
    from app.llm.pricing import unknown_models

    settings = Settings(config=config)
    try:
        parsed = load_config(settings.config)
    except ConfigError as exc:
        for error in exc.errors:
            typer.echo(error, err=True)
        count = len(exc.errors)
        where = settings.config or "built-in example config"
        typer.echo(f"{where}: invalid ({count} error{'s' if count != 1 else ''})", err=True)
        raise typer.Exit(2) from None
    for warning in unknown_models(parsed):
        typer.echo(f"warning: {warning}", err=True)
    typer.echo(f"config: {config or 'built-in example'}")
    typer.echo("sources:")
    for name, source in parsed.sources.items():
        extra = f", group_key: {source.group_key}" if source.group_key else ""
        typer.echo(
            f"  {name}: type {source.type} → pipeline {source.pipeline}{extra}"
            f" (POST /v1/webhooks/{name})"
        )
    typer.echo("pipelines:")
    for name, pipeline in parsed.pipelines.items():
        fallback = f", fallback {pipeline.fallback_model}" if pipeline.fallback_model else ""
        typer.echo(f"  {name}: model {pipeline.model}{fallback}; tools {', '.join(pipeline.tools)}")
    typer.echo("tools:")
    for name, tool in parsed.tools.items():
        typer.echo(f"  {name}: topic {tool.topic_arn or '(none: calls stay in the outbox)'}")
