"""CloudEvents 1.0 over HTTP (``type: cloudevents``): structured, binary and batch content modes.

- structured: ``Content-Type: application/cloudevents+json``, the body is the event;
- batch: ``application/cloudevents-batch+json``, the body is an array of events;
- binary: attributes in ``ce-*`` headers, the body is the event's ``data`` in its own
  content type (JSON is parsed, other text and form bodies kept as a string, anything else
  becomes ``data_base64``, as structured mode carries binary data). A form body is text:
  as a string, filters, Claude and the redaction of its fields read it like any text
  (``password=...`` in base64 is not redacted).

Every mode becomes the structured form (``specversion``, ``id``, ``source``, ``type``,
``subject``, ``time``, ``data`` and extensions), so group-key paths and filters read the same
whatever the mode. ``source + id`` identifies an event (the spec's uniqueness rule), which is
the dedup identity. Auth is a bearer token or an HMAC over the raw body; in binary mode the
``ce-*`` headers are outside the HMAC (Knative and Event Grid do not sign them either), so
with an HMAC secret a binary event also carries the signed body's digest as a second dedup
identity: the same signed body under a new ``ce-id`` is a duplicate.
"""

from __future__ import annotations

import base64
from dataclasses import replace
from typing import Any
from urllib.parse import unquote

from app.payloads import dotted, resolve_key
from app.source_config import SourceConfig
from app.sources.admission import Admitted, Body, StreamedMac, verify_whole
from app.sources.auth import HmacDefaults, build_authenticator
from app.sources.base import (
    AdapterDeps,
    Batch,
    Described,
    Headers,
    Lines,
    SourceKind,
    media_type,
    parse_json,
    signed_digest,
)
from app.sources.exceptions import InvalidPayload

STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"
REQUIRED = ("id", "source", "type")
CE_HMAC = HmacDefaults(header="X-Signature")
# Binary-mode bodies kept as text besides text/*.
_TEXT_MEDIA = frozenset(
    {"application/xml", "application/x-yaml", "application/x-www-form-urlencoded"}
)


class CloudEventsSource:
    def __init__(self, name: str, config: SourceConfig) -> None:
        self.name = name
        self.group_key = config.group_key
        self.signed = bool(config.secrets())
        self.timestamp_header = config.signature.timestamp_header if config.signature else None
        self.authenticate = build_authenticator(config, hmac_defaults=CE_HMAC)

    def admit(self, headers: Headers) -> Admitted | StreamedMac:
        return self.authenticate.admit(headers)

    async def verify(self, headers: Headers, body: Body) -> None:
        await verify_whole(self.admit(headers), body)

    async def describe(self, headers: Headers, body: Body) -> list[Described]:
        media = media_type(headers)
        if media == BATCH:
            batch = parse_json(body, media)
            if not isinstance(batch, list):
                raise InvalidPayload("a CloudEvents batch is a JSON array")
            return Batch(self._event(_checked(e, f"event {i}"), i) for i, e in enumerate(batch))
        if media == STRUCTURED:
            return [self._event(_checked(parse_json(body, media), "event"), None)]
        if "ce-specversion" in headers:
            event = self._event(_checked(_from_binary(headers, body, media), "event"), None)
            if not self.signed:
                return [event]
            stamp = headers.get(self.timestamp_header.lower()) if self.timestamp_header else None
            return [replace(event, replay_id=signed_digest(body, timestamp=stamp))]
        raise InvalidPayload(
            f"not a CloudEvent: expected {STRUCTURED}, {BATCH} or ce-* headers (binary mode)"
        )

    def _event(self, event: dict[str, Any], index: int | None) -> Described:
        group = resolve_key(event, self.group_key) or event.get("subject") or event["source"]
        return Described(
            type=str(event["type"]),
            delivery_id=f"{event['source']}\n{event['id']}",
            group_key=str(group),
            payload=event,
            batch_index=index,
        )


def _checked(event: Any, where: str) -> dict[str, Any]:
    if not isinstance(event, dict):
        raise InvalidPayload(f"{where}: a CloudEvent is a JSON object")
    if str(event.get("specversion")) != "1.0":
        raise InvalidPayload(f"{where}: specversion must be '1.0'")
    missing = [a for a in REQUIRED if not isinstance(event.get(a), str) or not event[a]]
    if missing:
        raise InvalidPayload(f"{where}: missing required attribute(s) {', '.join(missing)}")
    return event


def _from_binary(headers: Headers, body: Body, media: str) -> dict[str, Any]:
    event: dict[str, Any] = {
        # Header values are percent-encoded where they are not printable ASCII (HTTP binding).
        name.lower().removeprefix("ce-"): unquote(value)
        for name, value in headers.items()
        if name.lower().startswith("ce-")
    }
    if media:
        event["datacontenttype"] = headers.get("content-type", media)
    if not body:
        return event
    if not media or media == "application/json" or media.endswith("+json"):
        event["data"] = parse_json(body)
    elif media.startswith("text/") or media in _TEXT_MEDIA:
        event["data"] = body.decode("utf-8", "replace")
    else:
        event["data_base64"] = base64.b64encode(body).decode()
    return event


def summary(event_type: str, p: dict[str, Any]) -> Lines:
    fields = [("what", "type"), ("where", "source"), ("subject", "subject"), ("time", "time")]
    return [(label, dotted(p, path)) for label, path in fields]


def _adapter(name: str, config: SourceConfig, _: AdapterDeps) -> CloudEventsSource:
    return CloudEventsSource(name, config)


KIND = SourceKind(
    name="cloudevents",
    keys=frozenset({"secret", "signature", "token"}),
    needs=("token", "secret"),
    adapter=_adapter,
    summary=summary,
)
