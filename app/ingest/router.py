"""HTTP only: check the headers, read the body within the size limit, the read timeout and
the process's body budget, hand it to the ingest service.

Order per request: source → backlog → ``admit`` (credentials and signature headers: a request
they refuse never has its body read) → body, each chunk reserved from the process-wide
``BodyBudget`` and fed to the source's streaming check as it arrives, into one buffer (never
a list of chunks plus a joined copy) → verify, describe, queue → budget released.

``receive_webhook`` is reached two ways: as a FastAPI route on ``router`` (which the OpenAPI
schema and docs UI describe) and through ``WebhookFastPath``, the ASGI middleware that
``create_app`` installs in front of the routing. POSTs reach the middleware: it skips the
exception and body-limit middlewares, route matching over every router, and FastAPI's
per-request dependency solving, which together cost more CPU than verifying and queueing the
webhook (see docs/benchmarks.md). Same function, same error bodies; every other method and
path goes on to the router (a GET gets the route's 405).
"""

from __future__ import annotations

import asyncio

import orjson
import structlog
from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import AppError, InternalError, app_error_response, error_responses
from app.ingest.budget import Reservation
from app.ingest.exceptions import ClientDisconnected, PayloadTooLarge, RequestTimeout
from app.ingest.schemas import BatchIngestResponse, IngestResponse
from app.sources.admission import BodyCheck
from app.state import AppState

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
    read_seconds: float | None,
    reservation: Reservation,
    check: BodyCheck,
) -> bytearray:
    """Read at most ``limit`` bytes within ``read_seconds`` in total into one buffer, fed to
    ``check`` chunk by chunk, its bytes reserved from the process's budget.

    Larger bodies are refused as soon as the limit is passed (or declared), never buffered
    whole; a sender trickling its body is cut off at the timeout, so it cannot hold a
    connection (and the bytes it sent so far) for longer than that. A declared
    ``Content-Length`` is reserved and allocated at once (the chunks are copied into place:
    no list of chunks and joined copy, no regrowth); a chunked body grows as it arrives.
    """
    declared = request.headers.get("content-length")
    size = int(declared) if declared is not None and declared.isdigit() else None
    if size is not None and size > limit:
        raise PayloadTooLarge(f"body is larger than {limit} bytes")
    if size is not None:
        reservation.reserve(size)
    body = bytearray(size or 0)
    received = 0
    try:
        async with asyncio.timeout(read_seconds):
            async for chunk in request.stream():
                end = received + len(chunk)
                if end > (limit if size is None else size):
                    raise PayloadTooLarge(f"body is larger than {limit} bytes")
                check.update(chunk)
                if size is None:
                    reservation.reserve(len(chunk))
                    body += chunk
                else:
                    body[received:end] = chunk
                received = end
    except TimeoutError:
        raise RequestTimeout(f"the body was not received within {read_seconds:g}s") from None
    except ClientDisconnect:
        raise ClientDisconnected(f"the sender hung up after {received} bytes") from None
    if received != len(body):  # the server ends a declared body early only on a disconnect
        raise ClientDisconnected(f"the sender hung up after {received} bytes")
    return body


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
    state: AppState = request.app.state.gateway
    try:
        return await _receive(state, source, request)
    except AppError as exc:
        state.ingest.rejected(source, exc, remote=request.client.host if request.client else None)
        raise


async def _receive(state: AppState, source: str, request: Request) -> Response:
    service = state.ingest
    registered = service.source(source)
    state.backlog.check()
    check = service.admit(registered, request.headers)
    with state.body_budget.hold() as reservation:
        body = await read_body(
            request,
            registered.max_body_bytes,
            read_seconds=state.settings.body_read_timeout_seconds,
            reservation=reservation,
            check=check,
        )
        outcome = await service.ingest(registered, request.headers, body, check)
    queued = sum(1 for e in outcome.events if e.status == "queued")
    if queued:
        state.backlog.record_enqueued(queued)
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


class WebhookFastPath:
    """Serves ``POST /v1/webhooks/{source}`` (one path segment) before FastAPI's routing."""

    PREFIX = "/v1/webhooks/"

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            source = path[len(self.PREFIX) :] if path.startswith(self.PREFIX) else ""
            if source and "/" not in source:
                try:
                    response = await receive_webhook(source, Request(scope, receive))
                except AppError as exc:
                    response = app_error_response(exc)
                except Exception:
                    # Logged here, once, without the body; answered like any other error.
                    log.exception("webhook_failed", source=source)
                    response = app_error_response(InternalError())
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
