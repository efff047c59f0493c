"""Replay generations change the deduplication id; generation 0 keeps the original value."""

from __future__ import annotations

import hashlib

from app.publish.ids import deduplication_id


def test_generation_zero_is_the_original_id() -> None:
    expected = hashlib.sha256(b"evt_1:0").hexdigest()
    assert deduplication_id("evt_1", 0) == expected
    assert deduplication_id("evt_1", 0, 0) == expected


def test_each_generation_has_its_own_stable_ids() -> None:
    ids = {
        deduplication_id("evt_1", index, generation)
        for index in range(3)
        for generation in range(3)
    }
    assert len(ids) == 9
    assert deduplication_id("evt_1", 1, 2) == deduplication_id("evt_1", 1, 2)
    assert all(len(i) <= 128 for i in ids)
