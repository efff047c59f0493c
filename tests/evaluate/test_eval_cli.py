"""``eventgate eval``: cases and expectations, a pass rate per case, an exit code to gate on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from app.cli import app
from eventgate_dev.fake_anthropic import FakeAnthropicServer, Persona

EXAMPLE = Path(__file__).resolve().parents[2] / "app" / "example_evals.yaml"


@pytest.fixture
def env(redis_url: str, redis_prefix: str, database_url: str) -> dict[str, str]:
    # The built-in example config (no --config): the example file is written for it.
    return {
        "EVENTGATE_REDIS_URL": redis_url,
        "EVENTGATE_REDIS_PREFIX": redis_prefix,
        "EVENTGATE_DATABASE_URL": database_url,
        "EVENTGATE_AUTO_MIGRATE": "false",
    }


async def _eval(env: dict[str, str], *args: str) -> tuple[Result, dict[str, Any]]:
    result = await asyncio.to_thread(CliRunner().invoke, app, ["eval", *args], env=env)
    lines = result.stdout.strip().splitlines()
    found = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    return result, found


def _quiet_on_pushes(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Claude as the example expects it: nothing to do for a push."""
    if "push" in str(body["messages"][-1]["content"]):
        return [{"type": "text", "text": "routine"}]
    return None


async def test_the_example_file_passes_when_claude_decides_as_expected(
    env: dict[str, str], fake_claude: FakeAnthropicServer
) -> None:
    fake_claude.behaviour.responder = _quiet_on_pushes
    result, found = await _eval(env, str(EXAMPLE), "--runs", "3", "--json")
    assert result.exit_code == 0, result.output
    assert [(c["name"][:12], c["pass_rate"]) for c in found["cases"]] == [
        ("a critical f", 1.0),
        ("a routine pu", 1.0),
    ]
    assert (found["events"], found["runs"], found["passed"]) == (2, 3, True)
    assert found["action_agreement"] == 1.0 and found["exact_agreement"] == 1.0
    assert "ok   1.00 a critical firing alert" in result.stdout


async def test_a_case_below_min_pass_fails_the_run_and_says_why(
    env: dict[str, str], fake_claude: FakeAnthropicServer
) -> None:
    # Without the responder the fake alerts on the push too; a persona picks "low".
    fake_claude.behaviour.personas["claude-sonnet-4-6"] = Persona(enum="last")
    result, found = await _eval(env, str(EXAMPLE), "--json")
    assert result.exit_code == 1
    first, second = found["cases"]
    assert first["pass_rate"] == 0.0
    assert first["failures"] == [
        'publishAlert input.severity: "low", expected one of ["critical","high"]'
    ]
    assert second["failures"] == ["expected no tool call, got ['publishAlert']"]
    assert "FAIL 0.00 a routine push" in result.stdout
    # A lower bar passes the same decisions only when they reach it.
    lenient, _ = await _eval(env, str(EXAMPLE), "--min-pass", "0")
    assert lenient.exit_code == 0


async def test_stored_events_are_cases_too_and_the_group_id_is_the_gateways(
    env: dict[str, str], fake_claude: FakeAnthropicServer, tmp_path: Path
) -> None:
    cases = tmp_path / "cases.yaml"
    cases.write_text(
        """
cases:
  - name: the key decides the group
    source: alerts
    group_key: "payments api/5xx"
    payload: {status: firing}
    expect: {tool: publishAlert, group_id: payments-api}
  - name: missing stored event
    event_id: evt_not_there
    expect: {no_tool: true}
"""
    )
    result, _ = await _eval(env, str(cases))
    assert result.exit_code == 2 and "no stored event 'evt_not_there'" in result.output
    cases.write_text(cases.read_text().split("  - name: missing")[0])
    result, found = await _eval(env, str(cases), "--json")
    assert result.exit_code == 1
    # A key SNS does not accept is hashed: the expectation sees what would be published.
    (failure,) = found["cases"][0]["failures"]
    assert failure.startswith("publishAlert group_id: h-") and failure.endswith(
        "expected payments-api"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cases: []", "should be non-empty"),
        ("cases: [{name: x, expect: {tool: a}}]", "is not valid under any of the given schemas"),
        ("cases: [{name: x, source: nope, payload: {}, expect: {tool: a}}]", "no source 'nope'"),
        ("cases: [{name: x, source: alerts, payload: {}, expect: {colour: red}}]", "colour"),
        (
            "pipeline: nope\n"
            "cases: [{name: x, source: alerts, payload: 1, expect: {no_tool: true}}]",
            "no pipeline 'nope'",
        ),
        ("[" * 200, "nested more than"),
    ],
)
async def test_a_bad_file_is_refused_before_any_call(
    env: dict[str, str], fake_claude: FakeAnthropicServer, tmp_path: Path, text: str, message: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    result, _ = await _eval(env, str(bad))
    assert result.exit_code == 2
    assert message in result.output
    assert fake_claude.behaviour.requests == []
