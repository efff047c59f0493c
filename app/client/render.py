"""Admin API answers as rich tables and lines (colours on a terminal, plain text otherwise).

Every value of an answer goes through ``plain``: what a gateway (or whatever answers at
``--url``) sends is shown, never obeyed by rich or by the terminal.
"""

from __future__ import annotations

import os
import re
from datetime import datetime
from typing import Any

import orjson
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

STATUS_STYLES = {
    "queued": "yellow",
    "processing": "yellow",
    "held": "magenta",
    "published": "green",
    "no_action": "cyan",
    "filtered": "cyan",
    "dead_lettered": "bold red",
    "windowed": "cyan",
}
ATTEMPT_STYLES = {"ok": "green", "retry": "yellow", "unknown": "yellow"}
PUBLISH_STYLES = {"published": "green", "pending": "yellow", "dead": "bold red"}


# Width when the output is not a terminal (a pipe, a file): lines are not folded at 80.
PIPE_WIDTH = 200


def console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr); a pipe gets ``PIPE_WIDTH`` unless COLUMNS says."""
    out = Console(stderr=stderr)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = PIPE_WIDTH
    return out


# C0 and C1 controls (ESC starts ANSI and OSC 8 sequences; C1 0x9b is a CSI on its own),
# DEL, the line and paragraph separators, and the bidi controls that reorder what follows.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def plain(value: object, style: str = "") -> Text:
    """A value of an answer as inert text: a ``Text`` is never parsed for rich markup
    (``[red]``, ``[link=...]``, ``:emoji:`` stay as written), and each control character is
    written as its escape (``\\x1b``), so a field can neither restyle nor move the cursor
    nor start a line of its own (``\\n``, ``\\r``)."""
    return Text(_UNPRINTABLE.sub(_escape, str(value)), style=style)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def when(value: Any, style: str = "") -> Text:
    """An API time (ISO 8601, UTC) as ``2026-12-02 06:40:01Z``; ``-`` when absent."""
    if not isinstance(value, str):
        return Text("-", style=style)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return plain(value, style)
    return Text(parsed.strftime("%Y-%m-%d %H:%M:%SZ"), style=style)


def status(value: Any) -> Text:
    return plain(value, STATUS_STYLES.get(str(value), ""))


def events_table(page: dict[str, Any]) -> Group:
    items: list[dict[str, Any]] = page["items"]
    table = Table(header_style="bold", box=box.SIMPLE_HEAD)
    table.add_column("received (UTC)", no_wrap=True)
    table.add_column("event", overflow="fold", min_width=12)
    table.add_column("source", overflow="fold", min_width=6)
    table.add_column("type", overflow="fold", min_width=6)
    table.add_column("group key", overflow="fold", min_width=6)
    table.add_column("status", no_wrap=True)
    with_errors = any(item.get("error") for item in items)
    if with_errors:
        table.add_column("error", overflow="fold")
    for item in items:
        row = [
            when(item.get("received_at")),
            plain(item["event_id"]),
            plain(item.get("source") or "-"),
            plain(item.get("type") or "-"),
            plain(item.get("group_key") or "-"),
            status(item["status"]),
        ]
        if with_errors:
            row.append(plain(item.get("error") or ""))
        table.add_row(*row)
    more = " (more: raise --limit)" if page.get("next_cursor") else ""
    footer = plain(f"{len(items)} of {page['total']} events, newest first{more}", "dim")
    return Group(table, footer) if items else Group(Text("no events", style="dim"))


def event_line(item: dict[str, Any]) -> Text:
    """One event on one line, for ``events tail``."""
    line = when(item.get("received_at"), "dim")
    line.append_text(plain(f"  {item['event_id']}  "))
    line.append_text(plain(f"{item.get('source') or '-'}  {item.get('type') or '-'}  "))
    line.append_text(plain(f"{item.get('group_key') or '-'}  ", "dim"))
    line.append_text(status(item["status"]))
    if item.get("error"):
        line.append_text(plain(f"  {item['error']}", "red"))
    return line


def show_event(console: Console, event: dict[str, Any]) -> None:
    """The event, its timeline, each Claude attempt and each tool call with its publish state."""
    head = Text("event ", style="bold")
    head.append_text(plain(f"{event['event_id']}  ", "bold"))
    head.append_text(status(event["status"]))
    console.print(head)
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="dim")
    facts.add_column(overflow="fold")
    for label, value in (
        ("source", event.get("source")),
        ("type", event.get("type")),
        ("group key", event.get("group_key")),
        ("received", when(event.get("received_at")) if event.get("received_at") else None),
        ("updated", when(event.get("updated_at")) if event.get("updated_at") else None),
        ("generation", str(event.get("generation") or 0)),
        ("error", event.get("error")),
    ):
        if value:
            facts.add_row(label, value if isinstance(value, Text) else plain(value))
    console.print(facts)
    console.print(_timeline(event.get("timeline") or []))
    calls = event.get("llm_calls") or []
    console.print(_attempts(calls) if calls else Text("no LLM attempts yet", style="dim"))
    tools = event.get("tool_calls") or []
    if tools:
        console.print(Text("tool calls", style="bold"))
        for call in tools:
            console.print(_tool_call(call))
    else:
        console.print(Text("no tool calls", style="dim"))
    dead = event.get("dead_letter")
    if dead:
        line = plain(
            f"dead letter {dead.get('id')}: {dead.get('stage')}: {dead.get('reason')}", "red"
        )
        if dead.get("replayed_at"):
            line.append_text(plain(f" (replayed {when(dead['replayed_at'])})", "red"))
        console.print(line)


def _timeline(entries: list[dict[str, Any]]) -> Table:
    table = Table(title="timeline", title_justify="left", header_style="bold")
    table.add_column("at (UTC)", no_wrap=True)
    table.add_column("stage", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for entry in entries:
        table.add_row(
            when(entry.get("at")), plain(entry.get("stage")), plain(entry.get("detail") or "")
        )
    return table


def _attempts(calls: list[dict[str, Any]]) -> Table:
    table = Table(title="LLM attempts", title_justify="left", header_style="bold")
    table.add_column("#", no_wrap=True)
    table.add_column("model", overflow="fold", min_width=12)
    table.add_column("status", no_wrap=True)
    table.add_column("latency", no_wrap=True, justify="right")
    table.add_column("tokens", no_wrap=True, justify="right")
    cached = any(_cache(call) for call in calls)
    if cached:
        table.add_column("cache w/r", no_wrap=True, justify="right")
    table.add_column("cost", no_wrap=True, justify="right")
    table.add_column("stop", overflow="fold", min_width=8)
    failed = any(call.get("error_type") or call.get("error") for call in calls)
    if failed:
        table.add_column("error", overflow="fold")
    for call in calls:
        outcome = str(call.get("status"))
        row = [
            plain(call.get("attempt", "")),
            plain(call.get("model", "")),
            plain(outcome, ATTEMPT_STYLES.get(outcome, "red")),
            plain(f"{float(call.get('latency_ms') or 0):.0f} ms"),
            plain(f"{call.get('input_tokens') or 0}/{call.get('output_tokens') or 0}"),
        ]
        if cached:
            row.append(_cache(call))
        row += [
            plain(f"${float(call.get('cost_usd') or 0):.6f}"),
            plain(call.get("stop_reason") or "-"),
        ]
        if failed:
            error = " ".join(str(v) for v in (call.get("error_type"), call.get("error")) if v)
            row.append(plain(error))
        table.add_row(*row)
    return table


def _cache(call: dict[str, Any]) -> Text:
    written = call.get("cache_creation_input_tokens") or 0
    read = call.get("cache_read_input_tokens") or 0
    return plain(f"{written}/{read}" if written or read else "")


def _tool_call(call: dict[str, Any]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(overflow="fold")
    title = plain(f"#{call.get('seq')} {call.get('tool')}", "bold")
    if call.get("generation"):
        title.append_text(plain(f" (generation {call['generation']})", "dim"))
    grid.add_row(title, publish_state(call))
    message = call.get("message")
    tool_input = message.get("input") if isinstance(message, dict) else None
    grid.add_row("input", plain(orjson.dumps(tool_input).decode()))
    grid.add_row("group id", plain(call.get("group_id")))
    grid.add_row("dedup id", plain(call.get("dedup_id")))
    grid.add_row("topic", plain(call.get("topic_arn") or "none configured"))
    return grid


def publish_state(call: dict[str, Any]) -> Text:
    """Where the tool call is: published (with its SNS message id), held, pending or dead."""
    state = str(call.get("status"))
    style = PUBLISH_STYLES.get(state, "")
    if state == "published":
        text = f"published, SNS message id {call.get('sns_message_id')}"
        if call.get("sns_sequence_number"):
            text += f" (sequence {call['sns_sequence_number']})"
        return plain(text, style)
    if state == "pending" and not call.get("topic_arn"):
        return Text("held in the outbox (no topic configured)", style=style)
    error = f", last error: {call['last_error']}" if call.get("last_error") else ""
    attempts = call.get("attempts") or 0
    return plain(f"{state} ({attempts} publish attempts{error})", style)
