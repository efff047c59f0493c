"""Generic JSON senders (``type: standard-webhooks|hmac|token``): Standard Webhooks, a
configurable HMAC scheme, or a bearer token.

These carry in-house events and IoT telemetry: one JSON reading, or an array of readings.
With ``split: true`` an array becomes one event per reading (a batch), each with its own
group key (the configured path, e.g. the device id) so one device's readings stay in order
without holding up another's. Without ``split`` the array is one event.

Delivery ids, in order of preference: the Standard Webhooks ``webhook-id``, the configured
``delivery_header``, the configured ``delivery_id`` path, a hash of the content. A reading of
a split batch adds its position (``<id>#<i>``) or, with only a content hash, hashes itself,
so a sender retrying the same batch is deduplicated reading by reading. A ``delivery_header``
is not signed: with an HMAC scheme, the signed material's digest (``#<i>`` per reading) is a
second identity, so a replay under a new delivery id is a duplicate too.
"""

from __future__ import annotations

from typing import Any

from app.payloads import content_hash, resolve_key
from app.source_config import SourceConfig
from app.sources.admission import Admitted, Body, StreamedMac, verify_whole
from app.sources.auth import DEFAULT_TOLERANCE, HmacDefaults, build_authenticator
from app.sources.base import (
    AdapterDeps,
    Batch,
    Described,
    Headers,
    SourceKind,
    media_type,
    parse_json,
    signed_digest,
)
from app.sources.exceptions import InvalidPayload
from app.sources.signatures import standard_webhooks_admission, standard_webhooks_key

GENERIC_HMAC = HmacDefaults(header="X-Signature")


class GenericSource:
    def __init__(self, name: str, config: SourceConfig) -> None:
        self.name = name
        self.config = config
        self.standard = config.type == "standard-webhooks"
        if self.standard:
            self.keys = [standard_webhooks_key(s) for s in config.secrets()]
        else:
            self.authenticate = build_authenticator(config, hmac_defaults=GENERIC_HMAC)

    def admit(self, headers: Headers) -> Admitted | StreamedMac:
        if not self.standard:
            return self.authenticate.admit(headers)
        return standard_webhooks_admission(
            keys=self.keys,
            msg_id=headers.get("webhook-id"),
            timestamp=headers.get("webhook-timestamp"),
            signature_header=headers.get("webhook-signature"),
            tolerance_seconds=self.config.tolerance_seconds or DEFAULT_TOLERANCE,
        )

    async def verify(self, headers: Headers, body: Body) -> None:
        await verify_whole(self.admit(headers), body)

    async def describe(self, headers: Headers, body: Body) -> list[Described]:
        payload = parse_json(body, media_type(headers))
        base_id = self._request_id(headers)
        signed = self._replay_id(headers, body) if base_id else None
        if not isinstance(payload, list) or not self.config.split:
            delivery = base_id or resolve_key(payload, self.config.delivery_id)
            return [self._event(payload, delivery or content_hash(payload), None, signed)]
        events = Batch()
        for index, reading in enumerate(payload):
            if not isinstance(reading, dict):
                raise InvalidPayload(f"reading {index} is not a JSON object")
            own = resolve_key(reading, self.config.delivery_id)
            delivery = own or (f"{base_id}#{index}" if base_id else content_hash(reading))
            replay = f"{signed}#{index}" if signed and not own else None
            events.append(self._event(reading, delivery, index, replay))
        return events

    def _replay_id(self, headers: Headers, body: Body) -> str | None:
        """Only the header-borne ids of an HMAC scheme need one (webhook-id is signed)."""
        if self.standard or not self.config.secrets():
            return None
        scheme = self.config.signature
        stamp = scheme.timestamp_header if scheme else None
        return signed_digest(body, timestamp=headers.get(stamp.lower()) if stamp else None)

    def _request_id(self, headers: Headers) -> str | None:
        if self.standard:
            return headers.get("webhook-id")
        if self.config.delivery_header:
            return headers.get(self.config.delivery_header.lower()) or None
        return None

    def _event(
        self, payload: Any, delivery: str, index: int | None, replay_id: str | None
    ) -> Described:
        event_type = resolve_key(payload, self.config.event_type or "type")
        return Described(
            type=event_type or ("reading" if index is not None else "webhook"),
            delivery_id=delivery,
            group_key=resolve_key(payload, self.config.group_key) or self.name,
            payload=payload,
            batch_index=index,
            replay_id=replay_id,
        )


def _adapter(name: str, config: SourceConfig, _: AdapterDeps) -> GenericSource:
    return GenericSource(name, config)


# How the payload is read into events: a type path, a split, and the delivery identity.
PAYLOAD_KEYS = frozenset({"event_type", "split", "delivery_id", "delivery_header"})
STANDARD_WEBHOOKS = SourceKind(
    name="standard-webhooks",
    keys=frozenset({"secret", "event_type", "split", "delivery_id"}),
    needs=("secret",),
    adapter=_adapter,
)
HMAC = SourceKind(
    name="hmac",
    keys=frozenset({"secret", "signature"}) | PAYLOAD_KEYS,
    needs=("secret",),
    adapter=_adapter,
)
TOKEN = SourceKind(
    name="token", keys=frozenset({"token"}) | PAYLOAD_KEYS, needs=("token",), adapter=_adapter
)
