"""The console over plain HTTP: sessions, cookies, CSRF, the console switched off, and keyset
pages that never count."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.admin.repository import DeadLetterFilter, EventFilter
from app.admin.schemas import Page, Window
from app.admin.service import AdminService
from app.console.session import SESSION_SECONDS, SessionSigner
from app.queue.streams import EventQueue
from app.store.db import create_engine, session_factory
from app.store.models import DeadLetterRow, EventRow, WindowRow
from tests.console.conftest import ADMIN_TOKEN, GITHUB_SECRET, csrf_of, sign_in
from tests.support import github_request, issue_payload

GET_ROUTES = [
    "/console/events",
    "/console/events?status=published",
    "/console/events/evt_x",
    "/console/dead-letters",
    "/console/health",
]
POST_ROUTES = [
    "/console/sign-out",
    "/console/dead-letters/1/replay",
    "/console/events/evt_x/replay",
]
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def _cookie_header(reply: httpx.Response, name: str) -> str:
    [header] = [h for h in reply.headers.get_list("set-cookie") if h.startswith(f"{name}=")]
    return header


def test_every_page_and_action_needs_a_session(inprocess_gateway: Any) -> None:
    url = inprocess_gateway()
    other = SessionSigner("another-token-entirely-0000").issue()
    expired = SessionSigner(ADMIN_TOKEN, seconds=-1).issue()
    home = httpx.get(f"{url}/console")
    assert home.status_code == 303
    assert home.headers["location"] == "/console/events"
    for cookie in (None, "forged.0.abc", other, expired):
        cookies = {"eventgate_console": cookie} if cookie else {}
        with httpx.Client(base_url=url, cookies=cookies) as client:
            for path in GET_ROUTES:
                reply = client.get(path)
                assert reply.status_code == 303, (path, cookie)
                assert reply.headers["location"].startswith("/console/sign-in?next=/console/")
            for path in POST_ROUTES:
                reply = client.post(path, data={"csrf": "x"})
                assert reply.status_code == 401, (path, cookie)
                assert "Sign in first" in reply.text


def test_signing_in_sets_a_strict_httponly_expiring_cookie_without_the_token(
    inprocess_gateway: Any,
) -> None:
    with httpx.Client(base_url=inprocess_gateway()) as client:
        reply = sign_in(client)
        assert reply.status_code == 303
        assert reply.headers["location"] == "/console/events"
        header = _cookie_header(reply, "eventgate_console")
        flags = {part.strip().lower() for part in header.split(";")[1:]}
        assert "httponly" in flags
        assert "samesite=strict" in flags
        assert f"max-age={SESSION_SECONDS}" in flags
        assert "path=/console" in flags
        assert any(flag.startswith("expires=") for flag in flags)
        assert ADMIN_TOKEN not in header
        page = client.get("/console/events")
        assert page.status_code == 200
        assert ADMIN_TOKEN not in page.text
        assert "Sign out" in page.text
        assert "script" not in page.headers["content-security-policy"]
        assert page.headers["cache-control"] == "no-store"


def test_a_wrong_token_is_refused(inprocess_gateway: Any) -> None:
    with httpx.Client(base_url=inprocess_gateway()) as client:
        for wrong in ("", "wrong", ADMIN_TOKEN + "x", ADMIN_TOKEN[:-1]):
            reply = sign_in(client, wrong)
            assert reply.status_code == 401
            assert "That is not the admin token." in reply.text
            assert not [
                h
                for h in reply.headers.get_list("set-cookie")
                if h.startswith("eventgate_console=")
            ]
        assert client.get("/console/events").status_code == 303


def test_sign_in_without_the_forms_nonce_is_refused(inprocess_gateway: Any) -> None:
    with httpx.Client(base_url=inprocess_gateway()) as client:
        client.get("/console/sign-in")  # the nonce cookie is set, but not repeated in the form
        reply = client.post("/console/sign-in", data={"token": ADMIN_TOKEN})
        assert reply.status_code == 403
        assert "eventgate_console=" not in reply.headers.get("set-cookie", "")


def test_posts_without_the_sessions_csrf_token_are_refused(inprocess_gateway: Any) -> None:
    with httpx.Client(base_url=inprocess_gateway()) as client:
        assert sign_in(client).status_code == 303
        token = csrf_of(client.get("/console/events").text)
        wrong = token[:-1] + ("1" if token.endswith("0") else "0")  # one character off
        for path in POST_ROUTES:
            for data in ({}, {"csrf": ""}, {"csrf": wrong}, {"csrf": ADMIN_TOKEN}):
                reply = client.post(path, data=data)
                assert reply.status_code == 403, (path, data)
                assert "CSRF" in reply.text
        # Still signed in; with the token, the action runs (no such dead letter here).
        assert client.get("/console/events").status_code == 200
        reply = client.post("/console/dead-letters/1/replay", data={"csrf": token})
        assert reply.status_code == 404
        assert "no dead letter 1" in reply.text
        reply = client.post("/console/events/evt_x/replay", data={"csrf": token})
        assert reply.status_code == 404
        assert "no stored event evt_x" in reply.text
        out = client.post("/console/sign-out", data={"csrf": token})
        assert out.status_code == 303
        assert 'eventgate_console=""' in _cookie_header(out, "eventgate_console")
        assert client.get("/console/events").status_code == 303


def test_the_console_says_when_the_admin_api_is_off(inprocess_gateway: Any) -> None:
    with httpx.Client(base_url=inprocess_gateway(admin_token=None)) as client:
        for path in ["/console/sign-in", *GET_ROUTES]:
            reply = client.get(path)
            assert reply.status_code == 503, path
            assert "set EVENTGATE_ADMIN_TOKEN" in reply.text
        for path in ["/console/sign-in", *POST_ROUTES]:
            assert client.post(path, data={"token": "x", "csrf": "x"}).status_code == 503


def test_a_session_ends_when_it_expires_or_the_token_changes() -> None:
    now = [1_000_000.0]
    signer = SessionSigner(ADMIN_TOKEN, clock=lambda: now[0])
    cookie = signer.issue()
    session = signer.verify(cookie)
    assert session is not None
    assert signer.csrf_matches(session, signer.csrf_token(session))
    assert SessionSigner("rotated-token", clock=lambda: now[0]).verify(cookie) is None
    session_id, expires, signature = cookie.split(".")
    assert signer.verify(f"{session_id}.{int(expires) + 3600}.{signature}") is None
    now[0] += SESSION_SECONDS - 1
    assert signer.verify(cookie) is not None
    now[0] += 1
    assert signer.verify(cookie) is None


def _events(count: int) -> list[EventRow]:
    return [
        EventRow(
            id=f"evt_{n:04d}",
            source="github",
            type="issues.opened",
            group_key=f"acme/repo{n % 3}",
            delivery_id=f"d{n}",
            pipeline="triage",
            status="published" if n % 4 else "dead_lettered",
            payload={"n": n},
            received_at=T0 + timedelta(seconds=n),
            updated_at=T0 + timedelta(seconds=n),
            deliveries=1,
        )
        for n in range(count)
    ]


async def test_the_events_list_pages_by_cursor_newest_first(
    inprocess_gateway: Any, sessions: async_sessionmaker[AsyncSession]
) -> None:
    async with sessions() as session:
        session.add_all(_events(120))
        await session.commit()
    url = inprocess_gateway()
    seen: list[str] = []
    async with httpx.AsyncClient(base_url=url) as client:
        form = await client.get("/console/sign-in")
        await client.post(
            "/console/sign-in", data={"token": ADMIN_TOKEN, "csrf": csrf_of(form.text)}
        )
        path: str | None = "/console/events"
        while path is not None:
            page = await client.get(path)
            assert page.status_code == 200
            seen += re.findall(r'href="/console/events/(evt_\d+)"', page.text)
            older = re.search(r'href="(/console/events\?[^"]*cursor=[^"]+)"', page.text)
            path = older.group(1).replace("&amp;", "&") if older else None
        assert seen == [f"evt_{n:04d}" for n in reversed(range(120))]
        dead = await client.get("/console/events?status=dead_lettered&source=github")
        ids = re.findall(r'href="/console/events/(evt_\d+)"', dead.text)
        assert ids == [f"evt_{n:04d}" for n in reversed(range(0, 120, 4))]
        since = await client.get("/console/events?since=2026-12-01T09:01:50")
        ids = re.findall(r'href="/console/events/(evt_\d+)"', since.text)
        assert ids == [f"evt_{n:04d}" for n in reversed(range(110, 120))]


@pytest.mark.parametrize("listing", ["events", "dead_letters"])
async def test_console_listings_never_count_rows(
    database_url: str, redis: Redis, redis_prefix: str, listing: str
) -> None:
    """The API's pages carry a total; the console's windows must not pay for one."""
    engine = create_engine(database_url)
    sessions = session_factory(engine)
    async with sessions() as session:
        session.add_all(_events(60))
        session.add_all(
            DeadLetterRow(event_id=f"evt_{n:04d}", stage="llm", reason="x") for n in range(60)
        )
        await session.commit()
    queue = EventQueue(redis, prefix=redis_prefix, partitions=4)
    service = AdminService(sessions=sessions, queue=queue, sources={})
    statements: list[str] = []

    def record(*args: Any) -> None:
        statements.append(str(args[2]).lower())

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    window: Window[Any]
    counted: Page[Any]
    try:
        if listing == "events":
            window = await service.event_window(EventFilter(), limit=50, cursor=None)
            counted = await service.events(EventFilter(), limit=50, cursor=None)
        else:
            window = await service.dead_letter_window(DeadLetterFilter(), limit=50, cursor=None)
            counted = await service.dead_letters(DeadLetterFilter(), limit=50, cursor=None)
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)
        await engine.dispose()
    assert len(window.items) == 50
    assert window.next_cursor is not None
    assert counted.total == 60
    [window_sql, *api_sql] = statements
    assert "count(" not in window_sql
    assert any("count(" in sql for sql in api_sql)


@pytest.mark.parametrize(
    ("next_url", "landing"),
    [
        ("/console/dead-letters?show=all", "/console/dead-letters?show=all"),
        ("https://elsewhere.example/", "/console/events"),
        ("//elsewhere.example/console/", "/console/events"),
        ("/console/..//elsewhere.example", "/console/events"),
    ],
)
def test_sign_in_returns_only_to_a_console_page(
    inprocess_gateway: Any, next_url: str, landing: str
) -> None:
    with httpx.Client(base_url=inprocess_gateway()) as client:
        form = client.get("/console/sign-in")
        reply = client.post(
            "/console/sign-in",
            data={"token": ADMIN_TOKEN, "csrf": csrf_of(form.text), "next": next_url},
        )
        assert reply.status_code == 303
        assert reply.headers["location"] == landing


def test_an_event_no_worker_has_stored_yet_shows_as_queued(inprocess_gateway: Any) -> None:
    """The ``api`` role runs no worker: the event stays on the Redis stream only."""
    url = inprocess_gateway()
    body, headers = github_request(GITHUB_SECRET, issue_payload("acme/queued", 1))
    sent = httpx.post(f"{url}/v1/webhooks/github", content=body, headers=headers)
    assert sent.status_code == 202
    event_id = sent.json()["event_id"]
    with httpx.Client(base_url=url) as client:
        assert sign_in(client).status_code == 303
        assert event_id not in client.get("/console/events").text
        page = client.get(f"/console/events/{event_id}")
        assert page.status_code == 200
        assert "waiting for a worker" in page.text
        assert 'class="status s-queued"' in page.text
        missing = client.get("/console/events/evt_nobody")
        assert missing.status_code == 404
        assert "no event" in missing.text


async def test_a_dead_letter_is_replayed_once_from_the_console(
    inprocess_gateway: Any, sessions: async_sessionmaker[AsyncSession]
) -> None:
    [row] = _events(1)  # evt_0000, dead_lettered
    async with sessions() as session:
        session.add(row)
        await session.flush()
        session.add(DeadLetterRow(event_id=row.id, stage="llm", reason="BadRequestError: 400"))
        await session.commit()
    async with httpx.AsyncClient(base_url=inprocess_gateway()) as client:
        form = await client.get("/console/sign-in")
        await client.post(
            "/console/sign-in", data={"token": ADMIN_TOKEN, "csrf": csrf_of(form.text)}
        )
        listed = await client.get("/console/dead-letters")
        assert "BadRequestError: 400" in listed.text
        token = csrf_of(listed.text)
        replay = await client.post("/console/dead-letters/1/replay", data={"csrf": token})
        assert replay.status_code == 303
        assert replay.headers["location"] == "/console/dead-letters?show=all&replayed=1"
        after = await client.get(replay.headers["location"])
        assert "Dead letter 1 was replayed" in after.text
        waiting = await client.get("/console/dead-letters")
        assert "BadRequestError: 400" not in waiting.text
        again = await client.post("/console/dead-letters/1/replay", data={"csrf": token})
        assert again.status_code == 409
        assert "already replayed" in again.text


async def test_an_events_page_shows_its_window_and_links_the_event_that_decided_it(
    inprocess_gateway: Any, sessions: async_sessionmaker[AsyncSession]
) -> None:
    member, decided = _events(1)[0], _events(2)[1]
    member.status, member.window_id, member.window_position = "windowed", 1, 1
    decided.id, decided.source, decided.status = "wn_decided", "window", "published"
    async with sessions() as session:
        session.add(
            WindowRow(
                id=1,
                pipeline="triage",
                group_key=member.group_key,
                status="enqueued",
                events=1,
                first_event_id=member.id,
                last_event_id=member.id,
                opened_at=T0,
                closes_at=T0,
                closed_at=T0,
                closed_by="time",
                event_id="wn_decided",
            )
        )
        session.add_all([member, decided])
        await session.commit()
    url = inprocess_gateway()
    async with httpx.AsyncClient(base_url=url) as client:
        form = await client.get("/console/sign-in")
        await client.post(
            "/console/sign-in", data={"token": ADMIN_TOKEN, "csrf": csrf_of(form.text)}
        )
        page = (await client.get(f"/console/events/{member.id}")).text
        window = (await client.get("/console/events/wn_decided")).text
    assert "Window 1" in page and "closed by time" in page
    assert 'href="/console/events/wn_decided"' in page and "(published)" in page
    assert f'href="/console/events/{member.id}"' in window
