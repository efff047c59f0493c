"""The Message Batches endpoints of the fake Anthropic API (``/v1/messages/batches``).

A batch's answers are the ones ``/v1/messages`` would give for the same params (the same
personas, responder and usage), worked out when the batch is created and shown only once it
has ended, ``batch_delay`` seconds later. Faults, set on ``FakeBehaviour``: the first
``batch_expire_first`` batches end with every request ``expired``; in the others, an exact
share ``batch_error_rate`` of the requests (by position: with 0.25, the 4th, 8th, ...) end
``errored``, and so does a request whose params lack ``model``, ``max_tokens`` or
``messages`` (the real API also reports invalid params per request, once the batch ends).
A cancel answers ``canceling``; the batch has ended, every request ``canceled``, at the next
look. Results before the end are refused with a 404, as is an unknown batch id.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

if TYPE_CHECKING:
    from eventgate_dev.fake_anthropic import FakeBehaviour

REQUIRED_PARAMS = ("model", "max_tokens", "messages")
OUTCOMES = ("succeeded", "errored", "canceled", "expired")


@dataclass
class FakeBatch:
    id: str
    created_at: datetime
    # time.monotonic() at which processing ends (sooner if canceled).
    ends_at: float
    # custom_id → the result object shown once the batch has ended.
    results: dict[str, dict[str, Any]]
    cancel_initiated_at: datetime | None = None
    ended_at: datetime | None = field(default=None)

    def ended(self, now: float) -> bool:
        """Whether processing has ended by ``now``. The first look after the end stamps
        ``ended_at`` and, for a canceled batch, turns every result to ``canceled``."""
        if self.ended_at is None and now >= self.ends_at:
            self.ended_at = datetime.now(UTC)
            if self.cancel_initiated_at is not None:
                self.results = {custom_id: {"type": "canceled"} for custom_id in self.results}
        return self.ended_at is not None

    def as_api(self, base_url: str, now: float) -> dict[str, Any]:
        ended = self.ended(now)
        counts = dict.fromkeys(("processing", *OUTCOMES), 0)
        if ended:
            for result in self.results.values():
                counts[result["type"]] += 1
        else:
            counts["processing"] = len(self.results)
        if ended:
            status = "ended"
        elif self.cancel_initiated_at is not None:
            status = "canceling"
        else:
            status = "in_progress"
        return {
            "id": self.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": counts,
            "created_at": _rfc3339(self.created_at),
            "expires_at": _rfc3339(self.created_at + timedelta(hours=24)),
            "ended_at": _rfc3339(self.ended_at),
            "cancel_initiated_at": _rfc3339(self.cancel_initiated_at),
            "archived_at": None,
            "results_url": f"{base_url}v1/messages/batches/{self.id}/results" if ended else None,
        }


def batch_routes(behaviour: FakeBehaviour) -> list[Route]:
    """The four endpoints, over ``behaviour.batches``; a request's message is
    ``behaviour.answer(params)``, as ``/v1/messages`` answers."""

    def created(requests: list[dict[str, Any]]) -> FakeBatch:
        expire = len(behaviour.batches) < behaviour.batch_expire_first
        return FakeBatch(
            id=f"msgbatch_{uuid.uuid4().hex[:24]}",
            created_at=datetime.now(UTC),
            ends_at=time.monotonic() + behaviour.batch_delay,
            results={
                entry["custom_id"]: {"type": "expired"}
                if expire
                else _outcome(behaviour, entry["params"], number)
                for number, entry in enumerate(requests)
            },
        )

    async def create(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return _refused(400, "invalid_request_error", "body: not JSON")
        requests = body.get("requests") if isinstance(body, dict) else None
        problem = _shape_problem(requests)
        if problem:
            return _refused(400, "invalid_request_error", problem)
        assert isinstance(requests, list)
        batch = created(requests)
        behaviour.batches[batch.id] = batch
        return _json(batch.as_api(str(request.base_url), time.monotonic()))

    async def retrieve(request: Request) -> JSONResponse:
        batch = behaviour.batches.get(request.path_params["batch_id"])
        if batch is None:
            return _not_found(request.path_params["batch_id"])
        return _json(batch.as_api(str(request.base_url), time.monotonic()))

    async def cancel(request: Request) -> JSONResponse:
        batch = behaviour.batches.get(request.path_params["batch_id"])
        if batch is None:
            return _not_found(request.path_params["batch_id"])
        now = time.monotonic()
        if not batch.ended(now) and batch.cancel_initiated_at is None:
            batch.cancel_initiated_at = datetime.now(UTC)
            shown = batch.as_api(str(request.base_url), now)
            batch.ends_at = now  # ends, all canceled, when next looked at
            return _json(shown)
        return _json(batch.as_api(str(request.base_url), now))

    async def results(request: Request) -> Response:
        batch_id = request.path_params["batch_id"]
        batch = behaviour.batches.get(batch_id)
        if batch is None:
            return _not_found(batch_id)
        if not batch.ended(time.monotonic()):
            return _refused(404, "not_found_error", f"batch {batch_id} has not ended yet")
        lines = (
            orjson.dumps({"custom_id": custom_id, "result": result})
            for custom_id, result in batch.results.items()
        )
        return Response(
            b"\n".join(lines) + b"\n",
            media_type="application/binary",
            headers={"request-id": _request_id()},
        )

    return [
        Route("/v1/messages/batches", create, methods=["POST"]),
        Route("/v1/messages/batches/{batch_id}", retrieve, methods=["GET"]),
        Route("/v1/messages/batches/{batch_id}/cancel", cancel, methods=["POST"]),
        Route("/v1/messages/batches/{batch_id}/results", results, methods=["GET"]),
    ]


def _outcome(behaviour: FakeBehaviour, params: dict[str, Any], number: int) -> dict[str, Any]:
    """The result of the ``number``-th request (from 0) of a batch that does not expire."""
    missing = [name for name in REQUIRED_PARAMS if name not in params]
    if missing:
        return {
            "type": "errored",
            "error": _error("invalid_request_error", f"{missing[0]}: Field required"),
        }
    rate = behaviour.batch_error_rate
    if int((number + 1) * rate) > int(number * rate):
        return {"type": "errored", "error": _error("api_error", "fake batch fault")}
    return {"type": "succeeded", "message": behaviour.answer(params)}


def _shape_problem(requests: Any) -> str | None:
    """What the real API refuses at once (400); invalid params are reported per request."""
    if not isinstance(requests, list) or not requests:
        return "requests: a non-empty list is required"
    seen: set[str] = set()
    for number, entry in enumerate(requests):
        if not isinstance(entry, dict) or not isinstance(entry.get("params"), dict):
            return f"requests.{number}: custom_id and params are required"
        custom_id = entry.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            return f"requests.{number}.custom_id: a non-empty string is required"
        if custom_id in seen:
            return f"requests.{number}.custom_id: {custom_id!r} is used twice"
        seen.add(custom_id)
    return None


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _refused(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse(_error(kind, message), status, headers={"request-id": _request_id()})


def _not_found(batch_id: str) -> JSONResponse:
    return _refused(404, "not_found_error", f"no batch {batch_id}")


def _json(body: dict[str, Any]) -> JSONResponse:
    return JSONResponse(body, headers={"request-id": _request_id()})


def _request_id() -> str:
    return f"req_fake_{uuid.uuid4().hex[:16]}"


def _rfc3339(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None
