"""The service's work, free of any web framework: validated request in,
engine call, JSON bytes or documents out. api.py wraps it in HTTP; the
command-line client runs it in-process."""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Any

import numpy as np
import orjson
from pydantic import ValidationError

import engine
from engine import BUGS, STAGE_IDS, STAGE_INFO
from engine.checks import shape_of
from engine.params import explicit_parameters

from . import serialize
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
        params = explicit_parameters(p.W_Q, p.W_K, p.W_V, p.W_O, d_model=req.d_model, num_heads=req.num_heads)
    return engine.trace(req.trace_config, split=req.split, input=req.input, parameters=params, bug=bug)


def trace_document(req: TraceRequest, limits: Settings) -> dict[str, Any]:
    t = run_trace(req, bug=req.inject_bug)
    doc = serialize.trace_document(t, include_parameters=req.include_parameters, stages=req.stages,
                                   precision=req.precision)
    if req.inject_bug:
        doc["injected_bug"] = {
            "name": req.inject_bug,
            "summary": BUGS[req.inject_bug].summary,
            "warning": "These numbers are deliberately wrong: the known bug "
                       f"'{req.inject_bug}' was injected on request.",
        }
    return doc


def render_trace(req: TraceRequest, limits: Settings) -> bytes:
    """The exact bytes /trace answers for a validated request."""
    return serialize.dumps(trace_document(req, limits))


# ------------------------------------------------------------------ /check

TOLERANCE_RULE = "|received − expected| ≤ atol + rtol·|expected|"


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def compare_stage(sid: str, expected: engine.Stage, received: list[Any], rtol: float, atol: float) -> dict[str, Any]:
    """Compare one submitted stage with the reference, value by value."""
    exp_shape = list(expected.shape)
    base = {"step": STAGE_INFO[sid].step, "expected_shape": exp_shape}
    if sid == "tokens":
        want = list(expected.values)
        shape_ok = len(received) == len(want)
        bad = [i for i, (w, r) in enumerate(zip(want, received)) if w != r]
        first = bad[0] if bad else None
        mism = len(bad) + abs(len(received) - len(want))
        return {**base, "passed": shape_ok and not bad, "shape_ok": shape_ok, "received_shape": [len(received)],
                "n_values": len(want), "mismatches": mism, "max_abs_error": None, "max_rel_error": None,
                "first_mismatch": None if first is None else {"index": [first], "expected": want[first],
                                                              "received": received[first]},
                "message": "the tokens match" if shape_ok and not bad else
                f"the tokens differ: expected {want}, got {received}"}

    got_shape = shape_of(received)
    if got_shape is None or list(got_shape) != exp_shape:
        return {**base, "passed": False, "shape_ok": False,
                "received_shape": None if got_shape is None else list(got_shape),
                "n_values": int(np.prod(exp_shape)), "mismatches": int(np.prod(exp_shape)),
                "max_abs_error": None, "max_rel_error": None, "first_mismatch": None,
                "message": f"the shape is wrong: expected {exp_shape} ({', '.join(STAGE_INFO[sid].axes)}), "
                           f"got {'a ragged array' if got_shape is None else list(got_shape)}"}

    obj = np.array(received, dtype=object)
    got_null = np.equal(obj, None)  # [same shape]
    got = np.where(got_null, 0.0, obj).astype(np.float64)
    exp = np.asarray(expected.values, dtype=np.float64)
    exp_null = expected.mask if expected.mask is not None else np.zeros(exp.shape, dtype=bool)
    both = ~exp_null & ~got_null  # numeric pairs
    abs_err = np.where(both, np.abs(got - exp), 0.0)
    ok_num = abs_err <= atol + rtol * np.abs(exp)
    bad = (both & ~ok_num) | (exp_null != got_null)
    mism = int(bad.sum())
    # Received values are bounded by 1e300 (models), so no error here overflows.
    max_abs = float(abs_err.max()) if both.any() else None
    nz = both & (exp != 0)
    with np.errstate(over="ignore"):  # a subnormal expected weight can make the ratio overflow
        rel = abs_err[nz] / np.abs(exp[nz])
    max_rel = float(min(rel.max(), np.finfo(np.float64).max)) if nz.any() else None
    first = None
    if mism:
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        first = {"index": list(idx),
                 "expected": None if exp_null[idx] else float(exp[idx]),
                 "received": None if got_null[idx] else float(got[idx])}
    if not mism:
        message = f"all {exp.size} values match (largest error {_fmt(max_abs or 0.0)})"
    else:
        e_txt = "null (masked)" if first["expected"] is None else _fmt(first["expected"])
        r_txt = "null" if first["received"] is None else _fmt(first["received"])
        message = (f"{mism} of {exp.size} values are off; the first is at {first['index']} "
                   f"({', '.join(STAGE_INFO[sid].axes)}): expected {e_txt}, got {r_txt}")
    return {**base, "passed": mism == 0, "shape_ok": True, "received_shape": list(got_shape),
            "n_values": int(exp.size), "mismatches": mism, "max_abs_error": max_abs, "max_rel_error": max_rel,
            "first_mismatch": first, "message": message}


def _matches(t: engine.Trace, submission: dict[str, list[Any]], rtol: float, atol: float) -> bool:
    return all(sid in t.stages and compare_stage(sid, t.stages[sid], vals, rtol, atol)["passed"]
               for sid, vals in submission.items())


def check_document(req: CheckRequest, limits: Settings) -> dict[str, Any]:
    """Compare a submission with the reference; diagnose the first wrong stage."""
    t = run_trace(req)
    order = [sid for sid in STAGE_IDS if sid in req.submission]  # the models checked that t has them all
    results = {sid: compare_stage(sid, t.stages[sid], req.submission[sid], req.rtol, req.atol) for sid in order}
    first_wrong = next((sid for sid in order if not results[sid]["passed"]), None)

    matches: list[str] = []
    if first_wrong is not None:
        for bug in engine.applicable_bugs(t.config, t.n_tokens, explicit_input=t.input_source == "explicit"):
            buggy = engine.recompute(t, bug)  # from the bug's step on; earlier arrays are reused
            if engine.same_numbers(buggy, t, order):
                continue  # this bug changes nothing the student submitted
            if _matches(buggy, req.submission, req.rtol, req.atol):
                matches.append(bug.name)
    bug = matches[0] if matches else None

    if first_wrong is None:
        diag_msg = "No bug: every submitted stage matches the reference."
        message = f"All {len(order)} submitted stage(s) match the reference within tolerance."
    else:
        info = STAGE_INFO[first_wrong]
        where = f"Stage '{first_wrong}' (step {info.step}, {t.stages[first_wrong].formula}) is the first that differs"
        if bug:
            diag_msg = f"Your numbers match the known bug '{bug}': {BUGS[bug].summary}."
        else:
            diag_msg = ("Your numbers do not match any known bug; compare your step "
                        f"{info.step} with {t.stages[first_wrong].formula}.")
        message = f"{where}: {results[first_wrong]['message']}. {diag_msg}"

    return {
        "schema_version": serialize.SCHEMA_VERSION,
        "engine_version": t.engine_version,
        "parameters_digest": t.parameters_digest,
        "config": serialize.config_document(t),
        "tolerance": {"rtol": req.rtol, "atol": req.atol, "rule": TOLERANCE_RULE},
        "passed": first_wrong is None,
        "first_wrong_stage": first_wrong,
        "stages": results,
        "diagnosis": {"bug": bug, "summary": BUGS[bug].summary if bug else None, "matches": matches,
                      "message": diag_msg},
        "message": message,
    }


# ------------------------------------------------------------------ batches and /version


def answer(path: str, req: TraceSpec, limits: Settings) -> Any:
    """The single endpoint's answer: /trace as pre-encoded bytes (embedded as-is), /check as a document."""
    if path == "/trace":
        return orjson.Fragment(render_trace(req, limits))  # type: ignore[arg-type]
    return check_document(req, limits)  # type: ignore[arg-type]


def batch_document(path: str, batch: BatchRequest, limits: Settings) -> dict[str, Any]:
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
    results = []
    for i, p in enumerate(parsed):
        if not isinstance(p, ProblemError):
            try:
                results.append({"index": i, "status": 200, "result": answer(single, p, limits), "problem": None})
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
        "stage_ids": list(STAGE_IDS),
        "bugs": {name: bug.summary for name, bug in BUGS.items()},
    }
