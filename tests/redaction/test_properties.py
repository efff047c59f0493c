"""Property: whatever JSON surrounds them, secrets placed at random — under secret-named keys,
in arrays, in form bodies and log lines, as credential-looking strings, inside JSON held in
strings (several levels) — never appear in the redacted payload or its serialised form."""

from __future__ import annotations

import base64
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from app.redaction import may_hold_secret, redact_payload, redact_to_json
from tests.redaction.test_text import every_rule

# Node = (JSON value, the secrets it holds).
Node = tuple[Any, list[str]]

# Filler text never contains "Q", and every secret starts with it: a secret cannot turn up in
# the output by coincidence.
FILLER_TEXT = st.text(st.characters(blacklist_characters="Q", codec="utf-8"), max_size=12)
SECRET = st.from_regex(r"Q[A-Za-z0-9]{15,23}", fullmatch=True)
SECRET_KEYS = [
    "password", "db_password", "Passwd", "pwd", "passphrase", "secret", "client_secret",
    "clientSecret", "token", "access_token", "X-Auth-Token", "api_key", "apiKey", "x-api-key",
    "aws_secret_access_key", "private_key", "credentials", "Authorization", "cookie",
    "Set-Cookie", "session_id", "card_number", "cvv", "password_confirmation",
]  # fmt: skip
ASSIGNED = [k for k in SECRET_KEYS if k not in ("Authorization", "cookie", "Set-Cookie")]
ISSUERS = ["4", "51", "55", "2221", "2720", "34", "37", "6011", "65", "3528", "36", "300"]


def _luhn_complete(digits: str) -> str:
    total = 0
    for i, c in enumerate(reversed(digits)):  # the check digit will shift positions by one
        n = int(c) * (2 if i % 2 == 0 else 1)
        total += n - 9 if n > 9 else n
    return digits + str((10 - total % 10) % 10)


@st.composite
def card_numbers(draw: st.DrawFn) -> str:
    prefix = draw(st.sampled_from(ISSUERS))
    length = draw(st.integers(13, 19))
    body = prefix + "".join(draw(st.lists(st.sampled_from("0123456789"),
                                          min_size=length - len(prefix) - 1,
                                          max_size=length - len(prefix) - 1)))  # fmt: skip
    number = _luhn_complete(body)
    sep = draw(st.sampled_from(["", " ", "-"]))
    return sep.join(number[i : i + 4] for i in range(0, len(number), 4))


@st.composite
def credential_strings(draw: st.DrawFn) -> Node:
    secret = draw(SECRET)
    kind = draw(st.integers(0, 11))
    if kind == 0:
        return f"Bearer {secret}", [secret]
    if kind == 1:
        encoded = base64.b64encode(f"user:{secret}".encode()).decode()
        return f"Basic {encoded}", [secret, encoded]
    if kind == 2:
        return f"https://deploy:{secret}@db.example.com:5432/app", [secret]
    if kind == 3:
        return f"a=1&{draw(st.sampled_from(ASSIGNED))}={secret}&b=2", [secret]
    if kind == 4:
        name = draw(st.sampled_from(ASSIGNED))
        return f"{draw(FILLER_TEXT)} {name}: {secret} {draw(FILLER_TEXT)}", [secret]
    if kind == 5:
        card = draw(card_numbers())
        return f"{draw(FILLER_TEXT)} {card} {draw(FILLER_TEXT)}", [card, card.replace(" ", "")]
    if kind == 6:
        return f"-----BEGIN EC PRIVATE KEY-----\n{secret}\n-----END EC PRIVATE KEY-----", [secret]
    if kind == 7:
        return f"eyJhbGciOiJIUzI1NiJ9.eyJ{secret}.{secret[::-1]}", [secret, secret[::-1]]
    if kind == 8:
        prefix = draw(st.sampled_from(["sk-ant-api03-", "sk-", "xoxb-", "ghp_", "github_pat_"]))
        return prefix + secret, [secret]
    if kind == 9:
        aws = "AKIA" + draw(st.from_regex(r"[A-Z0-9]{16}", fullmatch=True))
        return f"{draw(FILLER_TEXT)} {aws} {draw(FILLER_TEXT)}", [aws]
    if kind == 10:
        return f"whsec_{secret}", [secret]
    return f"Authorization: Bearer {secret}", [secret]


@st.composite
def under_secret_key(draw: st.DrawFn) -> Node:
    secret = draw(SECRET)
    value = draw(st.sampled_from([secret, [secret], {"value": secret}, {"a": [1, secret]}]))
    return {draw(st.sampled_from(SECRET_KEYS)): value}, [secret]


FILLER: st.SearchStrategy[Node] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**9), 10**9),
    st.floats(allow_nan=False, allow_infinity=False),
    FILLER_TEXT,
).map(lambda v: (v, []))


def _as_list(children: list[Node]) -> Node:
    return [v for v, _ in children], [s for _, ss in children for s in ss]


def _as_dict(entries: list[tuple[str, Node]]) -> Node:
    return {k: v for k, (v, _) in entries}, [s for _, (_, ss) in entries for s in ss]


def _escaped(node: Node) -> Node:
    """The child serialised into a string, as senders nest JSON in a field."""
    return orjson.dumps(node[0]).decode(), node[1]


def _containers(keys: st.SearchStrategy[str]) -> Any:
    def extend(children: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
        return st.one_of(
            st.lists(children, max_size=4).map(_as_list),
            st.lists(st.tuples(keys, children), max_size=4).map(_as_dict),
            children.map(_escaped),
        )

    return extend


PAYLOADS: st.SearchStrategy[Node] = st.recursive(
    st.one_of(FILLER, credential_strings(), under_secret_key()),
    _containers(FILLER_TEXT),
    max_leaves=16,
)
# Text that cannot spell a secret word, a credential prefix, a URL or a card number.
NEUTRAL_TEXT = st.text(
    st.characters(codec="utf-8", blacklist_characters="aeiouvwAEIOUVWQ0123456789:/-_"),
    max_size=12,
)
NEUTRAL: st.SearchStrategy[Node] = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-(10**9), 10**9),
        st.floats(-1e12, 1e12),  # as text (JSON in a string), no 13-digit run
        NEUTRAL_TEXT,
    ).map(lambda v: (v, [])),
    _containers(NEUTRAL_TEXT),
    max_leaves=16,
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(PAYLOADS)
def test_no_secret_survives_redaction(node: Node) -> None:
    payload, secrets = node
    before = orjson.dumps(payload)
    walked = orjson.dumps(redact_payload(payload)).decode()
    redacted, data = redact_to_json(payload)
    assert data == orjson.dumps(redacted)
    for secret in secrets:
        assert secret not in walked
        assert secret not in data.decode()
    assert orjson.dumps(payload) == before  # the input is left alone


@settings(max_examples=200, deadline=None)
@given(NEUTRAL)
def test_payloads_without_secrets_come_back_unchanged(node: Node) -> None:
    payload, _ = node
    _, data = redact_to_json(payload)
    assert data == orjson.dumps(payload)
    assert orjson.dumps(redact_payload(payload)) == data


# Pieces of every rule, glued at random: the scan must accept every text a rule changes, and
# that text's JSON serialisation (escaped quotes and line breaks) too.
PIECES = st.sampled_from(
    [
        "password", "Api_Key", "token", "SECRET", "cvv2", "session", "id", "card", "no", "cc",
        "Cookie", "Set-", "confirmation", "_", "-", ".", " ", "\t", "\n", "\x0b", "\x01", "=",
        ":", '"', "'", "\\", "&", "Bearer ", "basic ", "dXNlcjpwYXNz", "eyJ", "abcdefghij",
        "sk-", "xoxb-", "ghp_", "github_pat_", "AKIA", "ASIA", "ABCDEFGHIJKLMNOP", "whsec_",
        "https://", "u", "@", "/", "4111", "1111", "378282246310005", "5", "0", " 1", "-----BEGIN ",
        "PRIVATE KEY-----", "-----END ", "é", "K", "--", "keys", "tokens", "access", "2",
    ]
)  # fmt: skip


@settings(max_examples=1500, deadline=None)
@given(st.lists(PIECES, max_size=14).map("".join))
def test_the_scan_accepts_whatever_a_rule_changes(text: str) -> None:
    if every_rule(text) != text:
        assert may_hold_secret(text)
        assert may_hold_secret(orjson.dumps(text).decode())
        assert may_hold_secret(orjson.dumps({"k": [text]}).decode())
