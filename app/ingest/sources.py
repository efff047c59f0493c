"""Source adapters: one per ``type:`` in the config.

An adapter verifies the request (over the raw body, before parsing) and reads the parsed
payload into what the queue needs: event type, delivery id (the sender's retry identity) and
group key. ``describe`` returning None means "answer, but do not queue" (GitHub's ping).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from app.config import SourceConfig
from app.ingest.exceptions import InvalidPayload
from app.ingest.signatures import (
    standard_webhooks_key,
    verify_bearer,
    verify_github,
    verify_standard_webhooks,
)

Headers = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Described:
    type: str
    delivery_id: str
    group_key: str


class SourceAdapter(Protocol):
    def verify(self, headers: Headers, body: bytes) -> None: ...

    def describe(self, headers: Headers, payload: Any) -> Described | None: ...


def dotted(payload: Any, path: str) -> Any:
    """``a.b.0.c`` into nested dicts and lists; None when any step is missing."""
    node = payload
    for part in path.split("."):
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _key_from_path(payload: Any, path: str | None) -> str | None:
    if path is None:
        return None
    value = dotted(payload, path)
    if value is None or isinstance(value, dict | list):
        return None
    return str(value)


def body_hash(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


class GitHubSource:
    def __init__(self, name: str, config: SourceConfig) -> None:
        assert config.secret is not None
        self.name = name
        self.secret = config.secret.get_secret_value().encode()
        self.group_key_path = config.group_key

    def verify(self, headers: Headers, body: bytes) -> None:
        verify_github(self.secret, body, headers.get("x-hub-signature-256"))

    def describe(self, headers: Headers, payload: Any) -> Described | None:
        kind = headers.get("x-github-event")
        if not kind:
            raise InvalidPayload("missing X-GitHub-Event header")
        if kind == "ping":
            return None
        if not isinstance(payload, dict):
            raise InvalidPayload("a GitHub payload is a JSON object")
        action = payload.get("action")
        event_type = f"{kind}.{action}" if isinstance(action, str) and action else kind
        delivery = headers.get("x-github-delivery") or body_hash(orjson.dumps(payload))
        group_key = _key_from_path(payload, self.group_key_path) or self._default_key(payload)
        return Described(event_type, delivery, group_key)

    def _default_key(self, payload: dict[str, Any]) -> str:
        for path in (
            "repository.full_name",
            "organization.login",
            "installation.id",
            "sender.login",
        ):
            value = _key_from_path(payload, path)
            if value:
                return value
        return self.name


class AlertmanagerSource:
    def __init__(self, name: str, config: SourceConfig) -> None:
        assert config.token is not None
        self.name = name
        self.token = config.token.get_secret_value()
        self.group_key_path = config.group_key

    def verify(self, headers: Headers, body: bytes) -> None:
        verify_bearer(self.token, headers.get("authorization"))

    def describe(self, headers: Headers, payload: Any) -> Described | None:
        if not isinstance(payload, dict) or not isinstance(payload.get("alerts"), list):
            raise InvalidPayload("an Alertmanager payload is an object with an 'alerts' list")
        status = str(payload.get("status", "unknown"))
        group_key = _key_from_path(payload, self.group_key_path) or str(
            payload.get("groupKey") or self.name
        )
        # groupKey alone repeats every group_interval; the alerts' identities do not.
        alerts = sorted(
            f"{a.get('fingerprint', '')}@{a.get('startsAt', '')}@{a.get('status', '')}"
            for a in payload["alerts"]
            if isinstance(a, dict)
        )
        delivery = hashlib.sha256("\n".join([group_key, status, *alerts]).encode()).hexdigest()
        return Described(f"alert.{status}", delivery, group_key)


class StandardWebhooksSource:
    def __init__(self, name: str, config: SourceConfig) -> None:
        assert config.secret is not None
        self.name = name
        # Several space-separated secrets: the old and new one during a rotation.
        self.keys = [standard_webhooks_key(s) for s in config.secret.get_secret_value().split()]
        self.tolerance = config.tolerance_seconds
        self.group_key_path = config.group_key

    def verify(self, headers: Headers, body: bytes) -> None:
        verify_standard_webhooks(
            keys=self.keys,
            body=body,
            msg_id=headers.get("webhook-id"),
            timestamp=headers.get("webhook-timestamp"),
            signature_header=headers.get("webhook-signature"),
            tolerance_seconds=self.tolerance,
        )

    def describe(self, headers: Headers, payload: Any) -> Described | None:
        event_type = dotted(payload, "type")
        group_key = _key_from_path(payload, self.group_key_path) or self.name
        return Described(
            str(event_type) if isinstance(event_type, str) else "webhook",
            headers["webhook-id"],
            group_key,
        )


def build_adapter(name: str, config: SourceConfig) -> SourceAdapter:
    if config.type == "github":
        return GitHubSource(name, config)
    if config.type == "alertmanager":
        return AlertmanagerSource(name, config)
    return StandardWebhooksSource(name, config)
