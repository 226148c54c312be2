"""attention-trace HTTP service: a thin Flask layer over the numpy engine.

``create_app(settings)`` is the app factory; ``service.wsgi:app`` is what
gunicorn serves, configured from the environment. The endpoints are in
``service/routes/``, one module per family.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import cast

from flask import Flask, Response, g, request
from flask_cors import CORS
from flask_cors.core import ACL_ORIGIN

from .cache import ResponseCache
from .settings import Settings

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

#: CORS: what a browser on another origin may use (the API has no other methods,
#: and reads no other request header)
CORS_METHODS = ("GET", "POST")
CORS_HEADERS = ("Content-Type", "X-Request-ID")

# The API answers JSON only: nothing may run, load or frame.
API_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

#: the headers every answer gets after X-Request-ID, in this order, and whether the service's value replaces a
#: route's own (the viewer sets its own Content-Security-Policy and Cache-Control). Answers are computed per
#: request and may echo a student's tokens: no shared or browser cache keeps them.
SECURITY_HEADERS = (
    ("X-Content-Type-Options", "nosniff", True),
    ("Content-Security-Policy", API_CSP, False),
    ("Referrer-Policy", "no-referrer", True),
    ("Cache-Control", "no-store", False),
)


def find_openapi() -> Path:
    """The contract this package serves: service/openapi.yaml, package data in a wheel (in the repository, a
    link to the top-level openapi.yaml, so there is one file). Never the working directory's: that could be
    another project's."""
    path = Path(__file__).resolve().parent / "openapi.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the service package was installed without its package data")
    return path


def create_app(settings: Settings | None = None) -> Flask:
    settings = settings or Settings.from_env()
    # No app-level static route: the viewer blueprint serves /static/ with its own headers.
    app = Flask(__name__, static_folder=None)
    # No redirect is ever built from the Host header: werkzeug would answer
    # "/static//x" with a 308 to http://<Host>/static/x (an open redirect
    # behind a cache). With slashes not merged, such a path is just a 404.
    app.url_map.merge_slashes = False
    app.config.update(MAX_CONTENT_LENGTH=settings.max_body_bytes)
    app.extensions["attention_trace.settings"] = settings
    app.extensions["attention_trace.openapi"] = find_openapi().read_bytes()
    # The weight cache is per process; the app's settings bound it. (Imported
    # here: gunicorn's master imports this package but never needs numpy.)
    from engine.params import set_cache_bytes

    set_cache_bytes(weights=settings.weight_cache_bytes)
    app.extensions["attention_trace.responses"] = (
        ResponseCache(settings.response_cache_bytes) if settings.response_cache_bytes else None
    )

    from .compression import add_vary, maybe_compress
    from .problems import ProblemError, register_error_handlers
    from .routes import FAMILIES

    for family in FAMILIES:  # one blueprint per endpoint family (service/routes/)
        app.register_blueprint(family.bp)
    register_error_handlers(app)
    # Browser frontends on other origins may call the API; never with credentials.
    # With any origin allowed, answer a literal "*" (cacheable, and browsers
    # refuse credentials with it) instead of echoing the caller's origin.
    # Only the methods and request headers the API uses are allowed.
    any_origin = settings.cors_origins == ("*",)
    cors = _cors_hook(app, lambda: CORS(app, origins=list(settings.cors_origins), supports_credentials=False,
                                        send_wildcard=any_origin, methods=list(CORS_METHODS),
                                        allow_headers=list(CORS_HEADERS), expose_headers=["X-Request-ID"],
                                        max_age=600))
    # flask-cors's answer to a request it always answers alike, computed by flask-cors once, here: not a
    # preflight, no Private-Network request header, and either no Origin or any origin allowed (then "*"
    # whatever the Origin). Copying it costs ~1 µs; asking flask-cors again on every answer cost ~19 µs of an
    # S trace's ~300 µs (in process, measured). Every other request still goes to flask-cors.
    constant_cors = _cors_answer(app, cors)

    @app.before_request
    def _request_id() -> None:
        environ = request.environ
        given = environ.get("HTTP_X_REQUEST_ID", "")
        g.request_id = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        g.cpu_start = time.thread_time()
        # RFC 9112 3.2: a server MUST answer 400 to an HTTP/1.1 request without Host.
        if environ.get("SERVER_PROTOCOL") == "HTTP/1.1" and not environ.get("HTTP_HOST"):
            raise ProblemError(400, "Bad Request", "An HTTP/1.1 request must carry a Host header.",
                               kind="bad-request")

    @app.after_request
    def _headers(resp: Response) -> Response:
        headers = resp.headers
        # The route's header names, read once: werkzeug's Headers finds a name by scanning and lower-casing
        # every header, and raises and catches KeyError for a missing one. A lookup for each header below
        # cost ~10 µs an answer (in process, measured).
        present = {name.lower() for name in headers.keys()}
        added = []
        request_id = g.get("request_id") or uuid.uuid4().hex
        for name, value, replaces in (("X-Request-ID", request_id, True), *SECURITY_HEADERS):
            if name.lower() not in present:
                added.append((name, value))
            elif replaces:
                headers[name] = value
        headers.extend(added)  # appended in the order above, as one assignment each would
        if not any_origin:
            add_vary(resp, "Origin")  # the CORS headers depend on it
        resp = maybe_compress(resp, settings, present)
        environ = request.environ
        if (request.method != "OPTIONS" and "HTTP_ACCESS_CONTROL_REQUEST_PRIVATE_NETWORK" not in environ
                and (any_origin or "HTTP_ORIGIN" not in environ) and ACL_ORIGIN.lower() not in present):
            headers.extend(constant_cors)
            return resp
        return cors(resp)
    return app


def _cors_hook(app: Flask, configure: Callable[[], object]) -> Callable[[Response], Response]:
    """Run ``configure`` (flask-cors's ``CORS(app, ...)``) and take the after-request hook it registers out
    of the app's list, for ``_headers`` to call: it then runs after the service's own headers, as it did
    when flask-cors called it (after-request hooks run last-registered first). flask-cors still wraps the
    app's error handlers with the same hook."""
    hooks = app.after_request_funcs.setdefault(None, [])
    before = list(hooks)
    configure()
    added = [f for f in hooks if f not in before]
    if len(added) != 1:
        raise RuntimeError(f"flask-cors registered {len(added)} after-request hooks, not one")
    hooks.remove(added[0])
    return cast(Callable[[Response], Response], added[0])  # flask-cors's hook (Flask's list types any callable)


def _cors_answer(app: Flask, cors: Callable[[Response], Response]) -> list[tuple[str, str]]:
    """The CORS headers flask-cors adds to a GET or POST answer without an Origin header (with any origin
    allowed, its answer to every Origin)."""
    with app.test_request_context("/", method="GET"):
        resp = app.response_class()
        before = len(list(resp.headers.items()))
        resp = cors(resp)
    return list(resp.headers.items())[before:]  # flask-cors only adds headers, at the end
