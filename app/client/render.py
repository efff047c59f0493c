"""Admin API answers as rich tables and lines (colours on a terminal, plain text otherwise)."""

from __future__ import annotations

import os
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


def when(value: Any) -> str:
    """An API time (ISO 8601, UTC) as ``2026-12-02 06:40:01Z``; ``-`` when absent."""
    if not isinstance(value, str):
        return "-"
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return value
    return parsed.strftime("%Y-%m-%d %H:%M:%SZ")


def status(value: Any) -> Text:
    return Text(str(value), style=STATUS_STYLES.get(str(value), ""))


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
        row: list[str | Text] = [
            when(item.get("received_at")),
            item["event_id"],
            item.get("source") or "-",
            item.get("type") or "-",
            item.get("group_key") or "-",
            status(item["status"]),
        ]
        if with_errors:
            row.append(item.get("error") or "")
        table.add_row(*row)
    more = " (more: raise --limit)" if page.get("next_cursor") else ""
    footer = Text(f"{len(items)} of {page['total']} events, newest first{more}", style="dim")
    return Group(table, footer) if items else Group(Text("no events", style="dim"))


def event_line(item: dict[str, Any]) -> Text:
    """One event on one line, for ``events tail``."""
    line = Text()
    line.append(when(item.get("received_at")), style="dim")
    line.append(f"  {item['event_id']}  ")
    line.append(f"{item.get('source') or '-'}  {item.get('type') or '-'}  ")
    line.append(f"{item.get('group_key') or '-'}  ", style="dim")
    line.append_text(status(item["status"]))
    if item.get("error"):
        line.append(f"  {item['error']}", style="red")
    return line


def show_event(console: Console, event: dict[str, Any]) -> None:
    """The event, its timeline, each Claude attempt and each tool call with its publish state."""
    head = Text()
    head.append("event ", style="bold")
    head.append(f"{event['event_id']}  ", style="bold")
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
            facts.add_row(label, value)
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
        replayed = f" (replayed {when(dead.get('replayed_at'))})" if dead.get("replayed_at") else ""
        console.print(
            Text(f"dead letter {dead['id']}: {dead['stage']}: {dead['reason']}{replayed}", "red")
        )


def _timeline(entries: list[dict[str, Any]]) -> Table:
    table = Table(title="timeline", title_justify="left", header_style="bold")
    table.add_column("at (UTC)", no_wrap=True)
    table.add_column("stage", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for entry in entries:
        table.add_row(when(entry.get("at")), entry["stage"], entry.get("detail") or "")
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
        row: list[str | Text] = [
            str(call.get("attempt", "")),
            str(call.get("model", "")),
            Text(outcome, style=ATTEMPT_STYLES.get(outcome, "red")),
            f"{float(call.get('latency_ms') or 0):.0f} ms",
            f"{call.get('input_tokens') or 0}/{call.get('output_tokens') or 0}",
        ]
        if cached:
            row.append(_cache(call))
        row += [f"${float(call.get('cost_usd') or 0):.6f}", str(call.get("stop_reason") or "-")]
        if failed:
            row.append(" ".join(str(v) for v in (call.get("error_type"), call.get("error")) if v))
        table.add_row(*row)
    return table


def _cache(call: dict[str, Any]) -> str:
    written = call.get("cache_creation_input_tokens") or 0
    read = call.get("cache_read_input_tokens") or 0
    return f"{written}/{read}" if written or read else ""


def _tool_call(call: dict[str, Any]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(overflow="fold")
    title = Text(f"#{call.get('seq')} ", style="bold")
    title.append(str(call.get("tool")), style="bold")
    if call.get("generation"):
        title.append(f" (generation {call['generation']})", style="dim")
    grid.add_row(title, publish_state(call))
    message = call.get("message")
    tool_input = message.get("input") if isinstance(message, dict) else None
    grid.add_row("input", orjson.dumps(tool_input).decode())
    grid.add_row("group id", str(call.get("group_id")))
    grid.add_row("dedup id", str(call.get("dedup_id")))
    grid.add_row("topic", str(call.get("topic_arn") or "none configured"))
    return grid


def publish_state(call: dict[str, Any]) -> Text:
    """Where the tool call is: published (with its SNS message id), held, pending or dead."""
    state = str(call.get("status"))
    style = PUBLISH_STYLES.get(state, "")
    if state == "published":
        text = f"published, SNS message id {call.get('sns_message_id')}"
        if call.get("sns_sequence_number"):
            text += f" (sequence {call['sns_sequence_number']})"
        return Text(text, style=style)
    if state == "pending" and not call.get("topic_arn"):
        return Text("held in the outbox (no topic configured)", style=style)
    error = f", last error: {call['last_error']}" if call.get("last_error") else ""
    attempts = call.get("attempts") or 0
    return Text(f"{state} ({attempts} publish attempts{error})", style=style)
