"""Windows: a pipeline with ``window: {seconds, max_events}`` decides a key's events together.

    pipelines:
      incidents:
        window: {seconds: 60, max_events: 100}
        model: claude-sonnet-4-6
        system: Write one incident report for these alerts.
        tools: [publishNotification]

- The worker takes each event of such a pipeline into the open window of its key (the
  ``windows`` table, ``app/store/windows.py``): the event is stored, ends ``windowed`` and
  its stream entry is acked. A window opens with its key's first event and closes
  ``seconds`` later (``app/schedule/windows.py`` closes it) or at its ``max_events``-th
  event (the worker that took that event in closes it).
- A closed window becomes one event of source ``window`` on its key's stream, with an id
  derived from the pipeline and its first and last event ids (``window_event``). From there
  it is an event like any other: decided by one Claude call whose user turn lists the
  window's events oldest first, within a bound (``render_window``), audited, its tool
  calls published with ids derived from its id, so a retried window never publishes twice,
  and a key's windows reach the stream, and so are decided and published, in the order
  they opened.
- Durable at every step: the members are rows before their entries are acked, a window is
  closed before its event is built, and its event is enqueued (deduplicated by its id) until
  the window is marked ``enqueued``. A process killed with a window open leaves it in the
  table, and any process closes and enqueues it.
- Other keys never wait: taking an event in is one short transaction.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from app.decide.prompts import DEFAULT_BUDGET_CHARS, fence_safe, one_line, render_event
from app.events import WINDOW_SOURCE, Event, make_event
from app.source_config import SourceConfig
from app.store.models import EventRow, WindowRow
from app.store.windows import as_utc, window_view

# Every event of a window is rendered within its share of the source's budget, at least this.
MIN_MEMBER_CHARS = 400
# The user turn of a window stops growing here (about 25k tokens): later events are counted,
# not shown, so a full window of large events is still a prompt Claude takes.
MAX_WINDOW_CHARS = 100_000


def window_event_id(pipeline: str, first_event_id: str, last_event_id: str) -> str:
    digest = hashlib.sha256(f"{pipeline}\0{first_event_id}\0{last_event_id}".encode())
    return f"wn_{digest.hexdigest()[:32]}"


def window_event(row: WindowRow) -> Event:
    """The event that stands for closed window ``row``: the same whoever builds it."""
    assert row.first_event_id is not None and row.last_event_id is not None
    assert row.closed_at is not None
    event_id = window_event_id(row.pipeline, row.first_event_id, row.last_event_id)
    return make_event(
        id=event_id,
        source=WINDOW_SOURCE,
        config=None,
        type="window",
        group_key=row.group_key,
        delivery_id=event_id,
        pipeline=row.pipeline,
        received_at=as_utc(row.closed_at),
        payload={"window": window_view(row)},
    )


def member_event(row: EventRow, config: SourceConfig | None) -> Event:
    return make_event(
        id=row.id,
        source=row.source,
        config=config,
        type=row.type,
        group_key=row.group_key,
        delivery_id=row.delivery_id,
        pipeline=row.pipeline,
        received_at=as_utc(row.received_at),
        payload=row.payload,
    )


def render_window(event: Event, members: Sequence[Event]) -> str:
    """The user turn of a window: what it is, then each event (oldest first) rendered as a
    single event would be, within its share of the budget, while the turn stays within
    ``MAX_WINDOW_CHARS`` (the first event is always shown)."""
    window = event.payload.get("window", {}) if isinstance(event.payload, dict) else {}
    count = len(members)
    parts = [
        f"window of {count} events of one group, oldest first: decide them together",
        f"group: {fence_safe(one_line(event.group_key))}",
        f"window closed by: {one_line(window.get('closed_by') or 'time')}",
    ]
    used = sum(len(part) + 1 for part in parts)
    for number, member in enumerate(members, start=1):
        budget = max(
            MIN_MEMBER_CHARS, (member.prompt_budget_chars or DEFAULT_BUDGET_CHARS) // count
        )
        rendered = render_event(member.model_copy(update={"prompt_budget_chars": budget}))
        block = f'<window_event n="{number}">\n{rendered}\n</window_event>'
        if number > 1 and used + len(block) > MAX_WINDOW_CHARS:
            parts.append(
                f"{count - number + 1} later events of this window are not shown: "
                "the window's prompt budget is spent"
            )
            break
        parts.append(block)
        used += len(block) + 1
    return "\n".join(parts)
