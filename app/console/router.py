"""The operators' console at ``/console``, HTTP only: server-rendered pages over the admin
service (events, an event's timeline, dead letters and their replay) and the health glance.

Every page needs a signed-in session and every POST the session's CSRF token (``gate.py``).
Listings page by keyset cursors and never count.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated
from urllib.parse import quote, urlencode

import structlog
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import FileResponse, RedirectResponse, Response

from app.admin.repository import DeadLetterFilter, EventFilter
from app.admin.schemas import EventStatusName, EventSummary, Window
from app.console.access import STYLESHEET, console_access, current_session, read_form, render
from app.console.gate import (
    checked_post,
    disabled,
    drop_cookie,
    gate,
    refused,
    safe_next,
    set_cookie,
)
from app.console.session import (
    COOKIE_PATH,
    SESSION_COOKIE,
    SIGN_IN_COOKIE,
    SIGN_IN_SECONDS,
    Session,
    new_sign_in_nonce,
    sign_in_nonce_matches,
    token_matches,
)
from app.errors import AppError

log = structlog.get_logger(__name__)
router = APIRouter(prefix="/console", include_in_schema=False)

PAGE_SIZE = 50
STATUSES: tuple[EventStatusName, ...] = (
    "queued",
    "processing",
    "held",
    "published",
    "no_action",
    "dead_lettered",
    "windowed",
)
Filter = Annotated[str, Query(max_length=200, pattern=r"^[^\x00]*$")]
Cursor = Annotated[str | None, Query(max_length=500)]


@router.get("")
@router.get("/")
async def home() -> Response:
    return RedirectResponse(f"{COOKIE_PATH}/events", status_code=303)


@router.get("/console.css")
async def stylesheet() -> Response:
    return FileResponse(STYLESHEET, media_type="text/css")


def _sign_in_form(
    request: Request, *, next_url: str, error: str | None = None, status_code: int = 200
) -> Response:
    nonce = new_sign_in_nonce()
    response = render(
        request,
        "sign_in.html",
        {"nonce": nonce, "next": next_url, "error": error},
        session=None,
        status_code=status_code,
    )
    set_cookie(response, request, SIGN_IN_COOKIE, nonce, max_age=SIGN_IN_SECONDS)
    return response


@router.get("/sign-in")
async def sign_in_page(request: Request, next: str = "") -> Response:
    # Any text: ``safe_next`` keeps a console page (of up to NEXT_MAX_CHARS) and replaces
    # anything else, so a link with a strange ``next`` still shows the form.
    if console_access(request).signer is None:
        return disabled(request)
    if current_session(request) is not None:
        return RedirectResponse(safe_next(next), status_code=303)
    return _sign_in_form(request, next_url=safe_next(next))


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    access = console_access(request)
    if access.signer is None or not access.admin.token:
        return disabled(request)
    form = await read_form(request)
    if form is None:
        return refused(request, 413, "Form too large", "The form was larger than expected.")
    if not sign_in_nonce_matches(request.cookies.get(SIGN_IN_COOKIE), form.get("csrf")):
        log.warning("console_csrf_refused", path=request.url.path)
        return refused(
            request, 403, "Refused", "The sign-in form expired or did not come from here."
        )
    next_url = safe_next(form.get("next"))
    if not token_matches(form.get("token", ""), access.admin.token):
        log.warning(
            "console_sign_in_refused", client=request.client.host if request.client else None
        )
        return _sign_in_form(
            request, next_url=next_url, error="That is not the admin token.", status_code=401
        )
    log.info("console_signed_in", client=request.client.host if request.client else None)
    response = RedirectResponse(next_url, status_code=303)
    cookie = access.signer.issue()
    set_cookie(response, request, SESSION_COOKIE, cookie, max_age=access.signer.seconds)
    drop_cookie(response, request, SIGN_IN_COOKIE)
    return response


@router.post("/sign-out")
async def sign_out(request: Request) -> Response:
    posted = await checked_post(request)
    if isinstance(posted, Response):
        return posted
    response = RedirectResponse(f"{COOKIE_PATH}/sign-in", status_code=303)
    drop_cookie(response, request, SESSION_COOKIE)
    return response


def _since(value: str) -> datetime | None:
    """A ``datetime-local`` field (no offset) is read as UTC, like the admin API's times.

    Raises ``ValueError`` with the form's error for text that is not a time, or one outside
    datetime's range once moved to UTC (``0001-01-01T00:00+01:00``)."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except (ValueError, OverflowError):
        raise ValueError(
            "Received since: not a time between years 1 and 9999 (YYYY-MM-DDTHH:MM:SS, UTC)."
        ) from None


@router.get("/events")
async def events(
    request: Request,
    status: Filter = "",
    source: Filter = "",
    since: Filter = "",
    cursor: Cursor = None,
) -> Response:
    session = gate(request)
    if not isinstance(session, Session):
        return session
    filters = {"status": status if status in STATUSES else "", "source": source, "since": since}
    try:
        received_since = _since(since)
    except ValueError as exc:
        empty: Window[EventSummary] = Window(items=[], next_cursor=None)
        return _events_page(request, session, filters, empty, error=str(exc), first_page=True)
    flt = EventFilter(status=filters["status"] or None, source=source or None, since=received_since)
    try:
        window = await console_access(request).admin.service.event_window(
            flt, limit=PAGE_SIZE, cursor=cursor
        )
    except AppError as exc:
        return refused(request, exc.status_code, "Cannot list events", exc.message)
    return _events_page(request, session, filters, window, first_page=cursor is None)


def _events_page(
    request: Request,
    session: Session,
    filters: dict[str, str],
    window: Window[EventSummary],
    *,
    first_page: bool,
    error: str | None = None,
) -> Response:
    """The listing; with ``error`` (a filter that cannot be used) a 422 showing it above the
    form, and no rows."""
    older = (
        f"?{urlencode({**filters, 'cursor': window.next_cursor})}" if window.next_cursor else None
    )
    context = {
        "window": window,
        "filters": filters,
        "statuses": STATUSES,
        "sources": sorted(console_access(request).admin.service.sources),
        "older": older,
        "first_page": first_page,
        "newest": f"?{urlencode(filters)}",
        "error": error,
    }
    return render(
        request, "events.html", context, session=session, status_code=422 if error else 200
    )


EventId = Annotated[str, Path(max_length=64, pattern=r"^[^\x00]*$")]


@router.get("/events/{event_id}")
async def event(request: Request, event_id: EventId, replayed: int = 0) -> Response:
    session = gate(request)
    if not isinstance(session, Session):
        return session
    try:
        detail = await console_access(request).admin.service.event(event_id)
    except AppError as exc:
        return refused(request, exc.status_code, "No such event", exc.message)
    context = {"event": detail, "replayed": replayed}
    return render(request, "event.html", context, session=session)


@router.post("/events/{event_id}/replay")
async def replay_held(request: Request, event_id: EventId) -> Response:
    posted = await checked_post(request)
    if isinstance(posted, Response):
        return posted
    try:
        await console_access(request).admin.service.replay_held(event_id)
    except AppError as exc:
        return refused(request, exc.status_code, "Not replayed", exc.message)
    return RedirectResponse(
        f"{COOKIE_PATH}/events/{quote(event_id, safe='')}?replayed=1", status_code=303
    )


@router.get("/dead-letters")
async def dead_letters(
    request: Request, show: Filter = "waiting", cursor: Cursor = None, replayed: int = 0
) -> Response:
    session = gate(request)
    if not isinstance(session, Session):
        return session
    flt = DeadLetterFilter(replayed=False if show == "waiting" else None)
    service = console_access(request).admin.service
    try:
        window = await service.dead_letter_window(flt, limit=PAGE_SIZE, cursor=cursor)
    except AppError as exc:
        return refused(request, exc.status_code, "Cannot list dead letters", exc.message)
    older = (
        f"?{urlencode({'show': show, 'cursor': window.next_cursor})}"
        if window.next_cursor
        else None
    )
    context = {"window": window, "show": show, "older": older, "replayed": replayed}
    return render(request, "dead_letters.html", context, session=session)


@router.post("/dead-letters/{dead_letter_id}/replay")
async def replay(
    request: Request, dead_letter_id: Annotated[int, Path(ge=1, le=2**63 - 1)]
) -> Response:
    posted = await checked_post(request)
    if isinstance(posted, Response):
        return posted
    try:
        await console_access(request).admin.service.replay(dead_letter_id)
    except AppError as exc:
        return refused(request, exc.status_code, "Not replayed", exc.message)
    return RedirectResponse(
        f"{COOKIE_PATH}/dead-letters?show=all&replayed={dead_letter_id}", status_code=303
    )


@router.get("/health")
async def health(request: Request) -> Response:
    session = gate(request)
    if not isinstance(session, Session):
        return session
    glance = await console_access(request).glance.read()
    return render(request, "health.html", {"glance": glance}, session=session)
