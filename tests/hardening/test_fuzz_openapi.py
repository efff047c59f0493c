"""Schemathesis against the ingest role's own OpenAPI schema, in-process over ASGI.

The app is built at import (nothing connects before its lifespan starts, which schemathesis
runs on the first request and ends with the test). Redis is the real one when reachable
(a private key prefix), else ``memory://``; the database is a throwaway SQLite file, since
the ingest role only pings it.

Budget: at most ``MAX_EXAMPLES`` generated cases per operation, positive and negative data.
Each generated webhook case is sent three times: as generated (random source names → 404),
to the GitHub source unsigned (→ 401, or 413 first when over the limit), and to a token
source with the right token, so the generated bodies and content types reach parsing,
batching, dedup and the queue (→ 200/202/400/413/415). Every response must be non-5xx and
conform to the schema (status code, content type, headers, body).
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from app.config import parse_config
from app.main import create_app
from app.settings import Settings
from tests.conftest import HAVE_REDIS, REDIS_URL

MAX_EXAMPLES = 60
TOKEN = "fuzz-token-0123456789"
ADMIN_TOKEN = "fuzz-admin-token-0123456789"
CONFIG = f"""
sources:
  github: {{type: github, secret: fuzz-github-secret, pipeline: triage}}
  hook: {{type: token, token: {TOKEN}, split: true, group_key: device, pipeline: triage}}
pipelines:
  triage: {{model: claude-sonnet-4-6, system: triage, tools: [publishAlert]}}
tools:
  publishAlert:
    description: Raise an alert.
    input_schema: {{type: object, properties: {{title: {{type: string}}}}}}
"""
_DB = Path(tempfile.mkdtemp(prefix="eventgate-fuzz-")) / "fuzz.db"

app = create_app(
    Settings(
        redis_url=REDIS_URL if HAVE_REDIS else "memory://",
        redis_prefix=f"egfuzz-{uuid.uuid4().hex[:10]}",
        database_url=f"sqlite+aiosqlite:///{_DB}",
        max_body_bytes=2048,  # small, so generated bodies reach the 413 branch too
        log_format="json",
        log_level="warning",
        admin_token=ADMIN_TOKEN,
    ),
    parse_config(CONFIG, env={}),
    role="api",
)
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors_and_responses_conform(case: Any) -> None:
    if case.operation.path.startswith("/v1/") and "webhooks" not in case.operation.path:
        # The admin API with its token (its 401 without one is covered in tests/admin). A
        # cursor is opaque: any string fits the schema, but only one the API handed out is
        # accepted (400 otherwise), so the "valid data is accepted" check cannot apply; and
        # times are parsed leniently (a Unix timestamp is a fine `since`), more than the
        # schema's date-time, so neither can "invalid data is rejected".
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {ADMIN_TOKEN}"}
        case.call_and_validate(excluded_checks=[positive_data_acceptance, negative_data_rejection])
        return
    case.call_and_validate()
    if case.operation.path == "/v1/webhooks/{source}":
        # Which bodies a source accepts depends on its config and limits (a scalar is fine
        # for a token source, a non-object reading is not for a split one; the size limit
        # is checked before the signature), which one static schema for every source cannot
        # express; the remaining checks hold for any source.
        lenient = [negative_data_rejection, positive_data_acceptance]
        case.path_parameters = {"source": "github"}  # unsigned
        case.call_and_validate(excluded_checks=lenient)
        case.path_parameters = {"source": "hook"}
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {TOKEN}"}
        case.call_and_validate(excluded_checks=lenient)
