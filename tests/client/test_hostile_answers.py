"""What a gateway (or anything at --url) answers is data, never instructions to the
terminal: rich markup, ANSI escapes, OSC 8 links, carriage returns and bidi controls in any
field are shown as text; and an answer that is not the admin API's shape is one error line."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from typer.testing import CliRunner, Result

from app.cli import app as cli
from app.client.admin import MAX_ANSWER_BYTES
from tests.client.conftest import Answer, FakeAdmin

MARKUP = ["[red]boom[/red]", "[link=https://evil.example]click[/link]", ":warning:", "[bold"]
CONTROLS = ["\x1b", "\x9b", "\r", "\x07", "\x08", "\u202e", "\u2066"]
HOSTILE = (
    " ".join(MARKUP)
    + " \x1b[2J\x1b[31mred\x1b[0m \x1b]8;;https://evil.example\x1b\\here\x1b]8;;\x1b\\"
    + " ok\rFAKE \x9b31m \x07\x08 \u202eevil \u2066x"
    + "\nevt_forged  published"
)


def _item(event_id: str) -> dict[str, Any]:
    return {
        "event_id": event_id,
        "source": HOSTILE,
        "type": HOSTILE,
        "group_key": HOSTILE,
        "status": "dead_lettered",
        "received_at": HOSTILE,
        "updated_at": HOSTILE,
        "generation": 1,
        "error": HOSTILE,
    }


def _event() -> dict[str, Any]:
    return _item("evt_1") | {
        "timeline": [{"at": HOSTILE, "stage": HOSTILE, "detail": HOSTILE}],
        "llm_calls": [
            {
                "attempt": HOSTILE,
                "model": HOSTILE,
                "status": HOSTILE,
                "latency_ms": 1.0,
                "input_tokens": HOSTILE,
                "output_tokens": HOSTILE,
                "cost_usd": 0.5,
                "stop_reason": HOSTILE,
                "error_type": HOSTILE,
                "error": HOSTILE,
                "response_text": HOSTILE,
            }
        ],
        "tool_calls": [
            {
                "seq": HOSTILE,
                "tool": HOSTILE,
                "generation": HOSTILE,
                "status": "dead",
                "attempts": HOSTILE,
                "last_error": HOSTILE,
                "group_id": HOSTILE,
                "dedup_id": HOSTILE,
                "topic_arn": HOSTILE,
                "message": {"input": {HOSTILE: HOSTILE, "list": [HOSTILE]}},
            },
            {
                "seq": 1,
                "tool": "t",
                "status": "published",
                "sns_message_id": HOSTILE,
                "sns_sequence_number": HOSTILE,
                "message": {"input": None},
            },
        ],
        "dead_letter": {"id": HOSTILE, "stage": HOSTILE, "reason": HOSTILE, "replayed_at": HOSTILE},
    }


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), env={"COLUMNS": "250"})


def assert_inert(output: str) -> None:
    for control in CONTROLS:
        assert control not in output, repr(control)
    for markup in MARKUP:
        assert markup in output
    assert "⚠" not in output
    # A newline in a field never starts a line of its own.
    assert not [line for line in output.splitlines() if line.lstrip().startswith("evt_forged")]


def test_list_shows_every_field_as_text(fake_admin: FakeAdmin) -> None:
    fake_admin.answer_list({"items": [_item("evt_1")], "total": 1, "next_cursor": None})
    result = run("events", "list", "--url", fake_admin.url, "--token", "t")
    assert result.exit_code == 0, result.output
    assert_inert(result.stdout)
    assert "\\x1b[31m" in result.stdout  # shown, not obeyed


def test_show_shows_every_field_as_text(fake_admin: FakeAdmin) -> None:
    fake_admin.answer_event(_event())
    result = run("events", "show", "evt_1", "--url", fake_admin.url, "--token", "t")
    assert result.exit_code == 0, result.output
    assert_inert(result.stdout)
    assert "\\x1b[31m" in result.stdout


def test_tail_shows_every_field_as_text(fake_admin: FakeAdmin) -> None:
    first = {"items": [_item("evt_1")], "total": 1, "next_cursor": None}
    then = {"items": [_item("evt_2"), _item("evt_1")], "total": 2, "next_cursor": None}
    fake_admin.answer_list(first, then)
    result = run(
        "events",
        "tail",
        "--url",
        fake_admin.url,
        "--token",
        "t",
        "--last",
        "1",
        "--count",
        "1",
        "--interval",
        "0.05",
    )
    assert result.exit_code == 0, result.output
    assert_inert(result.stdout)
    assert "evt_1" in result.stdout and "evt_2" in result.stdout


def test_an_error_detail_is_shown_as_text(fake_admin: FakeAdmin) -> None:
    fake_admin.answer_everything(
        Answer(orjson.dumps({"error": HOSTILE, "detail": HOSTILE}), status=500)
    )
    result = run("events", "list", "--url", fake_admin.url, "--token", "t")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert_inert(result.stderr)


NOT_A_PAGE = [
    {},
    [],
    "events",
    42,
    None,
    {"items": "evt_1", "total": 1},
    {"items": [1], "total": 1},
    {"items": [{}], "total": 1},
    {"items": [{"event_id": 1, "status": "published"}], "total": 1},
    {"items": [{"event_id": "evt_1", "status": None}], "total": 1},
    {"items": [], "total": "many"},
    {"items": [], "total": True},
]
NOT_AN_EVENT = [
    {},
    [],
    "evt_1",
    {"event_id": "evt_1"},
    {"event_id": "evt_1", "status": "published", "timeline": "none"},
    {"event_id": "evt_1", "status": "published", "timeline": [1]},
    {"event_id": "evt_1", "status": "published", "llm_calls": [{"latency_ms": "slow"}]},
    {"event_id": "evt_1", "status": "published", "llm_calls": [{"cost_usd": "free"}]},
    {"event_id": "evt_1", "status": "published", "tool_calls": {"0": {}}},
    {"event_id": "evt_1", "status": "published", "dead_letter": "yes"},
]
NOT_JSON = [
    Answer(b"", content_type="text/plain"),
    Answer(b"ok", content_type="text/plain"),
    Answer(
        b"<!doctype html><html><body>Sign in to the proxy</body></html>", content_type="text/html"
    ),
    Answer(b"\xff\xfe\x00garbage"),
    Answer(b'{"items": [}'),
    Answer(b"[" * 100_000 + b"]" * 100_000),
    Answer(b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
]


def assert_one_error_line(result: Result, url: str) -> str:
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.stdout == ""
    assert "Traceback" not in result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {url} answered ")
    return line


@pytest.mark.parametrize("page", NOT_A_PAGE)
def test_list_and_tail_refuse_an_answer_that_is_not_a_page(
    fake_admin: FakeAdmin, page: object
) -> None:
    fake_admin.answer_list(page)
    for command in (["list"], ["tail", "--count", "1", "--interval", "0.05"]):
        result = run("events", *command, "--url", fake_admin.url, "--token", "t")
        line = assert_one_error_line(result, fake_admin.url)
        assert "not the admin API's" in line


@pytest.mark.parametrize("event", NOT_AN_EVENT)
def test_show_refuses_an_answer_that_is_not_an_event(fake_admin: FakeAdmin, event: object) -> None:
    fake_admin.answer_event(event)
    result = run("events", "show", "evt_1", "--url", fake_admin.url, "--token", "t")
    line = assert_one_error_line(result, fake_admin.url)
    assert "not the admin API's" in line


@pytest.mark.parametrize("answer", NOT_JSON, ids=lambda a: a.body[:12].decode("latin-1"))
def test_an_answer_that_is_not_json_is_one_error_line(
    fake_admin: FakeAdmin, answer: Answer
) -> None:
    fake_admin.answer_everything(answer)
    for command in (["list"], ["show", "evt_1"], ["tail", "--count", "1"]):
        result = run("events", *command, "--url", fake_admin.url, "--token", "t")
        line = assert_one_error_line(result, fake_admin.url)
        assert "is --url an eventgate gateway?" in line


@pytest.mark.parametrize("status", [200, 500])
def test_an_endless_answer_is_cut_off(fake_admin: FakeAdmin, status: int) -> None:
    """Read up to MAX_ANSWER_BYTES, then one error line: never all of it into memory."""
    fake_admin.answer_everything(Answer(b"[" + b" " * 65535, status=status, endless=True))
    for command in (["list"], ["show", "evt_1"], ["tail", "--count", "1"]):
        result = run("events", *command, "--url", fake_admin.url, "--token", "t")
        line = assert_one_error_line(result, fake_admin.url)
        assert f"more than {MAX_ANSWER_BYTES // 2**20} MiB" in line
