"""Admin auth and the service, as dependencies.

With no ``EVENTGATE_ADMIN_TOKEN`` the admin API is off: every admin endpoint answers 503
``AdminDisabled`` (the gateway is up, the feature is not configured), never data.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Annotated

import structlog
from fastapi import Depends, Request

from app.admin.exceptions import AdminDisabled, Unauthorized
from app.admin.service import AdminService

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class AdminAccess:
    """What the app factory gives the admin API (``app.state.admin``): the token it checks
    (None: the admin API is off) and the service behind it."""

    token: str | None
    service: AdminService


def _access(request: Request) -> AdminAccess:
    access: AdminAccess = request.app.state.admin
    return access


def require_admin(request: Request) -> None:
    token = _access(request).token
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


def get_admin_service(request: Request) -> AdminService:
    return _access(request).service


AdminServiceDep = Annotated[AdminService, Depends(get_admin_service)]
