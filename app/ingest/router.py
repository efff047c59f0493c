"""HTTP only: read the body within the size limit, hand it to the ingest service."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.deps import IngestServiceDep
from app.errors import error_body
from app.ingest.exceptions import PayloadTooLarge
from app.ingest.schemas import IngestResponse

router = APIRouter(tags=["ingest"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {
        "description": text,
        "content": {"application/json": {"example": error_body(name, text)}},
    }
    for status, name, text in [
        (400, "InvalidPayload", "body is not valid JSON"),
        (401, "InvalidSignature", "signature does not match the body"),
        (404, "UnknownSource", "no source named 'x' is configured"),
        (413, "PayloadTooLarge", "body is larger than 5242880 bytes"),
        (415, "UnsupportedMediaType", "expected application/json"),
        (503, "QueueUnavailable", "the event queue is unreachable; retry later"),
    ]
}


async def read_limited(request: Request, limit: int) -> bytes:
    """Read at most ``limit`` bytes; refuse larger bodies without buffering them whole."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"body is larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


@router.post(
    "/v1/webhooks/{source}",
    status_code=202,
    response_model=IngestResponse,
    responses={
        200: {"model": IngestResponse, "description": "duplicate delivery or ping"},
        **_ERRORS,
    },
)
async def receive_webhook(source: str, request: Request, service: IngestServiceDep) -> Response:
    """Verify, deduplicate and durably queue one webhook delivery.

    202 means the event is on the queue. A redelivery of an event already queued gets 200
    with the original `event_id`; a GitHub `ping` gets 200 and is not queued.
    """
    registered = service.source(source)
    body = await read_limited(request, registered.max_body_bytes)
    outcome = await service.ingest(registered, request.headers, body)
    code = 202 if outcome.status == "queued" else 200
    # Built by hand on the hot path (same shape as IngestResponse, which documents it).
    body_out = {"status": outcome.status}
    if outcome.event_id is not None:
        body_out = {"event_id": outcome.event_id, **body_out}
    return Response(orjson.dumps(body_out), status_code=code, media_type="application/json")
