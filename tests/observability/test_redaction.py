"""Secret values never reach a log line, even when a call site logs them by mistake."""

from __future__ import annotations

import orjson
import pytest
import structlog

from app.observability.logging import LOG_VALUE_CHARS, configure_logging


def test_secret_keys_and_headers_are_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(fmt="json")
    structlog.get_logger("t").info(
        "oops",
        token="tok-123",
        api_key="sk-ant-456",
        headers={
            "Authorization": "Bearer admin-789",
            "X-Hub-Signature-256": "sha256=abc",
            "webhook-signature": "v1,xyz",
            "X-GitHub-Event": "issues",
        },
        event_id="evt_1",
    )
    line = orjson.loads(capsys.readouterr().err.strip().splitlines()[-1])
    text = orjson.dumps(line).decode()
    for secret in ("tok-123", "sk-ant-456", "admin-789", "sha256=abc", "v1,xyz"):
        assert secret not in text
    assert line["headers"]["X-GitHub-Event"] == "issues"
    assert line["headers"]["Authorization"] == "[redacted]"
    assert line["token"] == "[redacted]"
    assert line["event_id"] == "evt_1"


def test_bound_context_is_merged_into_every_line(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(fmt="json")
    with structlog.contextvars.bound_contextvars(event_id="evt_2", source="github", partition=3):
        structlog.get_logger("t").info("inside")
    structlog.get_logger("t").info("outside")
    inside, outside = (orjson.loads(x) for x in capsys.readouterr().err.strip().splitlines())
    assert (inside["event_id"], inside["source"], inside["partition"]) == ("evt_2", "github", 3)
    assert "event_id" not in outside


def test_credential_looking_values_are_redacted_whatever_the_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging(fmt="json")
    structlog.get_logger("t").warning(
        "db_unreachable",
        dsn="postgresql://app:pg-pass-123@db.internal:5432/app",
        error="401 from upstream: Authorization: Bearer abcdefghijklmnop-77",
        detail={"config": {"client_secret": "cs-88", "host": "db"}, "calls": ["token=tk-99"]},
        aws_secret_access_key="wJalrXUtnFEMI-66",
        event_id="evt_3",
        count=3,
    )
    line = orjson.loads(capsys.readouterr().err.strip().splitlines()[-1])
    text = orjson.dumps(line).decode()
    for secret in ("pg-pass-123", "abcdefghijklmnop-77", "cs-88", "tk-99", "wJalrXUtnFEMI-66"):
        assert secret not in text
    assert line["dsn"] == "postgresql://app:[REDACTED:password]@db.internal:5432/app"
    assert line["detail"]["config"]["host"] == "db"
    assert line["aws_secret_access_key"] == "[redacted]"
    assert (line["event_id"], line["count"]) == ("evt_3", 3)


def test_an_exception_message_is_redacted_too(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(fmt="json")
    try:
        raise ConnectionError("cannot reach redis://:redis-pass-55@cache:6379/0")
    except ConnectionError:
        structlog.get_logger("t").exception("redis_down")
    err = capsys.readouterr().err
    assert "redis-pass-55" not in err
    assert "[REDACTED:password]" in err


def test_a_long_value_is_cut_before_it_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever a sender puts in a logged value (a URL of 64 KiB), a line reads at most
    ``LOG_VALUE_CHARS`` of each string: its start and its end, secrets redacted in both."""
    configure_logging(fmt="json")
    long = "password=pw-head-1 " + "x" * 100_000 + " Authorization: Bearer tail-secret-22"
    structlog.get_logger("t").warning("webhook_rejected", detail=long, nested={"a": [long]})
    line = orjson.loads(capsys.readouterr().err.strip().splitlines()[-1])
    for value in (line["detail"], line["nested"]["a"][0]):
        assert len(value) < LOG_VALUE_CHARS + 100  # the marker, and "[REDACTED:...]"
        assert f"…[{len(long) - LOG_VALUE_CHARS} characters cut]…" in value
        assert value.startswith("password=[REDACTED:password] xxx")
        assert value.endswith("Authorization: [REDACTED:authorization]")
    assert "pw-head-1" not in orjson.dumps(line).decode()
    assert "tail-secret-22" not in orjson.dumps(line).decode()


def test_a_list_of_strings_is_redacted_like_any_nested_value(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A list of short strings (a decision's tool names) is read with the line's other
    strings: plain, it is printed as it is; holding a credential, it is redacted as a nested
    value, JSON text inside a string included."""
    configure_logging(fmt="json")
    log = structlog.get_logger("t")
    log.info("llm_decided", tools=("publishAlert", "openIssue"), refused=[], model="m")
    log.info(
        "llm_decided",
        tools=["publishAlert", "token=tk-77"],
        refused=['{"password": "pw-66"}'],
        model="m",
    )
    plain, secret = (orjson.loads(x) for x in capsys.readouterr().err.strip().splitlines())
    assert (plain["tools"], plain["refused"]) == (["publishAlert", "openIssue"], [])
    assert secret["tools"][0] == "publishAlert"
    text = orjson.dumps(secret).decode()
    assert "tk-77" not in text and "pw-66" not in text
