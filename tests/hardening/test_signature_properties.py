"""Property: every signature scheme answers any header a sender can send with either
success (only for the right credential) or ``InvalidSignature`` — never another exception
(a 500) — and a credential that differs from the right one never passes.

Header values arrive decoded as latin-1 (Starlette), so any character up to U+00FF."""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import time

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from app.source_config import SourceConfig
from app.sources.auth import HmacDefaults, build_authenticator
from app.sources.exceptions import InvalidSignature
from app.sources.signatures import (
    check_timestamp,
    verify_basic,
    verify_bearer,
    verify_github,
    verify_standard_webhooks,
)

header = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=80)
maybe_header = st.none() | header
bodies = st.binary(max_size=200)
SECRET = "signature-properties-s3cr3t"
TOKEN = "the-right-bearer-token"
PASSWORD = "the-right-password"
NOW = 1_760_000_000.0


def github_signature(body: bytes) -> str:
    return "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()


@settings(max_examples=300)
@given(body=bodies, given_header=maybe_header)
@example(body=b"{}", given_header="sha256=" + "\xe9" * 64)
def test_github_any_header(body: bytes, given_header: str | None) -> None:
    right = github_signature(body)
    if given_header is not None and given_header.strip().lower() == right:
        verify_github([SECRET.encode()], body, given_header)
        return
    with pytest.raises(InvalidSignature):
        verify_github([SECRET.encode()], body, given_header)
    verify_github([SECRET.encode()], body, right)


@settings(max_examples=300)
@given(given_header=maybe_header)
@example(given_header="Bearer tok\xe9n")
def test_bearer_any_header(given_header: str | None) -> None:
    if given_header is not None and given_header.lower().startswith("bearer "):
        assume(given_header.partition(" ")[2].strip() != "the-token")
    with pytest.raises(InvalidSignature):
        verify_bearer(["the-token"], given_header)


@settings(max_examples=300)
@given(given_header=maybe_header)
@example(given_header="Basic \xe9\xe9\xe9\xe9")  # not ASCII: not base64 either
@example(given_header="Basic dXNlcjpwYXNzCg==")  # "user:pass\n"
def test_basic_any_header(given_header: str | None) -> None:
    right = "Basic " + base64.b64encode(b"user:pass").decode()
    # (the right credentials with extra "=" padding still decode to them: allowed)
    assume(given_header is None or not given_header.strip().startswith(right))
    with pytest.raises(InvalidSignature):
        verify_basic("user", "pass", given_header)
    verify_basic("user", "pass", right)


@settings(max_examples=300)
@given(timestamp=header | st.floats(allow_nan=True).map(str))
@example(timestamp="nan")
@example(timestamp="NaN")
@example(timestamp="inf")
@example(timestamp="-infinity")
def test_timestamp_any_value(timestamp: str) -> None:
    try:
        sent = float(timestamp)
    except ValueError:
        sent = math.nan
    if math.isfinite(sent):
        seconds = sent / 1000 if sent > 1e11 else sent
        if abs(NOW - seconds) <= 300:
            check_timestamp(timestamp, tolerance_seconds=300, now=NOW)
            return
    with pytest.raises(InvalidSignature):
        check_timestamp(timestamp, tolerance_seconds=300, now=NOW)


@settings(max_examples=300)
@given(
    body=bodies,
    msg_id=maybe_header,
    timestamp=maybe_header | st.integers(-(10**12), 10**12).map(str),
    signature=maybe_header,
)
def test_standard_webhooks_any_headers(
    body: bytes, msg_id: str | None, timestamp: str | None, signature: str | None
) -> None:
    with pytest.raises(InvalidSignature):
        verify_standard_webhooks(
            keys=[SECRET.encode()],
            body=body,
            msg_id=msg_id,
            timestamp=timestamp,
            signature_header=signature,
            tolerance_seconds=300,
            now=NOW,
        )


def _generic_auth(encoding: str):  # type: ignore[no-untyped-def]
    config = SourceConfig.model_validate(
        {
            "type": "grafana",  # takes an HMAC scheme, a token and basic auth together
            "pipeline": "p",
            "secret": SECRET,
            "token": TOKEN,
            "basic_auth": {"username": "user", "password": PASSWORD},
            "signature": {
                "header": "X-Sig",
                "encoding": encoding,
                "prefix": "v1=",
                "timestamp_header": "X-Ts",
            },
        }
    )
    return build_authenticator(config, hmac_defaults=HmacDefaults("X-Signature"))


@settings(max_examples=300)
@given(
    body=bodies,
    encoding=st.sampled_from(["hex", "base64"]),
    headers=st.dictionaries(
        st.sampled_from(["x-sig", "x-ts", "authorization", "x-other"]), header, max_size=4
    ),
)
@example(body=b"{}", encoding="hex", headers={"x-sig": "v1=00", "x-ts": "nan"})
def test_generic_hmac_and_token_any_headers(
    body: bytes, encoding: str, headers: dict[str, str]
) -> None:
    credential = headers.get("authorization", "").partition(" ")[2].strip()
    assume(credential not in (TOKEN, base64.b64encode(f"user:{PASSWORD}".encode()).decode()))
    with pytest.raises(InvalidSignature):
        _generic_auth(encoding)(headers, body)


@settings(max_examples=100)
@given(body=bodies, encoding=st.sampled_from(["hex", "base64"]), flip=st.integers(0, 200))
def test_generic_hmac_right_signature_passes_and_any_change_fails(
    body: bytes, encoding: str, flip: int
) -> None:
    now = str(int(time.time()))
    mac = hmac.new(SECRET.encode(), f"{now}.".encode() + body, hashlib.sha256).digest()
    value = mac.hex() if encoding == "hex" else base64.b64encode(mac).decode()
    auth = _generic_auth(encoding)
    auth({"x-sig": "v1=" + value, "x-ts": now}, body)
    index = flip % len(value)
    changed = value[:index] + ("A" if value[index] != "A" else "B") + value[index + 1 :]
    assume(changed.lower() != value.lower() or encoding == "base64")
    with pytest.raises(InvalidSignature):
        auth({"x-sig": "v1=" + changed, "x-ts": now}, body)
