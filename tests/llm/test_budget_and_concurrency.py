"""Daily budgets (dead-letter or wait), in-flight limits per process and per pipeline."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import pytest_httpx2._plugin  # noqa: F401  (registers respx's httpcore2 mocker)
import respx
from anthropic import AsyncAnthropic
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.llm.client import ClaudeClient
from app.observability.metrics import LLM_BUDGET_REMAINING
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.llm.harness import BASE, Script, build, config_text, make_event, reply

USAGE = {"input_tokens": 600, "output_tokens": 100}


@pytest.fixture
def api() -> Iterator[respx.Router]:
    with respx.mock(base_url=BASE, using="httpcore2") as router:
        yield router


async def test_exhausted_budget_dead_letters_without_calling_claude(
    api: respx.Router, sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    budget = "    budget: {daily_tokens: 1000, on_exhausted: dead_letter}\n"
    h = build(sessions=sessions, redis=redis, prefix=redis_prefix, text=config_text(budget))
    script = Script([reply(usage=USAGE)])
    api.post("/v1/messages").mock(side_effect=script)
    events = [make_event(n) for n in range(3)]
    for event in events:
        await h.processor.process(event)
    outcomes = [await h.rows(e.id) for e in events]
    # 700 tokens, then 1400 (over), then nothing left: the third never reaches Claude.
    assert len(script.bodies) == 2
    assert [len(o.outbox) for o in outcomes] == [1, 1, 0]
    assert outcomes[2].event.status == "dead_lettered"
    assert "daily budget of pipeline 'triage' exhausted" in outcomes[2].dead[0].reason
    assert outcomes[2].calls == []
    assert LLM_BUDGET_REMAINING.labels(pipeline="triage", unit="tokens")._value.get() == 0


async def test_exhausted_budget_waits_for_the_next_day_by_default(
    api: respx.Router, sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    budget = "    budget: {daily_cost_usd: 0.001}\n"
    h = build(
        sessions=sessions,
        redis=redis,
        prefix=redis_prefix,
        text=config_text(budget),
        llm_budget_poll_seconds=3600,
    )
    script = Script([reply(usage=USAGE)])  # $0.0033 per call: over after one
    api.post("/v1/messages").mock(side_effect=script)
    first, second = make_event(1), make_event(2)
    await h.processor.process(first)
    day_one = h.budgets.key("triage")
    await h.processor.process(second)  # waits (fake time) until the UTC day turns
    out = await h.rows(second.id)
    assert len(script.bodies) == 2
    assert len(out.outbox) == 1
    assert out.dead == []
    assert h.sleeps.delays  # it did wait
    assert all(d <= 3600 for d in h.sleeps.delays)
    assert h.budgets.key("triage") != day_one


async def test_budget_config_needs_a_limit() -> None:
    from app.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as caught:
        parse_config(config_text("    budget: {on_exhausted: wait}\n"))
    assert "pipelines.triage.budget" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        parse_config(config_text("    provider: openai\n"))
    assert "pipelines.triage.provider" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        parse_config(config_text("    max_concurrency: 0\n"))
    assert "pipelines.triage.max_concurrency" in str(caught.value)


@pytest.mark.parametrize(
    ("pipeline_limit", "process_limit", "expected"), [(2, 16, 2), (None, 3, 3)]
)
async def test_in_flight_calls_never_exceed_the_limits(
    fake_claude: FakeAnthropicServer,
    sessions: async_sessionmaker[AsyncSession],
    redis: Redis,
    redis_prefix: str,
    pipeline_limit: int | None,
    process_limit: int,
    expected: int,
) -> None:
    fake_claude.behaviour.latency = 0.2
    extra = f"    max_concurrency: {pipeline_limit}\n" if pipeline_limit else ""
    client = ClaudeClient(
        AsyncAnthropic(api_key="sk-ant-test", base_url=fake_claude.base_url, max_retries=0)
    )
    h = build(
        sessions=sessions,
        redis=redis,
        prefix=redis_prefix,
        text=config_text(extra),
        clients={"anthropic": client},
        llm_max_concurrency=process_limit,
    )
    events = [make_event(n, group=f"repo-{n}") for n in range(8)]
    await asyncio.gather(*(h.processor.process(e) for e in events))
    await client.close()
    assert len(fake_claude.behaviour.requests) == 8
    assert fake_claude.behaviour.max_in_flight == expected
    outcomes = [await h.rows(e.id) for e in events]
    assert [len(o.outbox) for o in outcomes] == [1] * 8


async def test_bedrock_pipelines_call_bedrock_runtime_signed_with_sigv4(
    sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    h = build(
        sessions=sessions,
        redis=redis,
        prefix=redis_prefix,
        text=config_text("    provider: bedrock\n"),
        clients={"bedrock": ClaudeClient.bedrock(region="us-east-1", timeout=10)},
    )
    script = Script([reply(usage=USAGE)])
    with respx.mock(
        base_url="https://bedrock-runtime.us-east-1.amazonaws.com", using="httpcore2"
    ) as bedrock:
        route = bedrock.post(path__regex=r"/model/.+/invoke").mock(side_effect=script)
        event = make_event()
        await h.processor.process(event)
    out = await h.rows(event.id)
    assert route.call_count == 1
    request = route.calls[0].request
    assert "claude-sonnet-4-6" in request.url.path
    assert request.headers["authorization"].startswith("AWS4-HMAC-SHA256")
    assert "anthropic_version" in script.bodies[0]
    assert "model" not in script.bodies[0]  # Bedrock takes the model from the URL
    assert out.calls[0].provider == "bedrock"
    assert len(out.outbox) == 1


async def test_a_pipeline_whose_provider_has_no_client_is_dead_lettered(
    sessions: async_sessionmaker[AsyncSession], redis: Redis, redis_prefix: str
) -> None:
    h = build(
        sessions=sessions,
        redis=redis,
        prefix=redis_prefix,
        text=config_text("    provider: bedrock\n"),
    )
    event = make_event()
    await h.processor.process(event)
    out = await h.rows(event.id)
    assert out.dead[0].reason == "provider 'bedrock' is not configured"
