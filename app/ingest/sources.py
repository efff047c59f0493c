"""Source adapters by ``type:``, and the GitHub adapter.

GitHub sends ~60 event kinds; all share the envelope read here: the kind in
``X-GitHub-Event``, an optional ``action`` (the event type becomes ``kind.action``), the
delivery GUID in ``X-GitHub-Delivery`` (kept across GitHub's redeliveries) and one of
``repository`` / ``organization`` / ``installation`` / ``sender`` naming what it is about.
Only the body is signed, so its digest is a second dedup identity (a replay under a new
delivery GUID is a duplicate).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from app.ingest.adapter import (
    Described,
    Headers,
    SourceAdapter,
    media_type,
    parse_json,
    signed_digest,
)
from app.ingest.admission import Body, StreamedMac, verify_whole
from app.ingest.alerting import AlertSource
from app.ingest.cloudevents import CloudEventsSource
from app.ingest.exceptions import InvalidPayload
from app.ingest.generic import GenericSource
from app.ingest.signatures import github_admission
from app.ingest.sns import AwsSnsSource, SnsHttp
from app.payloads import content_hash, first_key
from app.source_config import SourceConfig

# Built-in group-key rules for kinds that are not about one repository.
GITHUB_GROUP_KEYS: dict[str, str] = {
    "marketplace_purchase": "marketplace_purchase.account.login",
    "sponsorship": "sponsorship.sponsorable.login",
    "security_advisory": "security_advisory.ghsa_id",
    "installation": "installation/{installation.id}",
    "installation_repositories": "installation/{installation.id}",
    "installation_target": "installation/{installation.id}",
    "github_app_authorization": "sender.login",
}
GITHUB_DEFAULT_RULE = [
    "repository.full_name",
    "organization.login",
    "installation/{installation.id}",
    "sender.login",
]


class GitHubSource:
    def __init__(self, name: str, config: SourceConfig) -> None:
        self.name = name
        self.secrets = [s.encode() for s in config.secrets()]
        self.group_key = config.group_key
        self.group_keys = {**GITHUB_GROUP_KEYS, **config.group_keys}

    def admit(self, headers: Headers) -> StreamedMac:
        return github_admission(self.secrets, headers.get("x-hub-signature-256"))

    async def verify(self, headers: Headers, body: Body) -> None:
        await verify_whole(self.admit(headers), body)

    async def describe(self, headers: Headers, body: Body) -> list[Described]:
        kind = headers.get("x-github-event")
        if not kind:
            raise InvalidPayload("missing X-GitHub-Event header")
        payload = _github_payload(headers, body)
        if kind == "ping":
            return []
        if not isinstance(payload, dict):
            raise InvalidPayload("a GitHub payload is a JSON object")
        action = payload.get("action")
        event_type = f"{kind}.{action}" if isinstance(action, str) and action else kind
        delivery = headers.get("x-github-delivery") or content_hash(payload)
        return [
            Described(
                event_type,
                delivery,
                self.group_key_of(kind, payload),
                payload,
                replay_id=signed_digest(body),  # X-GitHub-Delivery is not signed
            )
        ]

    def group_key_of(self, kind: str, payload: dict[str, Any]) -> str:
        specs = [s for s in (self.group_key, self.group_keys.get(kind)) if s]
        return first_key(payload, [*specs, *GITHUB_DEFAULT_RULE]) or self.name


def _github_payload(headers: Headers, body: Body) -> Any:
    media = media_type(headers)
    if media == "application/x-www-form-urlencoded":
        # GitHub's "form" content type: the JSON document is in the `payload` field.
        form = parse_qs(body.decode("utf-8", "replace"))
        if "payload" not in form:
            raise InvalidPayload("form body has no 'payload' field")
        return parse_json(form["payload"][0].encode())
    return parse_json(body, media)


@dataclass(frozen=True, slots=True)
class AdapterDeps:
    """Network edges some adapters need; tests pass fakes, so nothing leaves the machine."""

    sns_http: SnsHttp | None = None


def build_adapter(
    name: str, config: SourceConfig, deps: AdapterDeps | None = None
) -> SourceAdapter:
    deps = deps or AdapterDeps()
    builders: dict[str, Callable[[], SourceAdapter]] = {
        "github": lambda: GitHubSource(name, config),
        "alertmanager": lambda: AlertSource(name, config),
        "grafana": lambda: AlertSource(name, config),
        "standard-webhooks": lambda: GenericSource(name, config),
        "hmac": lambda: GenericSource(name, config),
        "token": lambda: GenericSource(name, config),
        "cloudevents": lambda: CloudEventsSource(name, config),
        "aws-sns": lambda: AwsSnsSource(name, config, http=deps.sns_http),
    }
    return builders[config.type]()


__all__ = ["AdapterDeps", "Described", "SourceAdapter", "build_adapter"]
