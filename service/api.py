"""HTTP endpoints: validate at the edge (pydantic), call the core, serialise."""

from __future__ import annotations

from typing import TypeVar

from flask import Blueprint, Response, current_app, request
from pydantic import BaseModel, ValidationError
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from . import core, serialize
from .models import BatchRequest, CheckRequest, TraceRequest
from .problems import ProblemError, validation_problem
from .settings import Settings

bp = Blueprint("api", __name__)

M = TypeVar("M", bound=BaseModel)

_JSON_TYPES = ("application/json",)


def settings() -> Settings:
    return current_app.extensions["attention_trace.settings"]


def json_response(doc: object, status: int = 200) -> Response:
    return current_app.response_class(serialize.dumps(doc), status=status, mimetype="application/json")


def read_body() -> bytes:
    """The request body, at most max_body_bytes: 413 above it, whether or not
    a Content-Length was sent (a chunked body has none), 400 if it cannot be read."""
    limit = settings().max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise RequestEntityTooLarge()
    try:
        body = request.environ["wsgi.input"].read(limit + 1) if request.content_length is None \
            else request.get_data(cache=False)
    except HTTPException:
        raise
    except Exception as e:  # gunicorn's InvalidChunkSize, NoMoreData, ...: the client's framing
        raise ProblemError(400, "Malformed JSON", f"The request body could not be read: {type(e).__name__}.",
                           kind="malformed-json") from None
    if len(body) > limit:
        raise RequestEntityTooLarge()
    return body


def read_json_body() -> bytes:
    """Check the content type, then read the bounded body."""
    mimetype = request.mimetype
    if not (mimetype in _JSON_TYPES or (mimetype.startswith("application/") and mimetype.endswith("+json"))):
        got = f"'{request.content_type}'" if request.content_type else "no Content-Type"
        raise ProblemError(415, "Unsupported Media Type",
                           f"Send the body as JSON with 'Content-Type: application/json' (got {got}).",
                           kind="unsupported-media-type", headers={"Accept-Post": "application/json"})
    return read_body()


def parse_body(model: type[M], body: bytes | None = None) -> M:
    """Validate the JSON body (read here unless given) with pydantic."""
    if body is None:
        body = read_json_body()
    try:
        return model.model_validate_json(body, context={"settings": settings()})
    except ValidationError as e:
        raise validation_problem(e) from None


@bp.post("/trace")
def post_trace() -> Response:
    raw = read_json_body()
    cache = current_app.extensions["attention_trace.responses"]
    body = cache.get(raw) if cache is not None else None
    if body is None:
        body = core.render_trace(parse_body(TraceRequest, raw), settings())
        if cache is not None:
            cache.put(raw, body)
    return current_app.response_class(body, mimetype="application/json")


@bp.post("/check")
def post_check() -> Response:
    return json_response(core.check_document(parse_body(CheckRequest), settings()))


def _batch() -> Response:
    batch = parse_body(BatchRequest)
    return json_response(core.batch_document(request.path, batch, settings()))


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
