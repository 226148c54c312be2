"""The trace's own floor: a plain Flask app that computes an uncached /trace answer and nothing else.

    gunicorn -k sync -w 2 -b 127.0.0.1:PORT bench.compute_floor_app:app   (bench/worker_bench.py starts it)

Its one route reads the body, validates it with the service's own request
model (pydantic) and answers ``render_trace``'s bytes: the same bytes as
/trace. None of the service's app is used (no factory, hooks, CORS, security
headers, error handlers, response cache or compression), and gunicorn runs it
with its own defaults, under the floor's server. So what it costs on top of
bench/floor_app.py is the trace's own work (validation, the engine, the
encoding) under Flask, and what the service costs on top of it is everything
else: the app's edge and the project's worker.

Section 6 reports it for reference, beside the fixed floor: it is the most the
S uncached ratio can reach under Flask with this engine, whatever the server.

It also runs under the project's own server (the committed gunicorn.conf.py),
for the time-per-byte series: there it answers through the same worker, with
the same access log, as the service. For that it echoes X-Request-ID (the
access log names a request by it) and, like the service, tells the worker what
a /trace body costs (``request_cost``: a cheap one is answered on the worker's
event loop) and takes the request the worker validated for it. gunicorn's stock
workers never ask, so under them neither costs anything.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, Response, request

from engine.params import set_cache_bytes
from service.edge import carried
from service.routes.trace import TraceRequest, render_trace
from service.routes.trace import request_cost as trace_request_cost
from service.settings import Settings

_settings = Settings.from_env()
set_cache_bytes(weights=_settings.weight_cache_bytes)  # as the service's factory does
_context = {"settings": _settings}

app = Flask(__name__)


@app.post("/trace")
def trace() -> Response:
    body = request.get_data(cache=False)
    req = carried(request.environ, TraceRequest, body)  # only under the project's worker, for a cheap body
    if req is None:
        req = TraceRequest.model_validate_json(body, context=_context)
    resp = Response(render_trace(req), mimetype="application/json")
    rid = request.headers.get("X-Request-ID")
    if rid is not None:
        resp.headers["X-Request-ID"] = rid
    return resp


@app.get("/health")
def health() -> Response:
    return Response(b'{"status":"ok"}', mimetype="application/json")


def request_cost(method: str, path: str, body: bytes) -> tuple[float, dict[str, Any]] | None:
    """What service/worker.py asks an app about a small body (the service's own answer for /trace)."""
    return trace_request_cost(body, _settings) if method == "POST" and path == "/trace" else None


app.request_cost = request_cost  # type: ignore[attr-defined]  # an attribute of ours
