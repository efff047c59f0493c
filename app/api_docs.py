"""``/docs`` (Swagger UI) and ``/redoc`` served with their JavaScript and CSS from the installed
``fastapi-offline`` package, so the pages work on a machine without internet (FastAPI's own
pages load them from a CDN). The app factory turns FastAPI's pages off and calls this."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/docs-assets"
# The package ships swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js, favicon.png.
ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"


def install_offline_docs(
    app: FastAPI, *, docs_url: str = "/docs", redoc_url: str = "/redoc"
) -> None:
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_url = f"{docs_url}/oauth2-redirect"
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

    def assets(request: Request) -> str:
        return f"{request.scope.get('root_path', '')}{ASSETS_URL}"

    @app.get(docs_url, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - API docs",
            oauth2_redirect_url=f"{root}{oauth2_url}",
            swagger_js_url=f"{assets(request)}/swagger-ui-bundle.js",
            swagger_css_url=f"{assets(request)}/swagger-ui.css",
            swagger_favicon_url=f"{assets(request)}/favicon.png",
        )

    @app.get(oauth2_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(redoc_url, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{assets(request)}/redoc.standalone.js",
            redoc_favicon_url=f"{assets(request)}/favicon.png",
            with_google_fonts=False,
        )
