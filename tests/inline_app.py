"""A WSGI app for tests/test_worker_inline.py: it says which thread answered, and what its cost estimate saw.

    POST /cost/<ms>     request_cost says <ms> milliseconds, and adds the body it saw to the environ
    POST /none          request_cost cannot say (None)
    POST /raise         request_cost raises
    POST /sleep/<s>     request_cost says 1 s; the app creates the file the body names, then sleeps <s> seconds
    GET  /health        200

Every answer is JSON: the thread that ran the app, the body it read, and what request_cost added (or null).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

SEEN = "inline_test.seen"


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    path = environ["PATH_INFO"]
    body = environ["wsgi.input"].read()
    if path.startswith("/sleep/"):
        open(body.decode(), "w").close()  # the test waits for it: the work thread is busy from here
        time.sleep(float(path.rsplit("/", 1)[1]))
    out = json.dumps({"thread": threading.current_thread().name, "body": body.decode("latin-1"),
                      "seen": environ.get(SEEN)}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))])
    return [out]


def request_cost(method: str, path: str, body: bytes) -> tuple[float, dict[str, Any]] | None:
    if path == "/none":
        return None
    if path == "/raise":
        raise RuntimeError("the estimate failed")
    if path.startswith("/sleep/"):
        return 1.0, {SEEN: body.decode("latin-1")}
    return float(path.rsplit("/", 1)[1]) / 1000, {SEEN: body.decode("latin-1")}


app.request_cost = request_cost  # what service/worker.py reads
