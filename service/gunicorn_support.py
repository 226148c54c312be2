"""gunicorn extensions used by gunicorn.conf.py (loaded in the master, before any worker).

- ``JsonAccessLogger``: access-log values are JSON-escaped, so a quote,
  backslash or percent-decoded newline in a path or user agent can neither
  break a log line nor forge a field (gunicorn itself escapes only quotes),
  and each is computed only when the log format reads it.
- ``problem_response`` / ``write_problem``: the errors gunicorn answers
  itself, before the app sees the request (400 bad request line, 414, 431,
  417, 501; and, in service/worker.py, 408 and 503), become problem+json with
  the app's security headers instead of an HTML page.
- ``handle_error``: when the arbiter aborts a worker that is still waiting on
  a slow client's body (WORKER TIMEOUT), that client gets 408, not a 500.

These hook gunicorn's own extension points (``logger_class``) and, for the
last two, two functions of the exact gunicorn version pinned in
requirements.txt; tests/test_hostile.py fails if an upgrade changes them, or
changes what gunicorn's own atoms read.
"""

from __future__ import annotations

import json
import logging
import os
import traceback
import uuid
from typing import Any

import gunicorn.util
from gunicorn.glogging import Logger
from gunicorn.workers.base import Worker

from service import API_CSP

_KINDS = {400: "bad-request", 408: "request-timeout", 414: "uri-too-long", 417: "expectation-failed",
          431: "header-fields-too-large", 501: "not-implemented"}


class _LazyJsonAtoms(dict):
    """gunicorn's access-log atoms (Logger.atoms, read through its SafeAtoms: "{name}i" case-insensitive,
    "-" when missing), each JSON-escaped, so that a quote, backslash or percent-decoded newline in a path or
    user agent can neither break a line nor forge a field (gunicorn itself escapes only quotes).

    Each atom is computed when the format reads it: gunicorn builds ~50 (every request and response header,
    every environ key) for a format that reads 10, and the line cost 23 µs, now 14 (measured in process).
    tests/test_hostile.py checks that every atom reads as gunicorn's, escaped."""

    def __init__(self, logger: Logger, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        dict.__init__(self)
        self.logger, self.resp, self.req, self.environ, self.request_time = logger, resp, req, environ, request_time

    def __bool__(self) -> bool:  # logging unwraps a lone mapping argument only when it is truthy
        return True

    def __getitem__(self, k: str) -> Any:
        value = self._atom(k)
        return json.dumps(value)[1:-1] if isinstance(value, str) else value

    def _atom(self, k: str) -> Any:
        if k.startswith("{"):  # {name}i, {name}o, {name}e: a request header, a response header, an environ key
            kl = k.lower()
            name, kind = kl[1:-2], kl[-2:]
            pairs = self._pairs(kind)
            found = "-"
            for key, value in pairs:  # the last one wins, as in gunicorn's dict
                if key.lower() == name:
                    found = value
            return found
        env, rt, resp = self.environ, self.request_time, self.resp
        sent = getattr(resp, "sent", None)
        if k == "s":
            status = resp.status
            return status.split(None, 1)[0] if isinstance(status, str) else status
        atom = _SIMPLE_ATOMS.get(k)
        if atom is None:
            return "-"
        return atom(self.logger, env, rt, sent)

    def _pairs(self, kind: str) -> Any:
        if kind == "}i":
            headers = self.req.headers if hasattr(self.req, "headers") else self.req
            return headers.items() if hasattr(headers, "items") else headers
        if kind == "}o":
            headers = self.resp.headers
            return headers.items() if hasattr(headers, "items") else headers
        if kind == "}e":
            return self.environ.items()
        return ()


#: gunicorn's one-letter atoms (Logger.atoms), from the logger, environ, request time and bytes sent
_SIMPLE_ATOMS: dict[str, Any] = {
    "h": lambda log, env, rt, sent: env.get("REMOTE_ADDR", "-"),
    "l": lambda log, env, rt, sent: "-",
    "u": lambda log, env, rt, sent: log._get_user(env) or "-",
    "t": lambda log, env, rt, sent: log.now(),
    "r": lambda log, env, rt, sent: f"{env['REQUEST_METHOD']} {env['RAW_URI']} {env['SERVER_PROTOCOL']}",
    "m": lambda log, env, rt, sent: env.get("REQUEST_METHOD"),
    "U": lambda log, env, rt, sent: env.get("PATH_INFO"),
    "q": lambda log, env, rt, sent: env.get("QUERY_STRING"),
    "H": lambda log, env, rt, sent: env.get("SERVER_PROTOCOL"),
    "b": lambda log, env, rt, sent: sent is not None and str(sent) or "-",
    "B": lambda log, env, rt, sent: sent,
    "f": lambda log, env, rt, sent: env.get("HTTP_REFERER", "-"),
    "a": lambda log, env, rt, sent: env.get("HTTP_USER_AGENT", "-"),
    "T": lambda log, env, rt, sent: rt.seconds,
    "D": lambda log, env, rt, sent: rt.seconds * 1000000 + rt.microseconds,
    "M": lambda log, env, rt, sent: rt.seconds * 1000 + int(rt.microseconds / 1000),
    "L": lambda log, env, rt, sent: "%d.%06d" % (rt.seconds, rt.microseconds),
    "p": lambda log, env, rt, sent: f"<{os.getpid()}>",
}


class JsonAccessLogger(Logger):
    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: Any) -> None:
        """gunicorn's Logger.access, with the atoms computed as the format reads them (_LazyJsonAtoms).

        Where the access log is what gunicorn sets up for ``accesslog`` (one stream or file handler that
        writes the message alone, no filter), the line is written to that handler's stream under its lock,
        as its ``emit`` would, without building a LogRecord. On a slow CPU the trip through ``logging`` was
        4.5 % of a worker's busy time answering small traces (py-spy, under load); writing directly saved
        26–146 µs of CPU a request in three runs. Any other set-up goes through ``logging``."""
        if not self.access_log_enabled:
            return
        try:
            atoms = _LazyJsonAtoms(self, resp, req, environ, request_time)
            handler = _plain_handler(self.access_log)
            if handler is None:
                self.access_log.info(self.cfg.access_log_format, atoms)
                return
            line = self.cfg.access_log_format % atoms
            with handler.lock:
                handler.stream.write(line + handler.terminator)
                handler.flush()
        except Exception:  # noqa: BLE001 (as gunicorn: a broken log line must not fail the request)
            self.error(traceback.format_exc())


def _plain_handler(log: logging.Logger) -> logging.StreamHandler | None:
    """The access log's one handler when writing to it directly is what ``logging`` would do: an INFO line
    is enabled, nothing filters or propagates it, and the handler is a plain stream or file handler whose
    formatter writes the message alone (gunicorn's own set-up for ``accesslog``); else None."""
    if log.filters or log.propagate or not log.isEnabledFor(logging.INFO) or len(log.handlers) != 1:
        return None
    handler = log.handlers[0]
    fmt = handler.formatter
    if type(handler) not in _PLAIN_HANDLERS or handler.filters or handler.level > logging.INFO \
            or type(fmt) is not logging.Formatter or fmt._fmt != "%(message)s" or handler.lock is None \
            or getattr(handler, "stream", None) is None:
        return None
    return handler


#: handlers whose emit() is "format, write with the terminator, flush" (FileHandler opens its file on first
#: use when delayed: then its stream is None, and logging writes the line)
_PLAIN_HANDLERS = (logging.StreamHandler, logging.FileHandler)


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
