"""Annotated dependencies: endpoints reach the lifespan's clients through these."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.state import AppState


# ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in the thread pool, a
# thread hop per request. (Webhooks do not come through here: see app/ingest/router.py.)
async def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.gateway
    return state


StateDep = Annotated[AppState, Depends(get_state)]
