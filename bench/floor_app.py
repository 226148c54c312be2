"""The whole-stack floor: a plain Flask app that answers a prepared body, for gunicorn's sync worker.

    gunicorn -k sync -w 2 -b 127.0.0.1:PORT bench.floor_app:app   (bench/server_bench.py starts it)

It is the least any Flask service on gunicorn can do for a request: read the
body, answer ``$BENCH_STATIC_DIR/<name>.json`` as it is. Nothing of the
service is imported here (no factory, hooks, CORS, security headers, error
handlers, request ids or access log), and gunicorn runs it with its own
defaults, not the project's gunicorn.conf.py. So the floor stays where it is
whatever the service or its server cost: a costlier server lowers the ratio
against it and cannot raise it. (The static route of bench/wsgi.py is the
other floor: the service's own app and server answering the same bytes.)
"""

from __future__ import annotations

import os
from pathlib import Path

from flask import Flask, Response, abort, request

app = Flask(__name__)

_BODIES: dict[str, bytes] = {}
_dir = os.environ.get("BENCH_STATIC_DIR")
if _dir:
    for path in Path(_dir).glob("*.json"):
        _BODIES[path.stem] = path.read_bytes()


@app.route("/floor/<name>", methods=["GET", "POST"])
def floor(name: str) -> Response:
    request.get_data(cache=False)
    body = _BODIES.get(name)
    if body is None:
        abort(404)
    return Response(body, mimetype="application/json")


@app.get("/health")
def health() -> Response:
    return Response(b'{"status":"ok"}', mimetype="application/json")
