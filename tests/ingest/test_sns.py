"""SNS notifications signed with a self-made certificate; no network is touched."""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx
import orjson
import pytest

from app.source_config import SourceConfig
from app.sources.aws_sns import AwsSnsSource
from app.sources.exceptions import CertificateUnavailable, InvalidSignature, StaleTimestamp
from tests.sources_support import CERT_URL, FakeSnsHttp, SnsSigner, http_status_error, payload

TOPIC = "arn:aws:sns:eu-west-1:123456789012:ops-alarms"


@pytest.fixture(scope="module")
def signer() -> SnsSigner:
    return SnsSigner()


def source(http: FakeSnsHttp, **keys: Any) -> AwsSnsSource:
    config = SourceConfig.model_validate(
        {"type": "aws-sns", "pipeline": "p", "topic_arns": [TOPIC], **keys}
    )
    return AwsSnsSource("sns", config, http=http)


@pytest.mark.parametrize("version", ["1", "2"])
async def test_signed_cloudwatch_alarm_verifies_and_describes(
    signer: SnsSigner, version: str
) -> None:
    http = FakeSnsHttp({CERT_URL: signer.cert_pem})
    adapter = source(http)
    body = orjson.dumps(signer.sign(payload("sns_cloudwatch_alarm.json"), version=version))
    await adapter.verify({}, body)
    await adapter.verify({}, body)
    assert http.fetched == [CERT_URL]  # cached after the first fetch
    (event,) = await adapter.describe({}, body)
    assert event.type == "cloudwatch.alarm.ALARM"
    assert event.group_key == "alarm/widgets-api-5xx-rate"
    assert event.delivery_id == "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324"
    assert event.payload["Message"]["Trigger"]["MetricName"] == "HTTPCode_Target_5XX_Count"
    assert event.firing == ("widgets-api-5xx-rate",)


async def test_tampered_message_and_foreign_certificate_host_are_refused(signer: SnsSigner) -> None:
    http = FakeSnsHttp({CERT_URL: signer.cert_pem})
    adapter = source(http)
    signed = signer.sign(payload("sns_cloudwatch_alarm.json"))
    with pytest.raises(InvalidSignature, match="does not match"):
        await adapter.verify({}, orjson.dumps(signed | {"Subject": "OK: all fine"}))
    for url in (
        "https://sns.eu-west-1.amazonaws.com.evil.example/cert.pem",
        "http://sns.eu-west-1.amazonaws.com/cert.pem",
        "https://sns.eu-west-1.amazonaws.com:8443/cert.pem",
        "https://sns.eu-west-1.amazonaws.com/cert.txt",
    ):
        forged = signer.sign(payload("sns_cloudwatch_alarm.json"), cert_url=url)
        with pytest.raises(InvalidSignature):
            await adapter.verify({}, orjson.dumps(forged))
    assert http.fetched == [CERT_URL]  # never fetched from anywhere but an SNS host
    other_topic = signer.sign(
        payload("sns_cloudwatch_alarm.json") | {"TopicArn": TOPIC.replace("ops", "evil")}
    )
    with pytest.raises(InvalidSignature, match="topic_arns"):
        await adapter.verify({}, orjson.dumps(other_topic))
    stale = signer.sign(
        payload("sns_cloudwatch_alarm.json"),
        timestamp=dt.datetime.now(dt.UTC) - dt.timedelta(hours=2),
    )
    with pytest.raises(StaleTimestamp):
        await adapter.verify({}, orjson.dumps(stale))


async def test_subscription_confirmation_as_configured(signer: SnsSigner) -> None:
    body = orjson.dumps(signer.sign(payload("sns_subscription_confirmation.json"), version="2"))
    http = FakeSnsHttp({CERT_URL: signer.cert_pem})
    quiet = source(http)
    await quiet.verify({}, body)
    assert await quiet.describe({}, body) == []
    assert http.confirmed == []
    confirming = source(http, confirm_subscriptions=True)
    assert await confirming.describe({}, body) == []
    assert http.confirmed == [payload("sns_subscription_confirmation.json")["SubscribeURL"]]
    hostile = payload("sns_subscription_confirmation.json") | {
        "SubscribeURL": "https://attacker.example/?Action=ConfirmSubscription"
    }
    with pytest.raises(InvalidSignature):
        await confirming.describe({}, orjson.dumps(hostile))
    assert len(http.confirmed) == 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    "error",
    [
        httpx.ConnectError("[Errno -2] Name or service not known"),
        httpx.ReadTimeout("timed out"),
        http_status_error(CERT_URL, 503),
        OSError("network is unreachable"),
    ],
    ids=["dns", "timeout", "5xx", "os"],
)
async def test_a_certificate_that_cannot_be_fetched_is_retryable_and_cached(
    signer: SnsSigner, error: Exception
) -> None:
    """SNS retries only a 5xx: a 401 for our own network failure would drop the message."""
    http = FakeSnsHttp({}, errors={CERT_URL: error})
    clock = Clock()
    adapter = AwsSnsSource("sns", _config(), http=http, clock=clock)
    body = orjson.dumps(signer.sign(payload("sns_cloudwatch_alarm.json")))
    with pytest.raises(CertificateUnavailable) as info:
        await adapter.verify({}, body)
    assert info.value.status_code == 503
    assert info.value.headers == {"Retry-After": "30"}
    clock.now += 20
    with pytest.raises(CertificateUnavailable) as again:
        await adapter.verify({}, body)
    assert again.value.headers == {"Retry-After": "10"}
    assert http.fetched == [CERT_URL]  # the failure was cached: no second fetch
    clock.now += 11
    http.errors.clear()
    http.certificates[CERT_URL] = signer.cert_pem
    await adapter.verify({}, body)
    assert http.fetched == [CERT_URL, CERT_URL]


async def test_a_certificate_the_host_refuses_or_mangles_is_a_401(signer: SnsSigner) -> None:
    missing = FakeSnsHttp({}, errors={CERT_URL: http_status_error(CERT_URL, 404)})
    body = orjson.dumps(signer.sign(payload("sns_cloudwatch_alarm.json")))
    with pytest.raises(InvalidSignature):
        await source(missing).verify({}, body)
    garbage = FakeSnsHttp({CERT_URL: b"not a certificate"})
    with pytest.raises(InvalidSignature):
        await source(garbage).verify({}, body)


async def test_cheap_checks_come_before_any_fetch(signer: SnsSigner) -> None:
    http = FakeSnsHttp({CERT_URL: signer.cert_pem})
    adapter = source(http)
    good = signer.sign(payload("sns_cloudwatch_alarm.json"))
    bad = {
        "topic": good | {"TopicArn": TOPIC.replace("ops", "evil")},
        "version": good | {"SignatureVersion": "3"},
        "signature": good | {"Signature": "not base64!"},
        "stale": signer.sign(
            payload("sns_cloudwatch_alarm.json"),
            timestamp=dt.datetime.now(dt.UTC) - dt.timedelta(hours=2),
        ),
        "url": good | {"SigningCertURL": "https://sns.s3.amazonaws.com/cert.pem"},
        "pem": good | {"SigningCertURL": CERT_URL.replace(".pem", ".txt")},
        "timestamp": good | {"Timestamp": "yesterday"},
    }
    for name, message in bad.items():
        with pytest.raises(InvalidSignature):
            await adapter.verify({}, orjson.dumps(message))
        assert http.fetched == [], name


def _config() -> SourceConfig:
    return SourceConfig.model_validate({"type": "aws-sns", "pipeline": "p", "topic_arns": [TOPIC]})
