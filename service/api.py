"""HTTP endpoints: validate at the edge (pydantic), call the core, serialise."""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any, TypeVar

import orjson
from flask import Blueprint, Response, current_app, request
from pydantic import BaseModel, ValidationError

from engine import BUGS, ENGINE_VERSION, STAGE_IDS

from . import core, serialize
from .models import BatchRequest, CheckRequest, TraceRequest, TraceSpec
from .problems import TYPE_BASE, ProblemError, validation_problem
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


def engine_problem(e: core.RequestError) -> ProblemError:
    return ProblemError(422, "Invalid request", e.message, kind="validation-error",
                        errors=[{"pointer": e.pointer, "message": e.message, "type": e.type}])


@bp.post("/trace")
def post_trace() -> Response:
    req = parse_body(TraceRequest)
    try:
        body = core.render_trace(req, settings())
    except core.RequestError as e:
        raise engine_problem(e) from None
    return current_app.response_class(body, mimetype="application/json")


@bp.post("/check")
def post_check() -> Response:
    req = parse_body(CheckRequest)
    try:
        return json_response(core.check_document(req, settings()))
    except core.RequestError as e:
        raise engine_problem(e) from None


def _problem_doc(e: ProblemError, pointer_prefix: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"type": TYPE_BASE + e.kind, "title": e.title, "status": e.status, "detail": e.detail,
                           "instance": request.path}
    if e.errors is not None:
        doc["errors"] = [{**err, "pointer": pointer_prefix + err["pointer"]} for err in e.errors]
    return doc


def _batch(model: type[TraceSpec], answer) -> Response:
    """Validate and answer each item on its own; bound the total work first."""
    batch = parse_body(BatchRequest)
    limits = settings()
    ctx = {"settings": limits}
    parsed: list[TraceSpec | ProblemError] = []
    for item in batch.items:
        try:
            parsed.append(model.model_validate(item, context=ctx))
        except ValidationError as e:
            parsed.append(validation_problem(e))
    total = sum(p._value_count for p in parsed if not isinstance(p, ProblemError))
    if total > limits.max_trace_values:
        raise ProblemError(422, "Invalid request",
                           f"the batch's traces would hold {total} numbers together, above the limit of "
                           f"{limits.max_trace_values}; split it into smaller batches", kind="validation-error",
                           errors=[{"pointer": "/items", "type": "batch_too_large",
                                    "message": f"{total} numbers in all; the limit is {limits.max_trace_values}"}])
    results = []
    for i, p in enumerate(parsed):
        if not isinstance(p, ProblemError):
            try:
                results.append({"index": i, "status": 200, "result": answer(p, limits), "problem": None})
                continue
            except core.RequestError as e:
                p = engine_problem(e)
        results.append({"index": i, "status": p.status, "result": None, "problem": _problem_doc(p, f"/items/{i}")})
    return json_response({"results": results})


@bp.post("/trace/batch")
def post_trace_batch() -> Response:
    # Each trace is pre-encoded once and embedded as-is (no re-parsing).
    return _batch(TraceRequest, lambda req, limits: orjson.Fragment(core.render_trace(req, limits)))


@bp.post("/check/batch")
def post_check_batch() -> Response:
    return _batch(CheckRequest, core.check_document)


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
        "bugs": {name: bug.summary for name, bug in BUGS.items()},
    })


@bp.get("/openapi.yaml")
def openapi() -> Response:
    return current_app.response_class(current_app.extensions["attention_trace.openapi"],
                                      mimetype="application/yaml")
