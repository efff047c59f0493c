"""A gateway pointed at one node of a real Redis Cluster (``tests/redis_cluster.py``): the
cluster is detected (or forced), every partition takes webhooks, and ``/readyz`` answers 503
while a master is down. Before, a plain client got MovedError and every webhook 503."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio.cluster import RedisCluster
from redis.cluster import RedisCluster as SyncCluster
from redis.exceptions import MovedError, SlotNotCoveredError

from app.config import load_config
from app.faults import dependency_unavailable, raised_in_redis_client
from app.ingest.collapse import AlertCollapser
from app.llm.breaker import BreakerPolicy, CircuitBreaker
from app.llm.budget import BudgetLedger
from app.llm.ratelimit import ModelLimits, RateLimiter
from app.main import create_app
from app.publish.coordination import PublishedMemory, RelayLease
from app.queue.connection import is_cluster, open_redis
from app.queue.streams import EventQueue
from app.settings import Settings
from tests.conftest import HAVE_REDIS, REDIS_URL
from tests.redis_cluster import LocalCluster, require_cluster_tools
from tests.support import ServerThread, github_request, issue_payload

SECRET = "dev-github-secret"  # the built-in config's GitHub secret
PARTITIONS = 16


def _cluster_settings(
    make_settings: Callable[..., Settings], cluster: LocalCluster, **overrides: object
) -> Settings:
    return make_settings(redis_url=cluster.url, partitions=PARTITIONS, **overrides)


def _send(url: str, repo: str, number: int = 1) -> httpx.Response:
    body, headers = github_request(SECRET, issue_payload(repo, number))
    return httpx.post(f"{url}/v1/webhooks/github", content=body, headers=headers, timeout=10)


async def test_a_cluster_node_is_detected_and_a_plain_one_is_not(
    redis_cluster: LocalCluster,
) -> None:
    clustered = await open_redis(redis_cluster.node_url(1))
    plain = await open_redis(REDIS_URL if HAVE_REDIS else "memory://")
    try:
        assert isinstance(clustered, RedisCluster)
        assert is_cluster(clustered) and not is_cluster(plain)
        assert EventQueue(clustered, prefix="p", partitions=4).cluster
        assert not EventQueue(plain, prefix="p", partitions=4).cluster
    finally:
        await clustered.aclose()
        await plain.aclose()


async def test_eventgate_redis_cluster_forces_the_mode_either_way(
    redis_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVENTGATE_REDIS_CLUSTER", "true")
    assert Settings().redis_cluster is True
    forced = await open_redis(redis_cluster.url, cluster=True)
    # false on a cluster node: a plain client, which is what failed before (MovedError).
    monkeypatch.setenv("EVENTGATE_REDIS_CLUSTER", "false")
    assert Settings().redis_cluster is False
    plain = await open_redis(redis_cluster.url, cluster=False)
    try:
        assert is_cluster(forced) and not is_cluster(plain)
        queue = EventQueue(plain, prefix="forced", partitions=PARTITIONS)
        with pytest.raises(MovedError):
            await queue.check_writable()
    finally:
        await forced.aclose()
        await plain.aclose()


async def test_every_other_key_family_keeps_to_one_slot_per_call(
    redis_cluster: LocalCluster,
) -> None:
    """Breaker, rate limiter, budget, relay lease, published memory and alert collapse: each
    script or pipeline the gateway sends is accepted by the cluster client (a call over two
    slots is refused with RedisClusterException)."""
    redis = await open_redis(redis_cluster.url)
    prefix = "families"
    try:
        breaker = CircuitBreaker(redis, prefix=prefix, policy=BreakerPolicy())
        permit = await breaker.allow("anthropic", "m")
        assert await breaker.record("anthropic", "m", ok=False, permit=permit)
        limiter = RateLimiter(redis, prefix=prefix, limits=lambda _: ModelLimits(requests=60))
        assert await limiter.try_acquire("m", input_tokens=10, output_tokens=10) == 0
        spend = await BudgetLedger(redis, prefix=prefix).charge("p", tokens=5, cost_usd=0.5)
        assert spend.tokens == 5
        lease = RelayLease(redis, prefix=prefix, owner="me")
        assert await lease.hold()
        await lease.release()
        memory = PublishedMemory(redis, prefix=prefix, window_seconds=60)
        await memory.remember_many([(f"d{n}", f"m{n}") for n in range(20)])
        assert await memory.recall_many([f"d{n}" for n in range(20)]) == [
            f"m{n}" for n in range(20)
        ]
        collapser = AlertCollapser(redis, prefix=prefix)
        prints = ("a", "b", "c")
        await collapser.remember(source="alerts", fingerprints=prints, event_id="e", window_ms=9)
        await collapser.forget(source="alerts", fingerprints=prints)
    finally:
        await redis.aclose()


def test_a_gateway_on_one_node_takes_webhooks_of_every_partition(
    redis_cluster: LocalCluster, make_settings: Callable[..., Settings]
) -> None:
    settings = _cluster_settings(make_settings, redis_cluster)
    app = create_app(settings, load_config(None, env={}), role="api")
    repos = [f"acme/repo-{n:02d}" for n in range(64)]
    with ServerThread(app) as server:
        assert app.state.running.shared.queue.cluster  # detected: nothing set it
        ready = httpx.get(f"{server.url}/readyz", timeout=10)
        assert ready.status_code == 200, ready.text
        replies = [_send(server.url, repo) for repo in repos]
        assert [r.status_code for r in replies] == [202] * len(repos), replies[0].text
    lengths = _stream_lengths(redis_cluster, settings.redis_prefix)
    assert all(n > 0 for n in lengths), lengths  # the 64 keys cover every partition
    assert sum(lengths) == len(repos)


def test_readyz_says_503_while_a_master_is_down_and_webhooks_get_503_never_500(
    own_cluster: LocalCluster, make_settings: Callable[..., Settings]
) -> None:
    settings = _cluster_settings(make_settings, own_cluster)
    app = create_app(settings, load_config(None, env={}), role="api")
    with ServerThread(app) as server:
        assert httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200
        retries = app.state.running.shared.queue.redis.retry.get_retries()
        own_cluster.kill(1)  # not the node the gateway was pointed at
        killed = time.monotonic()
        while (ready := httpx.get(f"{server.url}/readyz", timeout=10)).status_code != 503:
            assert time.monotonic() - killed < 10, ready.text
            time.sleep(0.1)
        noticed = time.monotonic() - killed
        assert ready.json()["checks"]["redis"].startswith("error"), ready.text
        replies, took = [], []
        for n in range(24):  # keys of many partitions, until three were refused
            started = time.monotonic()
            replies.append(_send(server.url, f"acme/down-{n:02d}"))
            took.append(time.monotonic() - started)
            if sum(r.status_code == 503 for r in replies) == 3:
                break
    codes = {r.status_code for r in replies}
    refused = [r for r in replies if r.status_code == 503]
    print(
        f"\ncluster outage: /readyz 503 after {noticed:.2f} s; webhook codes {sorted(codes)}; "
        f"slowest answer {max(took):.2f} s"
    )
    assert codes <= {202, 503}, [r.text for r in replies if r.status_code not in (202, 503)]
    assert refused, "no webhook of a partition on the dead master was refused"
    assert all(r.json()["error"] == "QueueUnavailable" for r in refused)
    assert all("retry-after" in r.headers for r in refused)
    # The cluster client's retries are bounded: three (redis-py's default of ten held these
    # answers 4.2-6.7 s here), and each refusal took 0.7-3.2 s, so the count is what is
    # checked; the time only has to stay under the 10 s socket timeout (no hang on the dead
    # master).
    assert retries == 3
    assert max(took) < 10, took


def _stream_lengths(cluster: LocalCluster, prefix: str) -> list[int]:
    client = SyncCluster.from_url(cluster.url)
    try:
        return [int(client.xlen(f"{prefix}:{{p{p}}}:stream")) for p in range(PARTITIONS)]
    finally:
        client.close()


def test_an_attribute_error_inside_redis_py_is_a_redis_failure_and_ours_is_not() -> None:
    """What a master going away made redis-py's cluster client raise now and then (a 500
    before): an AttributeError from its own code, or a RuntimeError from the transport
    below it, on a connection closed under it."""
    inside: dict[str, object] = {"__name__": "redis.asyncio.connection"}
    exec("def send(writer):\n    writer.writelines([])", inside)  # noqa: S102
    with pytest.raises(AttributeError) as theirs:
        inside["send"](None)  # type: ignore[operator]
    assert raised_in_redis_client(theirs.value)
    inside["closed"] = _closed_transport
    exec("def send_closed():\n    closed()", inside)  # noqa: S102
    with pytest.raises(RuntimeError) as passing_through:
        inside["send_closed"]()  # type: ignore[operator]
    assert raised_in_redis_client(passing_through.value)
    with pytest.raises(AttributeError) as ours:
        None.writelines([])  # type: ignore[attr-defined]
    assert not raised_in_redis_client(ours.value)
    assert not raised_in_redis_client(ValueError("redis"))
    # The worker retries such a failure in place; it never counts against the event.
    assert dependency_unavailable(theirs.value) and not dependency_unavailable(ours.value)
    assert dependency_unavailable(SlotNotCoveredError("slot 7 has no master"))


def _closed_transport() -> None:
    """Raised below redis-py (uvloop's transport), on its way up through it."""
    raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster of this test's own: it kills a master."""
    require_cluster_tools()
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        yield cluster.start()
    finally:
        cluster.stop()
