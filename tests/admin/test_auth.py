"""Every admin route needs the bearer token; without a configured token the API is off."""

from __future__ import annotations

import httpx
import pytest

from tests.admin.conftest import ADMIN_TOKEN, GatewayFactory

ROUTES = [
    ("GET", "/v1/events/evt_x"),
    ("GET", "/v1/events"),
    ("GET", "/v1/llm-calls"),
    ("GET", "/v1/dead-letters"),
    ("POST", "/v1/dead-letters/1/replay"),
]


def test_admin_api_is_off_without_a_token(gateway_factory: GatewayFactory) -> None:
    with gateway_factory(admin_token=None) as server:
        for method, path in ROUTES:
            reply = httpx.request(
                method, server.url + path, headers={"Authorization": "Bearer anything"}
            )
            assert reply.status_code == 503, path
            assert reply.json() == {
                "error": "AdminDisabled",
                "detail": "admin API is disabled: set EVENTGATE_ADMIN_TOKEN",
            }


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": f"Bearer {ADMIN_TOKEN}x"},
        {"Authorization": f"Basic {ADMIN_TOKEN}"},
        {"Authorization": ADMIN_TOKEN},
    ],
    ids=["missing", "wrong", "longer", "basic-scheme", "no-scheme"],
)
def test_admin_routes_refuse_a_missing_or_wrong_token(
    gateway_factory: GatewayFactory, headers: dict[str, str]
) -> None:
    with gateway_factory() as server:
        for method, path in ROUTES:
            reply = httpx.request(method, server.url + path, headers=headers)
            assert reply.status_code == 401, path
            assert reply.headers["www-authenticate"] == "Bearer"
            assert reply.json()["error"] == "Unauthorized"
            assert ADMIN_TOKEN not in reply.text


def test_the_right_token_is_accepted_in_any_scheme_case(
    gateway_factory: GatewayFactory,
) -> None:
    with gateway_factory() as server:
        for scheme in ("Bearer", "bearer"):
            reply = httpx.get(
                server.url + "/v1/events", headers={"Authorization": f"{scheme} {ADMIN_TOKEN}"}
            )
            assert reply.status_code == 200
            assert reply.json() == {"items": [], "total": 0, "next_cursor": None}


def test_ingest_and_health_need_no_admin_token(gateway_factory: GatewayFactory) -> None:
    with gateway_factory() as server:
        assert httpx.get(server.url + "/healthz").status_code == 200
        assert httpx.get(server.url + "/metrics").status_code == 200
