"""The key-ordered dispatcher: per-key FIFO, one in flight per key, keys never wait on
each other beyond the concurrency limit — for any interleaving of arrivals and completions."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from app.queue.dispatcher import KeyOrderedDispatcher
from app.supervision import Supervisor

Item = tuple[str, int]


class Recorder:
    """A handler whose completions are released in an order chosen by the test."""

    def __init__(self) -> None:
        self.started: list[Item] = []
        self.finished: list[Item] = []
        self.running: set[Item] = set()
        self.max_running = 0
        self.gates: dict[Item, asyncio.Event] = {}

    async def handle(self, item: Item) -> None:
        assert item[0] not in {key for key, _ in self.running}, "two in flight for one key"
        self.running.add(item)
        self.max_running = max(self.max_running, len(self.running))
        self.started.append(item)
        gate = self.gates.setdefault(item, asyncio.Event())
        await gate.wait()
        self.running.discard(item)
        self.finished.append(item)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@settings(max_examples=150, deadline=None)
@given(
    arrivals=st.lists(st.sampled_from("abcdef"), min_size=1, max_size=40),
    concurrency=st.integers(1, 6),
    picks=st.lists(st.integers(0, 1000), max_size=200),
)
def test_any_interleaving_keeps_per_key_order_and_no_cross_key_waiting(
    arrivals: list[str], concurrency: int, picks: list[int]
) -> None:
    async def scenario() -> None:
        recorder = Recorder()
        dispatcher: KeyOrderedDispatcher[Item] = KeyOrderedDispatcher(
            recorder.handle, concurrency=concurrency, max_buffered=len(arrivals)
        )
        dispatcher.start(Supervisor())
        items: list[Item] = []
        counts: dict[str, int] = {}
        for key in arrivals:
            counts[key] = counts.get(key, 0) + 1
            items.append((key, counts[key]))
        pending = list(items)
        choice = iter(picks)
        while len(recorder.finished) < len(items):
            # Arrive some, then complete one running item chosen by hypothesis.
            if pending:
                key, seq = pending.pop(0)
                await dispatcher.submit(key, (key, seq))
            await _settle()
            # No key waits on another: with a free slot, every key that has
            # unstarted work has one item running.
            waiting = {
                k for k, s in items if (k, s) not in recorder.started and (k, s) not in pending
            }
            running_keys = {k for k, _ in recorder.running}
            if len(recorder.running) < concurrency:
                assert waiting <= running_keys, (waiting, running_keys)
            if recorder.running and (not pending or next(choice, 0) % 2):
                running = sorted(recorder.running)
                release = running[next(choice, 0) % len(running)]
                recorder.gates.setdefault(release, asyncio.Event()).set()
                await _settle()
        await dispatcher.wait_idle()
        await dispatcher.stop()
        assert recorder.max_running <= concurrency
        for key in counts:
            order = [seq for k, seq in recorder.finished if k == key]
            assert order == list(range(1, counts[key] + 1))

    asyncio.run(scenario())


async def test_failed_item_is_retried_in_place_before_later_items_of_its_key() -> None:
    calls: list[Item] = []
    failures = {("a", 1): 2}

    async def flaky(item: Item) -> None:
        calls.append(item)
        if failures.get(item, 0) > 0:
            failures[item] -= 1
            raise RuntimeError("transient")

    dispatcher: KeyOrderedDispatcher[Item] = KeyOrderedDispatcher(
        flaky, concurrency=2, max_buffered=10, retry_delay=0.001, max_retry_delay=0.01
    )
    dispatcher.start(Supervisor())
    for item in [("a", 1), ("a", 2), ("b", 1)]:
        await dispatcher.submit(item[0], item)
    await asyncio.wait_for(dispatcher.wait_idle(), 5)
    await dispatcher.stop()
    assert [c for c in calls if c[0] == "a"] == [("a", 1), ("a", 1), ("a", 1), ("a", 2)]
    assert ("b", 1) in calls


async def test_submit_waits_when_the_buffer_is_full() -> None:
    gate = asyncio.Event()

    async def blocked(_: Item) -> None:
        await gate.wait()

    dispatcher: KeyOrderedDispatcher[Item] = KeyOrderedDispatcher(
        blocked, concurrency=1, max_buffered=2
    )
    dispatcher.start(Supervisor())
    await dispatcher.submit("a", ("a", 1))
    await dispatcher.submit("b", ("b", 1))
    assert dispatcher.free_slots() == 0
    third = asyncio.create_task(dispatcher.submit("c", ("c", 1)))
    await _settle()
    assert not third.done()
    gate.set()
    await asyncio.wait_for(third, 5)
    await asyncio.wait_for(dispatcher.wait_idle(), 5)
    await dispatcher.stop()
