"""The trace's own floor: a plain Flask app that computes an uncached /trace answer and nothing else.

    gunicorn -k sync -w 2 -b 127.0.0.1:PORT bench.compute_floor_app:app   (bench/server_bench.py starts it)

Its one route reads the body, validates it with the service's own request
model (pydantic) and answers ``render_trace``'s bytes: the same bytes as
/trace. None of the service's app is used (no factory, hooks, CORS, security
headers, error handlers, response cache or compression), and gunicorn runs it
with its own defaults, under the floor's server. So what it costs on top of
bench/floor_app.py is the trace's own work (validation, the engine, the
encoding) under Flask, and what the service costs on top of it is everything
else: the app's edge (factory, hooks, CORS, headers, cache).

Section 6 holds the service against it under the same worker class (S
uncached ≥ 0.9× of it), and it is the most the ratio against the plain floor
can reach under Flask with this engine, whatever the server.
"""

from __future__ import annotations

from flask import Flask, Response, request

from engine.params import set_cache_bytes
from service.routes.trace import TraceRequest, render_trace
from service.settings import Settings

_settings = Settings.from_env()
set_cache_bytes(weights=_settings.weight_cache_bytes)  # as the service's factory does
_context = {"settings": _settings}

app = Flask(__name__)


@app.post("/trace")
def trace() -> Response:
    body = request.get_data(cache=False)
    req = TraceRequest.model_validate_json(body, context=_context)
    resp = Response(render_trace(req), mimetype="application/json")
    rid = request.headers.get("X-Request-ID")
    if rid is not None:
        resp.headers["X-Request-ID"] = rid
    return resp


@app.get("/health")
def health() -> Response:
    return Response(b'{"status":"ok"}', mimetype="application/json")
