"""Process tuning: the worker handles more events at once than Claude calls may be in flight
(that bound is the caller's: tests/llm/test_budget_and_concurrency.py), and the young
generation is collected less often."""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest

from app.cli import GC_YOUNG_THRESHOLD, tune_gc
from app.config import load_config
from app.main import create_app
from app.settings import Settings
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.support import ServerThread


@pytest.mark.parametrize(("worker_concurrency", "expected"), [(None, 6), (4, 4)])
def test_worker_concurrency_defaults_to_twice_the_claude_slots(
    make_settings: Callable[..., Settings],
    fake_claude: FakeAnthropicServer,  # the worker runs only with Claude configured
    worker_concurrency: int | None,
    expected: int,
) -> None:
    settings = make_settings(llm_max_concurrency=3, worker_concurrency=worker_concurrency)
    app = create_app(settings, load_config(None, env={}), role="worker")
    with ServerThread(app):
        processing = app.state.running.worker.processing
        assert processing is not None
        runners = [
            n for n in app.state.running.shared.supervisor.loops if n.startswith("dispatch-")
        ]
        assert len(runners) == expected


def test_the_cli_has_a_started_gateway_collect_young_objects_less_often(
    make_settings: Callable[..., Settings],
) -> None:
    """The tuning is the CLI's (``after_startup``): a gateway built by a test leaves the
    test process's GC alone."""
    before = gc.get_threshold()
    app = create_app(make_settings(), load_config(None, env={}), role="api")
    with ServerThread(app):
        assert gc.get_threshold() == before
    app = create_app(make_settings(), load_config(None, env={}), role="api", after_startup=tune_gc)
    try:
        with ServerThread(app):
            assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
