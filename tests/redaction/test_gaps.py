"""Secrets in realistic payload shapes that once survived redaction into the stored event (and
so into the prompt, the audit log and the admin API). ``redact_to_json`` is what ingest runs
on every event; the last test goes over HTTP."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import httpx
import orjson
import pytest
import structlog
from redis import Redis

from app.config import parse_config
from app.events import Event
from app.main import create_app
from app.queue.streams import unpack_entry
from app.redaction import redact_to_json
from app.settings import Settings
from tests.support import ServerThread

PASSWORD = "Qx7Lm2Vz9-hunter"


def _stored(payload: Any) -> str:
    """The payload's JSON as ingest queues it (redaction on, the default)."""
    _, data = redact_to_json(payload)
    return data.decode()


@pytest.mark.parametrize(
    "payload",
    [
        {"db": {"passwords": [PASSWORD]}},
        {"service": {"api_keys": [PASSWORD]}},
        {"tls": {"private_keys": {"web": PASSWORD}}},
        {"accessKeys": [PASSWORD]},
        {"oauth": {"refresh_tokens": [PASSWORD]}},
        {"form": f"user=bob&passwords={PASSWORD}"},
    ],
    ids=["passwords", "api_keys", "private_keys", "accessKeys", "refresh_tokens", "in-text"],
)
def test_plural_secret_keys_are_redacted(payload: dict[str, Any]) -> None:
    assert PASSWORD not in _stored(payload)


@pytest.mark.parametrize("key", ["session2_id", "Api2Key", "card1-number"])
def test_a_pair_with_digits_between_its_words_is_redacted(key: str) -> None:
    """The rule drops the digits that end a word; the scan in front of the walk once did not
    see these keys, so the walk never ran."""
    assert PASSWORD not in _stored({key: PASSWORD})


def test_tokens_alone_are_counted_not_secret() -> None:
    usage = {"usage": {"max_tokens": 1024, "input_tokens": 17, "tokens": 30}, "auths": {"a": 1}}
    assert _stored(usage) == orjson.dumps(usage).decode()


CARD = 4111111111111111


@pytest.mark.parametrize(
    "payload",
    [
        {"payment": {"card": CARD, "amount": 1200}},
        # Stripe's shape: card[number], card[exp_month], card[cvc].
        {"source": {"card": {"number": CARD, "exp_month": 12, "cvc": 123}}},
        {"customer": {"cards": [CARD, 5555555555554444]}},
    ],
    ids=["card", "card.number", "cards"],
)
def test_a_card_number_sent_as_a_json_number_under_a_card_key_is_redacted(
    payload: dict[str, Any],
) -> None:
    assert str(CARD) not in _stored(payload)


def test_numbers_under_a_card_that_are_no_card_number_are_kept() -> None:
    payload = {
        "card": {"id": 1700000000000, "exp_month": 12, "last4": 1111, "number": 4111111111111112},
        "order": {"id": CARD},  # a Luhn-valid id: numbers are redacted by their key only
    }
    assert _stored(payload) == orjson.dumps(payload).decode()


GITHUB_TOKEN = "ghp_Zx8Kq2Lm4Np6Rs8Tv0Wy2Ab4Cd6Ef8Gh0Ij"


@pytest.mark.parametrize(
    "payload",
    [
        # A map keyed by token (token → scopes, session id → user) is a common shape.
        {"tokens": {GITHUB_TOKEN: ["repo", "admin:org"]}},
        {"headers": {f"Authorization: Bearer {GITHUB_TOKEN}": True}},
        {"hook": orjson.dumps({GITHUB_TOKEN: 1}).decode()},  # JSON held in a string
    ],
    ids=["token-as-key", "header-line-as-key", "in-json-text"],
)
def test_a_credential_used_as_a_key_is_redacted(payload: dict[str, Any]) -> None:
    assert GITHUB_TOKEN not in _stored(payload)


def test_keys_that_become_the_same_name_are_all_kept() -> None:
    other = "ghp_" + "Q" * 36
    redacted, _ = redact_to_json({"first": 1, GITHUB_TOKEN: ["repo"], other: ["gist"], "z": 2})
    assert redacted == {
        "first": 1,
        "[REDACTED:api_key]": ["repo"],
        "[REDACTED:api_key] (2)": ["gist"],
        "z": 2,
    }
    assert list(redacted) == ["first", "[REDACTED:api_key]", "[REDACTED:api_key] (2)", "z"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A passphrase: once only its first word was replaced, the other three stayed.
        ("db password: correct horse battery staple", "db password: [REDACTED:password]"),
        ("passphrase = correct horse battery staple", "passphrase = [REDACTED:password]"),
        ("password:\tcorrect horse\nnext line", "password:\t[REDACTED:password]\nnext line"),
        # The phrase stops at the next key, a bracket, a comma, a quote, the end of the line.
        ("password: hunter2 user: bob", "password: [REDACTED:password] user: bob"),
        ("password = a b c, d", "password = [REDACTED:password], d"),
        ("echo 'password: correct horse' | x", "echo 'password: [REDACTED:password]' | x"),
        # The separator touches the value: one word (logfmt, query strings).
        ("password=hunter2 user=bob", "password=[REDACTED:password] user=bob"),
        # A CI log line: an option and its value.
        (
            "mysql -h db -u root --password Qx7Lm2Vz9-hunter -e 'select 1'",
            "mysql -h db -u root --password [REDACTED:password] -e 'select 1'",
        ),
        ("deploy --api-key=k-123 --env prod", "deploy --api-key=[REDACTED:api_key] --env prod"),
        ("vault -token 'a b c' -x", "vault -token [REDACTED:token] -x"),
        ("run -dbpassword x", "run -dbpassword [REDACTED:password]"),  # one word, ends so
        ("cmd --password --verbose", "cmd --password --verbose"),  # no value: a prompt
        ("app --token-file /etc/token", "app --token-file /etc/token"),
    ],
)
def test_a_secret_assignment_in_a_log_line_is_redacted_whole(text: str, expected: str) -> None:
    assert _stored({"log": text}) == orjson.dumps({"log": expected}).decode()


# -- A form body in a binary CloudEvent: the gateway once hid it in base64 ---------------

CE_TOKEN = "gaps-cloudevents-token-0123456789"
CE_CONFIG = f"""
sources:
  events: {{type: cloudevents, token: {CE_TOKEN}, pipeline: p}}
pipelines:
  p: {{model: claude-sonnet-4-6, system: s, tools: [t]}}
tools:
  t: {{description: d, input_schema: {{type: object}}}}
"""


def test_a_form_body_in_a_binary_cloudevent_is_redacted(
    make_settings: Callable[..., Settings], redis_url: str
) -> None:
    """Form bodies are redacted, and binary mode is read into the structured form. A form
    body was neither JSON nor ``text/*``, so it became ``data_base64`` before redaction ran:
    the password was stored (and sent to Claude, who reads base64) as sent. It is text now,
    stored as ``data``, and its password field is redacted like a GitHub form body's."""
    if redis_url.startswith("memory://"):
        pytest.skip("needs a real Redis to read the stream from outside the process")
    settings = make_settings(partitions=1)
    app = create_app(settings, parse_config(CE_CONFIG, env={}), role="api")
    form = urlencode({"user": "deployer", "password": PASSWORD})
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        reply = client.post(
            "/v1/webhooks/events",
            content=form.encode(),
            headers={
                "Authorization": f"Bearer {CE_TOKEN}",
                "Content-Type": "application/x-www-form-urlencoded",
                "ce-specversion": "1.0",
                "ce-id": "form-1",
                "ce-source": "/deploy-hook",
                "ce-type": "deploy.requested",
            },
        )
    structlog.reset_defaults()
    assert reply.status_code == 202, reply.text
    stream = Redis.from_url(redis_url)
    try:
        entries: Any = stream.xrange(f"{settings.redis_prefix}:{{p0}}:stream")
    finally:
        stream.close()
    payload = Event.from_bytes(unpack_entry(entries[0][1][b"e"])).payload
    readable = orjson.dumps(payload).decode()
    if "data_base64" in payload:
        readable += base64.b64decode(payload["data_base64"]).decode("utf-8", "replace")
    assert PASSWORD not in readable, payload
    assert payload["data"] == "user=deployer&password=[REDACTED:password]"


def test_binary_data_in_base64_is_not_read() -> None:
    """What docs/sources.md says of binary CloudEvents: ``data_base64`` is stored as sent."""
    data = base64.b64encode(b"password=hunter2").decode()
    payload = {"specversion": "1.0", "datacontenttype": "application/octet-stream"}
    payload["data_base64"] = data
    assert _stored(payload) == orjson.dumps(payload).decode()
