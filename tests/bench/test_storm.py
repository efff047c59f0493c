"""The recorded alert storm of ``bench.alert_storm``: its size, that it is the same every run,
and that the gateway's Alertmanager source reads it the way the benchmark says (a re-send of
an unchanged group has the delivery id of the group's previous notification)."""

from __future__ import annotations

from collections import Counter

import orjson

from app.source_config import SourceConfig
from app.sources.alerts import AlertSource
from bench.storm import alert_storm

HEADERS = {"content-type": "application/json"}


def test_the_storm_is_500_deliveries_over_50_groups_and_the_same_every_time() -> None:
    storm = alert_storm()
    assert len(storm) == 500
    assert Counter(d.group_key for d in storm) == {key: 10 for key in {d.group_key for d in storm}}
    assert len({d.group_key for d in storm}) == 50
    assert orjson.dumps([d.payload for d in storm]) == orjson.dumps(
        [d.payload for d in alert_storm()]
    )
    assert [d.payload for d in alert_storm(seed=1)] != [d.payload for d in storm]
    assert [d.tick for d in storm] == sorted(d.tick for d in storm)


def test_some_groups_are_critical_and_each_storm_ends_resolved() -> None:
    storm = alert_storm()
    severity = {d.group_key: d.severity for d in storm}
    critical = sum(1 for s in severity.values() if s == "critical")
    assert 0 < critical < len(severity) / 3
    assert set(severity.values()) == {"critical", "warning", "info"}
    last = {d.group_key: d for d in storm}  # in sending order, so each group's last
    assert {d.payload["status"] for d in last.values()} == {"resolved"}
    assert 0.2 < sum(d.repeat for d in storm) / len(storm) < 0.6


async def test_a_resend_has_its_previous_delivery_id_and_a_change_a_new_one() -> None:
    source = AlertSource(
        "alertmanager",
        SourceConfig(type="alertmanager", pipeline="p", token="storm-token-0123456789"),
    )
    previous: dict[str, tuple[str, bool]] = {}  # group -> (delivery id, had resolved alerts)
    same_ids = 0
    for delivery in alert_storm():
        (described,) = await source.describe(HEADERS, orjson.dumps(delivery.payload))
        assert described.group_key == delivery.group_key
        if delivery.group_key not in previous:
            assert not delivery.repeat
        else:
            before, had_resolved = previous[delivery.group_key]
            same = described.delivery_id == before
            assert same == (delivery.repeat and not had_resolved), delivery.payload
            same_ids += same
        previous[delivery.group_key] = (described.delivery_id, bool(described.resolved))
    assert same_ids > 100  # most re-sends are exactly the previous notification
