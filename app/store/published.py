"""The relay's write after a round on PostgreSQL, as one statement on the driver's pool.

What ``OutboxRelay`` otherwise does in one transaction of four or five statements (mark the
round's rows published; find which of their events have no row left to publish, or only
held ones; finish those ``published`` or ``held``) is here one statement of data-modifying
CTEs: one round trip, no transaction to open and commit, and no IN list for SQLAlchemy to
render per call. The CTEs all read the snapshot taken before the statement, so the rows
being marked count as published by their ids; an event finished ``published`` by this
round is not also made ``held`` (in the transaction the second UPDATE found it published
already). What it answers is what the transaction's statements answered: the finished
events' ``received_at`` times and how many events became ``held``.

Before it, in the same transaction, the round's events are locked (in id order, so two
relays never deadlock on them): two relays publishing the last rows of one event (its
tool calls in groups of different relay slots) would otherwise each read the other's row
as unpublished, and neither would finish the event. The second to get the locks reads
what the first committed. (The transaction of statements had the same race.)
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import bindparam, text

from app.events import EventStatus
from app.store.driver import DriverPool
from app.store.models import OutboxStatus, utcnow

LOCK_EVENTS = text(
    "SELECT id FROM events WHERE id = ANY(CAST(:event_ids AS VARCHAR[])) ORDER BY id FOR UPDATE"
)
MARK_AND_FINISH = text(
    """
WITH given AS (
    SELECT * FROM unnest(
        CAST(:row_ids AS BIGINT[]),
        CAST(:message_ids AS VARCHAR[]),
        CAST(:sequence_numbers AS VARCHAR[])
    ) AS g(id, message_id, sequence_number)
), marked AS (
    UPDATE outbox SET
        status = :published,
        sns_message_id = given.message_id,
        sns_sequence_number = given.sequence_number,
        published_at = :now,
        attempts = outbox.attempts + 1,
        last_error = NULL
    FROM given WHERE outbox.id = given.id
    RETURNING outbox.id
), touched AS (
    SELECT DISTINCT event_id, generation
    FROM unnest(CAST(:event_ids AS VARCHAR[]), CAST(:generations AS INTEGER[]))
        AS t(event_id, generation)
), unfinished AS (
    SELECT o.event_id, o.generation,
        bool_or(NOT (o.status = :pending AND o.topic_arn IS NULL)) AS to_publish
    FROM outbox o
    JOIN touched t ON o.event_id = t.event_id AND o.generation = t.generation
    WHERE o.status <> :published AND o.id <> ALL(CAST(:row_ids AS BIGINT[]))
    GROUP BY o.event_id, o.generation
), all_published AS (
    SELECT t.event_id FROM touched t
    LEFT JOIN unfinished u ON u.event_id = t.event_id AND u.generation = t.generation
    WHERE u.event_id IS NULL
), finished AS (
    UPDATE events SET status = :published, error = NULL, updated_at = :now
    WHERE events.id IN (SELECT event_id FROM all_published)
        AND events.status IN (:processing, :held)
    RETURNING events.received_at
), held AS (
    UPDATE events SET status = :held, updated_at = :now
    WHERE events.id IN (SELECT event_id FROM unfinished WHERE NOT to_publish)
        AND events.id NOT IN (SELECT event_id FROM all_published)
        AND events.status = :processing
    RETURNING events.id
)
SELECT
    (SELECT count(*) FROM marked),
    ARRAY(SELECT received_at FROM finished),
    (SELECT count(*) FROM held)
"""
).bindparams(
    bindparam("published", EventStatus.PUBLISHED),
    bindparam("processing", EventStatus.PROCESSING),
    bindparam("held", EventStatus.HELD),
    bindparam("pending", OutboxStatus.PENDING),
)


async def mark_and_finish(
    driver: DriverPool,
    published: Sequence[tuple[int, str, str | None]],
    events: Sequence[tuple[str, int]],
) -> tuple[list[datetime], int]:
    """Mark ``published`` ((row id, SNS message id, sequence number) each) and finish the
    ``events`` ((event id, generation) each) they leave with nothing to publish; the
    finished events' ``received_at`` times and how many became ``held``."""
    row = await driver.fetchrow_locked(
        LOCK_EVENTS,
        {"event_ids": sorted({event_id for event_id, _ in events})},
        MARK_AND_FINISH,
        {
            "row_ids": [row_id for row_id, _, _ in published],
            "message_ids": [message_id for _, message_id, _ in published],
            "sequence_numbers": [number for _, _, number in published],
            "event_ids": [event_id for event_id, _ in events],
            "generations": [generation for _, generation in events],
            "now": utcnow(),
        },
    )
    if row is None:
        raise RuntimeError("the relay's round write returned no row")
    _, received, held = row
    return list(received), int(held)
