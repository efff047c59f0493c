"""Signature schemes: generic HMAC, Grafana, bearer, basic, Standard Webhooks, rotation."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

import pytest

from app.source_config import SourceConfig
from app.sources.alerts import GRAFANA_HMAC
from app.sources.auth import HmacDefaults, build_authenticator
from app.sources.exceptions import InvalidSignature, StaleTimestamp
from app.sources.signatures import standard_webhooks_key, verify_standard_webhooks

BODY = b'{"device": {"id": "th-1"}, "temperature_c": 71.5}'


def source(**keys: object) -> SourceConfig:
    return SourceConfig.model_validate({"type": "hmac", "pipeline": "p", **keys})


def sign(secret: str, data: bytes, algo: str = "sha256") -> bytes:
    return hmac.new(secret.encode(), data, getattr(hashlib, algo)).digest()


def test_hmac_hex_sha256_default_header() -> None:
    auth = build_authenticator(
        source(secret="hmac-test-secret-s3"), hmac_defaults=HmacDefaults("X-Signature")
    )
    auth({"x-signature": sign("hmac-test-secret-s3", BODY).hex()}, BODY)
    with pytest.raises(InvalidSignature, match="does not match"):
        auth({"x-signature": sign("hmac-test-secret-other", BODY).hex()}, BODY)
    with pytest.raises(InvalidSignature, match="missing X-Signature"):
        auth({}, BODY)


def test_hmac_sha512_base64_with_prefix_and_timestamp() -> None:
    config = source(
        secret="sha512-test-secret-k",
        signature={
            "header": "X-Hub-Sig",
            "algorithm": "sha512",
            "encoding": "base64",
            "prefix": "sha512=",
            "timestamp_header": "X-Ts",
            "signed_payload": "v0:{timestamp}:{body}",
        },
    )
    auth = build_authenticator(config, hmac_defaults=HmacDefaults("X-Signature"))
    now = str(int(time.time()))
    good = base64.b64encode(
        sign("sha512-test-secret-k", f"v0:{now}:".encode() + BODY, "sha512")
    ).decode()
    auth({"x-hub-sig": f"sha512={good}", "x-ts": now}, BODY)
    with pytest.raises(InvalidSignature, match="must start with"):
        auth({"x-hub-sig": good, "x-ts": now}, BODY)
    with pytest.raises(InvalidSignature, match="missing X-Ts"):
        auth({"x-hub-sig": f"sha512={good}"}, BODY)
    stale = str(int(time.time()) - 301)
    old = base64.b64encode(
        sign("sha512-test-secret-k", f"v0:{stale}:".encode() + BODY, "sha512")
    ).decode()
    with pytest.raises(StaleTimestamp):
        auth({"x-hub-sig": f"sha512={old}", "x-ts": stale}, BODY)


def test_hmac_rotation_accepts_old_and_new_secret() -> None:
    auth = build_authenticator(
        source(secret="rotation-secret-new rotation-secret-old"), hmac_defaults=HmacDefaults("X-S")
    )
    auth({"x-s": sign("rotation-secret-old", BODY).hex()}, BODY)
    auth({"x-s": sign("rotation-secret-new", BODY).hex()}, BODY)
    with pytest.raises(InvalidSignature):
        auth({"x-s": sign("rotation-secret-older", BODY).hex()}, BODY)


def test_grafana_signs_timestamp_colon_body_in_milliseconds_or_seconds() -> None:
    config = SourceConfig.model_validate(
        {
            "type": "grafana",
            "pipeline": "p",
            "secret": "grafana-test-secret",
            "signature": {"timestamp_header": "X-Grafana-Alerting-Timestamp"},
        }
    )
    auth = build_authenticator(config, hmac_defaults=GRAFANA_HMAC)
    ts = str(int(time.time() * 1000))
    auth(
        {
            "x-grafana-alerting-signature": sign(
                "grafana-test-secret", f"{ts}:".encode() + BODY
            ).hex(),
            "x-grafana-alerting-timestamp": ts,
        },
        BODY,
    )
    with pytest.raises(InvalidSignature):
        auth(
            {
                "x-grafana-alerting-signature": sign("grafana-test-secret", BODY).hex(),
                "x-grafana-alerting-timestamp": ts,
            },
            BODY,
        )


def test_alertmanager_accepts_bearer_or_basic_and_reports_mismatch() -> None:
    config = SourceConfig.model_validate(
        {
            "type": "alertmanager",
            "pipeline": "p",
            "token": "alertmanager-t0k-token",
            "basic_auth": {"username": "am", "password": "alertmanager-password"},
        }
    )
    auth = build_authenticator(config, hmac_defaults=None)
    auth({"authorization": "Bearer alertmanager-t0k-token"}, BODY)
    auth({"authorization": "Basic " + base64.b64encode(b"am:alertmanager-password").decode()}, BODY)
    with pytest.raises(InvalidSignature, match="credentials do not match"):
        auth({"authorization": "Basic " + base64.b64encode(b"am:nope").decode()}, BODY)
    with pytest.raises(InvalidSignature, match="bearer token does not match"):
        auth({"authorization": "Bearer alertmanager-t0k-tokens"}, BODY)
    with pytest.raises(InvalidSignature, match="missing Authorization"):
        auth({}, BODY)


def _whsig(key: bytes, msg_id: str, ts: str, body: bytes) -> str:
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def test_standard_webhooks_rotation_multiple_signatures_and_tolerance() -> None:
    old = standard_webhooks_key(
        "whsec_" + base64.b64encode(b"old-key-32-bytes-long-old-key-32").decode()
    )
    new = standard_webhooks_key(
        "whsec_" + base64.b64encode(b"new-key-32-bytes-long-new-key-32").decode()
    )
    ts = str(int(time.time()))
    # The sender signs with both keys during its rotation; we know only the new one.
    header = f"{_whsig(old, 'msg_1', ts, BODY)} {_whsig(new, 'msg_1', ts, BODY)}"
    verify_standard_webhooks(
        keys=[new],
        body=BODY,
        msg_id="msg_1",
        timestamp=ts,
        signature_header=header,
        tolerance_seconds=300,
    )
    with pytest.raises(InvalidSignature):
        verify_standard_webhooks(
            keys=[new],
            body=BODY,
            msg_id="msg_2",
            timestamp=ts,
            signature_header=header,
            tolerance_seconds=300,
        )
    for skew in (-301, 301):  # ± tolerance
        sent = str(int(time.time()) + skew)
        with pytest.raises(StaleTimestamp):
            verify_standard_webhooks(
                keys=[new],
                body=BODY,
                msg_id="msg_1",
                timestamp=sent,
                signature_header=_whsig(new, "msg_1", sent, BODY),
                tolerance_seconds=300,
            )
