"""A key's recent history in the prompt: its last N events before this one, each with the
decision stored for it, so Claude can judge an event against what came before.

The history is one fenced block after the event, oldest first, one line per earlier event:
when it arrived, its type and source, its summary (the source's summary lines), and what was
decided (the accepted tool calls with their inputs, or the event's status when there are
none). It stays bounded: each line is cut to its share of ``max_chars`` and the block never
exceeds it; secrets are redacted (the payloads are stored redacted, the inputs are Claude's
and pass through the same text redaction); the fence cannot be closed from inside.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import orjson
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.config import HistoryConfig
from app.decide.prompts import fence_safe, one_line, summarize
from app.events import Event
from app.redaction.text import redact_text
from app.store.models import EventRow, OutboxRow

OPEN, CLOSE = "<key_history>", "</key_history>"


async def earlier_events(
    session: AsyncSession, event: Event, *, limit: int
) -> Sequence[tuple[EventRow, list[str]]]:
    """The key's last ``limit`` events received before ``event``, oldest first, each with its
    decision's calls as ``tool {input}`` texts (its current generation)."""
    rows = (
        await session.scalars(
            select(EventRow)
            .where(
                EventRow.group_key == event.group_key,
                EventRow.id != event.id,
                EventRow.received_at <= event.received_at,
            )
            .order_by(EventRow.received_at.desc(), EventRow.id.desc())
            .limit(limit)
        )
    ).all()
    if not rows:
        return []
    outbox = (
        await session.scalars(
            select(OutboxRow)
            .where(OutboxRow.event_id.in_([row.id for row in rows]))
            .order_by(OutboxRow.event_id, OutboxRow.seq)
        )
    ).all()
    generation = {row.id: row.replays for row in rows}
    calls: dict[str, list[str]] = {}
    for call in outbox:
        if call.generation == generation[call.event_id]:
            given = orjson.loads(call.body).get("input", {})
            calls.setdefault(call.event_id, []).append(
                f"{call.tool} {orjson.dumps(given, option=orjson.OPT_SORT_KEYS).decode()}"
            )
    return [(row, calls.get(row.id, [])) for row in reversed(rows)]


def history_block(
    earlier: Sequence[tuple[EventRow, list[str]]],
    *,
    source_types: Mapping[str, str | None],
    config: HistoryConfig,
) -> str:
    """The fenced block for the prompt ("" when the key has no earlier event)."""
    if not earlier:
        return ""
    head = "earlier events of this group, oldest first, each with what was decided:"
    room = config.max_chars - len(OPEN) - len(CLOSE) - len(head) - 3
    share = max(80, room // len(earlier))
    lines: list[str] = []
    for row, calls in earlier:
        summary = "; ".join(
            f"{label}: {value}"
            for label, value in summarize(source_types.get(row.source), row.type, row.payload)
        )
        decided = " | ".join(calls) if calls else f"no tool call ({row.status})"
        text = (
            f"- {row.received_at.isoformat()} {one_line(row.type)} ({row.source})"
            f"{': ' + summary if summary else ''} -> {decided}"
        )
        line = fence_safe(one_line(redact_text(text), cap=share))[:share]
        if sum(len(done) + 1 for done in lines) + len(line) > room:
            break
        lines.append(line)
    return "\n".join([OPEN, head, *lines, CLOSE])
