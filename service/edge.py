"""The HTTP edge every route shares: the content type, the bounded body, pydantic validation, JSON answers.

Each route module (``service/routes/``) reads its body through these, so every
endpoint refuses alike: 415 for a body that is not JSON (or, where a route
takes one, an npz archive), 413 above the path's body limit
(``Settings.body_limit``), 400 for a body that cannot be read, and one 422
listing every problem pydantic and the engine's rules find.
"""

from __future__ import annotations

from typing import TypeVar

from flask import Response, current_app, request
from pydantic import BaseModel, ValidationError
from werkzeug.exceptions import RequestEntityTooLarge

from . import npz, serialize
from .problems import ProblemError, validation_problem
from .settings import Settings

M = TypeVar("M", bound=BaseModel)

_JSON_TYPES = ("application/json",)


def settings() -> Settings:
    return current_app.extensions["attention_trace.settings"]


def json_response(doc: object, status: int = 200) -> Response:
    return current_app.response_class(serialize.dumps(doc), status=status, mimetype="application/json")


def read_body() -> bytes:
    """The request body, at most this path's limit (Settings.body_limit): 413 above it, whether
    or not a Content-Length was sent (a chunked body has none), 400 if it cannot be read.

    Read from the WSGI input stream with its bound, not through werkzeug's get_data: what a server
    must do for a read of at most Content-Length bytes (PEP 3333), or of limit + 1 of a body the
    server terminates (chunked), while get_data wraps the stream in a LimitedStream that read an S
    trace's body in three calls."""
    limit = settings().body_limit(request.path)
    length = request.content_length  # None for a chunked body
    if length is not None and length > limit:
        raise RequestEntityTooLarge()
    try:
        body = request.environ["wsgi.input"].read(limit + 1 if length is None else length)
    except Exception as e:  # noqa: BLE001 (gunicorn's InvalidChunkSize, NoMoreData, ...: the client's framing)
        raise ProblemError(400, "Malformed JSON", f"The request body could not be read: {type(e).__name__}.",
                           kind="malformed-json") from None
    if len(body) > limit:
        raise RequestEntityTooLarge()
    if length is not None and len(body) < length:
        raise ProblemError(400, "Malformed JSON", f"The request body ended after {len(body)} of the {length} bytes "
                           "its Content-Length announced.", kind="malformed-json")
    return body


def read_json_body(*, npz_too: bool = False) -> bytes:
    """Check the content type, then read the bounded body. ``npz_too``: /check, which also takes an
    ``application/x-npz`` submission (service/npz.py)."""
    environ = request.environ
    # What nearly every client sends is accepted without parsing it (werkzeug's parse: ~3 µs).
    mimetype = "application/json" if environ.get("CONTENT_TYPE") == "application/json" else request.mimetype
    if not (mimetype in _JSON_TYPES or (mimetype.startswith("application/") and mimetype.endswith("+json"))
            or (npz_too and mimetype == npz.MEDIA_TYPE)):
        got = f"'{request.content_type}'" if request.content_type else "no Content-Type"
        also = f" or as an npz archive with 'Content-Type: {npz.MEDIA_TYPE}'" if npz_too else ""
        raise ProblemError(415, "Unsupported Media Type",
                           f"Send the body as JSON with 'Content-Type: application/json'{also} (got {got}).",
                           kind="unsupported-media-type",
                           headers={"Accept-Post": "application/json" + (f", {npz.MEDIA_TYPE}" if npz_too else "")})
    coding = environ.get("HTTP_CONTENT_ENCODING", "")
    if coding.strip().lower() not in ("", "identity"):  # bodies are never decoded: a coded one would be garbage
        raise ProblemError(415, "Unsupported Media Type",
                           f"Send the body without a Content-Encoding (got '{coding[:64]}').",
                           kind="unsupported-media-type", headers={"Accept-Encoding": "identity"})
    return read_body()


def bound_json_values(body: bytes) -> None:
    """Refuse (413) a /check body that holds more JSON values than max_check_json_values, before parsing it.

    Every JSON value is the document, the first item of an array or object, or
    follows a comma, so commas + opening brackets + 1 bounds the values from above
    (commas in strings only make the bound safer); bytes.count runs in C.
    """
    limit = settings().max_check_json_values
    count = body.count(b",") + 1
    if count <= limit:
        count += body.count(b"[")
    if count <= limit:
        count += body.count(b"{")
    if count > limit:
        raise ProblemError(413, "Request Entity Too Large",
                           f"The request body holds more than {limit} JSON values (numbers, nulls, lists, ...), the "
                           f"limit for {request.path}; send fewer stages per request, or split the batch.",
                           kind="payload-too-large")


def parse_body(model: type[M], body: bytes | None = None) -> M:
    """Validate the JSON body (read here unless given) with pydantic."""
    if body is None:
        body = read_json_body()
    try:
        return model.model_validate_json(body, context={"settings": settings()})
    except ValidationError as e:
        raise validation_problem(e) from None
