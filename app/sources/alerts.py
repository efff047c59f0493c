"""Alertmanager (webhook v4) and Grafana alerting (``type: alertmanager|grafana``): the adapter,
their config keys, their prompt summary and trim hints. One notification per alert group.

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

from app.payloads import dotted, resolve_key
from app.source_config import SourceConfig
from app.sources.admission import Admitted, Body, StreamedMac, verify_whole
from app.sources.auth import HmacDefaults, build_authenticator
from app.sources.base import (
    AdapterDeps,
    Described,
    Headers,
    Lines,
    SourceKind,
    media_type,
    parse_json,
)
from app.sources.exceptions import InvalidPayload

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


# Alerts listed one by one in the summary (their labels then leave the trimmed payload).
ALERT_LINES = 10


def summary(event_type: str, p: dict[str, Any]) -> Lines:
    items = [a for a in p.get("alerts") or [] if isinstance(a, dict)]
    firing = sum(1 for a in items if a.get("status") == "firing")
    lines: Lines = [
        ("what", f"{p.get('status')}: {firing} firing, {len(items) - firing} resolved"),
        ("title", p.get("title")),
        ("severity", dotted(p, "commonLabels.severity") or _worst(items)),
        ("group", _labels(p.get("groupLabels"))),
        ("receiver", p.get("receiver")),
    ]
    truncated = p.get("truncatedAlerts")
    if isinstance(truncated, int) and truncated > 0:
        lines.append(("truncated", f"{truncated} more alert(s) were not sent by the sender"))
    for index, alert in enumerate(items[:ALERT_LINES]):
        labels = alert.get("labels") or {}
        notes = alert.get("annotations") or {}
        text = notes.get("summary") or notes.get("description") or ""
        where = _labels({k: v for k, v in labels.items() if k not in ("alertname", "severity")})
        lines.append(
            (
                f"alert {index + 1}",
                f"[{alert.get('status')}] {labels.get('alertname', '?')} "
                f"severity={labels.get('severity', '-')} {where} since {alert.get('startsAt')}"
                f" — {text}",
            )
        )
    if len(items) > ALERT_LINES:
        lines.append(("more alerts", str(len(items) - ALERT_LINES)))
    first = items[0] if items else {}
    runbook = dotted(first, "annotations.runbook_url")
    for label, url in (("runbook", runbook), ("source link", first.get("generatorURL"))):
        lines.append((label, url))
    lines.append(("dashboard", first.get("dashboardURL") or p.get("externalURL")))
    return lines


def _labels(labels: Any) -> str:
    if not isinstance(labels, dict):
        return ""
    return " ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _worst(items: list[dict[str, Any]]) -> str | None:
    order = ["critical", "error", "high", "warning", "medium", "low", "info"]
    found = {str(dotted(a, "labels.severity")).lower() for a in items}
    return next((s for s in order if s in found), None)


# Trim hints: what the summary says already leaves the payload.
SUMMARISED = frozenset(
    {"status", "receiver", "groupLabels", "truncatedAlerts", "title", "externalURL", "message"}
)


def slim(payload: Any) -> Any:
    """Alert fields the summary does not carry: fingerprints, other annotations, values."""
    if not isinstance(payload, dict) or not isinstance(payload.get("alerts"), list):
        return payload
    slimmed = {k: v for k, v in payload.items() if k not in SUMMARISED}
    alerts = [a for a in payload["alerts"] if isinstance(a, dict)]
    # Only the alerts the summary lists lose their labels; any beyond keep everything.
    slimmed["alerts"] = [
        {
            k: v
            for k, v in alert.items()
            if k not in ("labels", "status", "startsAt", "generatorURL", "silenceURL", "panelURL")
            and not (k == "endsAt" and str(v).startswith("0001"))
        }
        | {"annotations": _other_notes(alert.get("annotations"))}
        for alert in alerts[:ALERT_LINES]
    ] + alerts[ALERT_LINES:]
    return slimmed


def _other_notes(notes: Any) -> Any:
    if not isinstance(notes, dict):
        return notes
    return {k: v for k, v in notes.items() if k not in ("summary", "runbook_url")}


def _adapter(name: str, config: SourceConfig, _: AdapterDeps) -> AlertSource:
    return AlertSource(name, config)


ALERTMANAGER = SourceKind(
    name="alertmanager",
    keys=frozenset({"token", "basic_auth"}),
    needs=("token", "basic_auth"),
    adapter=_adapter,
    summary=summary,
    slim=slim,
    alert_fingerprints=True,
)
GRAFANA = SourceKind(
    name="grafana",
    keys=frozenset({"secret", "signature", "token", "basic_auth"}),
    needs=("secret", "token", "basic_auth"),
    adapter=_adapter,
    summary=summary,
    slim=slim,
    alert_fingerprints=True,
)
