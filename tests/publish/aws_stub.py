"""An SNS endpoint over real HTTP that answers every request with what the test set: an AWS
error (code and status) or a PublishBatch result with failed entries. The aioboto3 client,
botocore's parsing of the reply and ``SnsPublisher`` all run as in production; moto cannot
produce these answers (expired credentials, clock skew, throttling)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from xml.sax.saxutils import escape

from tests.support import free_port

_ERROR = (
    "<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code>"
    "<Message>{message}</Message></Error><RequestId>stub</RequestId></ErrorResponse>"
)
_BATCH = (
    '<PublishBatchResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/">'
    "<PublishBatchResult><Successful>{successful}</Successful><Failed>{failed}</Failed>"
    "</PublishBatchResult><ResponseMetadata><RequestId>stub</RequestId></ResponseMetadata>"
    "</PublishBatchResponse>"
)


class AwsStub:
    """``url`` answers each request with ``status`` and ``body``; ``requests`` counts them and
    ``received`` keeps each one's headers and body as they arrived."""

    def __init__(self) -> None:
        self.port = free_port()
        self.status = 500
        self.body = _ERROR.format(code="InternalError", message="not set up")
        self.requests = 0
        self.received: list[tuple[dict[str, str], bytes]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                stub.received.append((dict(self.headers.items()), body))
                stub.requests += 1
                payload = stub.body.encode()
                self.send_response(stub.status)
                self.send_header("Content-Type", "text/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> AwsStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def error(self, code: str, status: int, message: str = "refused by the stub") -> None:
        self.status = status
        self.body = _ERROR.format(code=escape(code), message=escape(message))

    def batch(self, *, successful: list[int], failed: dict[int, tuple[str, bool]]) -> None:
        """A 200 PublishBatch reply: entry ids in ``successful`` accepted, those in
        ``failed`` refused with (code, SenderFault)."""
        self.status = 200
        self.body = _BATCH.format(
            successful="".join(
                f"<member><Id>{i}</Id><MessageId>stub-{i}</MessageId></member>" for i in successful
            ),
            failed="".join(
                f"<member><Id>{i}</Id><Code>{escape(code)}</Code><Message>stub</Message>"
                f"<SenderFault>{str(sender).lower()}</SenderFault></member>"
                for i, (code, sender) in failed.items()
            ),
        )
