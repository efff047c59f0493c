"""Liveness, readiness and Prometheus metrics. What readiness checks is registered by the app
factory (``app.state.health``, a ``Health``), per role."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.observability.health import Health

router = APIRouter(tags=["health"])


def _health(request: Request) -> Health:
    health: Health = request.app.state.health
    return health


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up and serving."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready when Redis and the database answer, every background loop runs and (in a role
    that calls Claude) Claude is configured; the body lists each check."""
    ready, checks = await _health(request).readiness()
    return JSONResponse(
        {"status": "ready" if ready else "not_ready", "checks": checks},
        status_code=200 if ready else 503,
    )


@router.get("/metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    await _health(request).refresh()
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
