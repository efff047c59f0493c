"""Claude replies (or a payload that steers them) that the tool checks must not let through.

1. ``group_id: llm`` takes Claude's ``message_group_id`` when it is a valid SNS id. The check
   used ``re.match`` with ``$``, which also matches before a trailing newline: ``"ops\\n"``
   and 128 characters + ``"\\n"`` passed; SNS refuses such an id, and on PostgreSQL the 129
   characters do not fit ``outbox.group_id``, so every retry paid for another Claude call.
2. A refused tool name or a dropped input key was written raw into the audit row's and the
   event's ``error`` text: a NUL in it is refused by PostgreSQL, with the same result.
3. Whatever else the database refuses in a decision is refused every time: the event is
   dead-lettered after one Claude call. The reply's own metadata (model, stop reason,
   request id, token counts) is kept within the audit columns, so it is never the cause.
4. Undeclared keys were dropped only where a schema had ``properties`` itself: under
   ``$ref``, ``allOf``/``anyOf``/``oneOf`` they were all kept, so a reply could slip a
   ``topic_arn`` into the published body although the schema never declares it.

Claude is faked at the HTTP edge (respx over httpcore2, as elsewhere in ``tests/llm``);
Redis and the database are the real ones when reachable.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import pytest_httpx2._plugin  # noqa: F401  (registers respx's httpcore2 mocker)
import respx
from jsonschema import Draft202012Validator
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from app.decide.tools import ToolCheck, check_tool_uses
from app.llm.client import ClaudeReply
from app.publish.ids import resolve_group_id
from app.store.driver import DriverPool
from tests.llm.harness import BASE, build, make_event, reply, tool_use

# What SNS accepts as a MessageGroupId (AWS docs; NOTES.md).
SNS_ID = re.compile(r"[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}")


@pytest.fixture
def api() -> Iterator[respx.Router]:
    with respx.mock(base_url=BASE, using="httpcore2") as router:
        yield router


@pytest.mark.parametrize("proposed", ["ops\n", "g" * 128 + "\n"], ids=["newline", "129-chars"])
def test_an_llm_group_id_that_sns_refuses_falls_back_to_the_event_key(proposed: str) -> None:
    group_id, _ = resolve_group_id("llm", "acme/api", {"message_group_id": proposed})
    assert SNS_ID.fullmatch(group_id), f"{group_id!r} is used as the MessageGroupId"


LLM_GROUP_CONFIG = """
sources:
  github: {type: github, secret: attack-github-secret-0123456789, pipeline: triage}
pipelines:
  triage: {model: claude-sonnet-4-6, system: s, tools: [publishAlert]}
tools:
  publishAlert:
    description: Raise an alert.
    group_id: llm
    input_schema:
      type: object
      properties:
        title: {type: string}
        message_group_id: {type: string}
      required: [title]
"""


PLAIN_CONFIG = """
sources:
  github: {type: github, secret: attack-github-secret-0123456789, pipeline: triage}
pipelines:
  triage: {model: claude-sonnet-4-6, system: s, tools: [publishAlert]}
tools:
  publishAlert:
    description: Raise an alert.
    input_schema:
      type: object
      properties: {title: {type: string}, severity: {type: string}}
      required: [title]
"""


async def _deliver_like_the_worker(h: Any, event: Any, *, times: int) -> list[str]:
    """``process`` as the worker calls it: again after each failure (up to max deliveries)."""
    failures: list[str] = []
    for _ in range(times):
        try:
            await h.processor.process(event)
            return failures
        except Exception as exc:  # noqa: BLE001 (the worker counts any failure and retries)
            failures.append(type(exc).__name__)
    return failures


async def test_a_hostile_group_id_costs_one_claude_call_and_publishes_under_a_valid_id(
    api: respx.Router,
    sessions: async_sessionmaker[AsyncSession],
    redis: Redis,
    redis_prefix: str,
) -> None:
    h = build(sessions=sessions, redis=redis, prefix=redis_prefix, text=LLM_GROUP_CONFIG)
    hostile = {"title": "disk full", "message_group_id": "g" * 128 + "\n"}
    route = api.post("/v1/messages").mock(return_value=reply(tool_use(value=hostile)))
    event = make_event()

    failures = await _deliver_like_the_worker(h, event, times=6)
    outcome = await h.rows(event.id)
    assert route.call_count == 1, (
        f"Claude was asked {route.call_count} times ({failures}); the event ended "
        f"{outcome.event.status}: {outcome.event.error}"
    )
    assert [SNS_ID.fullmatch(row.group_id) is not None for row in outcome.outbox] == [True]


@pytest.mark.parametrize(
    ("block", "published"),
    [
        (tool_use(name="publishAlert\x00", use_id="toolu_nul"), 1),  # refused: not offered
        (tool_use(value={"severity": "high", "title": "x", "note\x00": 1}), 2),  # key dropped
    ],
    ids=["refused-tool-name", "dropped-input-key"],
)
async def test_a_nul_in_a_refused_name_or_dropped_key_does_not_poison_the_decision(
    api: respx.Router,
    sessions: async_sessionmaker[AsyncSession],
    redis: Redis,
    redis_prefix: str,
    block: dict[str, Any],
    published: int,
) -> None:
    h = build(sessions=sessions, redis=redis, prefix=redis_prefix, text=PLAIN_CONFIG)
    good = tool_use(value={"title": "disk full"}, use_id="toolu_good")
    route = api.post("/v1/messages").mock(return_value=reply(good, block))
    event = make_event()

    failures = await _deliver_like_the_worker(h, event, times=6)
    outcome = await h.rows(event.id)
    assert route.call_count == 1, (
        f"Claude was asked {route.call_count} times ({failures}); the event ended "
        f"{outcome.event.status}: {outcome.event.error}"
    )
    assert len(outcome.outbox) == published
    assert "\\x00" in (outcome.event.error or "")  # shown escaped, not dropped


def _check(schema: dict[str, Any], tool_input: dict[str, Any]) -> dict[str, Any]:
    check = _check_reply(tool_input, schema=schema)
    assert not check.invalid, check.invalid
    (accepted,) = check.accepted
    cleaned: dict[str, Any] = accepted["input"]
    return cleaned


TARGET = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
SCHEMAS = {
    "$ref": {
        "type": "object",
        "properties": {"target": {"$ref": "#/$defs/target"}},
        "$defs": {"target": TARGET},
    },
    "allOf": {"type": "object", "properties": {"target": {"allOf": [TARGET]}}},
    "anyOf": {"type": "object", "properties": {"target": {"anyOf": [TARGET, {"type": "null"}]}}},
    "top-level-allOf": {
        "allOf": [{"type": "object", "properties": {"target": TARGET}, "required": ["target"]}]
    },
}


@pytest.mark.parametrize("schema", list(SCHEMAS.values()), ids=list(SCHEMAS))
def test_undeclared_keys_are_dropped_whatever_the_schema_composes(schema: dict[str, Any]) -> None:
    smuggled = {
        "target": {"id": "db-1", "topic_arn": "arn:aws:sns:us-east-1:6:x.fifo"},
        "message_group_id": "attacker",
    }
    cleaned = _check(schema, smuggled)
    published = orjson.dumps(cleaned).decode()
    assert "topic_arn" not in published and "message_group_id" not in published, published


@pytest.mark.parametrize(
    ("model", "stop_reason", "usage"),
    [
        ("m" * 300, "tool_use", {"input_tokens": 100, "output_tokens": 20}),
        ("claude\x00-x", "tool_use\x00" + "s" * 100, {"input_tokens": 3e9, "output_tokens": 1}),
        (None, 7, {"input_tokens": -5, "output_tokens": "20", "cache_read_input_tokens": True}),
    ],
    ids=["long-model", "nul-and-3e9-tokens", "wrong-types"],
)
async def test_reply_metadata_beyond_the_audit_columns_is_kept_within_them(
    api: respx.Router,
    sessions: async_sessionmaker[AsyncSession],
    redis: Redis,
    redis_prefix: str,
    model: Any,
    stop_reason: Any,
    usage: dict[str, Any],
) -> None:
    """The model, stop reason and token counts come from the API's answer (here a broken or
    hostile proxy's). They were kept as given: on PostgreSQL a NUL, a model over 100
    characters or a count over 2**31 refused the whole decision, so it was dead-lettered (or,
    where the refusal hit the dead-letter write too, retried, paying each time). They are
    kept within the columns instead, and the decision is stored after one call."""
    h = build(sessions=sessions, redis=redis, prefix=redis_prefix, text=PLAIN_CONFIG)
    answer = reply(tool_use(value={"title": "disk full"}))
    body = orjson.loads(answer.content) | {"model": model, "stop_reason": stop_reason}
    body["usage"] = usage
    route = api.post("/v1/messages").mock(
        return_value=httpx.Response(200, json=body, headers={"request-id": "r" * 300})
    )
    event = make_event()

    failures = await _deliver_like_the_worker(h, event, times=6)
    outcome = await h.rows(event.id)
    assert route.call_count == 1, f"Claude was asked {route.call_count} times ({failures})"
    assert outcome.event.status == "held" and len(outcome.outbox) == 1  # no topic
    (call,) = outcome.calls
    assert call.status == "ok"
    assert 0 < len(call.model) <= 100 and call.model.isprintable()
    assert call.stop_reason is None or (
        len(call.stop_reason) <= 64 and call.stop_reason.isprintable()
    )
    assert call.request_id is not None and len(call.request_id) <= 200
    counts = [call.input_tokens, call.output_tokens, call.cache_read_input_tokens]
    assert all(0 <= count < 2**31 for count in counts), counts


async def test_a_malformed_reply_is_retried_not_stored(
    api: respx.Router,
    sessions: async_sessionmaker[AsyncSession],
    redis: Redis,
    redis_prefix: str,
) -> None:
    """A 200 whose body is not a message (a JSON list, content that is not a list of
    blocks, a proxy's HTML page, nothing, cut-off JSON): an error the attempt records and
    retries, not a crash of the decide stage that leaves the audit row unfinished."""
    h = build(sessions=sessions, redis=redis, prefix=redis_prefix, text=PLAIN_CONFIG)
    route = api.post("/v1/messages")
    json_type = {"content-type": "application/json"}
    route.side_effect = [
        httpx.Response(200, json=[{"type": "message"}]),
        httpx.Response(200, json={"type": "message", "content": "text", "model": "m"}),
        httpx.Response(200, content=b"<html>502 Bad Gateway</html>", headers=json_type),
        httpx.Response(200, content=b"", headers=json_type),
        httpx.Response(200, content=b'{"content": [1', headers=json_type),
        reply(tool_use(value={"title": "disk full"})),
    ]
    event = make_event()

    failures = await _deliver_like_the_worker(h, event, times=8)
    outcome = await h.rows(event.id)
    assert failures == [] and route.call_count == 6
    assert len(outcome.outbox) == 1
    assert [c.error_type for c in outcome.calls] == ["MalformedReply"] * 5 + [None]


@pytest.mark.parametrize("on_driver", [False, True], ids=["engine", "driver"])
async def test_a_decision_the_database_refuses_is_dead_lettered_after_one_call(
    api: respx.Router,
    sessions: async_sessionmaker[AsyncSession],
    redis: Redis,
    redis_prefix: str,
    database_url: str,
    on_driver: bool,
) -> None:
    """The database refuses the decision's rows (here a trigger raising a data exception,
    SQLSTATE 22023, as a value out of a column's range would): it will refuse them every
    time, so the event is dead-lettered after one Claude call, and the audit row keeps the
    call without the reply's texts. The same through SQLAlchemy and straight on the driver's
    pool (as ``serve`` runs the decision on PostgreSQL)."""
    if not database_url.startswith("postgresql"):
        pytest.skip("the refusal is a PostgreSQL trigger")
    engine = create_async_engine(database_url)
    async with engine.begin() as conn:
        for statement in _REFUSE_OUTBOX_ROWS:
            await conn.execute(text(statement))
    driver = await DriverPool.open(engine.url, engine.dialect, size=2) if on_driver else None
    try:
        h = build(
            sessions=sessions, redis=redis, prefix=redis_prefix, text=PLAIN_CONFIG, driver=driver
        )
        route = api.post("/v1/messages").mock(
            return_value=reply(tool_use(value={"title": "refuse-me"}))
        )
        event = make_event()

        failures = await _deliver_like_the_worker(h, event, times=6)
        outcome = await h.rows(event.id)
    finally:
        async with engine.begin() as conn:
            await conn.execute(text("DROP TRIGGER IF EXISTS refuse_outbox_rows ON outbox"))
        await engine.dispose()
        if driver is not None:
            await driver.close()
    assert route.call_count == 1, f"Claude was asked {route.call_count} times ({failures})"
    assert outcome.event.status == "dead_lettered" and not outcome.outbox
    assert "could not be stored" in (outcome.event.error or "")
    (call,) = outcome.calls
    assert call.status == "error" and call.response_text is None


_REFUSE_OUTBOX_ROWS = [
    """CREATE OR REPLACE FUNCTION refuse_outbox_rows() RETURNS trigger AS $$
    BEGIN
      IF NEW.body LIKE '%refuse-me%' THEN
        RAISE EXCEPTION 'refused by the test' USING ERRCODE = '22023';
      END IF;
      RETURN NEW;
    END $$ LANGUAGE plpgsql""",
    "DROP TRIGGER IF EXISTS refuse_outbox_rows ON outbox",
    """CREATE TRIGGER refuse_outbox_rows BEFORE INSERT ON outbox
      FOR EACH ROW EXECUTE FUNCTION refuse_outbox_rows()""",
]


RECURSIVE = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "child": {"$ref": "#"}},
    "additionalProperties": False,
}


def test_a_deeply_nested_tool_input_is_invalid_not_a_crash() -> None:
    """A reply (steered by a hostile payload) nests a tool input 300 deep under a recursive
    schema: validation raised RecursionError out of the decide stage, so every delivery paid
    for another Claude call until the event was dead-lettered. It is an invalid input now."""
    value: dict[str, Any] = {"title": "x"}
    for _ in range(300):
        value = {"title": "x", "child": value}
    check = _check_reply(value, schema=RECURSIVE)
    assert not check.accepted and list(check.invalid.values()) == [
        "notify: input nested deeper than 64"
    ]
    shallow: dict[str, Any] = {"title": "x"}
    for _ in range(60):
        shallow = {"title": "x", "child": shallow}
    assert len(_check_reply(shallow, schema=RECURSIVE).accepted) == 1


def _check_reply(value: Any, *, schema: dict[str, Any]) -> ToolCheck:
    answer = ClaudeReply(
        model="claude-sonnet-4-6",
        request_id=None,
        stop_reason="tool_use",
        content=[{"type": "tool_use", "id": "toolu_1", "name": "notify", "input": value}],
        latency_ms=1.0,
    )
    validators = {"notify": Draft202012Validator(schema)}
    return check_tool_uses(answer, offered=["notify"], validators=validators, max_calls=5)
