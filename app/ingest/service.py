"""Ingest: admit (headers) → verify (body) → describe → bound, redact and serialise every
event → per event: filter → collapse → dedup + enqueue.

Invariant: the caller sends 2xx only after every event of the request was enqueued (or found
to be a duplicate, filtered or collapsed). Events are enqueued one after another, in request
order, so readings of one device in a batch keep their order. If Redis fails midway the
request gets ``QueueUnavailable`` (503 with Retry-After); the sender's retry describes the
same delivery ids, so the events already queued are answered ``duplicate``, never doubled.
With a replica acknowledgement (``app/queue/acks.py``) an event the replicas did not
acknowledge in time is answered ``QueueNotReplicated`` (503): it stays queued, and the retry
is answered ``duplicate`` only after the same wait succeeded.

Secrets in a payload are redacted once, when its event is built (``app.redaction``): after
verification and the group key, type and delivery id (filters and collapse read the payload
as sent too), and before the event is serialised for the stream, so Claude, the stored
payload, the audit log and the logs never see them. A payload nested deeper than
``MAX_DEPTH`` levels is refused (``InvalidPayload``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import structlog

from app.config import GatewayConfig, SourceConfig
from app.errors import AppError, QueueNotReplicated, QueueUnavailable
from app.events import Event, make_event
from app.faults import REDIS_ERRORS, raised_in_redis_client
from app.ingest.bounds import MAX_DELIVERY_ID_CHARS, MAX_GROUP_KEY_CHARS, bounded_key, checked_type
from app.ingest.collapse import AlertCollapser
from app.ingest.exceptions import ClientDisconnected, UnknownSource
from app.ingest.filters import evaluate
from app.ingest.rejections import UNKNOWN_SOURCE, RejectionLog, count_rejection
from app.observability.metrics import (
    ALERTS_COLLAPSED,
    DEDUP_HITS,
    EVENTS_FILTERED,
    WEBHOOKS_RECEIVED,
    labelled,
)
from app.payloads import resolve_key
from app.queue.acks import NotReplicated
from app.queue.backlog import BacklogMonitor
from app.queue.batching import EventEnqueuer
from app.queue.layout import PartitionCountMismatch
from app.queue.replays import ReplayInFlight
from app.queue.streams import NewEntry
from app.redaction import NestingTooDeep, payload_to_json, redact_to_json
from app.sources.admission import Body, BodyCheck
from app.sources.base import AdapterDeps, Batch, Described, Headers, SourceAdapter
from app.sources.exceptions import InvalidPayload
from app.sources.registry import build_adapter

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class EventOutcome:
    event_id: str | None
    status: str  # queued | duplicate | filtered | collapsed | ignored
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class IngestOutcome:
    events: list[EventOutcome]
    batch: bool

    @property
    def queued(self) -> bool:
        return any(e.status == "queued" for e in self.events)


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
        collapser: AlertCollapser,
        max_body_bytes: int,
        dedup_window_seconds: int,
        backlog: BacklogMonitor,
        redact_payloads: bool = True,
        deps: AdapterDeps | None = None,
        rejections: RejectionLog | None = None,
    ) -> None:
        self.queue = queue
        self.backlog = backlog
        self.redact_payloads = redact_payloads
        self.collapser = collapser
        self.rejections = rejections or RejectionLog()
        self.sources = {
            name: RegisteredSource(
                name=name,
                config=source,
                adapter=build_adapter(name, source, deps),
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

    def rejected(self, name: str, error: AppError, *, remote: str | None) -> None:
        """Count and (rate-limited) log a delivery answered with ``error``."""
        known = name in self.sources
        source = name if known else UNKNOWN_SOURCE
        kind = type(error).__name__
        count_rejection(source, kind)
        if isinstance(error, ClientDisconnected):
            # Nobody is left to answer; senders do this routinely (timeouts, deploys).
            log.info("webhook_client_disconnected", source=source, remote=remote)
            return
        self.rejections.record(
            source=source,
            error=kind,
            status=error.status_code,
            remote=remote,
            detail=error.message,
            requested=None if known else name,
        )

    def admit(self, source: RegisteredSource, headers: Headers) -> BodyCheck:
        """Before the body is read: refuse while the backlog is over its limit, and what the
        headers show is wrong; the returned check is fed the body's chunks as they arrive
        (see ``app/sources/admission.py``)."""
        self.backlog.check()
        return source.adapter.admit(headers)

    async def ingest(
        self,
        source: RegisteredSource,
        headers: Headers,
        body: Body,
        check: BodyCheck | None = None,
    ) -> IngestOutcome:
        """``check``: what ``admit`` returned, already fed with ``body``; without it the
        body is verified whole."""
        try:
            if check is None:
                await source.adapter.verify(headers, body)
            else:
                await check.finish(body)
            found = await source.adapter.describe(headers, body)
            batch = isinstance(found, Batch) or any(d.batch_index is not None for d in found)
            described = [_bounded(item) for item in found]
            # Every event of the request is built and serialised before the first is queued:
            # one that cannot be stored refuses the whole request, never half of a batch.
            prepared = [self._event(source, item) for item in described]
        except Exception as exc:
            if not isinstance(exc, AppError):  # rejections are counted by ``rejected``
                WEBHOOKS_RECEIVED.labels(source=source.name, outcome="error").inc()
            raise
        if not described:
            WEBHOOKS_RECEIVED.labels(source=source.name, outcome="ignored").inc()
            return IngestOutcome([] if batch else [EventOutcome(None, "ignored")], batch=batch)
        outcomes: list[EventOutcome] = []
        try:
            for item, (event, event_bytes) in zip(described, prepared, strict=True):
                outcomes.append(await self._one(source, item, event, event_bytes))
        except REDIS_ERRORS as exc:
            log.warning("enqueue_failed", source=source.name, error=type(exc).__name__)
            raise QueueUnavailable("the event queue is unreachable; retry later") from exc
        except (AttributeError, TypeError, RuntimeError) as exc:
            if not raised_in_redis_client(exc):
                raise
            log.warning("enqueue_failed", source=source.name, error=type(exc).__name__)
            raise QueueUnavailable("the event queue is unreachable; retry later") from exc
        except PartitionCountMismatch as exc:
            log.error("enqueue_refused", source=source.name, error=str(exc))
            raise QueueUnavailable("the event queue is misconfigured; retry later") from exc
        except ReplayInFlight as exc:
            raise QueueUnavailable(
                "an identical signed request is being queued right now; retry later",
                retry_after=1,
            ) from exc
        except NotReplicated as exc:
            log.warning("enqueue_not_replicated", source=source.name, detail=str(exc))
            raise QueueNotReplicated(
                f"the event is queued, but not acknowledged as asked: {exc}; retry later"
            ) from exc
        queued = 0
        for done in outcomes:
            labelled(WEBHOOKS_RECEIVED, source.name, done.status).inc()
            queued += done.status == "queued"
        if queued:
            self.backlog.record_enqueued(queued)
        return IngestOutcome(outcomes, batch=batch)

    async def _one(
        self, source: RegisteredSource, item: Described, event: Event, data: bytes
    ) -> EventOutcome:
        fields = {"source": source.name, "event_type": item.type, "group_key": item.group_key}
        verdict = evaluate(source.config.filters, item.type, item.payload)
        if not verdict.keep:
            EVENTS_FILTERED.labels(source=source.name, reason=verdict.reason).inc()
            log.info("webhook_filtered", reason=verdict.reason, detail=verdict.detail, **fields)
            return EventOutcome(None, "filtered", verdict.detail)
        firing, resolved = self._fingerprints(source.config, item)
        if firing and not resolved:  # a resolution in the same delivery is news
            repeat = await self.collapser.repeat_of(source=source.name, fingerprints=firing)
            if repeat is not None:
                ALERTS_COLLAPSED.labels(source=source.name).inc()
                log.info(
                    "webhook_collapsed", event_id=repeat.event_id, repeats=repeat.repeats, **fields
                )
                detail = f"repeat {repeat.repeats} of an alert already sent to the LLM"
                return EventOutcome(repeat.event_id, "collapsed", detail)
        result = await self.queue.enqueue(
            NewEntry(
                event_id=event.id,
                source=source.name,
                delivery_id=event.delivery_id,
                group_key=event.group_key,
                data=data,
                dedup_window_ms=source.dedup_window_ms,
                replay_id=item.replay_id,
            )
        )
        status = "queued" if result.created else "duplicate"
        if not result.created:
            DEDUP_HITS.labels(layer="delivery").inc()
        # Debug, not info: a line per accepted delivery cost about a fifth of ingest's CPU
        # (docs/benchmarks.md); the sender has the event id, and the metrics count them.
        log.debug("webhook_" + status, event_id=result.event_id, **fields)
        if result.created and source.config.collapse is not None:
            await self._track(source, firing, resolved, result.event_id)
        return EventOutcome(result.event_id, status)

    def _event(self, source: RegisteredSource, item: Described) -> tuple[Event, bytes]:
        """The event, with its payload redacted, and its bytes for the stream."""
        try:
            if self.redact_payloads:
                payload, payload_json = redact_to_json(item.payload)
            else:
                payload, payload_json = item.payload, payload_to_json(item.payload)
        except NestingTooDeep as exc:
            raise InvalidPayload(str(exc)) from None
        event = make_event(
            id=f"evt_{os.urandom(16).hex()}",
            source=source.name,
            config=source.config,
            type=item.type,
            group_key=item.group_key,
            delivery_id=item.delivery_id,
            pipeline=source.config.pipeline,
            received_at=datetime.now(UTC),
            payload=payload,
        )
        return event, event.to_bytes(payload_json=payload_json)

    @staticmethod
    def _fingerprints(
        config: SourceConfig, item: Described
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if config.collapse is None:
            return (), ()
        if config.collapse.fingerprint is None:
            return item.firing, item.resolved
        own = resolve_key(item.payload, config.collapse.fingerprint)
        return ((own,) if own else ()), ()

    async def _track(
        self,
        source: RegisteredSource,
        firing: tuple[str, ...],
        resolved: tuple[str, ...],
        event_id: str,
    ) -> None:
        """Best effort: the event is already queued, so a failure here only means the next
        repeat is not collapsed (one extra Claude call), never a lost event."""
        assert source.config.collapse is not None
        window_ms = 1000 * source.config.collapse.window_seconds
        try:
            await self.collapser.remember(
                source=source.name, fingerprints=firing, event_id=event_id, window_ms=window_ms
            )
            await self.collapser.forget(source=source.name, fingerprints=resolved)
        except REDIS_ERRORS as exc:
            log.warning("collapse_not_recorded", source=source.name, error=type(exc).__name__)


def _bounded(item: Described) -> Described:
    """The event as the database can store it (see ``app/ingest/bounds.py``)."""
    event_type = checked_type(item.type)
    delivery_id = bounded_key(item.delivery_id, MAX_DELIVERY_ID_CHARS)
    group_key = bounded_key(item.group_key, MAX_GROUP_KEY_CHARS)
    if delivery_id is item.delivery_id and group_key is item.group_key:
        return item  # the common case: nothing to change, no copy
    return replace(item, type=event_type, delivery_id=delivery_id, group_key=group_key)
