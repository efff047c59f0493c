"""What `events show` says of a tool call in each publish state, and of a failed attempt."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from app.client.render import show_event, status


def _event(**tool_call: Any) -> dict[str, Any]:
    call = {
        "seq": 0,
        "tool": "publishAlert",
        "group_id": "acme/api",
        "dedup_id": "d" * 64,
        "topic_arn": None,
        "status": "pending",
        "attempts": 0,
        "last_error": None,
        "sns_message_id": None,
        "message": {"input": {"title": "It broke"}},
    } | tool_call
    return {
        "event_id": "evt_1",
        "status": "processing",
        "source": "github",
        "received_at": "2026-12-02T06:40:01.5+00:00",
        "timeline": [],
        "llm_calls": [
            {
                "attempt": 1,
                "model": "claude-sonnet-4-5",
                "status": "retry",
                "latency_ms": 12.4,
                "input_tokens": 10,
                "output_tokens": 0,
                "error_type": "RateLimitError",
                "error": "429 from the API",
            }
        ],
        "tool_calls": [call],
        "dead_letter": None,
    }


def _shown(event: dict[str, Any]) -> str:
    console = Console(record=True, width=200)
    show_event(console, event)
    return console.export_text()


def test_a_call_without_topic_is_held_in_the_outbox() -> None:
    text = _shown(_event())
    assert "#0 publishAlert  held in the outbox (no topic configured)" in text
    assert '{"title":"It broke"}' in text
    assert "received    2026-12-02 06:40:01Z" in text


def test_pending_and_dead_calls_say_why() -> None:
    arn = "arn:aws:sns:us-east-1:123456789012:alerts.fifo"
    pending = _shown(_event(topic_arn=arn, attempts=2, last_error="Throttled"))
    assert "pending (2 publish attempts, last error: Throttled)" in pending
    dead = _shown(_event(topic_arn=arn, status="dead", attempts=9, last_error="NotFound"))
    assert "dead (9 publish attempts, last error: NotFound)" in dead


def test_a_failed_attempt_shows_its_error() -> None:
    (row,) = [line for line in _shown(_event()).splitlines() if "claude-sonnet-4-5" in line]
    assert "retry" in row
    assert "12 ms" in row
    assert "RateLimitError 429 from the API" in row


def test_a_held_event_has_a_colour_of_its_own() -> None:
    assert status("held").style not in ("", status("processing").style, status("published").style)
