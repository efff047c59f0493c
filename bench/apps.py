"""The bare baseline of ``bench.ingest``, for ``uvicorn --factory``: served with the same loop
and HTTP parser as ``eventgate api``, so the ratio measures the gateway's own work.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def bare_app() -> FastAPI:
    """Reads the body and answers 202: the ceiling of FastAPI + uvicorn on this machine."""
    app = FastAPI()

    @app.post("/v1/webhooks/{source}", status_code=202)
    async def receive(source: str, request: Request) -> JSONResponse:
        body = await request.body()
        return JSONResponse({"event_id": f"evt_{len(body)}", "status": "queued"}, 202)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
