"""``eventgate eval`` with hostile or broken files: refused with exit 2 before any call (never a
traceback, whose exit 1 reads as a failed gate), and a case payload treated as a webhook's."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from typer.testing import CliRunner, Result

from app.cli import app
from app.store.models import EventRow
from eventgate_dev.fake_anthropic import FakeAnthropicServer


@pytest.fixture
def env(redis_url: str, redis_prefix: str, database_url: str) -> dict[str, str]:
    return {
        "EVENTGATE_REDIS_URL": redis_url,
        "EVENTGATE_REDIS_PREFIX": redis_prefix,
        "EVENTGATE_DATABASE_URL": database_url,
        "EVENTGATE_AUTO_MIGRATE": "false",
    }


async def _eval(env: dict[str, str], path: Path, *args: str) -> tuple[Result, dict[str, Any]]:
    result = await asyncio.to_thread(CliRunner().invoke, app, ["eval", str(path), *args], env=env)
    lines = result.stdout.strip().splitlines()
    found = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    return result, found


CASE = "cases: [{name: x, source: alerts, payload: %s, expect: %s}]"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # ``in`` must be a list: a string was read as its characters, a number crashed.
        (
            CASE % ("{status: firing}", "{tool: publishAlert, input.severity: {in: critical}}"),
            "is not of type 'array'",
        ),
        (
            CASE % ("{status: firing}", "{tool: publishAlert, input.severity: {in: 5}}"),
            "is not of type 'array'",
        ),
        # no_tool beside an expectation of a call: the other was ignored, the case passed.
        (
            CASE % ("{status: firing}", "{no_tool: true, tool: publishAlert}"),
            "has too many properties",
        ),
        # Not YAML at all.
        ("cases: [", "expected"),
        # A payload no webhook could carry (orjson's 64-bit integers).
        (CASE % ("{n: 123456789012345678901234567890}", "{no_tool: true}"), "payload"),
    ],
)
async def test_a_hostile_file_is_refused_before_any_call(
    env: dict[str, str], fake_claude: FakeAnthropicServer, tmp_path: Path, text: str, message: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    result, _ = await _eval(env, bad)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert fake_claude.behaviour.requests == []


async def test_a_case_payload_is_redacted_like_a_webhooks(
    env: dict[str, str], fake_claude: FakeAnthropicServer, tmp_path: Path
) -> None:
    cases = tmp_path / "cases.yaml"
    cases.write_text(
        CASE % ("{status: firing, password: hunter2-not-for-claude}", "{tool: publishAlert}")
    )
    result, _ = await _eval(env, cases, "--min-pass", "0")
    assert result.exit_code == 0, result.output
    assert fake_claude.behaviour.requests
    assert "hunter2-not-for-claude" not in json.dumps(fake_claude.behaviour.requests)


async def test_a_stored_event_whose_pipeline_is_gone_is_refused(
    env: dict[str, str],
    sessions: async_sessionmaker[AsyncSession],
    fake_claude: FakeAnthropicServer,
    tmp_path: Path,
) -> None:
    async with sessions() as session:
        session.add(
            EventRow(
                id="evt_old",
                source="retired-source",
                type="push",
                group_key="acme/api",
                delivery_id="d1",
                pipeline="retired",
                status="no_action",
                payload=None,
                received_at=datetime(2026, 11, 30, tzinfo=UTC),
            )
        )
        await session.commit()
    cases = tmp_path / "cases.yaml"
    cases.write_text("cases: [{name: old, event_id: evt_old, expect: {no_tool: true}}]")
    result, _ = await _eval(env, cases)
    assert result.exit_code == 2, result.output
    assert "no pipeline 'retired'" in result.output
    # Through a configured pipeline, the event of a source no longer configured, with a null
    # payload, is decided.
    result, found = await _eval(env, cases, "--pipeline", "triage", "--min-pass", "0", "--json")
    assert result.exit_code == 0, result.output
    assert found["errors"] == [] and len(fake_claude.behaviour.requests) == 1


async def test_yaml_dates_in_a_case_are_the_json_text_a_webhook_would_carry(
    env: dict[str, str], fake_claude: FakeAnthropicServer, tmp_path: Path
) -> None:
    # YAML reads 2026-12-01 as a date, which no JSON payload or tool input holds.
    cases = tmp_path / "cases.yaml"
    cases.write_text(
        CASE % ("{since: 2026-12-01}", "{tool: publishAlert, input.severity: 2026-12-01}")
    )
    result, found = await _eval(env, cases, "--json")
    assert result.exit_code == 1, result.output
    (failure,) = found["cases"][0]["failures"]
    assert failure.startswith("publishAlert input.severity: ")
    assert failure.endswith(', expected "2026-12-01"')
    prompt = fake_claude.behaviour.requests[0]["messages"][0]["content"]
    assert '{"since":"2026-12-01"}' in prompt


async def test_eval_on_a_fresh_checkout_migrates_its_database_as_serve_does(
    env: dict[str, str], fake_claude: FakeAnthropicServer, tmp_path: Path
) -> None:
    # The example's CI gate with the default settings: a new SQLite file and
    # EVENTGATE_AUTO_MIGRATE on. It crashed on the missing audit table (exit 1, a failed gate).
    fresh = {key: value for key, value in env.items() if key != "EVENTGATE_AUTO_MIGRATE"}
    fresh["EVENTGATE_DATABASE_URL"] = f"sqlite+aiosqlite:///{tmp_path / 'new.db'}"
    cases = tmp_path / "cases.yaml"
    cases.write_text(CASE % ("{status: firing}", "{tool: publishAlert}"))
    result, found = await _eval(fresh, cases, "--json")
    assert result.exit_code == 0, result.output
    assert found["passed"] is True
