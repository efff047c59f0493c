"""Ingest: verify → parse → describe → dedup + enqueue, in that order.

Invariant: the caller sends 2xx only after ``enqueue`` returned, i.e. the event is on its
partition's stream (or a duplicate of one that is). Any Redis failure becomes
``QueueUnavailable`` (503 with Retry-After), never a 2xx.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

import orjson
import structlog
from redis.exceptions import RedisError

from app.config import GatewayConfig, SourceConfig
from app.errors import QueueUnavailable
from app.ingest.exceptions import InvalidPayload, UnknownSource, UnsupportedMediaType
from app.ingest.schemas import Event
from app.ingest.sources import Headers, SourceAdapter, build_adapter
from app.observability.metrics import WEBHOOKS_RECEIVED
from app.queue.batching import EventEnqueuer

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class IngestOutcome:
    event_id: str | None
    status: str  # queued | duplicate | ignored


@dataclass(frozen=True, slots=True)
class RegisteredSource:
    name: str
    config: SourceConfig
    adapter: SourceAdapter
    max_body_bytes: int
    dedup_window_ms: int


class IngestService:
    def __init__(
        self,
        *,
        config: GatewayConfig,
        queue: EventEnqueuer,
        max_body_bytes: int,
        dedup_window_seconds: int,
    ) -> None:
        self.queue = queue
        self.sources = {
            name: RegisteredSource(
                name=name,
                config=source,
                adapter=build_adapter(name, source),
                max_body_bytes=source.max_body_bytes or max_body_bytes,
                dedup_window_ms=1000 * (source.dedup_window_seconds or dedup_window_seconds),
            )
            for name, source in config.sources.items()
        }

    def source(self, name: str) -> RegisteredSource:
        try:
            return self.sources[name]
        except KeyError:
            raise UnknownSource(f"no source named {name!r} is configured") from None

    async def ingest(
        self, source: RegisteredSource, headers: Headers, body: bytes
    ) -> IngestOutcome:
        try:
            return await self._ingest(source, headers, body)
        except Exception as exc:
            outcome = type(exc).__name__ if hasattr(exc, "status_code") else "error"
            WEBHOOKS_RECEIVED.labels(source=source.name, outcome=outcome).inc()
            raise

    async def _ingest(
        self, source: RegisteredSource, headers: Headers, body: bytes
    ) -> IngestOutcome:
        source.adapter.verify(headers, body)
        payload = parse_body(headers.get("content-type", ""), body)
        described = source.adapter.describe(headers, payload)
        if described is None:
            WEBHOOKS_RECEIVED.labels(source=source.name, outcome="ignored").inc()
            return IngestOutcome(None, "ignored")
        event = Event(
            id=f"evt_{uuid.uuid4().hex}",
            source=source.name,
            type=described.type,
            group_key=described.group_key,
            delivery_id=described.delivery_id,
            pipeline=source.config.pipeline,
            received_at=datetime.now(UTC),
            payload=payload,
        )
        try:
            result = await self.queue.enqueue(
                event_id=event.id,
                source=source.name,
                delivery_id=event.delivery_id,
                group_key=event.group_key,
                data=event.to_bytes(),
                dedup_window_ms=source.dedup_window_ms,
            )
        except (RedisError, OSError) as exc:
            log.warning("enqueue_failed", source=source.name, error=type(exc).__name__)
            raise QueueUnavailable("the event queue is unreachable; retry later") from exc
        status = "queued" if result.created else "duplicate"
        WEBHOOKS_RECEIVED.labels(source=source.name, outcome=status).inc()
        log.info(
            "webhook_" + status,
            source=source.name,
            event_id=result.event_id,
            event_type=event.type,
            group_key=event.group_key,
        )
        return IngestOutcome(result.event_id, status)


def parse_body(content_type: str, body: bytes) -> Any:
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/x-www-form-urlencoded":
        # GitHub's "form" content type: the JSON document is in the `payload` field.
        form = parse_qs(body.decode("utf-8", "replace"))
        if "payload" not in form:
            raise InvalidPayload("form body has no 'payload' field")
        body = form["payload"][0].encode()
    elif media and media != "application/json" and not media.endswith("+json"):
        raise UnsupportedMediaType(f"expected application/json, got {media!r}")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidPayload(f"body is not valid JSON: {exc}") from None
