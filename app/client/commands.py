"""``eventgate events list | show ID | tail``: a running gateway's events, read through its
admin API (``--url`` / ``EVENTGATE_URL``, ``--token`` / ``EVENTGATE_ADMIN_TOKEN``).

Every failure is one line on stderr and exit code 1, never a traceback; ``--json`` prints the
API's answer as it is, for scripts.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import orjson
import typer
from rich.text import Text

from app.admin.schemas import EventStatusName
from app.client.admin import DEFAULT_URL, AdminApiError, AdminClient
from app.client.render import console, event_line, events_table, plain, show_event

events = typer.Typer(help="Events of a running gateway (its admin API).", no_args_is_help=True)

UrlOpt = Annotated[
    str, typer.Option("--url", envvar="EVENTGATE_URL", help="the gateway's base URL")
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="EVENTGATE_ADMIN_TOKEN",
        help="the gateway's admin token",
        show_default=False,
    ),
]
StatusOpt = Annotated[EventStatusName | None, typer.Option("--status")]
SourceOpt = Annotated[str | None, typer.Option("--source", help="a source name of the config")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the API's JSON answer")]
# The admin API's page limit.
MAX_LIMIT = 500


def _fail(exc: AdminApiError) -> typer.Exit:
    console(stderr=True).print(Text("error: ", style="bold red") + plain(exc), soft_wrap=True)
    return typer.Exit(1)


def _print_json(value: Any) -> None:
    typer.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


@events.command("list")
def list_events(
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    status: StatusOpt = None,
    source: SourceOpt = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=MAX_LIMIT)] = 20,
    as_json: JsonOpt = False,
) -> None:
    """Stored events, newest first."""
    try:
        with AdminClient(url=url, token=token) as client:
            page = client.events(status=status, source=source, limit=limit)
    except AdminApiError as exc:
        raise _fail(exc) from None
    if as_json:
        _print_json(page)
    else:
        console().print(events_table(page))


@events.command("show")
def show(
    event_id: Annotated[str, typer.Argument(help="an event id (evt_...)")],
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One event: status, timeline, each LLM attempt and each tool call."""
    try:
        with AdminClient(url=url, token=token) as client:
            event = client.event(event_id)
    except AdminApiError as exc:
        raise _fail(exc) from None
    if as_json:
        _print_json(event)
    else:
        show_event(console(), event)


@events.command("tail")
def tail(
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
    status: StatusOpt = None,
    source: SourceOpt = None,
    count: Annotated[
        int | None, typer.Option("--count", min=1, help="stop after this many new events")
    ] = None,
    last: Annotated[
        int, typer.Option("--last", min=0, max=MAX_LIMIT, help="first print the newest N")
    ] = 0,
    interval: Annotated[float, typer.Option("--interval", min=0.05, help="seconds")] = 1.0,
) -> None:
    """Print events as they appear (a worker stored them), until --count or Ctrl-C.

    With --status, an event appears when it reaches that status (e.g. published)."""
    # Polls the newest page of the list: an event is new when the previous page lacked it.
    out, err = console(), console(stderr=True)
    printed = 0
    try:
        with AdminClient(url=url, token=token) as client:

            def newest() -> list[dict[str, Any]]:
                page = client.events(status=status, source=source, limit=MAX_LIMIT)
                items: list[dict[str, Any]] = page["items"]
                return items

            items = newest()
            for item in reversed(items[:last]):
                out.print(event_line(item))
            seen = {item["event_id"] for item in items}
            err.print(Text(f"watching {client.url} for new events (Ctrl-C to stop)", "dim"))
            while count is None or printed < count:
                time.sleep(interval)
                items = newest()
                for item in reversed([i for i in items if i["event_id"] not in seen]):
                    out.print(event_line(item))
                    printed += 1
                    if count is not None and printed >= count:
                        break
                # Bounded: an event that left the newest page is not coming back to it.
                seen = {item["event_id"] for item in items}
    except AdminApiError as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:
        return
