from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.sources.exceptions import InvalidSignature, StaleTimestamp
from app.sources.signatures import (
    standard_webhooks_key,
    verify_bearer,
    verify_github,
    verify_standard_webhooks,
)

SECRET = b"It's a Secret to Everybody"
BODY = b"Hello, World!"
# GitHub's documented test vector for X-Hub-Signature-256.
GITHUB_VECTOR = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


def test_github_documented_vector_verifies() -> None:
    verify_github([SECRET], BODY, GITHUB_VECTOR)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, "missing X-Hub-Signature-256"),
        ("", "missing X-Hub-Signature-256"),
        ("sha1=abc", "must look like sha256=<hex>"),
        ("sha256=", "must look like sha256=<hex>"),
        ("sha256=" + "0" * 64, "does not match"),
    ],
)
def test_github_bad_signatures(header: str | None, message: str) -> None:
    with pytest.raises(InvalidSignature, match=message):
        verify_github([SECRET], BODY, header)


def test_github_signature_over_a_different_body_fails() -> None:
    with pytest.raises(InvalidSignature):
        verify_github([SECRET], BODY + b" ", GITHUB_VECTOR)


@given(st.binary(max_size=512), st.text(max_size=80))
def test_github_never_accepts_a_header_it_did_not_compute(body: bytes, header: str) -> None:
    expected = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
    if header.lower() == expected:
        verify_github([SECRET], body, header)
    else:
        with pytest.raises(InvalidSignature):
            verify_github([SECRET], body, header)


def test_bearer() -> None:
    verify_bearer(["tok"], "Bearer tok")
    verify_bearer(["tok"], "bearer tok")
    for header in (None, "tok", "Basic tok", "Bearer nope", "Bearer "):
        with pytest.raises(InvalidSignature):
            verify_bearer(["tok"], header)


def _sign(key: bytes, msg_id: str, ts: int, body: bytes) -> str:
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def test_standard_webhooks_spec_example() -> None:
    # The Standard Webhooks spec's example secret, id, timestamp and body.
    key = standard_webhooks_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    body = b'{"test": 2432232314}'
    verify_standard_webhooks(
        keys=[key],
        body=body,
        msg_id="msg_p5jXN8AQM9LWM0D4loKWxJek",
        timestamp="1614265330",
        signature_header="v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        tolerance_seconds=300,
        now=1614265330,
    )


def test_standard_webhooks_rotation_and_multiple_signatures() -> None:
    old, new = b"old-key", b"new-key"
    header = f"v1,bm9wZQ== {_sign(new, 'm1', 1000, BODY)}"
    verify_standard_webhooks(
        keys=[old, new],
        body=BODY,
        msg_id="m1",
        timestamp="1000",
        signature_header=header,
        tolerance_seconds=300,
        now=1000,
    )
    with pytest.raises(InvalidSignature):
        verify_standard_webhooks(
            keys=[old],
            body=BODY,
            msg_id="m1",
            timestamp="1000",
            signature_header=header,
            tolerance_seconds=300,
            now=1000,
        )


@pytest.mark.parametrize(
    ("msg_id", "timestamp", "now", "error", "match"),
    [
        ("m1", "1000", 1301, StaleTimestamp, "more than 300s"),
        ("m1", "1000", 699, StaleTimestamp, "more than 300s"),
        ("m1", "soon", 1000, InvalidSignature, "not an integer"),
        (None, "1000", 1000, InvalidSignature, "missing"),
        ("m2", "1000", 1000, InvalidSignature, "no v1 signature"),
    ],
    ids=["too-late", "too-early", "not-a-number", "no-id", "other-id"],
)
def test_standard_webhooks_stale_and_malformed(
    msg_id: str | None, timestamp: str, now: int, error: type[Exception], match: str
) -> None:
    key = b"k"
    with pytest.raises(error, match=match):
        verify_standard_webhooks(
            keys=[key],
            body=BODY,
            msg_id=msg_id,
            timestamp=timestamp,
            signature_header=_sign(key, "m1", 1000, BODY),
            tolerance_seconds=300,
            now=now,
        )


def test_whsec_secret_must_be_base64() -> None:
    with pytest.raises(ValueError, match="base64"):
        standard_webhooks_key("whsec_not*base64")
    assert standard_webhooks_key("plain") == b"plain"
