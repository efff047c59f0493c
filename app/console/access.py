"""What the app factory gives the console (``app.state.console``), and its page helpers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import orjson
from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from app.admin.deps import AdminAccess
from app.console.glance import HealthGlance
from app.console.session import SESSION_COOKIE, Session, SessionSigner

HERE = Path(__file__).parent
STYLESHEET = HERE / "static" / "console.css"
FORM_MAX_BYTES = 16 * 1024
# No script at all; styles and form posts only from the gateway itself; never framed.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True, slots=True)
class ConsoleAccess:
    """``signer`` is None when the admin API is off (no admin token): the console says so."""

    admin: AdminAccess
    glance: HealthGlance
    signer: SessionSigner | None

    @classmethod
    def build(cls, *, admin: AdminAccess, glance: HealthGlance) -> ConsoleAccess:
        signer = SessionSigner(admin.token) if admin.token else None
        return cls(admin=admin, glance=glance, signer=signer)


def console_access(request: Request) -> ConsoleAccess:
    access: ConsoleAccess = request.app.state.console
    return access


def current_session(request: Request) -> Session | None:
    signer = console_access(request).signer
    return signer.verify(request.cookies.get(SESSION_COOKIE)) if signer else None


def _when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pretty(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode()


def _pretty_text(value: str | None) -> str:
    """Audit text that is JSON (Claude's content blocks, the prompt's messages) indented;
    any other text as it is."""
    if not value:
        return ""
    try:
        return _pretty(orjson.loads(value))
    except orjson.JSONDecodeError:
        return value


templates = Jinja2Templates(directory=HERE / "templates")
templates.env.filters["when"] = _when
templates.env.filters["pretty"] = _pretty
templates.env.filters["pretty_text"] = _pretty_text


def render(
    request: Request,
    name: str,
    context: dict[str, Any],
    *,
    session: Session | None,
    status_code: int = 200,
) -> HTMLResponse:
    signer = console_access(request).signer
    csrf = signer.csrf_token(session) if signer and session else None
    response = templates.TemplateResponse(
        request,
        name,
        {"signed_in": session is not None, "csrf": csrf, **context},
        status_code=status_code,
    )
    response.headers.update(SECURITY_HEADERS)
    return response


async def read_form(request: Request) -> dict[str, str] | None:
    """An ``application/x-www-form-urlencoded`` body (first value of each field), or None
    past ``FORM_MAX_BYTES``: the console's forms are a few fields long."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_MAX_BYTES:
            return None
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {key: values[0] for key, values in fields.items()}
