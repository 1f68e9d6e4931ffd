"""The web pages the gateway serves: ``/demo`` (a chat page on the web SDK),
``/dashboard`` (the operator's live view) and ``/docs`` (Swagger UI on the OpenAPI
document, with ``server.docs``).

Their sources are in ``webui/``; ``make webui`` (part of ``make run`` and ``make test``)
bundles them, with the web SDK, uPlot and Swagger UI (pinned), into ``webui/dist``, which
is what is served here: every asset comes from the gateway itself, so the pages work
without any network and run no code from elsewhere on the origin that holds the admin
key. ``$TOKENPACE_WEBUI_DIR`` points elsewhere (an installed copy of the bundle).

Every page says so to the browser (:data:`PAGE_HEADERS`): a Content-Security-Policy that
allows scripts, styles, images and requests from the gateway only, and no framing
(``frame-ancestors 'none'``, and ``X-Frame-Options: DENY`` for older browsers), so the
admin key's form cannot be overlaid by another site; ``nosniff`` is on every response
(:class:`~gateway.http.middleware.GatewayMiddleware`).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.staticfiles import StaticFiles

from gateway.errors import SERVER_ERROR, GatewayError

WEBUI_DIR_ENV = "TOKENPACE_WEBUI_DIR"
ASSETS_PATH = "/webui"
PAGES = {"/demo": "demo.html", "/dashboard": "dashboard.html"}
DOCS = {"/docs": "docs.html"}  # with server.docs
HTML = "text/html; charset=utf-8"
PAGE_HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


def pages_not_built() -> GatewayError:
    """The answer, to anyone: without the server's filesystem paths."""
    return GatewayError(
        503,
        "The web pages are not built on this gateway: run `make webui`, which runs npm ci "
        f"and the build in webui/ (or point {WEBUI_DIR_ENV} at the built pages).",
        type=SERVER_ERROR,
        code="webui_not_built",
    )


def webui_dir() -> Path:
    """Where the built pages are: ``$TOKENPACE_WEBUI_DIR``, else the checkout's webui/dist."""
    configured = os.environ.get(WEBUI_DIR_ENV)
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2] / "webui" / "dist"


def is_built(directory: Path | None = None) -> bool:
    return all(((directory or webui_dir()) / name).is_file() for name in PAGES.values())


class _Assets(StaticFiles):
    """The bundle's scripts and styles; never cached stale across rebuilds."""

    def file_response(self, *args: object, **kwargs: object) -> Response:
        response = super().file_response(*args, **kwargs)  # type: ignore[arg-type]
        response.headers["Cache-Control"] = "no-cache"
        return response


def add_page_routes(app: FastAPI, *, docs: bool) -> None:
    """``GET /demo``, ``GET /dashboard``, with ``docs`` ``GET /docs``, and their assets
    under ``/webui/``; ``GET /`` names them and the API (JSON)."""
    directory = webui_dir()

    def page(name: str) -> Callable[[Request], Awaitable[Response]]:
        async def serve(request: Request) -> Response:
            path = directory / name
            if not path.is_file():
                raise pages_not_built()
            return FileResponse(path, media_type=HTML, headers=PAGE_HEADERS)

        return serve

    links = {"api": "/v1", **{r.lstrip("/"): r for r in {**PAGES, **(DOCS if docs else {})}}}

    async def index() -> JSONResponse:
        pages = ", ".join(r for r in links.values() if r != "/v1")
        return JSONResponse(
            {
                "object": "tokenpace.gateway",
                "message": f"tokenpace gateway: the OpenAI-compatible API is under /v1; "
                f"its web pages are {pages}.",
                "links": links,
            }
        )

    app.add_api_route(
        "/",
        index,
        methods=["GET"],
        tags=["pages"],
        summary="Where things are",
        include_in_schema=False,
    )
    for route, name in {**PAGES, **(DOCS if docs else {})}.items():
        app.add_api_route(
            route,
            page(name),
            methods=["GET"],
            tags=["pages"],
            summary=f"The {name.removesuffix('.html')} page (HTML)",
            response_class=Response,
            include_in_schema=False,
        )
    app.mount(ASSETS_PATH, _Assets(directory=directory, check_dir=False), name="webui")
