"""``eventgate replay`` and ``eventgate consistency`` over a real database and Redis, with
the fake Messages API answering per model: the figures, the audit rows, nothing published."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from typer.testing import CliRunner, Result

from app.cli import app
from app.config import parse_config
from app.llm.budget import BudgetLedger
from app.llm.ratelimit import ModelLimits, RateLimiter
from app.store.db import create_engine, session_factory
from app.store.migrate import upgrade_head
from app.store.models import EventRow, LlmCallRow, OutboxRow
from app.store.repository import LlmCallRepository
from eventgate_dev.fake_anthropic import FakeAnthropicServer, Persona

CONFIG = """
sources:
  github: {type: github, secret: "a-test-secret-of-enough-length", pipeline: triage}
pipelines:
  triage:
    model: claude-sonnet-4-6
    system: You triage GitHub events.
    tools: [publishAlert]
  triage-v2:
    model: claude-haiku-4-5
    system: You triage GitHub events, v2.
    tools: [publishAlert]
tools:
  publishAlert:
    description: Raise an alert.
    input_schema:
      type: object
      properties: {severity: {type: string, enum: [high, low]}, title: {type: string}}
      required: [severity, title]
"""
START = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


async def _seed(sessions: async_sessionmaker[AsyncSession]) -> None:
    """Three events decided live (publishAlert, severity high), one still queued."""
    async with sessions() as session:
        for n in range(4):
            event_id = f"evt_{n}"
            session.add(
                EventRow(
                    id=event_id,
                    source="github",
                    type="issues.opened",
                    group_key="acme/api",
                    delivery_id=f"d{n}",
                    pipeline="triage",
                    status="published" if n < 3 else "queued",
                    payload={"action": "opened", "issue": {"number": n}},
                    received_at=START + timedelta(minutes=n),
                )
            )
            if n < 3:
                given = {"severity": "high", "title": f"issue {n}"}
                session.add(
                    OutboxRow(
                        event_id=event_id,
                        source="github",
                        seq=0,
                        llm_call_id=f"llm_live_{n}",
                        tool="publishAlert",
                        group_id="acme/api",
                        dedup_id=f"dedup-{n}",
                        body=orjson.dumps({"tool": "publishAlert", "input": given}).decode(),
                        status="published",
                    )
                )
        await session.commit()


@pytest.fixture
def env(tmp_path: Path, redis_url: str, redis_prefix: str, database_url: str) -> dict[str, str]:
    config = tmp_path / "eventgate.yaml"
    config.write_text(CONFIG)
    return {
        "EVENTGATE_CONFIG": str(config),
        "EVENTGATE_REDIS_URL": redis_url,
        "EVENTGATE_REDIS_PREFIX": redis_prefix,
        "EVENTGATE_DATABASE_URL": database_url,
        "EVENTGATE_AUTO_MIGRATE": "false",
    }


async def _invoke(env: dict[str, str], *args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, app, list(args), env=env)


def _last_json(result: Result) -> dict[str, Any]:
    assert result.exit_code == 0, result.output
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


async def _counts(sessions: async_sessionmaker[AsyncSession]) -> tuple[int, dict[str, int]]:
    async with sessions() as session:
        outbox = await session.scalar(select(func.count()).select_from(OutboxRow))
        purposes = dict(
            (
                await session.execute(
                    select(LlmCallRow.purpose, func.count()).group_by(LlmCallRow.purpose)
                )
            ).all()
        )
    return int(outbox or 0), {str(k): int(v) for k, v in purposes.items()}


async def test_replay_through_another_model_measures_the_disagreement(
    env: dict[str, str],
    sessions: async_sessionmaker[AsyncSession],
    fake_claude: FakeAnthropicServer,
    tmp_path: Path,
) -> None:
    await _seed(sessions)
    fake_claude.behaviour.personas["claude-haiku-4-5"] = Persona(enum="last")
    report = tmp_path / "replay.md"
    result = await _invoke(
        env,
        "replay",
        "--pipeline",
        "triage-v2",
        "--since",
        "2026-11-30T00:00:00Z",
        "--report",
        str(report),
        "--json",
    )
    found = _last_json(result)
    # The queued event has no live decision: three events compared.
    assert found["events"] == 3 and found["candidate"] == "triage-v2"
    assert found["baseline"] == "live"
    assert found["action_agreement"] == 1.0  # publishAlert each time
    assert found["exact_agreement"] == 0.0  # but severity low, and another title
    assert found["fields"] == {"publishAlert.severity": 0.0}
    assert sorted(d["event_id"] for d in found["disagreements"]) == ["evt_0", "evt_1", "evt_2"]
    assert found["disagreements"][0]["candidate"][0]["input"]["severity"] == "low"
    assert set(found["cost_usd"]) == {"baseline", "candidate"} and found["errors"] == []
    assert "| evt_0 | publishAlert" in report.read_text()
    # Audited as replay calls of the candidate; no outbox row, so nothing to publish.
    outbox, purposes = await _counts(sessions)
    assert (outbox, purposes) == (3, {"replay": 3})
    async with sessions() as session:
        pipelines = set((await session.scalars(select(LlmCallRow.pipeline))).all())
        # A later live delivery numbers its attempts from the live rows only.
        live_attempts = await LlmCallRepository(session).count_for_event("evt_0")
    assert pipelines == {"triage-v2"} and live_attempts == 0


async def test_replay_selects_by_time_and_the_live_pipeline_agrees_on_action(
    env: dict[str, str],
    sessions: async_sessionmaker[AsyncSession],
    fake_claude: FakeAnthropicServer,
) -> None:
    await _seed(sessions)
    result = await _invoke(
        env,
        "replay",
        "--pipeline",
        "triage",
        "--since",
        "2026-11-30T12:01:00",
        "--until",
        "2026-11-30T12:02:00",
        "--json",
    )
    found = _last_json(result)
    assert found["events"] == 1  # evt_1 only
    assert found["action_agreement"] == 1.0 and found["fields"] == {"publishAlert.severity": 1.0}


async def test_consistency_compares_every_pair_of_runs(
    env: dict[str, str],
    sessions: async_sessionmaker[AsyncSession],
    fake_claude: FakeAnthropicServer,
) -> None:
    await _seed(sessions)
    fake_claude.behaviour.personas["claude-sonnet-4-6"] = Persona(vary=0.6, seed=3)
    result = await _invoke(
        env, "consistency", "--pipeline", "triage", "--events", "2", "--runs", "4", "--json"
    )
    found = _last_json(result)
    assert (found["events"], found["runs"], found["pairs"]) == (2, 4, 12)
    assert found["action_agreement"] == 1.0
    assert 0.0 < found["exact_agreement"] < 1.0  # the persona varies its severity
    assert found["tokens"]["input"] > 0 and found["tokens"]["output"] > 0
    outbox, purposes = await _counts(sessions)
    assert (outbox, purposes) == (3, {"consistency": 8})


async def test_an_unknown_pipeline_is_refused(
    env: dict[str, str], fake_claude: FakeAnthropicServer
) -> None:
    result = await _invoke(env, "replay", "--pipeline", "nope", "--since", "2026-01-01")
    assert result.exit_code == 2
    assert "no pipeline 'nope'" in result.output and "triage-v2" in result.output
    bad = await _invoke(env, "replay", "--pipeline", "triage", "--since", "yesterday")
    assert bad.exit_code == 2 and "not an ISO 8601 time" in bad.output


async def test_since_with_an_offset_is_the_same_instant_on_sqlite(
    env: dict[str, str], fake_claude: FakeAnthropicServer, tmp_path: Path
) -> None:
    # SQLite keeps times as text without their offset: 14:01+02:00 must be read as 12:01 UTC.
    url = f"sqlite+aiosqlite:///{tmp_path / 'offsets.db'}"
    await asyncio.to_thread(upgrade_head, url)
    engine = create_engine(url)
    try:
        await _seed(session_factory(engine))
    finally:
        await engine.dispose()
    result = await _invoke(
        env | {"EVENTGATE_DATABASE_URL": url},
        "replay",
        "--pipeline",
        "triage",
        "--since",
        "2026-11-30T14:01:00+02:00",
        "--until",
        "2026-11-30T07:02:00-05:00",
        "--json",
    )
    found = _last_json(result)
    assert found["events"] == 1  # evt_1 only, as on PostgreSQL


async def test_a_run_ends_with_its_errors_while_claude_is_down(
    env: dict[str, str],
    sessions: async_sessionmaker[AsyncSession],
    fake_claude: FakeAnthropicServer,
    tmp_path: Path,
) -> None:
    # Every call a 500: the live path waits out the outage (breaker, a two-hour deadline);
    # a run must end, each event's error said, and eval must fail its gate.
    await _seed(sessions)
    fake_claude.behaviour.down_until = time.monotonic() + 3600
    fake_claude.behaviour.down_status = 500
    fast = env | {
        "EVENTGATE_RERUN_DEADLINE_SECONDS": "2",
        "EVENTGATE_LLM_RETRY_BASE_SECONDS": "0.05",
        "EVENTGATE_LLM_RETRY_CAP_SECONDS": "0.2",
    }
    started = time.monotonic()
    ended = await _invoke(fast, "replay", "--pipeline", "triage", "--json")
    assert time.monotonic() - started < 30
    # Figures and errors printed, and exit 1: a run that decided nothing did not run.
    assert ended.exit_code == 1, ended.output
    found = json.loads(ended.stdout.strip().splitlines()[-1])
    assert found["pairs"] == 0
    assert sorted(e["event_id"] for e in found["errors"]) == ["evt_0", "evt_1", "evt_2"]
    assert "no decision within 2s" in found["errors"][0]["error"]
    ended = await _invoke(
        fast, "consistency", "--pipeline", "triage", "--events", "1", "--runs", "2"
    )
    assert ended.exit_code == 1 and "error: evt_0: no decision within 2s" in ended.stdout
    cases = tmp_path / "cases.yaml"
    cases.write_text("cases: [{name: x, source: github, payload: {}, expect: {no_tool: true}}]")
    result = await _invoke(fast, "eval", str(cases))
    assert result.exit_code == 1 and "no decision within 2s" in result.stdout


async def test_a_run_spends_its_own_budget_never_the_live_pipelines(
    env: dict[str, str],
    sessions: async_sessionmaker[AsyncSession],
    fake_claude: FakeAnthropicServer,
    redis: Redis,
    redis_prefix: str,
    tmp_path: Path,
) -> None:
    # A live pipeline that dead-letters its events once its day's budget is spent: a replay
    # or eval through it must not spend that budget (the day's live alerts would be lost).
    config = Path(env["EVENTGATE_CONFIG"])
    config.write_text(
        CONFIG.replace(
            "    tools: [publishAlert]\n  triage-v2:",
            "    tools: [publishAlert]\n"
            "    budget: {daily_tokens: 1000000, on_exhausted: dead_letter}\n"
            "  triage-v2:",
        )
    )
    await _seed(sessions)
    found = _last_json(await _invoke(env, "replay", "--pipeline", "triage", "--json"))
    assert found["pairs"] == 3 and found["errors"] == []
    budget = parse_config(config.read_text()).pipelines["triage"].budget
    assert budget is not None
    live = await BudgetLedger(redis, prefix=redis_prefix).status("triage", budget)
    assert live.spend.tokens == 0
    # The run's spend is counted, against a budget of the same size of its own.
    runs = await BudgetLedger(redis, prefix=f"{redis_prefix}:reruns").status("triage", budget)
    assert runs.spend.tokens > 0


async def test_a_report_that_cannot_be_written_is_refused_before_any_call(
    env: dict[str, str],
    sessions: async_sessionmaker[AsyncSession],
    fake_claude: FakeAnthropicServer,
    tmp_path: Path,
) -> None:
    # Found only once every call was paid for, it crashed the run and lost its figures.
    await _seed(sessions)
    missing = tmp_path / "no-such-dir" / "replay.md"
    result = await _invoke(env, "replay", "--pipeline", "triage", "--report", str(missing))
    assert result.exit_code == 2, result.output
    assert "cannot write the report" in result.output
    assert fake_claude.behaviour.requests == []


async def test_a_run_leaves_half_of_every_rate_limit_to_live_events(
    env: dict[str, str],
    sessions: async_sessionmaker[AsyncSession],
    fake_claude: FakeAnthropicServer,
    redis: Redis,
    redis_prefix: str,
) -> None:
    # Six requests a minute, shared with the live workers: a consistency run of eight calls
    # took all six, and live events waited for the bucket to refill.
    await _seed(sessions)
    limited = env | {
        "EVENTGATE_LLM_REQUESTS_PER_MINUTE": "6",
        "EVENTGATE_RERUN_DEADLINE_SECONDS": "2",
    }
    result = await _invoke(
        limited, "consistency", "--pipeline", "triage", "--events", "2", "--runs", "4", "--json"
    )
    assert result.exit_code == 1, result.output  # the run's calls past its share: errors
    found = json.loads(result.stdout.strip().splitlines()[-1])
    # Three calls from the bucket of six (and one more only if it refilled meanwhile).
    made = len(fake_claude.behaviour.requests)
    assert made in (3, 4) and len(found["errors"]) == 8 - made
    limiter = RateLimiter(redis, prefix=redis_prefix, limits=lambda _: ModelLimits(requests=6))
    room = await limiter.headroom("claude-sonnet-4-6")
    assert room.requests is not None and room.requests >= 3
