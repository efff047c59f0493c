"""Every signature and token comparison goes through ``hmac.compare_digest``.

A timing test would be flaky on a shared 2-core machine, so the proof is structural: with
``compare_digest`` replaced by one that always answers True, every scheme accepts a wrong
credential (so that answer is the one that decides — no ``==`` anywhere); answering False,
the right credential is refused. The wrong credentials have the right shape (a malformed
signature header is refused before any comparison). Stale timestamps are refused before any
comparison."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable

import pytest

from app.source_config import SourceConfig
from app.sources import auth, signatures
from app.sources.auth import HmacDefaults, build_authenticator
from app.sources.exceptions import InvalidSignature, StaleTimestamp

SECRET = "constant-time-s3cr3t"
BODY = b'{"a": 1}'
Check = Callable[[bool], None]  # right=True uses the right credential


def _hmac_source() -> Callable[[dict[str, str], bytes], None]:
    config = SourceConfig.model_validate(
        {
            "type": "hmac",
            "pipeline": "p",
            "secret": SECRET,
            "signature": {"header": "X-Sig", "timestamp_header": "X-Ts"},
        }
    )
    return build_authenticator(config, hmac_defaults=HmacDefaults("X-Signature"))


def github(right: bool) -> None:
    mac = hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()
    signatures.verify_github([SECRET.encode()], BODY, f"sha256={mac if right else '0' * 64}")


def bearer(right: bool) -> None:
    signatures.verify_bearer(["tok"], f"Bearer {'tok' if right else 'not'}")


def basic(right: bool) -> None:
    credentials = base64.b64encode(b"u:p" if right else b"u:x").decode()
    signatures.verify_basic("u", "p", f"Basic {credentials}")


def standard(right: bool) -> None:
    now = str(int(time.time()))
    mac = hmac.new(SECRET.encode(), f"m1.{now}.".encode() + BODY, hashlib.sha256).digest()
    value = base64.b64encode(mac if right else bytes(32)).decode()
    signatures.verify_standard_webhooks(
        keys=[SECRET.encode()],
        body=BODY,
        msg_id="m1",
        timestamp=now,
        signature_header=f"v1,{value}",
        tolerance_seconds=300,
    )


def generic(right: bool) -> None:
    now = str(int(time.time()))
    mac = hmac.new(SECRET.encode(), f"{now}.".encode() + BODY, hashlib.sha256).hexdigest()
    _hmac_source()({"x-sig": mac if right else "0" * 64, "x-ts": now}, BODY)


SCHEMES = [github, bearer, basic, standard, generic]


@pytest.fixture
def decide(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], list[object]]:
    calls: list[object] = []

    def install(answer: bool) -> list[object]:
        def fake(a: object, b: object) -> bool:
            calls.append((a, b))
            return answer

        for module in (signatures, auth):
            monkeypatch.setattr(module.hmac, "compare_digest", fake)
        return calls

    return install


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.__name__)
def test_compare_digest_decides(scheme: Check, decide: Callable[[bool], list[object]]) -> None:
    scheme(True)  # the real comparison accepts the right credential
    with pytest.raises(InvalidSignature):
        scheme(False)
    calls = decide(True)
    scheme(False)  # a wrong credential passes only because compare_digest said so
    assert calls
    decide(False)
    with pytest.raises(InvalidSignature):
        scheme(True)


@pytest.mark.parametrize("offset", [-301, 301])
def test_timestamps_outside_the_tolerance_are_refused_before_comparing(
    offset: int, decide: Callable[[bool], list[object]]
) -> None:
    calls = decide(True)
    sent = str(int(time.time()) + offset)
    with pytest.raises(StaleTimestamp):
        _hmac_source()({"x-sig": "0" * 64, "x-ts": sent}, BODY)
    with pytest.raises(StaleTimestamp):
        signatures.verify_standard_webhooks(
            keys=[SECRET.encode()],
            body=BODY,
            msg_id="m1",
            timestamp=sent,
            signature_header="v1,AAAA",
            tolerance_seconds=300,
        )
    assert calls == []
    inside = str(int(time.time()) + (offset - 2 if offset > 0 else offset + 2))
    _hmac_source()({"x-sig": "0" * 64, "x-ts": inside}, BODY)  # within: compared ("equal")
    assert calls
