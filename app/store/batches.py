"""The batch_requests table: events of ``mode: batch`` pipelines on their way through the
Message Batches API (``app/decide/batch_lane.py`` says how).

Invariants:
- one request per event and generation (a unique constraint): parking it again is a no-op;
- a request is sent by one process: it is claimed (``pending`` → ``submitting``, a
  conditional update) before its batch is created, and given back to ``pending`` only when
  the claim is older than the claim timeout (its process died before it recorded the batch);
- each claim counts an attempt, and the attempt number is the claim's fence: a process
  records its batch, gives its claim back or gives the request up only while the row still
  holds its attempt (``_held``), so one that stalled past its claim cannot undo or
  overwrite the claim of the process that took the request over;
- a key's requests are decided in the order they were parked: a request is decidable only
  when every earlier request of its pipeline and key is ``done``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, exists, func, select, tuple_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from app.store.models import BatchRequestRow, BatchRequestStatus, LlmCallRow

Status = BatchRequestStatus


def _held(rows: Sequence[BatchRequestRow]) -> ColumnElement[bool]:
    """The rows as this process read them: same id and same attempt (no claim since)."""
    return tuple_(BatchRequestRow.id, BatchRequestRow.attempts).in_(
        [(row.id, row.attempts) for row in rows]
    )


async def park(
    session: AsyncSession,
    *,
    event_id: str,
    generation: int,
    pipeline: str,
    group_key: str,
    request: dict[str, Any],
    now: datetime,
) -> bool:
    """Add the event's request; False when it is parked already. Commits."""
    found = await session.scalar(
        select(BatchRequestRow.id).where(
            BatchRequestRow.event_id == event_id, BatchRequestRow.generation == generation
        )
    )
    if found is not None:
        return False
    session.add(
        BatchRequestRow(
            event_id=event_id,
            generation=generation,
            pipeline=pipeline,
            group_key=group_key,
            status=Status.PENDING,
            attempts=0,
            request=request,
            created_at=now,
        )
    )
    try:
        await session.commit()
    except IntegrityError:  # parked by another delivery meanwhile
        await session.rollback()
        return False
    return True


async def pending_stats(session: AsyncSession, pipeline: str) -> tuple[int, datetime | None]:
    """How many requests of ``pipeline`` wait for a batch, and when the oldest was parked."""
    count, oldest = (
        await session.execute(
            select(func.count(), func.min(BatchRequestRow.created_at)).where(
                BatchRequestRow.pipeline == pipeline, BatchRequestRow.status == Status.PENDING
            )
        )
    ).one()
    return int(count or 0), oldest


async def claim_pending(
    session: AsyncSession, *, pipeline: str, limit: int, now: datetime
) -> Sequence[BatchRequestRow]:
    """Claim up to ``limit`` pending requests of ``pipeline``, oldest first, counting the
    attempt; the rows this process got. Commits."""
    ids = (
        await session.scalars(
            select(BatchRequestRow.id)
            .where(BatchRequestRow.pipeline == pipeline, BatchRequestRow.status == Status.PENDING)
            .order_by(BatchRequestRow.id)
            .limit(limit)
        )
    ).all()
    if not ids:
        return []
    got = (
        await session.scalars(
            update(BatchRequestRow)
            .where(BatchRequestRow.id.in_(ids), BatchRequestRow.status == Status.PENDING)
            .values(
                status=Status.SUBMITTING,
                claimed_at=now,
                attempts=BatchRequestRow.attempts + 1,
            )
            .returning(BatchRequestRow.id)
        )
    ).all()
    await session.commit()
    if not got:
        return []
    rows = await session.scalars(
        select(BatchRequestRow).where(BatchRequestRow.id.in_(got)).order_by(BatchRequestRow.id)
    )
    return rows.all()


async def mark_submitted(
    session: AsyncSession,
    rows: Sequence[BatchRequestRow],
    *,
    batch_id: str,
    call_ids: dict[int, str],
    now: datetime,
) -> set[int]:
    """The claimed rows are in ``batch_id``; their audit rows say so. Returns the ids of the
    rows recorded: a row whose claim was released (and maybe taken by another process) while
    the batch was being created is left as it is. Commits."""
    recorded: set[int] = set()
    for row in rows:
        found = await session.scalar(
            update(BatchRequestRow)
            .where(_held([row]), BatchRequestRow.status == Status.SUBMITTING)
            .values(
                status=Status.SUBMITTED,
                batch_id=batch_id,
                llm_call_id=call_ids[row.id],
                submitted_at=now,
            )
            .returning(BatchRequestRow.id)
        )
        if found is not None:
            recorded.add(row.id)
    await session.execute(
        update(LlmCallRow).where(LlmCallRow.id.in_(call_ids.values())).values(batch_id=batch_id)
    )
    await session.commit()
    return recorded


async def give_back(
    session: AsyncSession, rows: Sequence[BatchRequestRow], *, counted: bool
) -> None:
    """Claimed rows whose batch could not be created go back to ``pending`` (those this
    process still holds); a failure that was not the requests' fault (the API unreachable,
    the database refusing an audit row) does not count as their attempt. Commits."""
    values: dict[str, Any] = {"status": Status.PENDING, "claimed_at": None}
    if not counted:
        values["attempts"] = BatchRequestRow.attempts - 1
    if rows:
        await session.execute(
            update(BatchRequestRow)
            .where(_held(rows), BatchRequestRow.status == Status.SUBMITTING)
            .values(**values)
        )
    await session.commit()


UNFINISHED = (Status.PENDING, Status.SUBMITTING, Status.SUBMITTED, Status.ANSWERED)


async def any_unfinished(session: AsyncSession) -> bool:
    """Whether any request is not ``done``: one probe of the status index. Without one,
    a round of the lane has nothing to release, send, read or decide."""
    found = await session.scalar(
        select(BatchRequestRow.id).where(BatchRequestRow.status.in_(UNFINISHED)).limit(1)
    )
    return found is not None


async def release_stale_claims(session: AsyncSession, *, before: datetime) -> int:
    """Claims older than ``before`` (their process died before recording the batch) go back
    to ``pending``. Commits."""
    result = await session.execute(
        update(BatchRequestRow)
        .where(BatchRequestRow.status == Status.SUBMITTING, BatchRequestRow.claimed_at < before)
        .values(status=Status.PENDING, claimed_at=None)
    )
    await session.commit()
    return int(getattr(result, "rowcount", 0) or 0)


async def submitted_batches(session: AsyncSession) -> list[str]:
    ids = await session.scalars(
        select(BatchRequestRow.batch_id)
        .where(BatchRequestRow.status == Status.SUBMITTED)
        .group_by(BatchRequestRow.batch_id)
        .order_by(func.min(BatchRequestRow.id))
    )
    return [str(i) for i in ids.all() if i is not None]


async def pipeline_of(session: AsyncSession, batch_id: str) -> str | None:
    """The pipeline of a batch (all its requests have the same), read without the requests."""
    found = await session.scalar(
        select(BatchRequestRow.pipeline).where(BatchRequestRow.batch_id == batch_id).limit(1)
    )
    return str(found) if found is not None else None


async def submitted_at(session: AsyncSession, batch_id: str) -> datetime | None:
    """When the batch was created (recorded), read without its requests."""
    found = await session.scalar(
        select(func.min(BatchRequestRow.submitted_at)).where(BatchRequestRow.batch_id == batch_id)
    )
    return found if isinstance(found, datetime) else None


async def in_batch(session: AsyncSession, batch_id: str) -> Sequence[BatchRequestRow]:
    rows = await session.scalars(
        select(BatchRequestRow)
        .where(BatchRequestRow.batch_id == batch_id, BatchRequestRow.status == Status.SUBMITTED)
        .order_by(BatchRequestRow.id)
    )
    return rows.all()


async def set_outcome(
    session: AsyncSession,
    row: BatchRequestRow,
    *,
    status: str,
    reply: dict[str, Any] | None = None,
    error: str | None = None,
) -> bool:
    """A submitted request answered (``answered``, with its reply), or failed (back to
    ``pending``, or ``done`` when it is given up). False when it is no longer in the batch
    it was read in (another process read the batch first, and may have sent it again since).
    The caller commits."""
    values: dict[str, Any] = {"status": status, "reply": reply, "error": error}
    if status == Status.ANSWERED:
        values["claimed_at"] = None
    if status == Status.PENDING:
        values |= {"batch_id": None, "claimed_at": None, "submitted_at": None}
    result = await session.execute(
        update(BatchRequestRow)
        .where(
            _held([row]),
            BatchRequestRow.status == Status.SUBMITTED,
            BatchRequestRow.batch_id == row.batch_id,
        )
        .values(**values)
    )
    return bool(getattr(result, "rowcount", 0))


async def decidable(
    session: AsyncSession, *, limit: int, stale: datetime
) -> Sequence[BatchRequestRow]:
    """Answered requests whose key has no earlier request still to be done, oldest first,
    but for those another process claimed after ``stale`` (it is deciding them)."""
    earlier = aliased(BatchRequestRow)
    blocked = exists().where(
        and_(
            earlier.pipeline == BatchRequestRow.pipeline,
            earlier.group_key == BatchRequestRow.group_key,
            earlier.id < BatchRequestRow.id,
            earlier.status != Status.DONE,
        )
    )
    rows = await session.scalars(
        select(BatchRequestRow)
        .where(
            BatchRequestRow.status == Status.ANSWERED,
            (BatchRequestRow.claimed_at.is_(None)) | (BatchRequestRow.claimed_at < stale),
            ~blocked,
        )
        .order_by(BatchRequestRow.id)
        .limit(limit)
    )
    return rows.all()


async def claim_answered(
    session: AsyncSession, row_id: int, *, now: datetime, stale: datetime
) -> bool:
    """Claim an answered request for deciding it; False when another process holds a claim
    younger than ``stale``. Commits."""
    result = await session.execute(
        update(BatchRequestRow)
        .where(
            BatchRequestRow.id == row_id,
            BatchRequestRow.status == Status.ANSWERED,
            (BatchRequestRow.claimed_at.is_(None)) | (BatchRequestRow.claimed_at < stale),
        )
        .values(claimed_at=now)
    )
    await session.commit()
    return bool(getattr(result, "rowcount", 0))


async def pending_outside(
    session: AsyncSession, pipelines: Sequence[str]
) -> Sequence[BatchRequestRow]:
    """Requests waiting for a batch whose pipeline is none of ``pipelines``."""
    rows = await session.scalars(
        select(BatchRequestRow)
        .where(BatchRequestRow.status == Status.PENDING, BatchRequestRow.pipeline.not_in(pipelines))
        .order_by(BatchRequestRow.id)
        .limit(500)
    )
    return rows.all()


async def pending_pipelines(session: AsyncSession) -> list[str]:
    """The pipelines that have requests waiting for a batch."""
    names = await session.scalars(
        select(BatchRequestRow.pipeline)
        .where(BatchRequestRow.status == Status.PENDING)
        .group_by(BatchRequestRow.pipeline)
    )
    return [str(name) for name in names.all()]


async def give_up(session: AsyncSession, row: BatchRequestRow, *, error: str) -> bool:
    """The request is done without an answer, if it is still as read (its status and
    attempt); False when another process moved it first. The caller dead-letters its event
    in the same transaction, and commits."""
    result = await session.execute(
        update(BatchRequestRow)
        .where(_held([row]), BatchRequestRow.status == row.status)
        .values(status=Status.DONE, reply=None, error=error, claimed_at=None)
    )
    return bool(getattr(result, "rowcount", 0))


async def finish(session: AsyncSession, row_id: int, *, error: str | None = None) -> None:
    await session.execute(
        update(BatchRequestRow)
        .where(BatchRequestRow.id == row_id)
        .values(status=Status.DONE, reply=None, error=error)
    )
    await session.commit()


async def of_event(session: AsyncSession, event_id: str) -> Sequence[BatchRequestRow]:
    rows = await session.scalars(
        select(BatchRequestRow)
        .where(BatchRequestRow.event_id == event_id)
        .order_by(BatchRequestRow.id)
    )
    return rows.all()
