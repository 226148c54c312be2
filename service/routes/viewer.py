"""GET / and /static/…: the viewer, a static teaching page that draws the trace.

It is a plain client of the public JSON API (it only ``fetch``es ``/trace``,
``/explain``, ``/trace/html`` and ``/version``), served from
``service/static/`` with no build step and nothing from another origin: the
page, its style sheet, its icon and its scripts (plain scripts loaded in order
with ``defer``, format.js … app.js), and no other file (``VIEWER_FILES``). Its
responses carry their own Content-Security-Policy, which allows this origin's
script, style and fetches and nothing else (no inline script or style, no
framing); the API keeps its stricter policy (``API_CSP`` in
``service/__init__.py``, set only where a route set none).

``POST /trace/html`` (service/routes/trace.py) answers a /trace request with
the viewer's page for that trace as one offline file (viewer/offline_page.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flask import Blueprint, Response, send_from_directory
from pydantic import BaseModel
from werkzeug.exceptions import NotFound

if TYPE_CHECKING:
    from ..openapi import Parts

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"

#: what /static/ serves: the files the page refers to (its scripts, style sheet and icon), and the page itself
VIEWER_FILES = frozenset(
    re.findall(r'(?:src|href)="static/([^"]+)"', (STATIC_DIR / "index.html").read_text(encoding="utf-8"))
) | {"index.html"}

VIEWER_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'none'"
)

bp = Blueprint("viewer", __name__)


def _with_viewer_headers(resp: Response) -> Response:
    resp.headers["Content-Security-Policy"] = VIEWER_CSP
    resp.headers["X-Frame-Options"] = "DENY"
    resp.headers["Cross-Origin-Opener-Policy"] = "same-origin"
    # Not content-hashed names: revalidate each time (ETag / Last-Modified make it a cheap 304).
    resp.headers["Cache-Control"] = "no-cache"
    return resp


@bp.get("/")
def index() -> Response:
    return _with_viewer_headers(send_from_directory(STATIC_DIR, "index.html", mimetype="text/html"))


@bp.get("/static/<path:filename>")
def static(filename: str) -> Response:
    # Only the viewer's own files (404, as problem+json, for any other name: send_from_directory would also refuse
    # paths outside STATIC_DIR).
    if filename not in VIEWER_FILES:
        raise NotFound()
    return _with_viewer_headers(send_from_directory(STATIC_DIR, filename))


#: the viewer's answers are files, described in openapi.yaml without a schema of their own
MODELS: tuple[type[BaseModel], ...] = ()


def openapi_paths(parts: Parts) -> dict[str, Any]:
    """/ and /static/{path}: their path items of openapi.yaml (service/openapi.py). Static files have no
    failure of their own to report (no 500)."""
    common = {k: v for k, v in parts.common.items() if k != "500"}
    return {
        "/": {"get": {
            "operationId": "viewer", "tags": ["viewer"], "summary": "The interactive walkthrough page",
            "description": "A self-contained teaching page (docs/viewer.md) that draws the trace using only "
                           "this public API. It carries its own Content-Security-Policy.",
            "responses": {"200": {"description": "The page.", "headers": parts.headers,
                                  "content": {"text/html": {"schema": {"type": "string"}}}},
                          "304": {"description": "Not modified (ETag / If-None-Match)."},
                          **common},
        }},
        "/static/{path}": {"get": {
            "operationId": "viewerStatic", "tags": ["viewer"], "summary": "The page's script, style and icon",
            "parameters": [{"name": "path", "in": "path", "required": True, "schema": {"type": "string"},
                            "description": "A file of the viewer, e.g. app.js."}],
            "responses": {"200": {"description": "The file.", "headers": parts.headers, "content": {
                mime: {"schema": {"type": "string"}}
                for mime in ("text/html", "text/javascript", "text/css", "image/svg+xml")}},
                "304": {"description": "Not modified (ETag / If-None-Match)."},
                **common},
        }},
    }
