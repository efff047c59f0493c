"""The columns the store's tests start an event with (``start_delivery``'s ``fields``)."""

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
