"""structlog: JSON when not on a terminal (containers), readable on a terminal."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping, MutableMapping
from typing import Any

import orjson
import structlog

from app.redaction import (
    may_hold_secret,
    payload_to_json,
    redact_payload,
    redact_text,
    secret_kind,
)

# Header names whose values must never reach a log line.
SECRET_HEADERS = frozenset(
    {
        "authorization",
        "x-hub-signature",
        "x-hub-signature-256",
        "webhook-signature",
        "x-api-key",
        "cookie",
        "proxy-authorization",
    }
)

# Log keys whose values are secrets whatever the call site meant to log.
SECRET_KEYS = SECRET_HEADERS | {
    "token",
    "admin_token",
    "secret",
    "api_key",
    "password",
    "signature",
}
REDACTED = "[redacted]"
# A string value longer than this is cut to its first and last LOG_VALUE_CHARS // 2
# characters before anything reads it: a sender can put 64 KiB of URL into a rejection's
# detail, and the redaction rules, the renderer and the log store need not read it all.
LOG_VALUE_CHARS = 4096


def redact_secrets(
    _: Any, __: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Replace secret values: by key (``SECRET_KEYS`` and any key naming a secret), inside a
    logged ``headers`` mapping, and credential-looking text in any string value, nested ones
    and the rendered exception included. Strings are cut to ``LOG_VALUE_CHARS`` first, so a
    line costs at most that much reading per value. The line's strings cost one scan together
    (``may_hold_secret``) unless one of them may hold a secret: a line is logged per webhook."""
    texts: list[str] = []
    # Lists of short strings (a decision's tool names) join the line's one scan, and are
    # walked as nested values only when it finds something.
    plain_lists: list[str] = []
    for key, value in event_dict.items():
        if _names_secret(key):
            event_dict[key] = REDACTED
        elif isinstance(value, str):
            if len(value) > LOG_VALUE_CHARS:
                event_dict[key] = value = cut(value)
            texts.append(value)
        elif isinstance(value, list | tuple) and _short_strings(value):
            event_dict[key] = list(value)
            texts.extend(value)
            plain_lists.append(key)
        elif isinstance(value, Mapping | list | tuple):
            event_dict[key] = _redact_nested(value)
    # The scan finds in the joined text whatever it finds in one of the strings (a newline
    # only adds a boundary), so one scan tells whether any of them needs the rules.
    if texts and may_hold_secret("\n".join(texts)):
        for key in plain_lists:
            event_dict[key] = _redact_nested(event_dict[key])
        for key, value in event_dict.items():
            if isinstance(value, str) and value != REDACTED:
                event_dict[key] = redact_text(value)
    headers = event_dict.get("headers")
    if isinstance(headers, Mapping):
        event_dict["headers"] = {
            name: REDACTED if str(name).lower() in SECRET_HEADERS else value
            for name, value in headers.items()
        }
    return event_dict


def _short_strings(values: list[Any] | tuple[Any, ...]) -> bool:
    return all(type(v) is str and len(v) <= LOG_VALUE_CHARS for v in values)


def _names_secret(key: str) -> bool:
    """Whether a log key names a secret; decided once per key (log keys are few and fixed)."""
    decided = _SECRET_LOG_KEYS.get(key)
    if decided is None:
        decided = key.lower() in SECRET_KEYS or secret_kind(key) is not None
        if len(_SECRET_LOG_KEYS) < 4096:  # call sites name their keys: a bounded set
            _SECRET_LOG_KEYS[key] = decided
    return decided


_SECRET_LOG_KEYS: dict[str, bool] = {}


def cut(text: str) -> str:
    """``text`` cut to its first and last ``LOG_VALUE_CHARS // 2`` characters, the cut
    marked with how many characters it took (``…[60000 characters cut]…``)."""
    if len(text) <= LOG_VALUE_CHARS:
        return text
    half = LOG_VALUE_CHARS // 2
    return f"{text[:half]}…[{len(text) - 2 * half} characters cut]…{text[-half:]}"


def _redact_nested(value: Any) -> Any:
    try:
        data = orjson.loads(payload_to_json(dict(value) if isinstance(value, Mapping) else value))
        return redact_payload(_cut_strings(data))
    except (TypeError, ValueError):
        # Not JSON (objects logged as they are) or nested beyond the limit: the renderer
        # would print their repr, which cannot be checked, so print nothing of them.
        return REDACTED


def _cut_strings(data: Any) -> Any:
    """JSON ``data`` with every string value ``cut`` (containers changed in place)."""
    if isinstance(data, str):
        return cut(data)
    stack = [data] if isinstance(data, dict | list) else []
    while stack:
        node = stack.pop()
        for key, value in node.items() if isinstance(node, dict) else enumerate(node):
            if isinstance(value, str) and len(value) > LOG_VALUE_CHARS:
                node[key] = cut(value)
            elif isinstance(value, dict | list):
                stack.append(value)
    return data


def add_timestamp(
    _: Any, __: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """``timestamp``: ISO 8601 in UTC with microseconds (``2026-12-01T22:39:51.333459Z``).
    The date and time up to the second are formatted once per second: a line is logged per
    webhook, and a ``datetime`` per line cost a fifth of that line."""
    global _second
    now = time.time()
    second = int(now)
    cached = _second  # one tuple, read once: threads log too
    if cached[0] != second:
        cached = _second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    event_dict["timestamp"] = f"{cached[1]}.{int((now - second) * 1_000_000):06d}Z"
    return event_dict


_second: tuple[int, str] = (-1, "")


def configure_logging(*, fmt: str = "auto", level: str = "info") -> None:
    json_output = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(serializer=_orjson_dumps)
        if json_output
        else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            add_timestamp,
            # Before redaction: an exception's message can carry a secret (a DSN, a token).
            structlog.processors.format_exc_info,
            redact_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
        ),
        logger_factory=StderrLogger,
        # One log line per webhook is on the ingest hot path: resolve the processor chain
        # once per logger, not on every call (StderrLogger keeps that safe, see there). A
        # logger keeps the configuration of its first use, so this runs before anything is
        # logged (first thing in the app's lifespan).
        cache_logger_on_first_use=True,
    )


def _orjson_dumps(value: Any, **_: Any) -> str:
    return orjson.dumps(value, default=repr).decode()


class StderrLogger:
    """Writes each rendered line to whatever ``sys.stderr`` is at that moment.

    A cached logger outlives a swap of ``sys.stderr`` (pytest's capture, a daemonizing
    process), so the stream is looked up per line instead of being captured once.
    """

    def __init__(self, *_: object) -> None:
        pass

    def msg(self, message: str) -> None:
        stream = sys.stderr
        stream.write(message + "\n")
        stream.flush()

    debug = info = warning = warn = error = critical = exception = fatal = log = msg
