"""``GET /docs``: the API's interactive documentation (Swagger UI), served offline.

FastAPI's own page loads Swagger UI from a CDN, so behind a firewall (or on a machine with no
internet) ``/docs`` is a blank page. Here its script and style come from the ``fastapi-offline``
package's copy, served by the API itself under :data:`ASSETS_PATH`. There is no ``/redoc``:
ReDoc fetches its logo from its vendor's CDN whatever it is given."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

#: Where the documentation pages' scripts, styles and icon are served.
ASSETS_PATH = "/docs-assets"
ASSETS_FOLDER = Path(fastapi_offline.__file__).parent / "static"

router = APIRouter(tags=["docs"])


def mount_docs(app: FastAPI) -> None:
    """Serve ``/docs`` and its assets on ``app`` (built with ``docs_url=None, redoc_url=None``)."""
    app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS_FOLDER), name="docs-assets")
    app.include_router(router)


def _root(request: Request) -> str:
    return request.scope.get("root_path", "")  # behind a proxy that serves the API under a prefix


@router.get("/docs", include_in_schema=False)
async def swagger_ui(request: Request) -> HTMLResponse:
    root = _root(request)
    return get_swagger_ui_html(openapi_url=f"{root}{request.app.openapi_url}", title=f"{request.app.title} - Swagger UI",
                               swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
                               swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
                               swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon.png")
