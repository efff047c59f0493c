"""Admin API (Bearer EVENTGATE_ADMIN_TOKEN). Filled in by the operating issue."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["admin"])
