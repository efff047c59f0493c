"""Opaque keyset cursors: base64url of the last row's sort key, as JSON."""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime
from typing import Any

import orjson

from app.admin.exceptions import InvalidCursor


def as_utc(value: datetime) -> datetime:
    """SQLite returns naive datetimes (stored as UTC); PostgreSQL aware ones."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def encode(key: list[Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(key)).decode().rstrip("=")


def _decode(cursor: str) -> list[Any]:
    try:
        value = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError):
        raise InvalidCursor("cursor is not one this API returned") from None
    if not isinstance(value, list):
        raise InvalidCursor("cursor is not one this API returned")
    return value


def time_cursor(at: datetime, row_id: str) -> str:
    return encode([as_utc(at).isoformat(), row_id])


def decode_time_cursor(cursor: str | None) -> tuple[datetime, str] | None:
    if cursor is None:
        return None
    value = _decode(cursor)
    try:
        at, row_id = value
        if not isinstance(row_id, str) or "\x00" in row_id:
            raise ValueError(row_id)
        return as_utc(datetime.fromisoformat(at)), row_id
    except (TypeError, ValueError, OverflowError):
        raise InvalidCursor("cursor is not one this API returned") from None


def id_cursor(row_id: int) -> str:
    return encode([row_id])


def decode_id_cursor(cursor: str | None) -> int | None:
    """Row ids are positive 64-bit integers; anything else would fail in the database."""
    if cursor is None:
        return None
    value = _decode(cursor)
    if len(value) != 1 or type(value[0]) is not int or not 0 <= value[0] < 2**63:
        raise InvalidCursor("cursor is not one this API returned")
    return value[0]
