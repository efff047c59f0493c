"""Outbox rows as the worker stores them, relays built for tests, and publishers passed in
where a fault is needed (the ``Publisher`` protocol is the relay's edge)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.publish.coordination import PublishedMemory
from app.publish.ids import deduplication_id, message_group_id
from app.publish.relay import OutboxRelay
from app.publish.sns import OutgoingMessage, Published, Publisher, PublishError
from app.store.models import EventRow, OutboxRow

Sessions = async_sessionmaker[AsyncSession]


async def add_event(
    sessions: Sessions,
    event_id: str,
    group_key: str,
    tool_calls: int,
    topic_arn: str,
    *,
    source: str = "github",
    held_calls: int = 0,
) -> None:
    """An event in ``processing`` with ``tool_calls`` outbox rows (ids in seq order), then
    ``held_calls`` rows without a topic."""
    async with sessions() as session:
        session.add(
            EventRow(
                id=event_id,
                source=source,
                type="issues.opened",
                group_key=group_key,
                delivery_id=event_id,
                pipeline="triage",
                status="processing",
                payload={},
                received_at=datetime.now(UTC),
                deliveries=1,
            )
        )
        await session.flush()
        for seq in range(tool_calls + held_calls):
            body = {
                "tool": "publishAlert",
                "input": {"n": seq},
                "event": {
                    "id": event_id,
                    "source": source,
                    "type": "issues.opened",
                    "group_key": group_key,
                    "received_at": "2026-01-01T00:00:00Z",
                },
                "llm_call_id": "llm_x",
                "model": "m",
                "sequence": seq,
            }
            session.add(
                OutboxRow(
                    event_id=event_id,
                    source=source,
                    seq=seq,
                    llm_call_id="llm_x",
                    tool="publishAlert",
                    topic_arn=topic_arn if seq < tool_calls else None,
                    group_id=message_group_id(group_key),
                    dedup_id=deduplication_id(event_id, seq),
                    body=orjson.dumps(body).decode(),
                )
            )
        await session.commit()


def make_relay(
    sessions: Sessions,
    publisher: Publisher,
    memory: PublishedMemory | None = None,
    **options: Any,
) -> OutboxRelay:
    """No lease, and no backoff unless ``max_backoff`` is given: each ``publish_pending``
    retries what failed. ``options`` are the relay's other keyword arguments."""
    return OutboxRelay(
        sessions=sessions,
        publisher=publisher,
        lease=None,
        memory=memory,
        poll_seconds=0.1,
        **{"max_backoff": 0.0, **options},
    )


class RecordingPublisher:
    """Wraps a real publisher; fails chosen (dedup id → remaining failures) publishes."""

    def __init__(self, inner: Publisher, failures: dict[str, tuple[int, bool]]) -> None:
        self.inner = inner
        self.failures = failures
        self.calls: list[OutgoingMessage] = []
        self.batch_sizes: list[int] = []

    async def publish_batch(
        self, messages: list[OutgoingMessage]
    ) -> list[Published | PublishError]:
        self.calls += messages
        self.batch_sizes.append(len(messages))
        passed: list[int] = []
        results: dict[int, Published | PublishError] = {}
        for index, message in enumerate(messages):
            remaining, retryable = self.failures.get(message.dedup_id, (0, True))
            if remaining:
                self.failures[message.dedup_id] = (remaining - 1, retryable)
                code = "Throttling" if retryable else "InvalidParameter"
                results[index] = PublishError("injected", code=code, retryable=retryable)
            else:
                passed.append(index)
        if passed:
            sent = await self.inner.publish_batch([messages[i] for i in passed])
            results.update(zip(passed, sent, strict=True))
        return [results[i] for i in range(len(messages))]


class MemoryPublisher:
    """Accepts every message of a group not in ``throttled_groups`` (which get SNS's
    ``Throttling``) and records each call; no SNS behind it, for tests that look at what the
    relay sent and in which rounds rather than at a subscriber."""

    def __init__(self, *, throttled_groups: Iterable[str] = ()) -> None:
        self.throttled_groups = set(throttled_groups)
        self.batches: list[list[OutgoingMessage]] = []
        self.sent: list[OutgoingMessage] = []  # accepted, in the order they were sent

    async def publish_batch(
        self, messages: list[OutgoingMessage]
    ) -> list[Published | PublishError]:
        self.batches.append(list(messages))
        results: list[Published | PublishError] = []
        for message in messages:
            if message.group_id in self.throttled_groups:
                results.append(PublishError("Rate exceeded", code="Throttling", retryable=True))
            else:
                self.sent.append(message)
                results.append(Published(f"mid-{message.dedup_id[:12]}", None))
        return results
