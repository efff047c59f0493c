"""The one base error and its JSON rendering.

    AppError(message, status_code)
    ├── sources.exceptions.*     (InvalidSignature 401, InvalidPayload 400 ...: a delivery's own)
    ├── ingest.exceptions.*      (UnknownSource 404, PayloadTooLarge 413, RequestTimeout 408 ...)
    ├── Unavailable 503          (nothing was accepted; retry after ``Retry-After`` seconds)
    │   ├── QueueUnavailable     (Redis down or the backlog full)
    │   ├── QueueNotReplicated   (the one exception to "nothing accepted": see its docstring)
    │   ├── ingest BodyBufferFull, sources CertificateUnavailable
    ├── InternalError 500        (an exception nothing else handled: a bug, a dependency gone)
    ├── serving.*                (RequestHeadersTooLarge 431, TooManyConnections 503)
    └── admin.exceptions.*       (Unauthorized 401, NotFound 404 ...)

Every handler renders ``{"error": ClassName, "detail": message}``, the last resort included:
an unexpected exception is logged once, with its traceback, and answered JSON 500.
"""

from __future__ import annotations

from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = structlog.get_logger(__name__)


class AppError(Exception):
    status_code: int = 500

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status_code is not None:
            self.status_code = status_code

    @property
    def headers(self) -> dict[str, str] | None:
        return None


class Unavailable(AppError):
    """Nothing was accepted and the sender should come back: 503 with ``Retry-After``."""

    status_code = 503

    def __init__(self, message: str, *, retry_after: int = 5) -> None:
        super().__init__(message)
        self.retry_after = max(1, retry_after)

    @property
    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": str(self.retry_after)}


class QueueUnavailable(Unavailable):
    """Redis cannot be reached, or the backlog is over its limit."""


class QueueNotReplicated(Unavailable):
    """The event is queued on the primary, but the replicas (or the AOF fsync) that
    ``EVENTGATE_REDIS_ACK_*`` asks for did not acknowledge it in time. It will be processed;
    the sender's retry is answered ``duplicate`` once the acknowledgement is reached."""


class InternalError(AppError):
    """Answered for an exception no handler knew; the detail never carries its message."""

    status_code = 500

    def __init__(self, message: str = "unexpected error; it was logged") -> None:
        super().__init__(message)


class ErrorBody(BaseModel):
    """What every error response carries (the OpenAPI schema of 4xx/5xx bodies)."""

    error: str
    detail: str


def error_body(name: str, detail: str) -> dict[str, str]:
    return {"error": name, "detail": detail}


def error_responses(errors: list[tuple[int, str, str]]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for (status, error name, example detail) triples."""
    return {
        status: {
            "model": ErrorBody,
            "description": text,
            "content": {"application/json": {"example": error_body(name, text)}},
        }
        for status, name, text in errors
    }


def app_error_response(exc: AppError) -> JSONResponse:
    return JSONResponse(
        error_body(type(exc).__name__, exc.message), exc.status_code, headers=exc.headers
    )


class InternalErrorMiddleware:
    """The last resort around the routes: an exception that no handler turned into a
    response is logged once (traceback, method, path; never the request body) and answered
    JSON 500 ``InternalError``. Nothing re-raises it, so the server does not log it again."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            log.exception("request_failed", method=scope.get("method"), path=scope.get("path"))
            if not started:  # else the client gets a cut-off response: nothing else to do
                await app_error_response(InternalError())(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    async def app_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, AppError)
        return app_error_response(exc)

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        name = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
        # Keep the exception's headers: a 405 must say which methods are allowed (RFC 9110).
        return JSONResponse(error_body(name, str(exc.detail)), exc.status_code, headers=exc.headers)

    async def validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return JSONResponse(error_body("ValidationError", detail), 422)

    app.add_exception_handler(AppError, app_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_middleware(InternalErrorMiddleware)
