"""What is published for one tool call, built once, when the decision is stored.

The outbox row carries everything the relay sends: the SNS message body (JSON
``{"tool", "input", "event", "llm_call_id", "model", "sequence"}``), the topic, the
``MessageGroupId``, the ``MessageDeduplicationId`` and the attributes' values. The ids come
from data the gateway owns (``ids.py``), never from Claude's text; a tool's ``group_id: llm``
policy may take Claude's ``message_group_id`` only when it is a valid SNS id.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.config import ToolConfig
from app.events import WINDOW_SOURCE, Event
from app.observability.metrics import GROUP_ID_DISAGREEMENTS
from app.publish.ids import deduplication_id, resolve_group_id
from app.publish.sns import OutgoingMessage
from app.store.models import OutboxRow, PendingRow, slot_of


def outbox_row(
    *,
    event: Event,
    use: dict[str, Any],
    index: int,
    tool: ToolConfig,
    call_id: str,
    model: str,
) -> OutboxRow:
    """The row of the ``index``-th accepted tool call (``use``) of ``event``'s decision."""
    name = str(use["name"])
    tool_input = use.get("input", {})
    body = {
        "tool": name,
        "input": tool_input,
        "event": event.summary(),
        "llm_call_id": call_id,
        "model": model,
        "sequence": index,
    }
    if event.source == WINDOW_SOURCE and isinstance(event.payload, dict):
        window = event.payload.get("window") or {}
        body["window"] = {k: window.get(k) for k in ("first_event_id", "last_event_id", "events")}
    group_id, disagreed = resolve_group_id(tool.group_id, event.group_key, tool_input)
    if disagreed:
        GROUP_ID_DISAGREEMENTS.labels(tool=name, policy=tool.group_id).inc()
    return OutboxRow(
        event_id=event.id,
        source=event.source,
        seq=index,
        generation=event.generation,
        llm_call_id=call_id,
        tool=name,
        topic_arn=tool.topic_arn,
        group_id=group_id,
        relay_slot=slot_of(group_id),
        dedup_id=deduplication_id(event.id, index, event.generation),
        body=orjson.dumps(body).decode(),
    )


def outgoing(row: PendingRow) -> OutgoingMessage:
    """The SNS message of a stored row, as it is sent (and sent again after a crash)."""
    assert row.topic_arn is not None
    return OutgoingMessage(
        topic_arn=row.topic_arn,
        body=row.body,
        group_id=row.group_id,
        dedup_id=row.dedup_id,
        attributes={"tool": row.tool, "source": row.source, "event_id": row.event_id},
    )
