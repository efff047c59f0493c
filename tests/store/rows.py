"""The columns the store's tests start an event with (``start_delivery``'s ``fields``), and
those of an audit row written before its call."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def event_fields(event_id: str, **changed: Any) -> dict[str, Any]:
    """A GitHub issue opened on acme/api, with ``changed`` over it."""
    return {
        "id": event_id,
        "source": "github",
        "type": "issues.opened",
        "group_key": "acme/api",
        "delivery_id": f"d-{event_id}",
        "pipeline": "triage",
        "payload": {"action": "opened"},
        "received_at": datetime(2026, 12, 1, 8, 30, tzinfo=UTC),
    } | changed


def call_fields(call_id: str, **changed: Any) -> dict[str, Any]:
    """An audit row as written before its call, with ``changed`` over it; the database or
    the columns' defaults fill the rest."""
    return {
        "id": call_id,
        "event_id": "evt_1",
        "pipeline": "triage",
        "model": "claude-sonnet-4-6",
        "attempt": 1,
        "status": "unknown",
        "latency_ms": 0.0,
    } | changed
