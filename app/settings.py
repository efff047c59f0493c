"""Process settings, read from the environment (prefix ``EVENTGATE_``).

The SDKs' own variables (``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``, ``AWS_REGION``,
``AWS_ENDPOINT_URL_SNS`` ...) are read by the SDKs themselves and are not repeated here, except
where the gateway needs to know them (is the LLM configured? which region?).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EVENTGATE_", extra="ignore")

    config: Path | None = None
    redis_url: str = "memory://"
    # Prefix of every Redis key; lets several gateways (or test runs) share one Redis.
    redis_prefix: str = "eventgate"
    # What a 2xx promises (docs/operations.md): also on this many replicas (WAIT), and with
    # redis_ack_aof fsynced to the primary's AOF (WAITAOF, Redis 7.2+), each within the
    # timeout, else 503 QueueNotReplicated (the event stays queued). 0 / false: on the
    # primary only.
    redis_ack_replicas: int = Field(default=0, ge=0)
    redis_ack_timeout_ms: int = Field(default=500, ge=1, le=5000)
    redis_ack_aof: bool = False
    # Redis Cluster: unset, detected from the node at redis_url (INFO cluster); true or false
    # forces the cluster client or a plain one.
    redis_cluster: bool | None = None
    database_url: str = "sqlite+aiosqlite:///./eventgate.db"
    # Connections per process (PostgreSQL): up to half as many more under load, then kept.
    database_pool_size: int = Field(default=20, ge=1)
    admin_token: str | None = None
    auto_migrate: bool = True

    partitions: int = Field(default=16, ge=1, le=1024)
    dedup_window_seconds: int = Field(default=24 * 3600, ge=1)
    max_body_bytes: int = Field(default=5 * 1024 * 1024, ge=1)

    llm_max_concurrency: int = Field(default=16, ge=1)
    # Events a worker process handles at once (unset: 2 x llm_max_concurrency). Claude calls
    # stay within llm_max_concurrency; the others meanwhile store a finished call's outcome
    # or prepare the next one, so the Claude slots do not wait for the database.
    worker_concurrency: int | None = Field(default=None, ge=1)
    llm_timeout_seconds: float = Field(default=60.0, gt=0)
    llm_max_tokens: int = Field(default=1024, ge=1)
    # Failed (or crashed) processings of one event before it is dead-lettered as poison;
    # failures of an unavailable Redis or database do not count.
    max_deliveries: int = Field(default=5, ge=1)
    # A supervised background loop that ended unexpectedly is restarted after this long
    # (doubling on each restart in a row, up to 30 s).
    task_restart_seconds: float = Field(default=1.0, gt=0)
    # A dead owner's partitions are taken over within about this long.
    lease_ttl_ms: int = Field(default=10_000, ge=500)
    # Backpressure: ingest answers 503 past either limit (0 turns a limit off).
    backlog_max_depth: int = Field(default=100_000, ge=0)
    backlog_max_age_seconds: float = Field(default=0, ge=0)
    # Published dedup ids are remembered this long (SNS itself forgets after 5 minutes).
    publish_dedup_window_seconds: int = Field(default=24 * 3600, ge=1)

    shutdown_grace_seconds: float = Field(default=20.0, ge=0)

    relay_poll_seconds: float = Field(default=1.0, gt=0)
    # PublishBatch calls in flight at once (each for different message groups).
    relay_batch_concurrency: int = Field(default=4, ge=1)
    # Relays split the message groups into this many shards, a fair share for each live
    # relay process (app/publish/shards.py); every process must use the same count.
    relay_shards: int = Field(default=8, ge=1, le=256)

    log_format: str = Field(default="auto", pattern="^(auto|json|console)$")
    log_level: str = "info"

    # Operating (admin API, retention). Finished events (with their tool calls and dead
    # letters) and audit rows older than this are deleted periodically; 0 keeps everything.
    retention_seconds: int = Field(default=30 * 24 * 3600, ge=0)
    retention_interval_seconds: float = Field(default=3600.0, gt=0)

    # --- Claude call discipline: rate limits, retries, breaker, audit text ---
    # Defaults for models without a `models:` entry in the config; 0 = no local limit (the
    # anthropic-ratelimit-* headers and retry-after still slow the gateway down).
    llm_requests_per_minute: int = Field(default=0, ge=0)
    llm_input_tokens_per_minute: int = Field(default=0, ge=0)
    llm_output_tokens_per_minute: int = Field(default=0, ge=0)
    llm_retry_base_seconds: float = Field(default=1.0, gt=0)
    llm_retry_cap_seconds: float = Field(default=30.0, gt=0)
    llm_retry_after_max_seconds: float = Field(default=60.0, gt=0)
    # Time one event may spend in failing attempts and backoff before it is dead-lettered
    # (waits for an open breaker, the rate limiter or a budget do not count): two hours ride
    # out a bad hour of an overloaded API.
    llm_event_deadline_seconds: float = Field(default=7200.0, gt=0)
    llm_breaker_window_seconds: float = Field(default=30.0, gt=0)
    llm_breaker_min_calls: int = Field(default=5, ge=1)
    llm_breaker_failure_ratio: float = Field(default=0.5, gt=0, le=1)
    llm_breaker_cooldown_seconds: float = Field(default=15.0, gt=0)
    llm_breaker_consecutive_failures: int = Field(default=5, ge=1)
    llm_audit_text: str = Field(default="redacted", pattern="^(full|redacted|none)$")
    llm_budget_poll_seconds: float = Field(default=30.0, gt=0)
    # Replay, consistency and eval: the longest one event may take (waits for the breaker,
    # the rate limiter and retries included) before the run reports it as an error. The live
    # path waits out an outage; a run must end.
    rerun_deadline_seconds: float = Field(default=600.0, gt=0)
    llm_bedrock_region: str | None = None

    # Ingest hot path (benchmarks): commit concurrent requests' dedup + enqueue in one
    # round trip (app/queue/batching.py). Off: one Lua call per request.
    ingest_batching: bool = True

    # Hardening: a sender must deliver its whole body within this long (408 otherwise).
    body_read_timeout_seconds: float = Field(default=30.0, gt=0)
    # Serve with the built-in development secrets on a non-loopback address (a local demo).
    allow_dev_secrets: bool = False
    # Bytes of request bodies one process holds at once (503 BodyBufferFull beyond).
    ingest_buffer_bytes: int = Field(default=64 * 1024 * 1024, ge=1)
    # The HTTP server (eventgate serve/api/worker): open connections (or requests in
    # progress) past which requests get 503 TooManyConnections; idle keep-alive connections
    # closed after this long; bytes of a request line + headers, and of a chunked body's
    # framing and trailers (431 beyond); a connection must send a whole request head within
    # head_timeout_seconds of its first byte (and its first byte within keep_alive_seconds)
    # or it is closed.
    limit_concurrency: int = Field(default=1000, ge=1)
    keep_alive_seconds: int = Field(default=5, ge=1)
    max_header_bytes: int = Field(default=64 * 1024, ge=1024)
    head_timeout_seconds: float = Field(default=10.0, gt=0)

    # Secrets in payloads (keys naming them, credential-looking strings) are replaced at
    # ingest, before anything stores or forwards the payload; "off" keeps payloads as sent.
    payload_redaction: str = Field(default="on", pattern="^(on|off)$")

    @property
    def anthropic_api_key(self) -> str | None:
        return os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")

    @property
    def aws_region(self) -> str:
        # botocore reads AWS_DEFAULT_REGION only; honour AWS_REGION too (see NOTES.md).
        return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
