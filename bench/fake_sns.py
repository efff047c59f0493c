"""A stand-in for SNS's query API in benchmarks: Publish, PublishBatch and
GetTopicAttributes, each answered after a fixed latency, every call and message counted.

moto's cost grows with what its queues hold (docs/benchmarks.md), so a benchmark that counts
or times SNS calls talks to this instead. It keeps no queues: ``GET /_stats`` says how many
calls, messages and bytes arrived, and how many deduplication ids came more than once.

    python -m bench.fake_sns --port 8790 [--latency 0.02]
"""

from __future__ import annotations

import argparse
import asyncio
import uuid
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from aiohttp import web

NAMESPACE = "http://sns.amazonaws.com/doc/2010-03-31/"


@dataclass
class Seen:
    calls: int = 0
    messages: int = 0
    body_bytes: int = 0
    dedup_ids: set[str] = field(default_factory=set)
    repeated: int = 0

    def message(self, body: str, dedup_id: str) -> None:
        self.messages += 1
        self.body_bytes += len(body.encode())
        if dedup_id in self.dedup_ids:
            self.repeated += 1
        self.dedup_ids.add(dedup_id)


def _answer(action: str, result: str) -> web.Response:
    xml = (
        f'<{action}Response xmlns="{NAMESPACE}"><{action}Result>{result}</{action}Result>'
        f"<ResponseMetadata><RequestId>{uuid.uuid4()}</RequestId></ResponseMetadata>"
        f"</{action}Response>"
    )
    return web.Response(text=xml, content_type="text/xml")


def _entries(form: dict[str, str]) -> list[dict[str, str]]:
    entries: dict[int, dict[str, str]] = {}
    head = "PublishBatchRequestEntries.member."
    for name, value in form.items():
        if name.startswith(head):
            index, _, rest = name[len(head) :].partition(".")
            entries.setdefault(int(index), {})[rest] = value
    return [entries[index] for index in sorted(entries)]


def build_app(latency: float) -> web.Application:
    seen = Seen()

    async def api(request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items()}
        seen.calls += 1
        await asyncio.sleep(latency)
        action = form.get("Action", "")
        if action == "PublishBatch":
            members = []
            for entry in _entries(form):
                seen.message(entry.get("Message", ""), entry.get("MessageDeduplicationId", ""))
                members.append(
                    f"<member><Id>{escape(entry['Id'])}</Id><MessageId>{uuid.uuid4()}</MessageId>"
                    f"<SequenceNumber>{seen.messages:020d}</SequenceNumber></member>"
                )
            return _answer(action, f"<Successful>{''.join(members)}</Successful><Failed></Failed>")
        if action == "Publish":
            seen.message(form.get("Message", ""), form.get("MessageDeduplicationId", ""))
            return _answer(action, f"<MessageId>{uuid.uuid4()}</MessageId>")
        if action == "GetTopicAttributes":
            arn = escape(form.get("TopicArn", ""))
            return _answer(
                action,
                f"<Attributes><entry><key>TopicArn</key><value>{arn}</value></entry></Attributes>",
            )
        return web.Response(status=400, text=f"unsupported action {action!r}")

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "calls": seen.calls,
                "messages": seen.messages,
                "body_bytes": seen.body_bytes,
                "repeated_dedup_ids": seen.repeated,
            }
        )

    app = web.Application(client_max_size=4 * 2**20)
    app.router.add_post("/", api)
    app.router.add_get("/_stats", stats)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per call")
    args = parser.parse_args()
    web.run_app(build_app(args.latency), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
