"""The console against what a hostile browser or link can send: tokens and cookies that are
not ASCII, time filters out of range, and ``next`` values that try to leave the console."""

from __future__ import annotations

import html
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from app.console.session import SessionSigner
from tests.console.conftest import ADMIN_TOKEN, csrf_of, sign_in

NON_ASCII = ["é", "\u00ff" * 64, "токен", "\U0001f600", "a\u200bb"]


def _raw_cookie(name: str, value: str) -> dict[bytes, bytes]:
    """A Cookie header as a browser may send it: UTF-8 bytes, which httpx would not encode."""
    return {b"cookie": f"{name}={value}".encode()}


@pytest.mark.parametrize("value", NON_ASCII)
def test_a_non_ascii_session_cookie_is_sent_to_sign_in(inprocess_gateway: Any, value: str) -> None:
    url = inprocess_gateway()
    signed = SessionSigner(ADMIN_TOKEN).issue()
    session_id, expires, _ = signed.split(".")
    for cookie in (value, f"{session_id}.{expires}.{value}", f"{value}.{expires}.{value}"):
        reply = httpx.get(f"{url}/console/events", headers=_raw_cookie("eventgate_console", cookie))
        assert reply.status_code == 303, (cookie, reply.text)
        assert reply.headers["location"].startswith("/console/sign-in")
        posted = httpx.post(
            f"{url}/console/sign-out",
            headers=_raw_cookie("eventgate_console", cookie),
            data={"csrf": "x"},
        )
        assert posted.status_code == 401, (cookie, posted.text)


@pytest.mark.parametrize("value", NON_ASCII)
def test_a_non_ascii_csrf_token_is_refused_like_a_wrong_one(
    inprocess_gateway: Any, value: str
) -> None:
    with httpx.Client(base_url=inprocess_gateway()) as client:
        assert sign_in(client).status_code == 303
        for path in ("/console/sign-out", "/console/dead-letters/1/replay"):
            reply = client.post(path, data={"csrf": value})
            assert reply.status_code == 403, (path, reply.text)
            assert "CSRF" in reply.text
        assert client.get("/console/events").status_code == 200


@pytest.mark.parametrize("value", NON_ASCII)
def test_a_non_ascii_sign_in_nonce_is_refused(inprocess_gateway: Any, value: str) -> None:
    with httpx.Client(base_url=inprocess_gateway()) as client:
        form = client.get("/console/sign-in")
        nonce = csrf_of(form.text)
        for field, cookie in ((value, nonce), (nonce, value), (value, value)):
            reply = client.post(
                "/console/sign-in",
                headers=_raw_cookie("eventgate_console_sign_in", cookie),
                data={"token": ADMIN_TOKEN, "csrf": field},
            )
            assert reply.status_code == 403, (field, cookie, reply.text)
            assert "eventgate_console=" not in reply.headers.get("set-cookie", "")


@pytest.mark.parametrize(
    "since",
    [
        "0001-01-01T00:00:00+01:00",  # before year 1 once moved to UTC
        "9999-12-31T23:59:59-01:00",  # after year 9999 once moved to UTC
        "99999-01-01T00:00",
        "+099999-01-01T00:00",
        "2026-13-01T00:00",
        "100000000000000000000",
        "yesterday",
    ],
)
def test_a_since_filter_that_is_not_a_time_is_a_form_error(
    inprocess_gateway: Any, since: str
) -> None:
    with httpx.Client(base_url=inprocess_gateway()) as client:
        assert sign_in(client).status_code == 303
        reply = client.get("/console/events", params={"since": since})
        assert reply.status_code == 422, reply.text
        assert 'role="alert"' in reply.text
        assert "Received since" in reply.text  # the form is there, to correct it
        assert "not a time" in reply.text


def test_a_since_filter_at_the_ends_of_the_calendar_lists_events(inprocess_gateway: Any) -> None:
    with httpx.Client(base_url=inprocess_gateway()) as client:
        assert sign_in(client).status_code == 303
        for since in ("0001-01-01T00:00", "9999-12-31T23:59:59", "2026-12-01T09:00:00"):
            reply = client.get("/console/events", params={"since": since})
            assert reply.status_code == 200, (since, reply.text)
            assert 'role="alert"' not in reply.text


def test_a_long_next_page_is_where_sign_in_returns(inprocess_gateway: Any) -> None:
    """A listing's page (filters and a cursor) is longer than a form field's usual limit."""
    page = "/console/events?" + urlencode(
        {
            "status": "published",
            "source": "s" * 200,
            "since": "2026-12-01T09:00:00",
            "cursor": "c" * 500,
        }
    )
    with httpx.Client(base_url=inprocess_gateway()) as client:
        sent = client.get(page)
        assert sent.status_code == 303
        form = client.get(sent.headers["location"])
        assert form.status_code == 200, form.text
        assert f'name="next" value="{html.escape(page)}"' in form.text
        reply = client.post(
            "/console/sign-in",
            data={"token": ADMIN_TOKEN, "csrf": csrf_of(form.text), "next": page},
        )
        assert reply.status_code == 303
        assert reply.headers["location"] == page


@pytest.mark.parametrize(
    "next_url",
    [
        "//evil.example/console/",
        "https://evil.example/console/",
        "http:/console/x",
        "/\\evil.example",
        "/console/\\evil.example",
        "\\\\evil.example",
        "javascript:alert(1)",
        "JavaScript:alert(1)//console/",
        "data:text/html,<script>alert(1)</script>",
        "\t//evil.example",
        " /console/events",
        "/console/\r\nSet-Cookie: eventgate_console=x",
        "/console/\x00",
        "/console/../evil",
        "/console/%2e%2e/evil",
        "/console/%2E%2E%2Fevil",
        "/console/..%2f..%2fevil",
        "/consolex/",
        "/" + "console/" * 600,  # longer than any console page's address
    ],
)
def test_sign_in_never_returns_off_the_console(inprocess_gateway: Any, next_url: str) -> None:
    with httpx.Client(base_url=inprocess_gateway()) as client:
        page = client.get("/console/sign-in", params={"next": next_url})
        assert page.status_code == 200, page.text
        assert 'name="next" value="/console/events"' in page.text
        reply = client.post(
            "/console/sign-in",
            data={"token": ADMIN_TOKEN, "csrf": csrf_of(page.text), "next": next_url},
        )
        assert reply.status_code == 303
        assert reply.headers["location"] == "/console/events"
        # Signed in, the form sends the browser on at once: the same rule.
        again = client.get("/console/sign-in", params={"next": next_url})
        assert again.status_code == 303
        assert again.headers["location"] == "/console/events"
