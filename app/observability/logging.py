"""structlog: JSON when not on a terminal (containers), readable on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog

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


def configure_logging(*, fmt: str = "auto", level: str = "info") -> None:
    json_output = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
