"""The console's door: who may see a page or post a form, and the answer when not.

A GET without a session is sent to the sign-in form (303, back to the page afterwards); a
POST without one gets 401; a signed-in POST without the session's CSRF token gets 403. With
no admin token the console is off: 503, saying how to turn it on.
"""

from __future__ import annotations

from urllib.parse import quote, unquote, urlsplit

import structlog
from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from app.console.access import console_access, current_session, read_form, render
from app.console.session import COOKIE_PATH, Session

log = structlog.get_logger(__name__)


def refused(request: Request, status: int, title: str, detail: str) -> Response:
    return render(
        request,
        "message.html",
        {"title": title, "detail": detail},
        session=current_session(request),
        status_code=status,
    )


def disabled(request: Request) -> Response:
    return refused(
        request,
        503,
        "The console is off",
        "The admin API is disabled: set EVENTGATE_ADMIN_TOKEN and restart the gateway, "
        "then sign in here with that token.",
    )


def gate(request: Request) -> Session | Response:
    """The request's session, or the answer to give instead."""
    if console_access(request).signer is None:
        return disabled(request)
    session = current_session(request)
    if session is not None:
        return session
    if request.method == "GET":
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"{COOKIE_PATH}/sign-in?next={quote(target)}", status_code=303)
    return refused(request, 401, "Sign in first", "This action needs a signed-in session.")


async def checked_post(request: Request) -> tuple[Session, dict[str, str]] | Response:
    """A signed-in POST's session and form, once its CSRF token checks out."""
    session = gate(request)
    if not isinstance(session, Session):
        return session
    form = await read_form(request)
    if form is None:
        return refused(request, 413, "Form too large", "The form was larger than expected.")
    signer = console_access(request).signer
    if signer is None or not signer.csrf_matches(session, form.get("csrf")):
        log.warning("console_csrf_refused", path=request.url.path)
        return refused(request, 403, "Refused", "The form did not carry this session's CSRF token.")
    return session, form


# A console page's own address (filters and a cursor included) is well under this.
NEXT_MAX_CHARS = 4096


def safe_next(value: str | None) -> str:
    r"""Only a console page: never an open redirect to another site, nor out of /console.

    A path without scheme or host; no backslash or control character (browsers read ``\``
    as ``/`` and drop tabs and newlines, so ``/\evil`` and ``\t//evil`` leave the site);
    no empty, ``.`` or ``..`` segment, percent-encoded or not (``/console/%2e%2e/x`` is
    ``/x``)."""
    if value and len(value) <= NEXT_MAX_CHARS and _is_console_path(value):
        return value
    return f"{COOKIE_PATH}/events"


def _is_console_path(value: str) -> bool:
    if not value.startswith(f"{COOKIE_PATH}/"):  # so no scheme, no host
        return False
    if any(ch == "\\" or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        return False
    path = unquote(urlsplit(value).path)
    segments = path.removesuffix("/").split("/")[1:]
    return "\\" not in path and all(s not in ("", ".", "..") for s in segments)


def set_cookie(
    response: Response, request: Request, name: str, value: str, *, max_age: int
) -> None:
    """HttpOnly, SameSite=Strict, only under /console; Secure when served over HTTPS."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        expires=max_age,  # for clients that ignore Max-Age
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def drop_cookie(response: Response, request: Request, name: str) -> None:
    response.delete_cookie(
        name,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
