"""Admin API errors, rendered as ``{"error": Name, "detail": ...}``.

AppError
├── AdminDisabled 503        no EVENTGATE_ADMIN_TOKEN: the admin API is off
├── Unauthorized 401         missing or wrong bearer token (WWW-Authenticate: Bearer)
├── InvalidCursor 400        a ``cursor`` this API did not hand out
├── EventNotFound 404
├── DeadLetterNotFound 404
├── ShadowCandidateNotFound 404  neither configured nor with decisions
└── ReplayConflict 409       dead letter already replayed, its event moved on, or the event
                             to replay is not held
"""

from __future__ import annotations

from app.errors import AppError


class AdminDisabled(AppError):
    status_code = 503


class Unauthorized(AppError):
    status_code = 401

    @property
    def headers(self) -> dict[str, str] | None:
        return {"WWW-Authenticate": "Bearer"}


class InvalidCursor(AppError):
    status_code = 400


class EventNotFound(AppError):
    status_code = 404


class DeadLetterNotFound(AppError):
    status_code = 404


class ShadowCandidateNotFound(AppError):
    status_code = 404


class ReplayConflict(AppError):
    status_code = 409
