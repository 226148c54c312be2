"""The viewer: a static teaching page at ``GET /`` that draws the trace, and its offline export.

It is a plain client of the public JSON API (it only ``fetch``es ``/trace``,
``/explain``, ``/trace/html`` and ``/version``), served from
``service/static/`` with no build step and nothing from another origin: the
page, its style sheet, its icon and its scripts (plain scripts loaded in order
with ``defer``, format.js … app.js), and no other file (``VIEWER_FILES``). Its
responses carry their own Content-Security-Policy, which allows this origin's
script, style and fetches and nothing else (no inline script or style, no
framing); the API keeps its stricter policy (``API_CSP`` in
``service/__init__.py``, set only where a route set none).

``POST /trace/html`` answers a /trace request with the viewer's page for that
trace as one offline file (service/offline_page.py), as a download.
"""

from __future__ import annotations

import re
from pathlib import Path

from flask import Blueprint, Response, current_app, g, send_from_directory
from werkzeug.exceptions import NotFound

STATIC_DIR = Path(__file__).resolve().parent / "static"

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


@bp.post("/trace/html")
def trace_html() -> Response:
    """The trace of a /trace request body, drawn by the viewer, in one self-contained HTML file (a download)."""
    import orjson

    from . import budget, compression, core
    from .api import parse_body, read_json_body, settings
    from .models import TraceRequest
    from .problems import ProblemError
    from .offline_page import comparison_request, export_filename, render_html_bytes

    raw = read_json_body()
    req = parse_body(TraceRequest, raw)
    if req.stages is not None:
        message = "the page draws every stage: leave out stages"
        raise ProblemError(422, "Invalid request", f"/stages: {message}", kind="validation-error",
                           errors=[{"pointer": "/stages", "type": "export_needs_every_stage", "message": message}])
    limits = settings()
    # The page's cost, before any work (service/budget.py): over the budget, refused.
    work = budget.page_cost([req])
    if work > limits.max_request_cost:
        raise ProblemError(422, "Invalid request",
                           f"the page for this trace would cost {work} units of work, above the limit of "
                           f"{limits.max_request_cost}; use fewer tokens, a smaller d_model or fewer heads "
                           "(POST /trace answers the trace itself)",
                           kind="validation-error",
                           errors=[{"pointer": "", "type": "page_too_costly",
                                    "message": f"{work} units; the limit is {limits.max_request_cost}"}])
    body = orjson.loads(raw)
    # The "why divide by √d_k" comparison, as the viewer asks for it; left out when both traces together would
    # exceed one request's work budget (the page then says it holds none).
    alt = parse_body(TraceRequest, orjson.dumps(comparison_request(body)))
    with_alt = budget.page_cost([req, alt])
    compare = with_alt <= limits.max_request_cost
    work = with_alt if compare else work
    doc = core.trace_document(req)
    comparison = core.trace_document(alt) if compare else None
    g.cpu_estimate = compression.estimate_s(work)
    page = render_html_bytes(doc, body, comparison=comparison)
    resp = current_app.response_class(page, mimetype="text/html")
    resp.headers["Content-Type"] = "text/html; charset=utf-8"
    resp.headers["Content-Disposition"] = f'attachment; filename="{export_filename(doc, body)}"'
    return resp
