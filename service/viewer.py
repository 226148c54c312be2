"""The viewer: a static teaching page at ``GET /`` that draws the trace.

It is a plain client of the public JSON API (it only ``fetch``es ``/trace``
and ``/version``), served from ``service/static/`` with no build step and
nothing from another origin. Its responses carry their own
Content-Security-Policy, which allows this origin's script, style and fetches
and nothing else (no inline script or style, no framing); the API keeps its
stricter policy (``API_CSP`` in ``service/__init__.py``, set only where a
route set none).
"""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Response, send_from_directory

STATIC_DIR = Path(__file__).resolve().parent / "static"

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
    # send_from_directory refuses paths outside STATIC_DIR (404, as problem+json).
    return _with_viewer_headers(send_from_directory(STATIC_DIR, filename))
