"""Admin auth and the service, as dependencies.

With no ``EVENTGATE_ADMIN_TOKEN`` the admin API is off: every admin endpoint answers 503
``AdminDisabled`` (the gateway is up, the feature is not configured), never data.
"""

from __future__ import annotations

import hmac
from typing import Annotated

import structlog
from fastapi import Depends, Request

from app.admin.exceptions import AdminDisabled, Unauthorized
from app.admin.service import AdminService
from app.deps import StateDep

log = structlog.get_logger(__name__)


def require_admin(request: Request, state: StateDep) -> None:
    token = state.settings.admin_token
    if not token:
        raise AdminDisabled("admin API is disabled: set EVENTGATE_ADMIN_TOKEN")
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    # Constant-time comparison: response timing must not reveal how much of a guess matched.
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), token.encode()
    ):
        log.warning(
            "admin_unauthorized",
            path=request.url.path,
            client=request.client.host if request.client else None,
            had_credentials=bool(given),
        )
        raise Unauthorized("missing or wrong bearer token (Authorization: Bearer <token>)")


def get_admin_service(state: StateDep) -> AdminService:
    return AdminService(
        sessions=state.sessions,
        queue=state.queue,
        sources=state.config.sources,
        marker_ttl_ms=state.settings.dedup_window_seconds * 1000,
    )


AdminServiceDep = Annotated[AdminService, Depends(get_admin_service)]
