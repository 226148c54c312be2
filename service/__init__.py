"""attention-trace HTTP service: a thin Flask layer over the numpy engine.

``create_app(settings)`` is the app factory; ``service.wsgi:app`` is what
gunicorn serves, configured from the environment.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from flask import Flask, Response, g, request
from flask_cors import CORS

from .cache import ResponseCache
from .settings import Settings

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

# The API answers JSON only: nothing may run, load or frame.
API_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"


def find_openapi() -> Path:
    """openapi.yaml at the repository root (dev) or the working directory (container)."""
    for candidate in (Path(__file__).resolve().parent.parent / "openapi.yaml", Path.cwd() / "openapi.yaml"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("openapi.yaml not found next to the service package or in the working directory")


def create_app(settings: Settings | None = None) -> Flask:
    settings = settings or Settings.from_env()
    # No app-level static route: the viewer blueprint serves /static/ with its own headers.
    app = Flask(__name__, static_folder=None)
    app.config.update(MAX_CONTENT_LENGTH=settings.max_body_bytes)
    app.extensions["attention_trace.settings"] = settings
    app.extensions["attention_trace.openapi"] = find_openapi().read_bytes()
    app.extensions["attention_trace.responses"] = (
        ResponseCache(settings.response_cache_bytes) if settings.response_cache_bytes else None
    )

    from .api import bp
    from .compression import maybe_compress
    from .problems import register_error_handlers
    from .viewer import bp as viewer_bp

    app.register_blueprint(bp)
    app.register_blueprint(viewer_bp)
    register_error_handlers(app)
    # Browser frontends on other origins may call the API; never with credentials.
    # With any origin allowed, answer a literal "*" (cacheable, and browsers
    # refuse credentials with it) instead of echoing the caller's origin.
    CORS(app, origins=list(settings.cors_origins), supports_credentials=False,
         send_wildcard=settings.cors_origins == ("*",), expose_headers=["X-Request-ID"], max_age=600)

    @app.before_request
    def _request_id() -> None:
        given = request.headers.get("X-Request-ID", "")
        g.request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex

    @app.after_request
    def _headers(resp: Response) -> Response:
        resp.headers["X-Request-ID"] = g.get("request_id") or uuid.uuid4().hex
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers.setdefault("Content-Security-Policy", API_CSP)
        resp.headers["Referrer-Policy"] = "no-referrer"
        return maybe_compress(resp, settings)

    return app
