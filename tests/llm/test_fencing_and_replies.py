"""Every paid call keeps an audit row, a stale owner cannot store, and a hostile reply cannot
publish more, or other, than the pipeline's tools allow. Claude is mocked at the HTTP edge."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
import pytest_httpx2._plugin  # noqa: F401  (registers respx's httpcore2 mocker)
import respx
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.faults import LeaseLost
from tests.llm.harness import BASE, build, make_event, reply, tool_use


@pytest.fixture
def api() -> Iterator[respx.Router]:
    with respx.mock(base_url=BASE, using="httpcore2") as router:
        yield router


@dataclass
class FakeFence:
    epoch: int
    valid: bool = True

    async def check(self) -> None:
        if not self.valid:
            raise LeaseLost("moved")


class HeldAnswers:
    """Answers in order; an answer may be held until the test releases it."""

    def __init__(self, *answers: tuple[httpx.Response, asyncio.Event | None]) -> None:
        self.answers = list(answers)
        self.received = 0
        self.arrived = asyncio.Event()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        answer, gate = self.answers[min(self.received, len(self.answers) - 1)]
        self.received += 1
        self.arrived.set()
        if gate is not None:
            await gate.wait()
        return answer


async def test_a_call_cut_short_by_a_crash_leaves_an_unknown_audit_row(
    sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    h = build(sessions=sessions, redis=redis, prefix=redis_prefix)
    answers = HeldAnswers((reply(), asyncio.Event()))  # Claude never answers in time
    event = make_event()
    # The call never completes, so respx never counts it as made.
    with respx.mock(base_url=BASE, using="httpcore2", assert_all_called=False) as api:
        api.post("/v1/messages").mock(side_effect=answers)
        processing = asyncio.create_task(h.processor.process(event))
        await asyncio.wait_for(answers.arrived.wait(), 5)
        processing.cancel()  # the process dies with the call in flight
        await asyncio.gather(processing, return_exceptions=True)
    calls = (await h.rows(event.id)).calls
    assert [c.status for c in calls] == ["unknown"]  # was: no row at all
    assert calls[0].prompt_hash is not None


async def test_a_stale_owner_is_refused_and_its_paid_call_keeps_its_row(
    api: respx.Router, sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    h = build(sessions=sessions, redis=redis, prefix=redis_prefix)
    stalled = asyncio.Event()
    answers = HeldAnswers(
        (reply(tool_use()), stalled),  # the old owner's call: it stalls past its lease
        (reply({"type": "text", "text": "routine"}, stop_reason="end_turn"), None),
    )
    api.post("/v1/messages").mock(side_effect=answers)
    event = make_event()
    old = asyncio.create_task(h.processor.process(event, FakeFence(epoch=1)))
    await asyncio.wait_for(answers.arrived.wait(), 5)
    await h.processor.process(event, FakeFence(epoch=2))  # the new owner decides: no action
    stalled.set()
    with pytest.raises(LeaseLost):
        await old
    out = await h.rows(event.id)
    assert out.event.status == "no_action"
    assert out.outbox == []  # was: the old owner's tool call stored beside "no action"
    assert sorted(c.status for c in out.calls) == ["ok", "superseded"]


async def test_a_lost_lease_is_seen_before_claude_is_called(
    api: respx.Router, sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    h = build(sessions=sessions, redis=redis, prefix=redis_prefix)
    route = api.post("/v1/messages").mock(return_value=reply())
    event = make_event()
    with pytest.raises(LeaseLost):
        await h.processor.process(event, FakeFence(epoch=1, valid=False))
    assert route.call_count == 0
    assert (await h.rows(event.id)).calls == []
    # A tenure older than the one that started the event learns it before calling Claude.
    await h.processor.process(event, FakeFence(epoch=5))
    calls = route.call_count
    with pytest.raises(LeaseLost):
        await h.processor.process(event, FakeFence(epoch=4))
    assert route.call_count == calls


def _config(additional: str = "") -> str:
    return f"""
sources:
  github: {{type: github, secret: s3cret-s3cret-s3cret, pipeline: triage}}
pipelines:
  triage:
    model: claude-sonnet-4-6
    system: You triage events.
    tools: [publishAlert]
tools:
  publishAlert:
    description: Raise an alert.
    input_schema:
      type: object
      properties:
        severity: {{type: string}}
        details: {{type: object, properties: {{host: {{type: string}}}}}}
      required: [severity]
      {additional}
"""


async def test_a_reply_with_a_hundred_tool_calls_stores_at_most_max_tool_calls(
    api: respx.Router, sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    h = build(sessions=sessions, redis=redis, prefix=redis_prefix, text=_config())
    uses = [tool_use(value={"severity": "high"}, use_id=f"toolu_{n}") for n in range(100)]
    api.post("/v1/messages").mock(return_value=reply(*uses))
    event = make_event()
    await h.processor.process(event)
    out = await h.rows(event.id)
    assert len(out.outbox) == 5  # was: 100 outbox rows
    assert out.calls[-1].error is not None
    assert "refused 95 tool call(s) beyond max_tool_calls (5)" in out.calls[-1].error


@pytest.mark.parametrize(
    ("additional", "kept"),
    [("", False), ("additionalProperties: true", True)],
)
async def test_undeclared_input_keys_are_dropped_unless_the_schema_allows_them(
    api: respx.Router,
    sessions: async_sessionmaker[AsyncSession],
    redis: Redis,
    redis_prefix: str,
    additional: str,
    kept: bool,
) -> None:
    h = build(sessions=sessions, redis=redis, prefix=redis_prefix, text=_config(additional))
    hostile: dict[str, Any] = {
        "severity": "high",
        "details": {"host": "db-1", "topic_arn": "arn:aws:sns:us-east-1:1:evil.fifo"},
        "topic_arn": "arn:aws:sns:us-east-1:123456789012:other.fifo",
        "message_group_id": "somebody-else",
    }
    api.post("/v1/messages").mock(return_value=reply(tool_use(value=hostile)))
    event = make_event()
    await h.processor.process(event)
    out = await h.rows(event.id)
    published = orjson.loads(out.outbox[0].body)["input"]
    assert published["details"] == {"host": "db-1"}  # nested: declared properties only
    assert ("topic_arn" in published) is kept
    assert ("message_group_id" in published) is kept
    assert out.outbox[0].group_id == "acme/api"
