"""A short chaos run in CI (``python -m bench.chaos`` runs the long one): three processes,
kills, freezes past the lease TTL, a Redis restart and a failing Claude, and nothing is lost,
doubled, reordered or dead-lettered, and every Claude call is audited."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.conftest import HAVE_POSTGRES
from tests.hardening.chaos import ChaosPlan, ChaosRun
from tests.support import SnsFixture


@pytest.mark.skipif(not HAVE_POSTGRES, reason="processes share one PostgreSQL")
def test_a_short_chaos_run_loses_doubles_reorders_and_dead_letters_nothing(
    tmp_path: Path,
    moto_endpoint: str,
    fake_claude: FakeAnthropicServer,
    database_url: str,
    redis_prefix: str,
) -> None:
    sns = SnsFixture(moto_endpoint, f"chaos{tmp_path.name[-8:]}", count_all=False)
    plan = ChaosPlan(
        events=300,
        keys=30,
        send_seconds=40,
        every=(5.0, 7.0),
        claude_down_seconds=8,
        min_faults=5,
        settle_timeout=150,
    )
    report = ChaosRun(
        plan=plan,
        workdir=tmp_path,
        sns=sns,
        fake_claude=fake_claude,
        database_url=database_url,
        redis_prefix=redis_prefix,
        moto_endpoint=moto_endpoint,
    ).run()
    print("\n" + report.line())
    print("\n".join(report.faults))
    assert report.accepted == plan.events
    assert len(report.faults) >= 5, report.faults
    assert report.clean, report.line()
