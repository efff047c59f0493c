"""SNS certificate and subscription URLs: whatever string a (forged) message carries, the
gateway accepts it only if the host an HTTP client would really connect to is an SNS host,
over https on the default port. Checked against httpx's own URL parser, so a parser
differential (``\\``, ``@``, ``#``, odd dots, userinfo) cannot smuggle another host in."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.sources.aws_sns import SNS_HOST, SnsCertificates, check_sns_url
from app.sources.exceptions import InvalidSignature
from tests.sources_support import FakeSnsHttp

pieces = st.sampled_from(
    [
        "sns.us-east-1.amazonaws.com",
        "sns.cn-north-1.amazonaws.com.cn",
        "evil.example",
        "amazonaws.com",
        "@",
        "\\",
        "#",
        "?",
        "/",
        ":",
        ":443",
        ":8443",
        ".",
        "\u3002",
        "%2e",
        "%40",
        "user:pw@",
        "SNS.US-EAST-1.AMAZONAWS.COM",
        "cert.pem",
        " ",
        "\t",
    ]
)
urls = st.builds(
    lambda scheme, parts: scheme + "".join(parts),
    st.sampled_from(["https://", "http://", "HTTPS://", "https:/", "//", "https:\\\\"]),
    st.lists(pieces, min_size=1, max_size=7),
)


@settings(max_examples=500)
@given(url=urls)
@example(url="https://sns.us-east-1.amazonaws.com\\@evil.example/cert.pem")
@example(url="https://evil.example#@sns.us-east-1.amazonaws.com/cert.pem")
@example(url="https://sns.us-east-1.amazonaws.com.evil.example/cert.pem")
@example(url="https://sns.us-east-1.amazonaws.com:443/cert.pem")
def test_accepted_urls_connect_only_to_sns_hosts(url: str) -> None:
    try:
        check_sns_url(url, "SigningCertURL")
    except InvalidSignature:
        return
    parsed = httpx.URL(url)  # what the client would fetch
    assert parsed.scheme == "https"
    assert SNS_HOST.match(parsed.host), parsed.host
    assert parsed.port is None
    assert not parsed.userinfo


async def test_certificate_is_fetched_only_from_an_sns_pem_url() -> None:
    http = FakeSnsHttp({})
    certificates = SnsCertificates(http)
    for url in (
        "https://sns.us-east-1.amazonaws.com.evil.example/a.pem",
        "https://evil.example/sns.us-east-1.amazonaws.com/a.pem",
        "https://sns.us-east-1.amazonaws.com/a.pem.txt",
        "https://sns.us-east-1.amazonaws.com\\@evil.example/a.pem",
        "file:///etc/passwd",
    ):
        with pytest.raises(InvalidSignature):
            await certificates.public_key(url)
    assert http.fetched == []


@pytest.mark.parametrize(
    ("host", "accepted"),
    [
        ("sns.us-east-1.amazonaws.com", True),
        ("sns.eu-central-2.amazonaws.com", True),
        ("sns.us-gov-west-1.amazonaws.com", True),
        ("sns.ap-southeast-5.amazonaws.com", True),
        ("sns.cn-north-1.amazonaws.com.cn", True),
        # An S3 bucket named like that is anyone's: "s3" is no region.
        ("sns.s3.amazonaws.com", False),
        ("sns.evil.amazonaws.com", False),
        ("sns.us-east.amazonaws.com", False),
        ("sns.us-east-1-evil.amazonaws.com", False),
        ("sns.amazonaws.com", False),
    ],
)
def test_only_region_hosts_are_sns_hosts(host: str, accepted: bool) -> None:
    url = f"https://{host}/SimpleNotificationService-x.pem"
    if accepted:
        check_sns_url(url, "SigningCertURL")
    else:
        with pytest.raises(InvalidSignature):
            check_sns_url(url, "SigningCertURL")
