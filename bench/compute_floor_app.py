"""The trace's own floor: a plain Flask app that computes an uncached /trace answer and nothing else.

    gunicorn -c gunicorn.conf.py bench.compute_floor_app:app   (bench/server_bench.py starts it, and
    gunicorn -k sync -w 2 -b 127.0.0.1:PORT bench.compute_floor_app:app   under gunicorn's defaults)

Its one route reads the body, validates it with the service's own request
model (pydantic) and answers ``render_trace``'s bytes: the same bytes as
/trace. None of the service's app is used (no factory, hooks, CORS, security
headers, error handlers, response cache or compression). Under the committed
gunicorn.conf.py, what the service costs on top of it is the app's edge
(factory, hooks, request id, CORS, security headers, the compression
decision); section 6 holds the service against it there (S uncached ≥ 0.9×
of it). Under gunicorn's defaults (one listener, no access log) it also says
what the committed server configuration costs.
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
