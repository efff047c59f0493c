"""The LLM stage end to end inside one process: retries, breaker, fallback, repair, refusal,
stop reasons, auth failures and audit rows. Claude is mocked at the HTTP edge (respx)."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
import pytest_httpx2._plugin  # noqa: F401  (registers respx's httpcore2 mocker)
import respx
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.observability.metrics import LLM_COST
from tests.llm.harness import (
    BASE,
    Harness,
    Script,
    build,
    config_text,
    error,
    make_event,
    reply,
    tool_use,
)


@pytest.fixture
def api() -> Iterator[respx.Router]:
    with respx.mock(base_url=BASE, using="httpcore2") as router:
        yield router


@pytest.fixture
def harness(sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str) -> Harness:
    return build(sessions=sessions, redis=redis, prefix=redis_prefix)


def _script(api: respx.Router, *answers: object) -> Script:
    script = Script(list(answers))  # type: ignore[arg-type]
    api.post("/v1/messages").mock(side_effect=script)
    return script


async def test_retries_honour_retry_after_then_store_with_full_audit(
    api: respx.Router, harness: Harness
) -> None:
    script = _script(api, error(529, retry_after="3"), error(500), reply())
    event = make_event()
    await harness.processor.process(event)
    out = await harness.rows(event.id)
    assert len(script.bodies) == 3
    assert harness.sleeps.delays[0] >= 3.0  # never sooner than retry-after
    assert [c.attempt for c in out.calls] == [1, 2, 3]
    assert [c.status for c in out.calls] == ["retry", "retry", "ok"]
    assert [c.retry_reason for c in out.calls] == [
        None,
        "OverloadedError 529",
        "InternalServerError 500",
    ]
    assert out.calls[0].error_type == "OverloadedError"
    assert {c.breaker_state for c in out.calls} == {"closed"}
    assert all(c.prompt_hash and len(c.prompt_hash) == 64 for c in out.calls)
    assert out.calls[2].cost_usd == pytest.approx((100 * 3.0 + 20 * 15.0) / 1e6)
    assert len(out.outbox) == 1
    assert out.event.status == "held"  # stored; the tool has no topic to publish to


async def test_retry_after_is_clamped(api: respx.Router, harness: Harness) -> None:
    _script(api, error(429, retry_after="86400"), reply())
    await harness.processor.process(make_event())
    # The 429 holds the model in the shared limiter (clamped to 60 s) and the backoff
    # honours the clamped retry-after: nobody waits a day.
    assert max(harness.sleeps.delays) == pytest.approx(60.0)


@pytest.mark.parametrize("status", [400, 404, 413])
async def test_client_errors_are_not_retried_and_dead_letter(
    api: respx.Router, harness: Harness, status: int
) -> None:
    script = _script(api, error(status))
    event = make_event()
    await harness.processor.process(event)
    out = await harness.rows(event.id)
    assert len(script.bodies) == 1
    assert out.event.status == "dead_lettered"
    assert f"fault {status}" in out.dead[0].reason
    assert [c.status for c in out.calls] == ["error"]
    assert harness.health.auth_error is None


@pytest.mark.parametrize("status", [401, 403])
async def test_auth_errors_dead_letter_and_fail_readiness_until_a_call_succeeds(
    api: respx.Router, harness: Harness, status: int
) -> None:
    _script(api, error(status), reply())
    first = make_event(1)
    await harness.processor.process(first)
    assert (await harness.rows(first.id)).event.status == "dead_lettered"
    assert harness.health.describe() == (
        f"error: anthropic rejected the credentials (HTTP {status})"
    )
    await harness.processor.process(make_event(2))
    assert harness.health.describe() == "ok"


async def test_transient_errors_are_retried_past_any_fixed_count_while_the_breaker_is_closed(
    api: respx.Router, sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    h = build(sessions=sessions, redis=redis, prefix=redis_prefix, llm_breaker_min_calls=100)
    faults = [error(500), error(529), error(429), error(503), error(500), error(529)]
    script = _script(api, *faults, reply())
    event = make_event()
    await h.processor.process(event)
    out = await h.rows(event.id)
    assert len(script.bodies) == 7  # was: dead-lettered after the fourth failure
    assert out.dead == []
    assert len(out.outbox) == 1
    assert [c.status for c in out.calls] == ["retry"] * 6 + ["ok"]


async def test_gives_up_once_failing_attempts_pass_the_event_deadline(
    api: respx.Router, sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    h = build(
        sessions=sessions,
        redis=redis,
        prefix=redis_prefix,
        llm_breaker_min_calls=1000,
        llm_breaker_consecutive_failures=1000,
        llm_event_deadline_seconds=120,
    )
    script = _script(api, error(500))
    event = make_event()
    await h.processor.process(event)
    out = await h.rows(event.id)
    assert out.event.status == "dead_lettered"
    assert out.dead[0].reason.startswith("gave up after")
    assert "deadline 120s" in out.dead[0].reason
    assert sum(h.sleeps.delays) >= 100  # about the deadline of backoff, in fake time
    assert len(out.calls) == len(script.bodies)  # every attempt has its row


async def test_an_open_breaker_makes_events_wait_never_dead_letters(
    api: respx.Router, sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    h = build(
        sessions=sessions,
        redis=redis,
        prefix=redis_prefix,
        text=config_text(fallback=False),
        llm_event_deadline_seconds=1,
        llm_breaker_min_calls=2,
        llm_breaker_cooldown_seconds=15,
    )
    script = _script(api, error(503), error(503), error(503), reply())
    event = make_event()
    await h.processor.process(event)
    out = await h.rows(event.id)
    # Two failures open the breaker; the first probe after the cooldown fails and reopens
    # it; the second probe succeeds. The deadline (1 s) was passed, yet nothing dead-letters.
    assert len(script.bodies) == 4
    assert out.dead == []
    assert len(out.outbox) == 1
    assert [c.breaker_state for c in out.calls] == ["closed", "closed", "half_open", "half_open"]
    assert sum(h.sleeps.delays) >= 30  # two cooldowns of fake time were waited out


async def test_fallback_model_is_used_while_the_primary_breaker_is_open(
    api: respx.Router, sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    h = build(sessions=sessions, redis=redis, prefix=redis_prefix, llm_breaker_min_calls=2)

    def by_model(body: dict[str, object]) -> object:
        if body["model"] == "claude-sonnet-4-6":
            return error(529)
        return reply(model="claude-haiku-4-5")

    script = _script(api, by_model)
    event = make_event()
    await h.processor.process(event)
    out = await h.rows(event.id)
    assert [b["model"] for b in script.bodies] == [
        "claude-sonnet-4-6",
        "claude-sonnet-4-6",
        "claude-haiku-4-5",
    ]
    assert out.calls[-1].model == "claude-haiku-4-5"
    assert orjson.loads(out.outbox[0].body)["model"] == "claude-haiku-4-5"


async def test_invalid_tool_input_gets_one_repair_turn(api: respx.Router, harness: Harness) -> None:
    script = _script(
        api,
        reply(tool_use(value={"severity": "urgent", "title": "x"})),
        reply(tool_use(value={"severity": "high", "title": "x"}, use_id="toolu_2")),
    )
    event = make_event()
    await harness.processor.process(event)
    out = await harness.rows(event.id)
    repair_turn = script.bodies[1]["messages"]
    assert [m["role"] for m in repair_turn] == ["user", "assistant", "user"]
    result = repair_turn[2]["content"][0]
    assert result["type"] == "tool_result"
    assert result["tool_use_id"] == "toolu_1"
    assert result["is_error"] is True
    assert "severity: 'urgent' is not one of ['high', 'low']" in result["content"]
    assert [c.status for c in out.calls] == ["invalid_tool_input", "ok"]
    assert out.calls[1].retry_reason == "repair: invalid tool input"
    assert [orjson.loads(o.body)["input"]["severity"] for o in out.outbox] == ["high"]


async def test_still_invalid_after_repair_is_dead_lettered(
    api: respx.Router, harness: Harness
) -> None:
    script = _script(api, reply(tool_use(value={"severity": "high"})))
    event = make_event()
    await harness.processor.process(event)
    out = await harness.rows(event.id)
    assert len(script.bodies) == 2  # one repair turn, not more
    assert out.outbox == []
    assert out.event.status == "dead_lettered"
    assert "invalid tool input after repair" in out.dead[0].reason
    assert "'title' is a required property" in out.dead[0].reason


async def test_tools_not_offered_are_refused_and_recorded(
    api: respx.Router, harness: Harness
) -> None:
    _script(
        api,
        reply(tool_use("deleteRepository", {}, "toolu_x"), tool_use(use_id="toolu_y")),
        reply(tool_use("deleteRepository", {}, "toolu_z")),
    )
    first, second = make_event(1), make_event(2)
    await harness.processor.process(first)
    await harness.processor.process(second)
    one, two = await harness.rows(first.id), await harness.rows(second.id)
    assert [o.tool for o in one.outbox] == ["publishAlert"]
    assert "refused tools not offered: deleteRepository" in (one.calls[0].error or "")
    assert two.outbox == []
    assert two.event.status == "no_action"
    assert two.calls[0].tool_calls == [{"name": "deleteRepository", "input": {}}]


@pytest.mark.parametrize("stop_reason", ["max_tokens", "refusal"])
async def test_max_tokens_and_refusal_publish_nothing(
    api: respx.Router, harness: Harness, stop_reason: str
) -> None:
    script = _script(api, reply(tool_use(value={"severity": "hi"}), stop_reason=stop_reason))
    event = make_event()
    await harness.processor.process(event)
    out = await harness.rows(event.id)
    assert len(script.bodies) == 1  # no repair of a cut-off answer
    assert out.outbox == []
    assert out.event.status == "no_action"
    assert f"stop_reason {stop_reason}: nothing published" in (out.event.error or "")
    assert out.calls[0].stop_reason == stop_reason


async def test_cache_tokens_are_priced_and_counted_per_pipeline(
    api: respx.Router, harness: Harness
) -> None:
    usage = {
        "input_tokens": 1000,
        "output_tokens": 100,
        "cache_creation_input_tokens": 2000,
        "cache_read_input_tokens": 10000,
    }
    _script(api, reply(usage=usage))
    before = LLM_COST.labels(pipeline="triage")._value.get()
    event = make_event()
    await harness.processor.process(event)
    out = await harness.rows(event.id)
    expected = (1000 * 3.0 + 100 * 15.0 + 2000 * 3.75 + 10000 * 0.30) / 1e6
    assert out.calls[0].cost_usd == pytest.approx(expected)
    assert out.calls[0].cache_read_input_tokens == 10000
    assert LLM_COST.labels(pipeline="triage")._value.get() - before == pytest.approx(expected)
    spend = await harness.budgets.spent("triage")
    assert spend.tokens == 13100


@pytest.mark.parametrize("mode", ["full", "redacted", "none"])
async def test_audit_text_modes(
    api: respx.Router,
    sessions: async_sessionmaker[AsyncSession],
    redis: Redis,
    redis_prefix: str,
    mode: str,
) -> None:
    h = build(sessions=sessions, redis=redis, prefix=redis_prefix, llm_audit_text=mode)
    _script(api, reply(tool_use(value={"severity": "high", "title": "mail ops@example.com"})))
    payload = {"user": "dev@example.com", "token": "ghp_abcdefghijklmnop1234567890"}
    event = make_event(payload=payload)
    await h.processor.process(event)
    call = (await h.rows(event.id)).calls[0]
    assert call.prompt_hash is not None
    if mode == "none":
        assert call.prompt_text is None
        assert call.response_text is None
    elif mode == "full":
        assert "dev@example.com" in (call.prompt_text or "")
        assert "ops@example.com" in (call.response_text or "")
    else:
        assert "dev@example.com" not in (call.prompt_text or "")
        assert "ghp_abcdefghijklmnop" not in (call.prompt_text or "")
        assert "[REDACTED:email]" in (call.prompt_text or "")
        assert "[REDACTED:email]" in (call.response_text or "")


TOPIC = "arn:aws:sns:us-east-1:123456789012:alerts.fifo"
# publishAlert has a topic, publishNote none.
WITH_A_TOPIC = (
    config_text()
    .replace("    tools: [publishAlert]", "    tools: [publishAlert, publishNote]")
    .replace(
        "    description: Raise an alert.\n",
        f"    description: Raise an alert.\n    topic_arn: {TOPIC}\n",
    )
    + """  publishNote:
    description: Leave a note.
    input_schema: {type: object}
"""
)


@pytest.mark.parametrize(
    ("tools", "status"),
    [
        (["publishNote"], "held"),  # nothing the relay could ever send
        (["publishNote", "publishAlert"], "processing"),  # the relay sends publishAlert
        (["publishAlert"], "processing"),
    ],
)
async def test_a_decision_whose_calls_all_lack_a_topic_is_held(
    api: respx.Router,
    sessions: async_sessionmaker[AsyncSession],
    redis: Redis,
    redis_prefix: str,
    tools: list[str],
    status: str,
) -> None:
    harness = build(sessions=sessions, redis=redis, prefix=redis_prefix, text=WITH_A_TOPIC)
    uses = [
        tool_use(name, {} if name == "publishNote" else None, use_id=f"toolu_{n}")
        for n, name in enumerate(tools)
    ]
    _script(api, reply(*uses))
    event = make_event()
    await harness.processor.process(event)
    out = await harness.rows(event.id)
    assert out.event.status == status
    assert [(row.tool, row.topic_arn) for row in out.outbox] == [
        (name, TOPIC if name == "publishAlert" else None) for name in tools
    ]
    assert [row.status for row in out.outbox] == ["pending"] * len(tools)
