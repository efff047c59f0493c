"""The compose stack's sns-init and subscriber, against moto's server."""

from __future__ import annotations

import boto3
import orjson
import pytest

from eventgate_dev import sns_dev


def test_init_is_idempotent_and_the_subscriber_prints_what_arrives(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    arns = sns_dev.init(wait_seconds=5)
    assert sns_dev.init(wait_seconds=5) == arns
    assert set(arns) == set(sns_dev.TOPICS)
    sns = boto3.client("sns", endpoint_url=moto_endpoint, region_name="us-east-1")
    body = orjson.dumps({"tool": "publishAlert", "input": {"severity": "high"}}).decode()
    sns.publish(
        TopicArn=arns["alerts.fifo"],
        Message=body,
        MessageGroupId="acme/api",
        MessageDeduplicationId="d-1",
    )
    [message] = sns_dev.subscribe(once=True)
    assert message["Body"] == body
    assert f"[group acme/api] {body}" in capsys.readouterr().out
    assert sns_dev.subscribe(once=True) == []
