"""The service's request path, for in-process timings.

``render(raw, settings)`` is what POST /trace does for a body, without HTTP:
validate with ``TraceRequest`` then ``service.routes.trace.render_trace``. ``WsgiCaller`` goes through
the whole Flask app in process (routing, hooks, CORS, error handling), which
is the server's work minus gunicorn and the socket.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from service.routes import trace as trace_route
from service.routes.trace import TraceRequest
from service.settings import Settings


render_trace: Callable[[TraceRequest], bytes] = trace_route.render_trace


def validate(raw: bytes, settings: Settings) -> TraceRequest:
    return TraceRequest.model_validate_json(raw, context={"settings": settings})


def render(raw: bytes, settings: Settings) -> bytes:
    return render_trace(validate(raw, settings))


def render_npz(raw: bytes, settings: Settings) -> list[bytes]:
    """What POST /trace does for ``Accept: application/x-npz`` (service/npz.py), without HTTP."""
    return trace_route.render_trace_npz(validate(raw, settings))


class WsgiCaller:
    """POST a body to a path of a WSGI app in process; returns (status line, body bytes)."""

    def __init__(self, app: Any, path: str, body: bytes) -> None:
        from werkzeug.test import EnvironBuilder

        self.app = app
        self.body = body
        b = EnvironBuilder(path=path, method="POST", data=body, content_type="application/json",
                           base_url="http://127.0.0.1:8000/")
        try:
            self.environ = b.get_environ()
        finally:
            b.close()

    def __call__(self) -> tuple[str, bytes]:
        env = dict(self.environ)
        env["wsgi.input"] = io.BytesIO(self.body)
        status: list[str] = []

        def start_response(s: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
            status.append(s)
            return lambda _data: None

        it = self.app(env, start_response)
        try:
            out = b"".join(it)
        finally:
            close = getattr(it, "close", None)
            if close:
                close()
        return status[0], out
