"""attention-trace HTTP service: a thin Flask layer over the numpy engine.

``create_app(settings)`` is the app factory; ``service.wsgi:app`` is what
gunicorn serves, configured from the environment. The endpoints are in
``service/routes/``, one module per family.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from flask import Flask, Response, request
from flask_cors import CORS

from .cache import ResponseCache
from .compression import CPU_START
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


def constant_cors_applies(environ: Mapping[str, Any], any_origin: bool) -> bool:
    """Whether flask-cors's answer to this request is the one it always gives (``_cors_answer``): not a
    preflight, no Private-Network request header, and either no Origin or any origin allowed (then "*"
    whatever the Origin)."""
    return (environ.get("REQUEST_METHOD") != "OPTIONS"
            and "HTTP_ACCESS_CONTROL_REQUEST_PRIVATE_NETWORK" not in environ
            and (any_origin or "HTTP_ORIGIN" not in environ))


class AnswerHeaders:
    """WSGI middleware around the Flask app: every answer's X-Request-ID, security headers (SECURITY_HEADERS)
    and, where flask-cors's answer is always the same, its CORS headers, added to the finished header list.

    They are constants (the request id aside), so they are added as plain tuples: werkzeug's ``Headers``
    checks every value it is given, and adding these in an after-request hook cost ~25 µs of an S trace's
    ~830 µs of worker CPU over HTTP (docs/deploy.md). X-Request-ID, X-Content-Type-Options and Referrer-Policy
    replace a route's own in its place; a route's own Content-Security-Policy and Cache-Control are kept; the
    rest are appended in SECURITY_HEADERS' order. Responses to every request pass here, errors included."""

    def __init__(self, wsgi_app: Callable[..., Iterable[bytes]], constant_cors: list[tuple[str, str]],
                 any_origin: bool) -> None:
        self.wsgi_app = wsgi_app
        self.constant_cors = constant_cors
        self.any_origin = any_origin
        self.replaced = {name.lower(): (name, value) for name, value, replaces in SECURITY_HEADERS if replaces}
        self.appended = [(name, value, name.lower()) for name, value, _ in SECURITY_HEADERS]

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        environ[CPU_START] = time.thread_time()  # what compression may spend is measured from here
        given = environ.get("HTTP_X_REQUEST_ID", "")
        request_id = given if _REQUEST_ID.match(given) else secrets.token_hex(16)
        cors = self.constant_cors if constant_cors_applies(environ, self.any_origin) else ()
        replaced = {"x-request-id": ("X-Request-ID", request_id), **self.replaced}

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            present = set()
            for i, (name, _) in enumerate(headers):
                low = name.lower()
                present.add(low)
                if low in replaced:
                    headers[i] = replaced[low]
            if "x-request-id" not in present:
                headers.append(("X-Request-ID", request_id))
            headers.extend((name, value) for name, value, low in self.appended if low not in present)
            if cors and "access-control-allow-origin" not in present:  # an error handler's answer has flask-cors'
                headers.extend(cors)
            return start_response(status, headers, exc_info)

        return self.wsgi_app(environ, start)


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
    # flask-cors's answer to a request it always answers alike (constant_cors_applies), computed by flask-cors
    # once, here, and added by AnswerHeaders; asking flask-cors again on every answer cost ~19 µs of an S
    # trace's ~300 µs (in process, measured). Every other request still goes to flask-cors.
    app.wsgi_app = AnswerHeaders(app.wsgi_app, _cors_answer(app, cors), any_origin)  # type: ignore[method-assign]

    @app.before_request
    def _check_request() -> None:
        # RFC 9112 3.2: a server MUST answer 400 to an HTTP/1.1 request without Host.
        environ = request.environ
        if environ.get("SERVER_PROTOCOL") == "HTTP/1.1" and not environ.get("HTTP_HOST"):
            raise ProblemError(400, "Bad Request", "An HTTP/1.1 request must carry a Host header.",
                               kind="bad-request")

    @app.after_request
    def _encode(resp: Response) -> Response:
        if not any_origin:
            add_vary(resp, "Origin")  # the CORS headers depend on it
        resp = maybe_compress(resp, settings)
        return resp if constant_cors_applies(request.environ, any_origin) else cors(resp)
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
