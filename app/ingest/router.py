"""HTTP only: the one handler of a webhook delivery (``WebhookEntry``) and the FastAPI route
that documents it.

Order per request: source → ``admit`` (backlog, credentials and signature headers: a request
they refuse never has its body read) → body, each chunk reserved from the process-wide
``BodyBudget`` and fed to the source's streaming check as it arrives, into one buffer (never
a list of chunks plus a joined copy) → verify, describe, queue → budget released.

Where a webhook enters: the app factory builds the ``WebhookEntry`` with what it needs, and
the gateway's ASGI app (``app/main.py``) hands it ``POST /v1/webhooks/{source}`` before
FastAPI's middleware and routing, which cost more CPU than verifying and queueing a webhook.
The route below is the same handler reached through FastAPI (the OpenAPI description, and
``direct_webhooks=False``): one code path, so both answer the same for every status.
"""

from __future__ import annotations

import asyncio

import orjson
import structlog
from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from app.errors import AppError, InternalError, app_error_response, error_responses
from app.ingest.budget import BodyBudget, BodyBuffer, Reservation
from app.ingest.deadlines import ReadDeadlines
from app.ingest.exceptions import ClientDisconnected, PayloadTooLarge, RequestTimeout
from app.ingest.schemas import BatchIngestResponse, IngestResponse
from app.ingest.service import IngestService
from app.sources.admission import Body, BodyCheck

router = APIRouter(tags=["ingest"])
log = structlog.get_logger(__name__)

_ERRORS = error_responses(
    [
        (400, "InvalidPayload", "body is not valid JSON"),
        (401, "InvalidSignature", "signature does not match the body"),
        (404, "UnknownSource", "no source named 'x' is configured"),
        (408, "RequestTimeout", "the body was not received within 30s"),
        (413, "PayloadTooLarge", "body is larger than 5242880 bytes"),
        (415, "UnsupportedMediaType", "expected application/json"),
        (500, "InternalError", "unexpected error; it was logged"),
        (503, "QueueUnavailable", "the event queue is unreachable or full; retry later"),
        (503, "BodyBufferFull", "the gateway holds as many request bodies as it may"),
    ]
)
_ERRORS[503]["headers"] = {
    "Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "string"}}
}
# The body is read raw (signatures are over the exact bytes), so FastAPI cannot infer it.
_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "anyOf": [
                        {"type": "object"},
                        {"type": "array", "items": {"type": "object"}},
                    ]
                }
            }
        },
        "description": "the sender's JSON payload, exactly as signed (an array for batches)",
    }
}


async def read_body(
    request: Request,
    limit: int,
    *,
    deadlines: ReadDeadlines | None,
    reservation: Reservation,
    check: BodyCheck,
) -> Body:
    """Read at most ``limit`` bytes within ``deadlines.seconds`` in total (no time limit
    without ``deadlines``), fed to ``check`` chunk by chunk, the memory holding them reserved
    from the process's budget before it is taken.

    Larger bodies are refused as soon as the limit is passed (or declared), never buffered
    whole; a sender trickling its body is cut off at the timeout, so it cannot hold a
    connection (and the bytes it sent so far) for longer than that. A declared
    ``Content-Length`` is only a promise: nothing is reserved or allocated for bytes that
    have not arrived, so connections declaring bodies they never send hold nothing. A body
    that arrives in one chunk (most webhooks) is that chunk, reserved by its length. One in
    several chunks is copied into a ``BodyBuffer`` as they arrive (each chunk is then
    dropped) and returned as that ``bytearray``: copying it to ``bytes`` would hold it twice;
    nothing writes to it once it is returned. Any body up to ``min(limit, capacity)`` fits
    a free budget, however it is chunked; a larger one is ``PayloadTooLarge``.
    """
    # A body the whole budget cannot hold is too large, not "retry later": a 503 with
    # Retry-After would have its sender retry it for ever.
    limit = min(limit, reservation.budget.capacity)
    declared = request.headers.get("content-length")
    size = int(declared) if declared is not None and declared.isdigit() else None
    if size is not None and size > limit:
        raise PayloadTooLarge(f"body is larger than {limit} bytes")
    cap = limit if size is None else size
    buffer: BodyBuffer | None = None
    received = 0
    task = deadlines.start() if deadlines is not None else None
    try:
        while True:
            # ASGI messages, not ``request.stream()``: ``more_body`` tells a body that
            # is complete in its first chunk, which then needs no buffer.
            message = await request.receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunk: bytes = message.get("body", b"")
            more = message.get("more_body", False)
            received += len(chunk)
            if received > cap:
                raise PayloadTooLarge(f"body is larger than {limit} bytes")
            if buffer is None and not more:
                reservation.reserve(len(chunk))
                check.update(chunk)
                body: Body = chunk
                break
            if chunk:
                if buffer is None:
                    buffer = BodyBuffer(reservation, cap)
                buffer.write(chunk)
                check.update(chunk)
            if not more:
                body = buffer.body() if buffer is not None else b""
                break
    except asyncio.CancelledError:
        if task is None or deadlines is None or not deadlines.timed_out(task):
            raise
        raise RequestTimeout(f"the body was not received within {deadlines.seconds:g}s") from None
    except ClientDisconnect:
        raise ClientDisconnected(f"the sender hung up after {received} bytes") from None
    finally:
        if task is not None and deadlines is not None:
            deadlines.finish(task)
    if size is not None and received != size:  # ended early only on a disconnect
        raise ClientDisconnected(f"the sender hung up after {received} bytes")
    return body


class WebhookEntry:
    """Answers one webhook delivery; never raises (errors are answered as JSON)."""

    def __init__(self, *, service: IngestService, budget: BodyBudget, read_seconds: float) -> None:
        self.service = service
        self.budget = budget
        self.deadlines = ReadDeadlines(read_seconds)

    async def __call__(self, scope: Scope, receive: Receive, send: Send, source: str) -> None:
        response = await self.respond(source, Request(scope, receive))
        await response(scope, receive, send)

    async def respond(self, source: str, request: Request) -> Response:
        try:
            return await self._receive(source, request)
        except AppError as exc:
            remote = request.client.host if request.client else None
            self.service.rejected(source, exc, remote=remote)
            return app_error_response(exc)
        except Exception:
            # Logged here, once, without the body; answered like any other error.
            log.exception("webhook_failed", source=source)
            return app_error_response(InternalError())

    async def _receive(self, source: str, request: Request) -> Response:
        service = self.service
        registered = service.source(source)
        check = service.admit(registered, request.headers)
        with self.budget.hold() as reservation:
            body = await read_body(
                request,
                registered.max_body_bytes,
                deadlines=self.deadlines,
                reservation=reservation,
                check=check,
            )
            outcome = await service.ingest(registered, request.headers, body, check)
        code = 202 if outcome.queued else 200
        # Built by hand on the hot path (same shapes as IngestResponse / BatchIngestResponse,
        # which document them): a pydantic round trip per request costs more than the rest.
        entries = [
            {
                k: v
                for k, v in (("event_id", e.event_id), ("status", e.status), ("detail", e.detail))
                if v is not None
            }
            for e in outcome.events
        ]
        content = {"events": entries} if outcome.batch else entries[0]
        return Response(orjson.dumps(content), status_code=code, media_type="application/json")


WEBHOOKS_PREFIX = "/v1/webhooks/"


def webhook_source(path: str) -> str | None:
    """The source named by a webhook path (``/v1/webhooks/<source>``), else None."""
    if not path.startswith(WEBHOOKS_PREFIX):
        return None
    source = path[len(WEBHOOKS_PREFIX) :]
    return source if source and "/" not in source else None


@router.post(
    "/v1/webhooks/{source}",
    status_code=202,
    response_model=IngestResponse | BatchIngestResponse,
    responses={
        200: {
            "model": IngestResponse | BatchIngestResponse,
            "description": "nothing new queued: duplicate, filtered, collapsed or ignored",
        },
        **_ERRORS,
    },
    openapi_extra=_BODY,
)
async def receive_webhook(source: str, request: Request) -> Response:
    """Verify, filter, deduplicate and durably queue one webhook delivery.

    A single-event request answers `{"event_id", "status"}`: 202 `queued` means the event is
    on the queue; 200 `duplicate` (a redelivery, with the original `event_id`), `filtered`
    (dropped by the source's filters), `collapsed` (a repeat of a firing alert, with the
    `event_id` that went to the LLM) or `ignored` (a GitHub ping, an SNS confirmation).
    A batch request (CloudEvents batch mode, an array with `split: true`) answers
    `{"events": [...]}`, one entry per event in request order; 202 if any was queued.
    """
    entry: WebhookEntry = request.app.state.webhooks
    return await entry.respond(source, request)
