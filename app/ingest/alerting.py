"""Alertmanager (webhook v4) and Grafana alerting: one notification per alert group.

Both send ``{status, groupKey, alerts: [{status, labels, annotations, startsAt, fingerprint,
...}], truncatedAlerts, ...}``; Grafana adds ``title``, ``message``, ``state`` and per-alert
``values``, and may sign the body (HMAC-SHA256 over ``timestamp:body`` when a timestamp
header is configured). The whole body is kept as the payload, ``truncatedAlerts`` included.

Dedup: ``groupKey`` alone repeats every ``group_interval`` and the same group sends a new
notification whenever an alert joins, leaves or resolves, so the delivery id hashes groupKey,
status and each alert's fingerprint, startsAt and status.
"""

from __future__ import annotations

import hashlib
from typing import Any

from app.ingest.adapter import Described, Headers, media_type, parse_json
from app.ingest.admission import Admitted, Body, StreamedMac, verify_whole
from app.ingest.auth import HmacDefaults, build_authenticator
from app.ingest.exceptions import InvalidPayload
from app.payloads import resolve_key
from app.source_config import SourceConfig

GRAFANA_HMAC = HmacDefaults(
    header="X-Grafana-Alerting-Signature", signed_payload="{timestamp}:{body}"
)


class AlertSource:
    def __init__(self, name: str, config: SourceConfig) -> None:
        self.name = name
        self.kind = config.type
        self.group_key = config.group_key
        self.authenticate = build_authenticator(
            config, hmac_defaults=GRAFANA_HMAC if config.type == "grafana" else None
        )

    def admit(self, headers: Headers) -> Admitted | StreamedMac:
        return self.authenticate.admit(headers)

    async def verify(self, headers: Headers, body: Body) -> None:
        await verify_whole(self.admit(headers), body)

    async def describe(self, headers: Headers, body: Body) -> list[Described]:
        payload = parse_json(body, media_type(headers))
        if not isinstance(payload, dict) or not isinstance(payload.get("alerts"), list):
            raise InvalidPayload(f"an {self.kind} payload is an object with an 'alerts' list")
        alerts = [a for a in payload["alerts"] if isinstance(a, dict)]
        status = str(payload.get("status") or "unknown")
        group_key = (
            resolve_key(payload, self.group_key) or str(payload.get("groupKey") or "") or self.name
        )
        identities = sorted(
            f"{a.get('fingerprint', '')}@{a.get('startsAt', '')}@{a.get('status', '')}"
            for a in alerts
        )
        delivery = hashlib.sha256("\n".join([group_key, status, *identities]).encode()).hexdigest()
        return [
            Described(
                type=f"alert.{status}",
                delivery_id=delivery,
                group_key=group_key,
                payload=payload,
                firing=_fingerprints(alerts, "firing"),
                resolved=_fingerprints(alerts, "resolved"),
            )
        ]


def _fingerprints(alerts: list[dict[str, Any]], status: str) -> tuple[str, ...]:
    return tuple(
        sorted(
            str(a["fingerprint"])
            for a in alerts
            if a.get("status") == status and a.get("fingerprint")
        )
    )
