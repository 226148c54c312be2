"""gunicorn extensions used by gunicorn.conf.py (loaded in the master, before any worker).

- ``JsonAccessLogger``: access-log values are JSON-escaped, so a quote,
  backslash or percent-decoded newline in a path or user agent can neither
  break a log line nor forge a field (gunicorn itself escapes only quotes).
- ``problem_response`` / ``write_problem``: the errors gunicorn answers
  itself, before the app sees the request (400 bad request line, 414, 431,
  417, 501; and, in service/worker.py, 408 and 503), become problem+json with
  the app's security headers instead of an HTML page.
- ``handle_error``: when the arbiter aborts a worker that is still waiting on
  a slow client's body (WORKER TIMEOUT), that client gets 408, not a 500.

These hook gunicorn's own extension points (``logger_class``) and, for the
last two, two functions of the exact gunicorn version pinned in
requirements.txt; tests/test_hostile.py fails if an upgrade changes them.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import gunicorn.util
from gunicorn.glogging import Logger, SafeAtoms
from gunicorn.workers.base import Worker

from service import API_CSP

_KINDS = {400: "bad-request", 408: "request-timeout", 414: "uri-too-long", 417: "expectation-failed",
          431: "header-fields-too-large", 501: "not-implemented"}


class _JsonAtoms(SafeAtoms):
    """gunicorn's atoms, each JSON-escaped when the format reads it: gunicorn passes ~50 (every request and
    response header, every environ key) and the format uses 10, so escaping them all up front cost ~17 µs
    of a ~38 µs access-log line."""

    def __init__(self, atoms: dict[str, Any]) -> None:
        dict.__init__(self, atoms)

    def __getitem__(self, k: str) -> Any:
        value = super().__getitem__(k)  # SafeAtoms: "{header}i" case-insensitive, "-" when missing
        return json.dumps(value)[1:-1] if isinstance(value, str) else value


class JsonAccessLogger(Logger):
    atoms_wrapper_class = _JsonAtoms


_KINDS.update({413: "payload-too-large", 500: "internal-error", 503: "unavailable"})


def problem_response(status_int: int, reason: str, detail: str, request_id: str | None = None, *,
                     retry_after: int | None = None) -> bytes:
    """A complete HTTP/1.1 problem+json answer that closes the connection."""
    body = json.dumps({"type": "urn:attention-trace:problem:" + _KINDS.get(status_int, "http-error"),
                       "title": reason, "status": status_int, "detail": detail}).encode()
    extra = f"Retry-After: {retry_after}\r\n" if retry_after is not None else ""
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\n"
            f"Content-Type: application/problem+json\r\nContent-Length: {len(body)}\r\n"
            f"Cache-Control: no-store\r\n{extra}"
            f"X-Content-Type-Options: nosniff\r\nContent-Security-Policy: {API_CSP}\r\n"
            f"X-Request-ID: {request_id or uuid.uuid4().hex}\r\n\r\n")
    return head.encode("latin-1") + body


def write_problem(sock, status_int: int, reason: str, mesg: str) -> None:  # gunicorn.util.write_error's signature
    gunicorn.util.write_nonblock(sock, problem_response(
        status_int, reason, f"The server refused the request before reading it: {reason}."))


_original_handle_error = Worker.handle_error


def handle_error(self: Worker, req, client, addr, exc) -> None:
    if isinstance(exc, SystemExit) and not self.alive:
        # The arbiter timed this worker out while it read a slow client's body.
        try:
            write_problem(client, 408, "Request Timeout", "")
        except OSError:
            pass
        return
    _original_handle_error(self, req, client, addr, exc)


def install() -> None:
    """Patch gunicorn's error writers (called once from gunicorn.conf.py)."""
    gunicorn.util.write_error = write_problem
    Worker.handle_error = handle_error
