"""The long chaos run: 1,000 events over 50 keys into three ``eventgate serve`` processes on one
Redis (AOF) and PostgreSQL, while every 6-10 s one process is SIGKILLed and restarted or frozen
for 6 s (SIGSTOP, past its 3 s lease TTL), Redis is killed and restarted once, and Claude fails
16% of calls and is down for 15 s. Prints what the SNS FIFO subscriber received and whether
every Claude call was audited (see ``tests/hardening/chaos.py``), and appends it to
docs/benchmarks.md.

    python -m bench.chaos [--events 1000] [--keys 50] [--seed 7]
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from pathlib import Path

from moto.server import ThreadedMotoServer

from app.store.migrate import upgrade_head
from bench.common import Skip, database, free_port, report
from eventgate_dev.fake_anthropic import FakeAnthropicServer
from tests.hardening.chaos import ChaosPlan, ChaosRun
from tests.support import SnsFixture


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    fake = FakeAnthropicServer().start()
    endpoint = f"http://127.0.0.1:{port}"
    plan = ChaosPlan(events=args.events, keys=args.keys, seed=args.seed)
    try:
        with database("chaos") as database_url, tempfile.TemporaryDirectory() as workdir:
            if database_url.startswith("sqlite"):
                raise Skip("needs PostgreSQL on 127.0.0.1:5432 (three processes share it)")
            upgrade_head(database_url)
            result = ChaosRun(
                plan=plan,
                workdir=Path(workdir),
                sns=SnsFixture(endpoint, f"chaos{uuid.uuid4().hex[:8]}", count_all=False),
                fake_claude=fake,
                database_url=database_url,
                redis_prefix=f"chaos-{uuid.uuid4().hex[:8]}",
                moto_endpoint=endpoint,
            ).run()
    finally:
        fake.stop()
        moto.stop()
    verdict = "clean" if result.clean else "NOT CLEAN"
    report(
        "Chaos run",
        f"python -m bench.chaos --events {args.events} --keys {args.keys} --seed {args.seed}",
        [
            f"- plan: {args.events} events over {args.keys} keys into 3 `eventgate serve` "
            "processes, lease TTL 3 s; every 6-10 s a process is SIGKILLed and restarted or "
            "frozen for 6 s; Redis (AOF, fsync always) killed and restarted once; Claude fails "
            "16% of calls and is down for 15 s",
            f"- faults, in order: {'; '.join(f.split(' ', 1)[1] for f in result.faults)}",
            f"- result: `{result.line()}`",
            f"- verdict: **{verdict}** (clean: nothing lost, doubled, reordered or dead-lettered; "
            "at least one audit row per Claude request, and every answered request named by a "
            "row or one of the rows that cannot name it)",
        ],
    )


if __name__ == "__main__":
    main()
