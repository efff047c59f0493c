"""A recorded Alertmanager alert storm, generated from a seed: the same deliveries every run.

``alert_storm()`` gives 500 webhook (v4) deliveries over 50 alert groups by default, 10 per
group, in the order Alertmanager would send them. Time runs in ticks of ``group_interval``
(5 minutes); a group sends when it changed in the last tick (an instance joins, or one
resolves) and otherwise re-sends its unchanged state every ``repeat_interval`` (6 ticks, 30
minutes), the way Alertmanager re-notifies a group that is still firing. A group's last
delivery resolves every alert in it. Resolved alerts are sent once and then leave the group,
as Alertmanager deletes them after notifying.

Groups are ``group_by: [alertname, service]`` over ten services; a group's severity comes
from its alert rule (a fifth of the rules are critical, the rest warning or info). Some rules
template the measured value into the ``summary`` annotation, as many real rules do: their
re-sends carry a new number (the same alerts, so the same delivery id, but not the same
prompt). Fingerprints are hashes of the alert's labels, as Alertmanager's are.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

SEED = 20261203
GROUP_INTERVAL = timedelta(minutes=5)
REPEAT_TICKS = 6  # repeat_interval = 30 minutes
STARTED = datetime(2026, 11, 30, 2, 0, tzinfo=UTC)
NEVER = "0001-01-01T00:00:00Z"
SERVICES = (
    "checkout",
    "payments",
    "search",
    "cart",
    "auth",
    "inventory",
    "shipping",
    "catalog",
    "ledger",
    "gateway",
)


@dataclass(frozen=True, slots=True)
class Rule:
    alertname: str
    severity: str
    summary: str  # "{value}" is the templated measurement, if the rule has one


RULES = (
    Rule("HighErrorRate", "critical", "5xx ratio {value}% over 5m (threshold 5%)"),
    Rule("PodCrashLooping", "critical", "container restarted 5 times in 10 minutes"),
    Rule("HighLatency", "warning", "p99 latency {value}s (threshold 1.5s)"),
    Rule("DiskWillFillIn4h", "warning", "volume will fill in under 4 hours at this rate"),
    Rule("KafkaConsumerLag", "warning", "consumer lag {value}k messages"),
    Rule("MemoryPressure", "warning", "working set above 90% of the limit"),
    Rule("CpuThrottling", "warning", "throttled {value}% of CPU periods"),
    Rule("CertificateExpiresSoon", "info", "TLS certificate expires in 14 days"),
    Rule("DeploymentReplicasMismatch", "info", "replicas below the desired count"),
    Rule("SlowQueries", "info", "slow query log above 10 per minute"),
)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One webhook delivery: when (ticks since the storm began), the group's key, the body,
    and whether it is a re-send at repeat_interval (no alert joined, resolved or started
    since the group's previous notification). A re-send has the previous notification's
    delivery id in the gateway unless that one carried resolved alerts: those are gone now,
    only the firing set is the same."""

    tick: int
    group_key: str
    severity: str
    repeat: bool
    payload: dict[str, Any]


@dataclass
class _Alert:
    labels: dict[str, str]
    started_at: datetime
    ended_at: datetime | None = None

    @property
    def fingerprint(self) -> str:
        text = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class _Group:
    def __init__(self, rng: random.Random, rule: Rule, service: str, index: int) -> None:
        self.rng, self.rule, self.service = rng, rule, service
        self.labels = {"alertname": rule.alertname, "service": service}
        self.key = "{}:{" + f'alertname="{rule.alertname}", service="{service}"' + "}"
        self.hosts = [f"10.0.{index}.{n}:8080" for n in range(1, 9)]
        self.change_odds = rng.uniform(0.03, 0.2)
        self.alerts: list[_Alert] = []

    def start(self, tick: int) -> None:
        for _ in range(self.rng.randint(1, 3)):
            self.join(tick)

    def join(self, tick: int) -> None:
        used = {a.labels["instance"] for a in self.alerts}
        free = [h for h in self.hosts if h not in used]
        if not free:
            self.resolve(tick)
            return
        labels = {
            **self.labels,
            "severity": self.rule.severity,
            "instance": self.rng.choice(free),
            "job": f"{self.service}-api",
            "env": "prod",
            "region": "eu-west-1",
        }
        at = STARTED + GROUP_INTERVAL * tick - timedelta(seconds=self.rng.randint(5, 280))
        self.alerts.append(_Alert(labels, at.replace(microsecond=self.rng.randint(0, 999) * 1000)))

    def resolve(self, tick: int, *, every: bool = False) -> None:
        firing = [a for a in self.alerts if a.ended_at is None]
        for alert in firing if every else firing[:1]:
            alert.ended_at = STARTED + GROUP_INTERVAL * tick - timedelta(seconds=30)

    def change(self, tick: int) -> None:
        firing = len(self.alerts)
        if firing > 1 and self.rng.random() < 0.4:
            self.resolve(tick)
        else:
            self.join(tick)

    def notify(self) -> dict[str, Any]:
        """The notification's body; its resolved alerts then leave the group (Alertmanager
        deletes them once they were sent)."""
        body = self.payload()
        self.alerts = [a for a in self.alerts if a.ended_at is None]
        return body

    def payload(self) -> dict[str, Any]:
        alerts = [self._alert(a) for a in self.alerts]
        common = {
            k: v
            for k, v in alerts[0]["labels"].items()
            if all(a["labels"].get(k) == v for a in alerts)
        }
        firing = any(a["status"] == "firing" for a in alerts)
        return {
            "version": "4",
            "groupKey": self.key,
            "truncatedAlerts": 0,
            "status": "firing" if firing else "resolved",
            "receiver": "eventgate",
            "groupLabels": dict(self.labels),
            "commonLabels": common,
            "commonAnnotations": {"runbook_url": self._runbook()},
            "externalURL": "http://alertmanager.acme.internal:9093",
            "alerts": alerts,
        }

    def _alert(self, alert: _Alert) -> dict[str, Any]:
        value = f"{self.rng.uniform(1.6, 9.9):.1f}"
        summary = self.rule.summary.replace("{value}", value)
        return {
            "status": "firing" if alert.ended_at is None else "resolved",
            "labels": dict(alert.labels),
            "annotations": {
                "summary": summary,
                "description": f"{self.rule.alertname} on {alert.labels['instance']}: {summary}.",
                "runbook_url": self._runbook(),
            },
            "startsAt": _iso(alert.started_at),
            "endsAt": _iso(alert.ended_at) if alert.ended_at else NEVER,
            "generatorURL": "http://prometheus.acme.internal:9090/graph?g0.expr="
            + f"ALERTS%7Balertname%3D%22{self.rule.alertname}%22%7D",
            "fingerprint": alert.fingerprint,
        }

    def _runbook(self) -> str:
        return f"https://runbooks.acme.example/{self.rule.alertname.lower()}"


def alert_storm(*, groups: int = 50, per_group: int = 10, seed: int = SEED) -> list[Delivery]:
    """The storm's deliveries in sending order (by tick, then group)."""
    rng = random.Random(seed)
    pairs = rng.sample([(rule, service) for rule in RULES for service in SERVICES], groups)
    deliveries: list[Delivery] = []
    for index, (rule, service) in enumerate(pairs):
        group = _Group(rng, rule, service, index)
        tick = rng.randint(0, REPEAT_TICKS)
        group.start(tick)
        last_sent = tick
        sent = [Delivery(tick, group.key, rule.severity, False, group.notify())]
        while len(sent) < per_group:
            tick += 1
            final = len(sent) == per_group - 1
            changed = final or rng.random() < group.change_odds
            if not changed and tick - last_sent < REPEAT_TICKS:
                continue
            if final:
                group.resolve(tick, every=True)
            elif changed:
                group.change(tick)
            sent.append(Delivery(tick, group.key, rule.severity, not changed, group.notify()))
            last_sent = tick
        deliveries += sent
    return sorted(deliveries, key=lambda d: d.tick)
