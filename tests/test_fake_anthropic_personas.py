"""The fake Messages API answers differently per model or system prompt (personas), so
tests that compare pipelines see real disagreements."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from eventgate_dev.fake_anthropic import FakeAnthropicServer, FakeBehaviour, Persona

TOOLS = [
    {
        "name": "publishAlert",
        "input_schema": {
            "type": "object",
            "properties": {
                "severity": {"type": "string", "enum": ["high", "low"]},
                "page": {"type": "boolean"},
                "title": {"type": "string"},
            },
            "required": ["severity", "page", "title"],
        },
    },
    {"name": "publishNotification", "input_schema": {"type": "object", "properties": {}}},
]


def _ask(
    client: httpx.Client,
    model: str,
    system: str = "You triage.",
    content: str = "event type: push\ngroup: acme/api",
) -> list[Any]:
    body = {
        "model": model,
        "max_tokens": 100,
        "system": [{"type": "text", "text": system}],
        "tools": TOOLS,
        "messages": [{"role": "user", "content": content}],
    }
    answer = client.post("/v1/messages", json=body)
    assert answer.status_code == 200
    return [(b["name"], b["input"]) for b in answer.json()["content"] if b["type"] == "tool_use"]


@pytest.fixture
def personas() -> FakeAnthropicServer:
    behaviour = FakeBehaviour(
        personas={
            "claude-haiku-4-5": Persona(enum="last"),
            "claude-opus-4-5": Persona(tool="publishNotification"),
            "system:v2 rules": Persona(tool="none"),
            "claude-vary": Persona(vary=0.5, seed=7),
        }
    )
    return FakeAnthropicServer(behaviour).start()


def test_models_and_system_prompts_answer_differently(personas: FakeAnthropicServer) -> None:
    try:
        with httpx.Client(base_url=personas.base_url) as client:
            plain = _ask(client, "claude-sonnet-4-6")
            assert plain == [
                ("publishAlert", {"severity": "high", "page": True, "title": "push in acme/api"})
            ]
            assert _ask(client, "claude-haiku-4-5") == [
                ("publishAlert", {"severity": "low", "page": False, "title": "push in acme/api"})
            ]
            assert _ask(client, "claude-opus-4-5") == [("publishNotification", {})]
            # A system prompt's persona wins over the model's.
            assert _ask(client, "claude-haiku-4-5", system="Follow the v2 rules.") == []
    finally:
        personas.stop()


def test_a_varying_persona_disagrees_with_itself_repeatably() -> None:
    def answers() -> list[Any]:
        server = FakeAnthropicServer(
            FakeBehaviour(personas={"claude-vary": Persona(vary=0.5, seed=7)})
        ).start()
        try:
            with httpx.Client(base_url=server.base_url) as client:
                return [_ask(client, "claude-vary")[0][1]["severity"] for _ in range(40)]
        finally:
            server.stop()

    first = answers()
    assert set(first) == {"high", "low"}
    assert first.count("high") > first.count("low")  # half vary, and a varied one is 50/50
    assert answers() == first  # seeded


def test_persona_specs_parse_or_say_what_is_wrong() -> None:
    assert Persona.parse("tool:none,enum:last,vary:0.25,seed:3") == Persona(
        tool="none", enum="last", vary=0.25, seed=3
    )
    assert Persona.parse("") == Persona()
    for bad in ("enum:middle", "colour:red"):
        with pytest.raises(ValueError, match="parts are"):
            Persona.parse(bad)


def test_a_persona_with_when_calls_its_tool_only_for_prompts_containing_the_text() -> None:
    spec = "tool:publishNotification,when:severity=critical"
    assert Persona.parse(spec) == Persona(tool="publishNotification", when="severity=critical")
    server = FakeAnthropicServer(FakeBehaviour(personas={"triage": Persona.parse(spec)})).start()
    try:
        with httpx.Client(base_url=server.base_url) as client:
            critical = "event type: alert.firing\ngroup: db\nalert 1: severity=critical"
            warning = "event type: alert.firing\ngroup: disk\nalert 1: severity=warning"
            assert _ask(client, "triage", content=critical) == [("publishNotification", {})]
            assert [name for name, _ in _ask(client, "triage", content=warning)] == ["publishAlert"]
    finally:
        server.stop()
