"""An event whose tool calls with a topic are published, and whose others have none, ends
``held``; the relay never sends the held ones."""

from __future__ import annotations

from prometheus_client import REGISTRY
from sqlalchemy import select

from app.store.driver import DriverPool
from app.store.models import EventRow, OutboxRow
from tests.publish.support import MemoryPublisher, Sessions, add_event, make_relay

TOPIC = "arn:aws:sns:us-east-1:123456789012:alerts.fifo"


async def _statuses(sessions: Sessions) -> tuple[dict[str, str], dict[tuple[str, int], str]]:
    async with sessions() as session:
        events = {e.id: e.status for e in await session.scalars(select(EventRow))}
        rows = {(r.event_id, r.seq): r.status for r in await session.scalars(select(OutboxRow))}
    return events, rows


def _held_total() -> float:
    labels = {"status": "held"}
    return REGISTRY.get_sample_value("eventgate_events_finished_total", labels) or 0.0


async def test_an_event_left_with_only_held_calls_ends_held(
    sessions: Sessions, round_writes: DriverPool | None
) -> None:
    await add_event(sessions, "evt_mixed", "acme/api", 1, TOPIC, held_calls=1)
    await add_event(sessions, "evt_whole", "acme/web", 2, TOPIC)
    held_before = _held_total()
    publisher = MemoryPublisher()
    relay = make_relay(sessions, publisher, driver=round_writes)

    assert await relay.publish_pending() == 3
    events, rows = await _statuses(sessions)
    assert events == {"evt_mixed": "held", "evt_whole": "published"}
    assert rows[("evt_mixed", 0)] == "published"
    assert rows[("evt_mixed", 1)] == "pending"  # no topic: held in the outbox
    assert _held_total() == held_before + 1

    # Later rounds never send the held call: it has no topic of its own.
    assert await relay.publish_pending() == 0
    assert sorted(m.attributes["event_id"] for m in publisher.sent) == [
        "evt_mixed",
        "evt_whole",
        "evt_whole",
    ]
    assert (await _statuses(sessions))[0]["evt_mixed"] == "held"
