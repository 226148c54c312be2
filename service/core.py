"""The service's work, free of any web framework: validated request in,
engine call, JSON bytes or documents out. api.py wraps it in HTTP; the
command-line client runs it in-process."""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

import orjson
from pydantic import ValidationError

import engine
from engine import BUGS, checking
from engine.layer import ALL_STAGE_IDS, TOKEN_STAGE_IDS
from engine.params import explicit_parameters

from . import budget, npz, serialize
from .models import BatchRequest, CheckRequest, TraceRequest, TraceSpec
from .problems import ProblemError, engine_problem, problem_document, validation_problem
from .settings import Settings


def run_trace(req: TraceSpec, bug: str | None = None) -> engine.Trace:
    """The engine's trace for a validated request, with explicit arrays if given.

    An EngineError that escapes (only an explicit input that overflows float64
    can, after validation) becomes a 422 in the one handler, problems.engine_problem.
    """
    params = None
    if req.parameters is not None:
        p = req.parameters
        params = explicit_parameters(p.W_Q, p.W_K, p.W_V, p.W_O, d_model=req.d_model, num_heads=req.num_heads,
                                     num_kv_heads=req.num_kv_heads)
    return engine.trace(req.trace_config, split=req.split, input=req.input, parameters=params, bug=bug,
                        context_split=req.context_split, context_input=req.context_input)


def trace_document(req: TraceRequest, *, binary: bool = False) -> dict[str, Any]:
    """The /trace answer as a document; ``binary`` keeps masked stages as arrays plus a mask (service/npz.py)."""
    t = run_trace(req, bug=req.inject_bug)
    doc = serialize.trace_document(t, include_parameters=req.include_parameters, stages=req.stages,
                                   precision=req.precision, parameters_layout=req.parameters_layout,
                                   decode=engine.decode(t) if req.decode else None, binary=binary)
    if req.inject_bug:
        doc["injected_bug"] = injected_bug_document(req.inject_bug)
    return doc


def injected_bug_document(name: str) -> dict[str, str]:
    """The ``injected_bug`` member of an answer whose numbers carry a known bug on request."""
    return {"name": name, "summary": BUGS[name].summary,
            "warning": f"These numbers are deliberately wrong: the known bug '{name}' was injected on request."}


def render_trace(req: TraceRequest) -> bytes:
    """The exact bytes /trace answers for a validated request."""
    return serialize.dumps(trace_document(req))


def render_trace_npz(req: TraceRequest) -> bytes:
    """The bytes /trace answers to ``Accept: application/x-npz`` (service/npz.py)."""
    return npz.dumps(trace_document(req, binary=True))


# ------------------------------------------------------------------ /check


def check_document(req: CheckRequest) -> dict[str, Any]:
    """The /check answer: the reference traced, the submission checked by the engine (engine.checking),
    in the answer's envelope."""
    t = run_trace(req)
    tol = req.tolerance
    return {
        "schema_version": serialize.SCHEMA_VERSION,
        "engine_version": t.engine_version,
        "parameters_digest": t.parameters_digest,
        "config": serialize.config_document(t),
        "tolerance": tol.document(),
        **checking.check(t, checking.Submission(req.submission, req.shapes, req.arrays), tol),
    }


def check_request_npz(body: bytes, limits: Settings) -> CheckRequest:
    """The /check request an ``application/x-npz`` body holds (service/npz.py), validated as a JSON body
    is; the archive is refused (400, 413, 422) before anything in it is used if it is out of bounds."""
    try:
        meta, arrays = npz.read_submission(body, max_unpacked=limits.max_check_body_bytes,
                                           max_metadata_values=limits.max_check_json_values,
                                           token_stages=TOKEN_STAGE_IDS)
    except npz.NpzBodyError as e:
        if e.status == 422:
            raise ProblemError(422, "Invalid request", f"{e.pointer or 'body'}: {e}", kind="validation-error",
                               errors=[{"pointer": e.pointer or "", "message": str(e), "type": e.type}]) from None
        kind, title = {400: ("malformed-npz", "Malformed npz"),
                       413: ("payload-too-large", "Request Entity Too Large")}[e.status]
        raise ProblemError(e.status, title, f"The npz body: {e}.", kind=kind) from None
    try:
        return CheckRequest.model_validate(meta, context={"settings": limits, "npz_submission": arrays})
    except ValidationError as e:
        raise validation_problem(e) from None


# ------------------------------------------------------------------ batches and /version


def answer(path: str, req: TraceSpec, *, binary: bool = False) -> Any:
    """The single endpoint's answer: /trace as pre-encoded bytes (embedded as-is), /check as a document;
    ``binary``: a /trace document whose arrays service/npz.py stores."""
    if path == "/trace" and binary:
        return trace_document(req, binary=True)  # type: ignore[arg-type]
    if path == "/trace":
        return orjson.Fragment(render_trace(req))  # type: ignore[arg-type]
    return check_document(req)  # type: ignore[arg-type]


def batch_document(path: str, batch: BatchRequest, limits: Settings, *, binary: bool = False) -> dict[str, Any]:
    """Validate and answer each item of /trace/batch or /check/batch on its own, in order.

    The total work is bounded first: a batch whose traces would hold more than
    max_trace_values numbers together is refused whole (ProblemError 422).
    """
    single = path.removesuffix("/batch")
    model = {"/trace": TraceRequest, "/check": CheckRequest}[single]
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
    # ... and so is its CPU: weight generation and the /check comparisons count too (service/budget.py).
    work = budget.cost(single, [p for p in parsed if not isinstance(p, ProblemError)])
    if work > limits.max_request_cost:
        raise ProblemError(422, "Invalid request",
                           f"the batch would cost {work} units of work (numbers computed, weights generated), "
                           f"above the limit of {limits.max_request_cost}; split it into smaller batches or "
                           "share seeds between items", kind="validation-error",
                           errors=[{"pointer": "/items", "type": "batch_too_costly",
                                    "message": f"{work} units in all; the limit is {limits.max_request_cost}"}])
    results = []
    for i, p in enumerate(parsed):
        if not isinstance(p, ProblemError):
            try:
                results.append({"index": i, "status": 200, "result": answer(single, p, binary=binary),
                                "problem": None})
                continue
            except engine.EngineError as e:
                p = engine_problem(e)
        results.append({"index": i, "status": p.status, "result": None,
                        "problem": problem_document(p, path, f"/items/{i}")})
    return {"results": results}


def _dist_version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def version_document(limits: Settings) -> dict[str, Any]:
    """GET /version: versions, the limits in force, the stage ids and the known bugs."""
    return {
        "service": "attention-trace",
        "service_version": _dist_version("attention-trace"),
        "schema_version": serialize.SCHEMA_VERSION,
        "engine_version": engine.ENGINE_VERSION,
        "libraries": {
            "python": platform.python_version(),
            # The libraries that make or check the numbers; the web framework and
            # server are not named (no version banners, for the same reason as Server:).
            **{name: _dist_version(name) for name in ("numpy", "pydantic", "orjson", "regex")},
        },
        "limits": limits.limits(),
        "stage_ids": list(ALL_STAGE_IDS),
        "bugs": {name: bug.summary for name, bug in BUGS.items()},
    }
