"""Annotated dependencies: endpoints reach the lifespan's clients through these."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.ingest.service import IngestService
from app.state import AppState


# Dependencies are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in the
# thread pool, a thread hop per request on the ingest hot path (seen in the profile).
async def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.gateway
    return state


async def get_ingest(request: Request) -> IngestService:
    state: AppState = request.app.state.gateway
    return state.ingest


StateDep = Annotated[AppState, Depends(get_state)]
IngestServiceDep = Annotated[IngestService, Depends(get_ingest)]
