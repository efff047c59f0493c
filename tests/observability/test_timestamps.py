"""Log timestamps: the per-second cache gives what ``datetime`` would, second after second."""

from __future__ import annotations

import time
import types
from datetime import UTC, datetime

import pytest

from app.observability import logging as log_module


@pytest.mark.parametrize(
    "moments",
    [
        [1_700_000_000.0, 1_700_000_000.5, 1_700_000_000.999999, 1_700_000_001.000001],
        [1_798_761_599.25, 1_798_761_600.75],  # across a year's end (2026 → 2027)
        [1_798_761_600.75, 1_798_761_599.25],  # a clock stepped back
    ],
)
def test_timestamps_match_datetime(monkeypatch: pytest.MonkeyPatch, moments: list[float]) -> None:
    clock = iter(moments)
    fake = types.SimpleNamespace(
        time=lambda: next(clock), strftime=time.strftime, gmtime=time.gmtime
    )
    monkeypatch.setattr(log_module, "time", fake)
    for moment in moments:
        stamp = log_module.add_timestamp(None, "info", {})["timestamp"]
        second = int(moment)
        micros = int((moment - second) * 1_000_000)
        expected = datetime.fromtimestamp(second, UTC).replace(microsecond=micros)
        assert stamp == expected.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert datetime.fromisoformat(stamp) == expected
