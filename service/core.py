"""The service's work, free of any web framework: validated request in,
engine call, JSON bytes or documents out. api.py wraps it in HTTP; the
command-line client runs it in-process."""

from __future__ import annotations

import math
from collections.abc import Mapping
import platform
from importlib import metadata
from typing import Any

import numpy as np
import orjson
from pydantic import ValidationError

import engine
from engine import BUGS, STAGE_INFO
from engine.layer import ALL_STAGE_IDS, TOKEN_STAGE_IDS, Step, swapped
from engine.params import explicit_parameters

from . import budget, compare, hints, npz, serialize
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


def _fmt(x: float) -> str:
    return f"{x:.6g}"


class Submission:
    """A validated submission, each numeric stage read into arrays at most once, and only
    when its shape is one some trace has (so the arrays are bounded by the trace's size)."""

    def __init__(self, req: CheckRequest) -> None:
        self.raw = req.submission
        self.shapes = req.shapes
        self._read: dict[str, compare.Received] = dict(req.arrays)  # an npz body's stages are arrays already

    def received(self, sid: str) -> compare.Received:
        if sid not in self._read:
            self._read[sid] = compare.read(self.raw[sid], self.shapes[sid])
        return self._read[sid]


def _masked_note(count: int) -> str:
    return (f"; {count} masked entr{'y' if count == 1 else 'ies'} sent as -inf or a value ≤ -1e9 "
            f"{'was' if count == 1 else 'were'} treated as masked")


def _non_finite_text(c: compare.Comparison) -> str:
    shown = ", ".join(f"{name} at {idx}" for idx, name in c.non_finite_at)
    more = f" and {c.non_finite - len(c.non_finite_at)} more" if c.non_finite > len(c.non_finite_at) else ""
    return (f"{c.non_finite} of {c.n_values} values are not finite numbers ({shown}{more}), "
            "so this stage fails")


def compare_stages(order: list[str], t: engine.Trace, sub: Submission, tol: compare.Tolerance) -> dict[str, Any]:
    """Each submitted stage against the reference (the answer's per-stage entries, in ``order``). The
    numeric stages of the right shape are compared value by value, the small ones all at once
    (compare.compare_many), so a large one is never copied to be joined."""
    results: dict[str, Any] = {}
    numeric: list[str] = []
    for sid in order:
        results[sid] = _unmatched_shape(sid, t.stages[sid], sub)  # None: compared below, in this place
        if results[sid] is None:
            numeric.append(sid)
    items = [(np.asarray(t.stages[sid].values, dtype=np.float64), t.stages[sid].mask, sub.received(sid))
             for sid in numeric]
    for batch in compare.batches([e.size for e, _, _ in items]):  # the small stages at once, large ones alone
        for k, c in zip(batch, compare.compare_many([items[k] for k in batch], tol), strict=True):
            results[numeric[k]] = _stage_result(numeric[k], t.stages[numeric[k]], sub, c)
    return results


#: most characters of a token an answer repeats (a submitted token may be as long as the request)
TOKEN_SHOWN_CHARS = 64


def _token_cut(text: str) -> str:
    return text if len(text) <= TOKEN_SHOWN_CHARS else text[:TOKEN_SHOWN_CHARS] + "…"


def _token_shown(text: str) -> str:
    return repr(_token_cut(text))


def _unmatched_shape(sid: str, expected: engine.Stage, sub: Submission) -> dict[str, Any] | None:
    """The entry of the token stage, or of a stage whose shape is wrong; None for one to compare by value."""
    exp_shape = list(expected.shape)
    info = STAGE_INFO[sid]
    base = {"step": info.step, "expected_shape": exp_shape}
    none = {"rel_error": None, "abs_tolerance": None, "non_finite": None, "treated_as_masked": 0}
    if sid in TOKEN_STAGE_IDS:
        what = "tokens" if sid == "tokens" else "context tokens"
        received = sub.raw[sid]
        want = list(expected.values)
        shape_ok = len(received) == len(want)
        bad = [i for i, (w, r) in enumerate(zip(want, received)) if w != r]
        first = bad[0] if bad else None
        mism = len(bad) + abs(len(received) - len(want))
        # Summarised, never echoed: the answer stays small whatever the submission holds.
        parts = []
        if bad:
            parts.append(f"{len(bad)} of {min(len(want), len(received))} differ, the first at index {first}: "
                         f"expected {_token_shown(want[first])}, got {_token_shown(received[first])}")
        if not shape_ok:
            parts.append(f"expected {len(want)} {what}, got {len(received)}")
        return {**base, "passed": shape_ok and not bad, "shape_ok": shape_ok, "received_shape": [len(received)],
                "n_values": len(want), "mismatches": mism, "max_abs_error": None, "max_rel_error": None, **none,
                "first_mismatch": None if first is None else {"index": [first], "expected": _token_cut(want[first]),
                                                              "received": _token_cut(received[first])},
                "message": f"the {what} match" if shape_ok and not bad else f"the {what} differ: " + "; ".join(parts)}

    got_shape = sub.shapes[sid]
    if got_shape is None or list(got_shape) != exp_shape:
        return {**base, "passed": False, "shape_ok": False,
                "received_shape": None if got_shape is None else list(got_shape),
                "n_values": int(np.prod(exp_shape)), "mismatches": int(np.prod(exp_shape)),
                "max_abs_error": None, "max_rel_error": None, **none, "first_mismatch": None,
                "message": f"the shape is wrong: expected {exp_shape} ({', '.join(info.axes)}), "
                           f"got {'a ragged array' if got_shape is None else list(got_shape)}"}
    return None


def _stage_result(sid: str, expected: engine.Stage, sub: Submission, c: compare.Comparison) -> dict[str, Any]:
    """The answer's entry for a stage compared by value."""
    info = STAGE_INFO[sid]
    base = {"step": info.step, "expected_shape": list(expected.shape)}
    got_shape = sub.shapes[sid]
    first = None
    if c.first is not None:
        first = {"index": c.first, "expected": c.first_expected, "received": c.first_received}
    if not c.mismatches:
        message = f"all {c.n_values} values match (largest error {_fmt(c.max_abs_error or 0.0)})"
    else:
        parts = []
        if c.non_finite:
            parts.append(_non_finite_text(c))
        others = c.mismatches - c.non_finite
        if others or not c.non_finite:
            e_txt = "null (masked)" if c.first_expected is None else _fmt(c.first_expected)
            r = c.first_received
            r_txt = "null" if r is None else r if isinstance(r, str) else _fmt(r)
            parts.append(f"{c.mismatches} of {c.n_values} values are off{' in all' if c.non_finite else ''}; "
                         f"the first is at {c.first} ({', '.join(info.axes)}): expected {e_txt}, got {r_txt}")
        message = "; ".join(parts)
    if c.treated_as_masked:
        message += _masked_note(c.treated_as_masked)
    return {**base, "passed": c.passed, "shape_ok": True, "received_shape": list(got_shape),
            "n_values": c.n_values, "mismatches": c.mismatches, "max_abs_error": c.max_abs_error,
            "max_rel_error": c.max_rel_error, "rel_error": c.rel_error, "abs_tolerance": c.abs_tolerance,
            "non_finite": None if not c.non_finite else {
                "count": c.non_finite, "first": [{"index": idx, "value": name} for idx, name in c.non_finite_at]},
            "treated_as_masked": c.treated_as_masked, "first_mismatch": first, "message": message}


def _matches(values: Mapping[str, Any], sub: Submission, order: list[str], tol: compare.Tolerance) -> bool:
    """Whether every submitted stage matches a recomputed trace's ``values`` (engine.recompute_values)
    within the tolerance (``order``'s first stage first: give the first wrong one there, since a bug
    that explains it is rare)."""
    for sid in order:
        got = values.get(sid)
        if got is None:
            return False
        if sid in TOKEN_STAGE_IDS:
            if list(got) != sub.raw[sid]:
                return False
            continue
        shape = sub.shapes[sid]
        if shape is None or tuple(shape) != got.shape:
            return False
        mask = values["excluded"] if sid == "masked_scores" else None
        if not compare.passes(got, mask, sub.received(sid), tol):
            return False
    return True


def _affected(steps: tuple[Step, ...], made_by: dict[str, int], bug: engine.Bug,
              order: list[str]) -> list[str]:
    """The submitted stages a bug's recomputation can change: those computed at or after its first
    replaced step, in walkthrough order. Every earlier stage holds the reference's very arrays
    (engine.recompute_values reuses them), and tokens or an explicit input are no step's output.
    ``made_by``: the index of the step that writes each value."""
    start = swapped(steps, bug.replaces)[1]
    return [sid for sid in order if made_by.get(sid, -1) >= start]


def _hint_received(sid: str, t: engine.Trace, sub: Submission) -> compare.Received:
    """The first wrong stage's arrays for the hints: read only when they hold as many values as the stage."""
    shape = sub.shapes.get(sid)
    if shape is None or math.prod(shape) != math.prod(t.stages[sid].shape):
        return compare.Received(None)
    return sub.received(sid)


def check_document(req: CheckRequest) -> dict[str, Any]:
    """Compare a submission with the reference; diagnose the first wrong stage."""
    t = run_trace(req)
    tol = req.tolerance
    sub = Submission(req)
    order = [sid for sid in ALL_STAGE_IDS if sid in req.submission]  # the models checked that t has them all
    results = compare_stages(order, t, sub, tol)
    first_wrong = next((sid for sid in order if not results[sid]["passed"]), None)

    matches: list[str] = []
    hint_list: list[dict[str, str]] = []
    made_by = {out: i for i, step in enumerate(t.steps) for out in step.writes}
    if first_wrong in made_by:  # tokens, or an explicit input, no bug computes: none can explain them
        for bug in engine.applicable_bugs(t.config, t.n_tokens, explicit_input=t.input_source == "explicit",
                                          n_context=t.n_context):
            affected = _affected(t.steps, made_by, bug, order)
            if first_wrong not in affected:
                continue  # it changes nothing up to the first wrong stage, which it therefore cannot reproduce
            # The stages before the bug's step are the reference's (they passed: they come before the
            # first wrong one), so only the affected ones are compared, earliest first: they are the
            # cheapest to recompute (engine.recompute_values computes as they are read), and a bug that
            # changes a stage the reference got right usually fails right there.
            if _matches(engine.recompute_values(t, bug), sub, affected, tol):
                matches.append(bug.name)
    if first_wrong is not None:
        if not matches and first_wrong not in TOKEN_STAGE_IDS:  # what the student's numbers show (service/hints.py)
            st = t.stages[first_wrong]
            hint_list = hints.hints(first_wrong, np.asarray(st.values, dtype=np.float64), st.mask,
                                    _hint_received(first_wrong, t, sub), t.config, tol, cross=t.cross)
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
        if hint_list:
            message += " Hints: " + hints.summary(hint_list)

    return {
        "schema_version": serialize.SCHEMA_VERSION,
        "engine_version": t.engine_version,
        "parameters_digest": t.parameters_digest,
        "config": serialize.config_document(t),
        "tolerance": tol.document(),
        "passed": first_wrong is None,
        "first_wrong_stage": first_wrong,
        "stages": results,
        "diagnosis": {"bug": bug, "summary": BUGS[bug].summary if bug else None, "matches": matches,
                      "message": diag_msg, "hints": hint_list},
        "message": message,
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
