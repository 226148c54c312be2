"""What every ``attention-trace`` subcommand shares: exit codes, usage errors, resolving a query
token, the client (in process or --url) and its options, and files (colours, number formats and the
rendered text are in ``attention_trace.render``).

``attention_trace.cli`` (the parser and the trace/check/export/html commands) and
``attention_trace.explain_cli`` (one cell's numbers) both import from here, and neither from the
other's module: no import cycle.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from typing import Any

from .client import DEFAULT_RETRIES, DEFAULT_TIMEOUT, Client, LocalClient

PROG = "attention-trace"
EXIT_OK, EXIT_NOT_PASSED, EXIT_USAGE, EXIT_SERVICE = 0, 1, 2, 3


class UsageError(Exception):
    """A mistake in the command line or its files: exit 2 with this message."""


# ------------------------------------------------------------------ query tokens


def resolve_query(spec: str | None, texts: list[str], *, option: str = "--query", source: str = "sentence") -> int:
    """A query given as an index (negative counts from the end) or a token's text.

    Default: the second token if there is one, else the first. An integer that
    is no valid index is tried as text; "=TEXT" always means text. ``option`` and
    ``source`` name the option and the token list in the messages.
    """
    n = len(texts)
    if spec is None:
        return 1 if n > 1 else 0
    listing = ", ".join(f"{i} {t!r}" for i, t in enumerate(texts))
    if spec.startswith("=") and len(spec) > 1:
        text = spec[1:]
    else:
        text = spec
        if re.fullmatch(r"[+-]?\d+", spec):
            i = int(spec)
            if -n <= i < n:
                return i % n
            if spec not in texts:
                raise UsageError(f"{option} {spec}: there is no token {i}; the {n} token(s) are {listing}")
    if text in texts:
        return texts.index(text)
    folded = [t.casefold() for t in texts]
    if text.casefold() in folded:
        return folded.index(text.casefold())
    raise UsageError(f"{option} {spec!r} is not a token of the {source}; the tokens are {listing}")


# ------------------------------------------------------------- client and files


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def connection_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="the service's base URL, e.g. http://127.0.0.1:8000 "
                                 "(default: compute in this process, no server needed)")
    p.add_argument("--timeout", type=_positive_float, default=DEFAULT_TIMEOUT[1], metavar="SECONDS",
                   help=f"read timeout with --url (default {DEFAULT_TIMEOUT[1]:g})")
    p.add_argument("--retries", type=int, default=DEFAULT_RETRIES, choices=range(0, 11), metavar="N",
                   help=f"with --url, retries on a connection error or a 503 (default {DEFAULT_RETRIES})")
    p.add_argument("--request-id", metavar="ID", help="X-Request-ID to send with --url (A-Z a-z 0-9 . _ : -)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the output (default: only on a terminal, and never with NO_COLOR set)")


def make_client(args: argparse.Namespace) -> Client | LocalClient:
    if args.url:
        try:
            return Client(args.url, timeout=(DEFAULT_TIMEOUT[0], args.timeout), retries=args.retries,
                          request_id=args.request_id)
        except ValueError as e:
            raise UsageError(str(e)) from None
    try:
        return LocalClient(request_id=args.request_id)
    except ImportError as e:
        raise UsageError(f"{e}; or pass --url URL to use a running service") from None
    except ValueError as e:
        raise UsageError(str(e)) from None


def write_file(path: str, data: bytes) -> None:
    """Write an answer to ``path`` ('-' is standard output); a clear usage error if it cannot be written."""
    try:
        if path == "-":
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
            return
        with open(path, "wb") as f:
            f.write(data)
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None


def read_submission(path: str) -> dict[str, Any]:
    name = "standard input" if path == "-" else path
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as e:
        raise UsageError(f"cannot read {name}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{name} is not UTF-8 text: {e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{name} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{name} must hold a JSON object (a /check request body), not a {type(doc).__name__}")
    return doc


