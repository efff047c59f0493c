"""The admin API over HTTP, with each failure turned into one sentence a person can act on.

AdminApiError              every failure; ``str()`` is the one line the CLI prints
├── GatewayUnreachable     connection refused, DNS, timeout
├── TokenRefused           401: no token, or not the gateway's
├── AdminDisabled          503 AdminDisabled: the gateway runs without EVENTGATE_ADMIN_TOKEN
├── EventNotFound          404 on an event id
└── UnexpectedAnswer       any other status, or a body that is not the admin API's JSON

The token goes only into the ``Authorization`` header: no message here contains it.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from app.client.answers import EventAnswer, EventsPage, shape_problem

DEFAULT_URL = "http://127.0.0.1:8080"
# An event's answer holds its payload (5 MiB at most by default) and each attempt's prompt
# and reply: far below this. Past it, the CLI stops reading instead of filling its memory.
MAX_ANSWER_BYTES = 64 * 1024 * 1024
# ``timeout`` bounds each read; this, the whole answer (a server dripping a byte at a time
# would otherwise hold the CLI for ever).
ANSWER_SECONDS = 60.0


class AdminApiError(Exception):
    pass


class GatewayUnreachable(AdminApiError):
    pass


class TokenRefused(AdminApiError):
    pass


class AdminDisabled(AdminApiError):
    pass


class EventNotFound(AdminApiError):
    pass


class UnexpectedAnswer(AdminApiError):
    pass


class AdminClient:
    """``transport`` replaces the network (tests); the CLI uses the default one."""

    def __init__(
        self,
        *,
        url: str,
        token: str | None,
        timeout: float = 10.0,
        max_bytes: int = MAX_ANSWER_BYTES,
        answer_seconds: float = ANSWER_SECONDS,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.max_bytes = max_bytes
        self.answer_seconds = answer_seconds
        self._has_token = bool(token)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def events(
        self,
        *,
        status: str | None = None,
        source: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """One page of ``GET /v1/events``: ``items`` newest first, ``total``, ``next_cursor``."""
        params = {"status": status, "source": source, "limit": limit, "cursor": cursor}
        query = {k: v for k, v in params.items() if v is not None}
        return self._get("/v1/events", query, shape=EventsPage)

    def event(self, event_id: str) -> dict[str, Any]:
        """``GET /v1/events/{id}``: the event, its timeline, LLM attempts and tool calls."""
        path = f"/v1/events/{quote(event_id, safe='')}"
        return self._get(path, {}, shape=EventAnswer, event_id=event_id)

    def _get(
        self,
        path: str,
        params: dict[str, Any],
        *,
        shape: type[EventsPage | EventAnswer],
        event_id: str | None = None,
    ) -> dict[str, Any]:
        """The answer's JSON, once it has ``shape``."""
        try:
            with self._http.stream("GET", path, params=params) as reply:
                content = self._read(reply, path)
        except httpx.TimeoutException:
            raise GatewayUnreachable(
                f"the gateway at {self.url} did not answer within {self._http.timeout.read}s"
            ) from None
        except httpx.HTTPError as exc:
            raise GatewayUnreachable(
                f"cannot reach the gateway at {self.url} ({_reason(exc)}): is it running?"
                " Set --url or EVENTGATE_URL"
            ) from None
        if not reply.is_success:
            raise self._failure(reply, content, event_id)
        try:
            body = orjson.loads(content)
        except ValueError:  # orjson's, also for nesting past 1024 levels
            raise UnexpectedAnswer(
                f"{self.url} answered {path} with something that is not JSON:"
                " is --url an eventgate gateway?"
            ) from None
        problem = shape_problem(shape, body)
        if problem is not None:
            raise UnexpectedAnswer(
                f"{self.url} answered {path} with JSON that is not the admin API's ({problem}):"
                " is --url an eventgate gateway?"
            )
        answer: dict[str, Any] = body
        return answer

    def _read(self, reply: httpx.Response, path: str) -> bytes:
        """The body, up to ``max_bytes`` and within ``answer_seconds``."""
        deadline = time.monotonic() + self.answer_seconds
        content = bytearray()
        for chunk in reply.iter_bytes():
            content += chunk
            if time.monotonic() > deadline:
                raise GatewayUnreachable(
                    f"the gateway at {self.url} did not finish its answer within"
                    f" {self.answer_seconds:g}s"
                )
            if len(content) > self.max_bytes:
                raise UnexpectedAnswer(
                    f"{self.url} answered {path} with more than"
                    f" {self.max_bytes // 2**20} MiB: is --url an eventgate gateway?"
                )
        return bytes(content)

    def _failure(
        self, reply: httpx.Response, content: bytes, event_id: str | None
    ) -> AdminApiError:
        error, detail = _error_of(content)
        if reply.status_code == 401:
            if not self._has_token:
                return TokenRefused(
                    "the admin API needs a token: set --token or EVENTGATE_ADMIN_TOKEN"
                    " (the gateway's EVENTGATE_ADMIN_TOKEN)"
                )
            return TokenRefused(
                f"the gateway at {self.url} refused the admin token (401): use the value of"
                " the gateway's EVENTGATE_ADMIN_TOKEN"
            )
        if reply.status_code == 503 and error == "AdminDisabled":
            return AdminDisabled(
                f"the admin API of {self.url} is off: start the gateway with"
                " EVENTGATE_ADMIN_TOKEN set"
            )
        if reply.status_code == 404 and event_id is not None and error == "EventNotFound":
            return EventNotFound(f"no event {event_id!r} at {self.url}")
        if reply.status_code == 404:
            return UnexpectedAnswer(
                f"{self.url} has no admin API (404 on {reply.request.url.path}): point --url at"
                " an `eventgate serve` or `eventgate api` process"
            )
        name = f" {error}" if error else ""
        said = f": {detail}" if detail else ""
        return UnexpectedAnswer(f"{self.url} answered {reply.status_code}{name}{said}")


def _error_of(content: bytes) -> tuple[str | None, str | None]:
    """The ``{"error", "detail"}`` of an error answer (None for a body that is not one)."""
    try:
        body = orjson.loads(content)
    except ValueError:
        return None, None
    if not isinstance(body, dict):
        return None, None
    error, detail = body.get("error"), body.get("detail")
    return (
        error if isinstance(error, str) else None,
        detail if isinstance(detail, str) else None,
    )


def _reason(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        text = str(exc).lower()
        if "refused" in text:
            return "connection refused"
        if "name or service" in text or "nodename" in text or "resolution" in text:
            return "unknown host"
        return "cannot connect"
    return type(exc).__name__
