"""HTTP endpoints: validate at the edge (pydantic), call the core, serialise."""

from __future__ import annotations

from typing import TypeVar

from flask import Blueprint, Response, current_app, g, request
from pydantic import BaseModel, ValidationError
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from . import budget, compression, core, npz, serialize
from .models import BatchRequest, CheckRequest, TraceRequest
from .problems import ProblemError, validation_problem
from .settings import Settings

bp = Blueprint("api", __name__)

M = TypeVar("M", bound=BaseModel)

_JSON_TYPES = ("application/json",)
#: what /trace and /trace/batch can answer, the default first
_TRACE_TYPES = ("application/json", npz.MEDIA_TYPE)


def settings() -> Settings:
    return current_app.extensions["attention_trace.settings"]


def json_response(doc: object, status: int = 200) -> Response:
    return current_app.response_class(serialize.dumps(doc), status=status, mimetype="application/json")


def read_body() -> bytes:
    """The request body, at most this path's limit (Settings.body_limit): 413 above it, whether
    or not a Content-Length was sent (a chunked body has none), 400 if it cannot be read."""
    limit = settings().body_limit(request.path)
    request.max_content_length = limit  # werkzeug's own bound while reading (Flask >= 3.1: per request)
    if request.content_length is not None and request.content_length > limit:
        raise RequestEntityTooLarge()
    try:
        body = request.environ["wsgi.input"].read(limit + 1) if request.content_length is None \
            else request.get_data(cache=False)
    except HTTPException:
        raise
    except Exception as e:  # noqa: BLE001 (gunicorn's InvalidChunkSize, NoMoreData, ...: the client's framing)
        raise ProblemError(400, "Malformed JSON", f"The request body could not be read: {type(e).__name__}.",
                           kind="malformed-json") from None
    if len(body) > limit:
        raise RequestEntityTooLarge()
    return body


def read_json_body(*, npz_too: bool = False) -> bytes:
    """Check the content type, then read the bounded body. ``npz_too``: /check, which also takes an
    ``application/x-npz`` submission (service/npz.py)."""
    mimetype = request.mimetype
    if not (mimetype in _JSON_TYPES or (mimetype.startswith("application/") and mimetype.endswith("+json"))
            or (npz_too and mimetype == npz.MEDIA_TYPE)):
        got = f"'{request.content_type}'" if request.content_type else "no Content-Type"
        also = f" or as an npz archive with 'Content-Type: {npz.MEDIA_TYPE}'" if npz_too else ""
        raise ProblemError(415, "Unsupported Media Type",
                           f"Send the body as JSON with 'Content-Type: application/json'{also} (got {got}).",
                           kind="unsupported-media-type",
                           headers={"Accept-Post": "application/json" + (f", {npz.MEDIA_TYPE}" if npz_too else "")})
    coding = request.headers.get("Content-Encoding", "").strip().lower()
    if coding not in ("", "identity"):  # bodies are never decoded: a coded one would be parsed as garbage
        raise ProblemError(415, "Unsupported Media Type",
                           "Send the body without a Content-Encoding (got "
                           f"'{request.headers.get('Content-Encoding', '')[:64]}').",
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


def wants_npz() -> bool:
    """Content negotiation on /trace and /trace/batch: JSON unless the client prefers ``application/x-npz``
    (without an Accept header, or with */* or equal preference, JSON)."""
    accept = request.headers.get("Accept")
    if accept is None or accept == "*/*" or ("npz" not in accept.lower() and "*" not in accept):
        return False  # nothing can prefer npz (no header, any type alike, or none that matches it): skip the parse
    return request.accept_mimetypes.best_match(_TRACE_TYPES) == npz.MEDIA_TYPE


def post_trace_npz(raw: bytes) -> Response:
    """/trace as exact binary arrays (service/npz.py). The response cache keeps it under its own key."""
    cache = current_app.extensions["attention_trace.responses"]
    key = compression.encoded_key(npz.MEDIA_TYPE, raw)  # a variant's key, as each encoding's answer has
    body = cache.get(key) if cache is not None else None
    if body is None:
        req = parse_body(TraceRequest, raw)
        body = core.render_trace_npz(req)
        if cache is not None:
            cache.put(key, body, cost=compression.estimate_s(budget.cost("/trace", [req])))
    resp = current_app.response_class(body, mimetype=npz.MEDIA_TYPE)
    resp.vary.add("Accept")
    return resp


@bp.post("/trace")
def post_trace() -> Response:
    raw = read_json_body()
    if wants_npz():
        return post_trace_npz(raw)
    resp = post_trace_json(raw)
    resp.vary.add("Accept")  # the same URL answers npz to a client that asks for it
    return resp


def post_trace_json(raw: bytes) -> Response:
    cache = current_app.extensions["attention_trace.responses"]
    if cache is None:
        req = parse_body(TraceRequest, raw)
        g.cpu_estimate = compression.estimate_s(budget.cost("/trace", [req]))
        return current_app.response_class(core.render_trace(req), mimetype="application/json")
    # The cache keeps answers as sent: identity, and compressed (service/compression.py).
    g.response_cache_key = raw
    encoding = compression.choose_encoding(settings(), request.accept_encodings.quality)
    packed = cache.get(compression.encoded_key(encoding, raw)) if encoding else None
    if packed is not None:
        resp = current_app.response_class(packed, mimetype="application/json")
        resp.headers["Content-Encoding"] = encoding
        resp.vary.add("Accept-Encoding")
        return resp
    hit = cache.get_with_cost(raw)
    if hit is not None:
        body, g.cpu_estimate = hit
    else:
        req = parse_body(TraceRequest, raw)
        g.cpu_estimate = compression.estimate_s(budget.cost("/trace", [req]))  # what compression may spend
        body = core.render_trace(req)
        cache.put(raw, body, cost=g.cpu_estimate)
    return current_app.response_class(body, mimetype="application/json")


@bp.post("/check")
def post_check() -> Response:
    raw = read_json_body(npz_too=True)
    if request.mimetype == npz.MEDIA_TYPE:  # the stages as exact arrays: any size the trace limit allows
        return json_response(core.check_document(core.check_request_npz(raw, settings())))
    bound_json_values(raw)
    return json_response(core.check_document(parse_body(CheckRequest, raw)))


def _batch() -> Response:
    raw = read_json_body()
    if request.path == "/check/batch":
        bound_json_values(raw)
    batch = parse_body(BatchRequest, raw)
    if request.path == "/trace/batch" and wants_npz():
        resp = current_app.response_class(npz.dumps(core.batch_document(request.path, batch, settings(), binary=True)),
                                          mimetype=npz.MEDIA_TYPE)
    else:
        resp = json_response(core.batch_document(request.path, batch, settings()))
    if request.path == "/trace/batch":
        resp.vary.add("Accept")
    return resp


@bp.post("/trace/batch")
def post_trace_batch() -> Response:
    return _batch()


@bp.post("/check/batch")
def post_check_batch() -> Response:
    return _batch()


@bp.get("/health")
def health() -> Response:
    return json_response({"status": "ok"})


@bp.get("/version")
def version() -> Response:
    return json_response(core.version_document(settings()))


@bp.get("/openapi.yaml")
def openapi() -> Response:
    return current_app.response_class(current_app.extensions["attention_trace.openapi"],
                                      mimetype="application/yaml")
