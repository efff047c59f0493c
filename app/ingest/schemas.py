"""The answers of the ingest endpoint (the OpenAPI schema of its bodies)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

EventStatusWord = Literal["queued", "duplicate", "ignored", "filtered", "collapsed"]


class IngestResponse(BaseModel):
    """One event per request: ``{"event_id", "status"}`` (+ ``detail`` when not queued).

    ``event_id`` is left out when no event exists for the answer (ignored, filtered)."""

    event_id: str | None = None
    status: EventStatusWord
    detail: str | None = None


class BatchIngestResponse(BaseModel):
    """A batch request (CloudEvents batch mode, ``split: true``): one entry per event, in
    request order. 202 when at least one event was queued, else 200."""

    events: list[IngestResponse]
