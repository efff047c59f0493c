"""How ``eventgate serve|api|worker`` run uvicorn: its limits come from the settings.

uvicorn's httptools parser (the one ``uvicorn[standard]`` brings) has no limit on the size of
a request head: a client sending a 50 MiB header made the process hold it (and copy it while
parsing). ``BoundedHttpToolsProtocol`` counts the bytes received while a request line and
headers are incomplete and answers ``431 RequestHeadersTooLarge`` past ``max_header_bytes``
(give or take one socket read, at most 256 KiB); the connection is then closed. It also
answers requests past ``limit_concurrency`` (open connections, or requests in progress) with
``503 TooManyConnections`` + ``Retry-After`` in JSON like every other error, where uvicorn's
own check answers plain text. Idle keep-alive connections close after
``keep_alive_seconds``.

Worst case before any request is verified: ``limit_concurrency`` x ``max_header_bytes`` of
heads, plus ``ingest_buffer_bytes`` of bodies (``app/ingest/budget.py``).
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.errors import AppError, app_error_response, error_body
from app.ingest.rejections import RejectionLog
from app.settings import Settings

CLOSE_AFTER_SECONDS = 1.0  # time for the client to read the 431 before the socket closes
SERVER = "(server)"


class TooManyConnections(AppError):
    status_code = 503

    @property
    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": "1", "Connection": "close"}


class RequestHeadersTooLarge(AppError):
    status_code = 431


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    max_header_bytes: ClassVar[int] = 64 * 1024
    # Not ``limit_concurrency``: uvicorn's __init__ sets that attribute for its own check.
    max_connections: ClassVar[int | None] = None
    refusals: ClassVar[RejectionLog] = RejectionLog(event="request_refused")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._refused = False

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.max_header_bytes:
            self._refuse_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        limit = self.max_connections
        busy = limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit)
        # uvicorn runs ``self.app`` for the request whose head just completed.
        self.app = self._too_many_connections if busy else self.config.loaded_app
        super().on_headers_complete()

    async def _too_many_connections(self, scope: Any, receive: Any, send: Any) -> None:
        error = TooManyConnections("the gateway has as many connections as it may; retry later")
        self._refused_line(error)
        await app_error_response(error)(scope, receive, send)

    def _refuse_head(self) -> None:
        self._refused = True
        error = RequestHeadersTooLarge(
            f"the request line and headers are over {self.max_header_bytes} bytes"
        )
        self._refused_line(error)
        body = orjson.dumps(error_body(type(error).__name__, error.message))
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n".encode()
            + b"connection: close\r\n\r\n"
            + body
        )
        self.flow.pause_reading()
        self.loop.call_later(CLOSE_AFTER_SECONDS, self.transport.close)

    def _refused_line(self, error: AppError) -> None:
        self.refusals.record(
            source=SERVER,
            error=type(error).__name__,
            status=error.status_code,
            remote=self.client[0] if self.client else None,
            detail=error.message,
        )


def http_protocol(settings: Settings) -> type[BoundedHttpToolsProtocol]:
    """The protocol class uvicorn instantiates per connection, with these limits."""
    return cast(
        type[BoundedHttpToolsProtocol],
        type(
            "BoundedHttpToolsProtocol",
            (BoundedHttpToolsProtocol,),
            {
                "max_header_bytes": settings.max_header_bytes,
                "max_connections": settings.limit_concurrency,
                "refusals": RejectionLog(event="request_refused"),
            },
        ),
    )
