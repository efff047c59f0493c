"""Annotated dependencies: endpoints reach the lifespan's clients through these."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.ingest.service import IngestService
from app.state import AppState


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.gateway
    return state


def get_ingest(request: Request) -> IngestService:
    return get_state(request).ingest


StateDep = Annotated[AppState, Depends(get_state)]
IngestServiceDep = Annotated[IngestService, Depends(get_ingest)]
