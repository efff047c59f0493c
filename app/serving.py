"""How ``eventgate serve|api|worker`` run uvicorn: its limits come from the settings.

uvicorn's httptools parser (the one ``uvicorn[standard]`` brings) bounds neither a request
head nor the framing and trailers of a chunked body (httptools grows a header value with
``bytes +=``), and uvicorn times a connection out only after a response. Before anything is
verified, ``BoundedHttpToolsProtocol``:

* counts the bytes of each message that are not body (request line and headers, then each
  chunk's size line, extensions and, after the last chunk, the trailers) and refuses past
  ``max_header_bytes`` (give or take one socket read, at most 256 KiB): ``431
  RequestHeadersTooLarge`` while the head is incomplete, a closed connection afterwards;
* closes a new connection that sends nothing within ``keep_alive_seconds`` (like an idle
  keep-alive one), and one that has not sent a whole head within ``head_timeout_seconds``
  of its first byte: idle or trickling sockets cannot hold the connection limit;
* ends a connection whose request was answered before its body had all arrived (an unknown
  source, bad credentials, a body timeout): the rest would be read for nothing, and a sender
  trickling it would hold the connection for as long as it kept sending;
* answers requests past ``limit_concurrency`` (open connections, or requests in progress)
  with ``503 TooManyConnections`` + ``Retry-After``, and requests the parser refuses with
  ``400 InvalidHTTPRequest``, in JSON like every other error (uvicorn answers plain text).

Idle keep-alive connections close after ``keep_alive_seconds`` (uvicorn's own timer). Worst
case before any request is verified: ``limit_concurrency`` x ``max_header_bytes`` of heads,
plus ``ingest_buffer_bytes`` of bodies (``app/ingest/budget.py``).
"""

from __future__ import annotations

import weakref
from asyncio import TimerHandle
from typing import Any, ClassVar, cast

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from app.errors import AppError, app_error_response, error_body
from app.ingest.rejections import RejectionLog
from app.settings import Settings

# Time for the client to read an answer before the socket closes with its bytes unread
# (a close with unread bytes is a reset, which can overtake the answer).
CLOSE_AFTER_SECONDS = 1.0
SERVER = "(server)"
_CLOSE = (b"connection", b"close")


class TooManyConnections(AppError):
    status_code = 503

    @property
    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": "1", "Connection": "close"}


class RequestHeadersTooLarge(AppError):
    status_code = 431


class InvalidHTTPRequest(AppError):
    status_code = 400


class RequestHeadTimeout(AppError):
    status_code = 408


_STATUS_LINES = {
    400: b"HTTP/1.1 400 Bad Request\r\n",
    408: b"HTTP/1.1 408 Request Timeout\r\n",
    431: b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
}


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    max_header_bytes: ClassVar[int] = 64 * 1024
    head_timeout_seconds: ClassVar[float] = 10.0
    # Not ``limit_concurrency``: uvicorn's __init__ sets that attribute for its own check.
    max_connections: ClassVar[int | None] = None
    refusals: ClassVar[RejectionLog] = RejectionLog(event="request_refused")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._framing = 0  # bytes of the current message (or chunk) that are not body
        self._head_done = False
        self._begun = False  # a request line has started (not just blank lines)
        self._refused = False
        # When the head being received must be complete (None: no head under way). One
        # timer per connection checks it, re-armed only when it fires: a head completing
        # does not cancel it, so a keep-alive request costs no timer of its own.
        self._head_deadline: float | None = None
        self._head_timer: TimerHandle | None = None
        self._closing: RequestResponseCycle | None = None  # said Connection: close

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        # Idle until its first byte like a keep-alive connection between requests (uvicorn
        # cancels this timer on data); the head timer starts with that first byte.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._head_done and self._head_deadline is None:
            # The first byte of a next request (or a stray CRLF).
            self._head_deadline = self.loop.time() + self.head_timeout_seconds
            if self._head_timer is None:
                self._arm_head_timer(self.head_timeout_seconds)
        self._framing += len(data)
        super().data_received(data)
        if self._framing > self.max_header_bytes and not self._refused:
            if self._head_done:
                self._refuse_framing()
            else:
                self._refuse_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._framing = 0
        self._begun = True

    def on_headers_complete(self) -> None:
        self._head_done = True
        self._head_deadline = None  # the timer, when it fires, finds nothing to time out
        limit = self.max_connections
        busy = limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit)
        # uvicorn runs ``self.app`` for the request whose head just completed.
        self.app = self._too_many_connections if busy else self.config.loaded_app
        super().on_headers_complete()
        self._close_if_answered_early(self.cycle)

    def on_chunk_header(self) -> None:
        # Each chunk's size line (and, after the last one, the trailers) counts afresh.
        self._framing = 0

    def on_body(self, body: bytes) -> None:
        self._framing -= len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._head_done = self._begun = False
        super().on_message_complete()

    def _close_if_answered_early(self, cycle: RequestResponseCycle) -> None:
        """An answer that starts before the request's body has all arrived says
        ``Connection: close``. uvicorn would close at once on that header, with the body's
        bytes unread, a reset that can overtake the answer: ``on_response_complete`` closes
        a second later instead.

        The wrapper holds its cycle weakly and calls the class's ``send``: a closure over
        the cycle (or its bound ``send``), stored on that cycle, is a reference cycle, and
        every request's cycle (scope, body, task) would then wait for the cyclic GC."""
        send = type(cycle).send
        ref = weakref.ref(cycle)

        async def send_closing(message: Any) -> None:
            current = ref()
            if current is None:  # its task holds it while it runs: cannot happen
                return
            if message["type"] != "http.response.start" or not current.more_body:
                await send(current, message)
                return
            headers = list(message.get("headers", ()))
            if not any(name.lower() == b"connection" for name, _ in headers):
                headers.append(_CLOSE)
            await send(current, cast(Any, {**message, "headers": headers}))
            current.keep_alive = True  # uvicorn's immediate close off: ours comes later
            self._closing = current

        cycle.send = send_closing  # type: ignore[method-assign]

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle
        # ``self.cycle`` is a later pipelined request's while that one waits (its response
        # has not started); the answered request said it would close, or its body is still
        # arriving: it is this cycle and the parser has not seen the message end.
        if cycle is None or not cycle.response_complete:
            return
        if not (cycle.more_body or cycle is self._closing):
            return
        if self.transport.is_closing():
            return
        self._refused = True  # what arrives from now on is not parsed
        self.flow.pause_reading()
        self.loop.call_later(CLOSE_AFTER_SECONDS, self.transport.close)

    def send_400_response(self, msg: str) -> None:
        self._refused = True
        self._write_error(InvalidHTTPRequest("the request is not valid HTTP/1.1 (its framing)"))
        self.transport.close()

    def _arm_head_timer(self, seconds: float) -> None:
        self._head_timer = self.loop.call_later(seconds, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        deadline = self._head_deadline
        if deadline is None or self._head_done or self.transport.is_closing():
            return
        left = deadline - self.loop.time()
        if left > 0:  # a later head than the one this timer was armed for
            self._arm_head_timer(left)
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A request is being answered; its next head gets the timeout afresh.
            self._head_deadline = self.loop.time() + self.head_timeout_seconds
            self._arm_head_timer(self.head_timeout_seconds)
            return
        self._refused = True
        if self._begun:  # a request was started: say why the connection closes
            self._write_error(
                RequestHeadTimeout(
                    f"the request head was not received within {self.head_timeout_seconds:g}s"
                )
            )
        self.transport.close()

    async def _too_many_connections(self, scope: Any, receive: Any, send: Any) -> None:
        error = TooManyConnections("the gateway has as many connections as it may; retry later")
        self._refused_line(error)
        await app_error_response(error)(scope, receive, send)

    def _refuse_head(self) -> None:
        self._refused = True
        self._write_error(
            RequestHeadersTooLarge(
                f"the request line and headers are over {self.max_header_bytes} bytes"
            )
        )
        self.flow.pause_reading()
        self.loop.call_later(CLOSE_AFTER_SECONDS, self.transport.close)

    def _refuse_framing(self) -> None:
        """Chunk framing or trailers past the limit: a response may be under way already, so
        nothing more is written; the connection is cut."""
        self._refused = True
        self._refused_line(
            RequestHeadersTooLarge(
                f"chunk framing or trailers are over {self.max_header_bytes} bytes"
            )
        )
        self.transport.close()

    def _write_error(self, error: AppError) -> None:
        self._refused_line(error)
        body = orjson.dumps(error_body(type(error).__name__, error.message))
        self.transport.write(
            _STATUS_LINES[error.status_code]
            + b"content-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n".encode()
            + b"connection: close\r\n\r\n"
            + body
        )

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
                "head_timeout_seconds": settings.head_timeout_seconds,
                "max_connections": settings.limit_concurrency,
                "refusals": RejectionLog(event="request_refused"),
            },
        ),
    )
