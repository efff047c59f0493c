"""Helpers shared by tests: real services when reachable, signed requests, a server thread."""

from __future__ import annotations

import hashlib
import hmac
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import httpx
import orjson
import uvicorn


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerThread:
    """Runs an ASGI app under uvicorn in a thread (its own event loop), on a free port."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


def github_request(
    secret: str, payload: dict[str, Any], *, event: str = "issues", delivery: str | None = None
) -> tuple[bytes, dict[str, str]]:
    body = orjson.dumps(payload)
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return body, {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": f"sha256={signature}",
    }


def issue_payload(repo: str, number: int, action: str = "opened") -> dict[str, Any]:
    owner = repo.split("/")[0]
    return {
        "action": action,
        "issue": {
            "number": number,
            "title": f"Issue {number}",
            "state": "open",
            "html_url": f"https://github.com/{repo}/issues/{number}",
            "user": {"login": "octocat"},
            "body": "It broke.",
        },
        "repository": {
            "id": 1296269,
            "full_name": repo,
            "name": repo.split("/")[1],
            "owner": {"login": owner},
            "html_url": f"https://github.com/{repo}",
        },
        "sender": {"login": "octocat", "id": 1},
    }


class SnsFixture:
    """An SNS FIFO topic on moto with an SQS FIFO and a standard queue subscribed (raw).

    ``count_all=False`` leaves the standard queue out (``all_url`` is then empty): nothing
    drains it, and moto scans a queue's every message on each send, so a benchmark that
    publishes hundreds of messages would measure moto's growing queue instead of eventgate.
    """

    def __init__(self, endpoint: str, name: str, *, count_all: bool = True) -> None:
        self.sns = boto3.client("sns", endpoint_url=endpoint, region_name="us-east-1")
        self.sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
        self.topic_arn = self.sns.create_topic(
            Name=f"{name}.fifo", Attributes={"FifoTopic": "true"}
        )["TopicArn"]
        self.fifo_url = self._queue(f"{name}-sub.fifo", fifo=True)
        # The standard queue counts every publish (SQS FIFO would hide duplicates).
        self.all_url = self._queue(f"{name}-all", fifo=False) if count_all else ""
        self._seen: set[str] = set()
        self.redeliveries = 0

    def _queue(self, name: str, *, fifo: bool) -> str:
        attributes = {"FifoQueue": "true"} if fifo else {}
        url: str = self.sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        self.sns.subscribe(
            TopicArn=self.topic_arn,
            Protocol="sqs",
            Endpoint=arn,
            Attributes={"RawMessageDelivery": "true"},
        )
        return url

    def receive(self, url: str, *, expected: int, timeout: float = 30) -> list[dict[str, Any]]:
        """Drain ``url`` until ``expected`` messages arrived (or the timeout); delete them.

        An SQS redelivery (same SQS ``MessageId``, e.g. after a visibility timeout on a slow
        moto) is the queue's at-least-once delivery, not a second publish: it is counted in
        ``redeliveries`` and left out, like any FIFO consumer deduplicating would.
        """
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(got) < expected and time.monotonic() < deadline:
            reply = self.sqs.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=1,
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
            messages = reply.get("Messages", [])
            if messages:
                self.sqs.delete_message_batch(
                    QueueUrl=url,
                    Entries=[
                        {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]}
                        for n, m in enumerate(messages)
                    ],
                )
            for message in messages:
                if message["MessageId"] in self._seen:
                    self.redeliveries += 1
                    continue
                self._seen.add(message["MessageId"])
                got.append(message)
        return got

    def drain_extra(self, url: str) -> list[dict[str, Any]]:
        """Whatever else arrives within a short quiet period (to prove nothing more came)."""
        return self.receive(url, expected=10_000, timeout=2)


def gateway_env(
    *,
    config: Path,
    redis_url: str,
    redis_prefix: str,
    database_url: str,
    claude_url: str | None = None,
    sns_endpoint: str | None = None,
    **extra: str,
) -> dict[str, str]:
    """The environment of a gateway process on this test's Redis prefix and (migrated)
    database, with Claude at ``claude_url`` and SNS at ``sns_endpoint`` when given."""
    env = {
        "EVENTGATE_CONFIG": str(config),
        "EVENTGATE_REDIS_URL": redis_url,
        "EVENTGATE_REDIS_PREFIX": redis_prefix,
        "EVENTGATE_DATABASE_URL": database_url,
        "EVENTGATE_AUTO_MIGRATE": "false",
    }
    if claude_url is not None:
        env |= {"ANTHROPIC_BASE_URL": claude_url, "ANTHROPIC_API_KEY": "sk-ant-test-not-real"}
    if sns_endpoint is not None:
        env["AWS_ENDPOINT_URL_SNS"] = sns_endpoint
    return env | extra


class GatewayProcess:
    """`python -m app <role>` as a real process on a free port, logging JSON to a file."""

    def __init__(self, *, env: dict[str, str], log_path: Path, role: str = "serve") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app", role, "--port", str(self.port)],
            env={**os.environ, "EVENTGATE_LOG_FORMAT": "json", **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 60, path: str = "/readyz") -> GatewayProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited:\n{self.log_path.read_text()}")
            try:
                if httpx.get(f"{self.url}{path}", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"gateway not ready:\n{self.log_path.read_text()}")

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def log_events(self) -> list[dict[str, Any]]:
        events = []
        for line in self.log_path.read_text().splitlines():
            if line.startswith("{"):
                events.append(orjson.loads(line))
        return events


def gateway_config(topic_arn: str | None, *, secret: str = "${E2E_GITHUB_SECRET}") -> str:
    """One GitHub source, one pipeline offering publishAlert (on ``topic_arn`` if given)."""
    topic = f"\n    topic_arn: {topic_arn}" if topic_arn else ""
    return f"""
sources:
  github:
    type: github
    secret: {secret}
    pipeline: triage
pipelines:
  triage:
    model: claude-sonnet-4-6
    system: You triage GitHub events.
    tools: [publishAlert]
tools:
  publishAlert:
    description: Raise an alert.
    input_schema:
      type: object
      properties: {{severity: {{type: string, enum: [high, low]}}, title: {{type: string}}}}
      required: [severity, title]{topic}
"""
