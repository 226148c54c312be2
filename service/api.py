"""HTTP endpoints: validate at the edge, call the engine, serialise."""

from __future__ import annotations

import platform
from importlib import metadata
from typing import TypeVar

from flask import Blueprint, Response, current_app, request
from pydantic import BaseModel, ValidationError

import engine
from engine import ENGINE_VERSION, STAGE_IDS, EngineError, TraceConfig

from . import serialize
from .models import TraceRequest
from .problems import ProblemError, validation_problem
from .settings import Settings

bp = Blueprint("api", __name__)

M = TypeVar("M", bound=BaseModel)

_JSON_TYPES = ("application/json",)


def settings() -> Settings:
    return current_app.extensions["attention_trace.settings"]


def json_response(doc: object, status: int = 200) -> Response:
    return current_app.response_class(serialize.dumps(doc), status=status, mimetype="application/json")


def parse_body(model: type[M]) -> M:
    """Check the content type, read the bounded body and validate it with pydantic."""
    mimetype = request.mimetype
    if not (mimetype in _JSON_TYPES or (mimetype.startswith("application/") and mimetype.endswith("+json"))):
        got = f"'{request.content_type}'" if request.content_type else "no Content-Type"
        raise ProblemError(415, "Unsupported Media Type",
                           f"Send the body as JSON with 'Content-Type: application/json' (got {got}).",
                           kind="unsupported-media-type", headers={"Accept-Post": "application/json"})
    body = request.get_data(cache=False)  # werkzeug enforces MAX_CONTENT_LENGTH here (413)
    try:
        return model.model_validate_json(body, context={"settings": settings()})
    except ValidationError as e:
        raise validation_problem(e) from None


def run_trace(req: TraceRequest, limits: Settings) -> engine.Trace:
    try:
        config = TraceConfig(
            d_model=req.d_model,
            num_heads=req.num_heads,
            seed=req.seed,
            scale=req.scale,
            causal=req.causal,
            positional_encoding=req.positional_encoding,
            max_tokens=limits.max_tokens,
        )
        return engine.trace(config, sentence=req.sentence, tokens=req.tokens)
    except EngineError as e:
        # The models check the same rules first; this keeps the engine's word final.
        pointer = "/" + e.field if e.field else ""
        raise ProblemError(422, "Invalid request", e.message, kind="validation-error",
                           errors=[{"pointer": pointer, "message": e.message, "type": type(e).__name__}]) from None


@bp.post("/trace")
def post_trace() -> Response:
    req = parse_body(TraceRequest)
    return current_app.response_class(render_trace(req, settings()), mimetype="application/json")


def render_trace(req: TraceRequest, limits: Settings) -> bytes:
    """The exact bytes /trace answers for a validated request."""
    t = run_trace(req, limits)
    return serialize.dumps(serialize.trace_document(
        t, include_parameters=req.include_parameters, stages=req.stages, precision=req.precision))


@bp.get("/health")
def health() -> Response:
    return json_response({"status": "ok"})


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


@bp.get("/version")
def version() -> Response:
    return json_response({
        "service": "attention-trace",
        "service_version": _version("attention-trace"),
        "schema_version": serialize.SCHEMA_VERSION,
        "engine_version": ENGINE_VERSION,
        "libraries": {
            "python": platform.python_version(),
            **{name: _version(name) for name in ("numpy", "flask", "pydantic", "gunicorn", "orjson", "regex")},
        },
        "limits": settings().limits(),
        "stage_ids": list(STAGE_IDS),
    })


@bp.get("/openapi.yaml")
def openapi() -> Response:
    return current_app.response_class(current_app.extensions["attention_trace.openapi"],
                                      mimetype="application/yaml")

