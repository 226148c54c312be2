"""The benchmark's WSGI module: the service's own app, plus the framework's floor.

    gunicorn -c gunicorn.conf.py bench.wsgi:app

``app`` is the app that ``service.wsgi`` builds for production (same factory,
same environment handling, same BLAS pinning, same hooks, CORS and error
handlers), with one route added for the benchmark only:

* ``/bench/static/<name>`` answers the pre-encoded bytes of file
  ``$BENCH_STATIC_DIR/<name>.json`` (POST reads and drops the request body, as
  /trace reads its body), so the same server, config and Flask app answer a
  static JSON body of exactly the size of a trace: the framework's floor.

Nothing here is imported by the service or its tests.
"""

from __future__ import annotations

import os
from pathlib import Path

from flask import Flask, Response, abort, request

import service.wsgi

app = service.wsgi.app
if not isinstance(app, Flask):  # production wrapped its app: serve the factory's
    from service import create_app

    app = create_app()

_STATIC: dict[str, bytes] = {}
_dir = os.environ.get("BENCH_STATIC_DIR")
if _dir:
    for path in Path(_dir).glob("*.json"):
        _STATIC[path.stem] = path.read_bytes()


@app.route("/bench/static/<name>", methods=["GET", "POST"])
def bench_static(name: str) -> Response:
    request.get_data(cache=False)
    body = _STATIC.get(name)
    if body is None:
        abort(404)
    return app.response_class(body, mimetype="application/json")
