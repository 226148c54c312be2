"""Checking a student's numbers against a trace: each stage's verdict, the diagnosis and the messages.

``check(trace, submission, tolerance)`` is the framework-free heart of
/check and of the grader: every submitted stage is compared with the
reference (``compare``: the tolerance, the vectorised comparison), the first
wrong stage in walkthrough order is named, the known bugs that reproduce the
submission are found by ``engine.diagnose`` (one recomputation per applicable
bug), and when none does, ``hints`` says what the student's numbers show.
The messages are written to be shown to a student. The service wraps the
result in its answer's envelope (versions, config, tolerance); the grader
reads the verdicts, the matches and the hints from it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..bugs import ALL_BUGS
from ..layer import ALL_STAGE_IDS, BLOCK_STAGE_IDS, STAGE_INFO, TOKEN_STAGE_IDS
from ..tracing import Stage, Trace, diagnose
from . import compare, hints


def _fmt(x: float) -> str:
    return f"{x:.6g}"


class Submission:
    """A student's numbers for some stages, each numeric stage read into arrays at most once, and only
    when its shape is one some trace has (so the arrays are bounded by the trace's size).

    ``values``: stage id -> the tokens (strings), or a numeric stage as nested lists the way JSON holds
    it (numbers, null, "NaN", …); ``shapes``: each numeric stage's shape as ``compare.scan`` found it
    (None: ragged); ``arrays``: stages given as arrays already (an npz body, the grader's answers).
    """

    def __init__(self, values: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...] | None],
                 arrays: Mapping[str, compare.Received] | None = None) -> None:
        self.raw = values
        self.shapes = shapes
        self._read: dict[str, compare.Received] = dict(arrays or {})

    @classmethod
    def of_arrays(cls, arrays: Mapping[str, tuple[np.ndarray, np.ndarray | None]]) -> Submission:
        """Numeric stages as (values, where null) pairs of arrays: how the grader holds a student's answers."""
        read = {sid: compare.received_npz(values, null) for sid, (values, null) in arrays.items()}
        return cls(dict(arrays), {sid: r.shape for sid, r in read.items()}, read)

    @property
    def stage_ids(self) -> list[str]:
        """The submitted stages, in walkthrough order (a stack's, in the order of ``stage_order``)."""
        return [sid for sid in (*ALL_STAGE_IDS, *BLOCK_STAGE_IDS) if sid in self.raw]

    def stage_order(self, t: Trace) -> list[str]:
        """The submitted stages in the order ``t`` computes them: one layer's walkthrough order, or a stack's,
        where the norms come before or after the attention and a later layer's attention follows the block."""
        return [sid for sid in t.stages if sid in self.raw]

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


def compare_stages(order: list[str], t: Trace, sub: Submission, tol: compare.Tolerance) -> dict[str, Any]:
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


def _axes(sid: str, expected: Stage) -> tuple[str, ...]:
    """The axes a message names: the stage's own (one layer's, as before), with a stack's leading layer axis."""
    axes = STAGE_INFO[sid].axes
    return ("layer", *axes) if expected.axes[:1] == ("layer",) else axes


def _unmatched_shape(sid: str, expected: Stage, sub: Submission) -> dict[str, Any] | None:
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
            parts.append(f"{len(bad)} of {min(len(want), len(received))} differ, the first at index {bad[0]}: "
                         f"expected {_token_shown(want[bad[0]])}, got {_token_shown(received[bad[0]])}")
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
                "message": f"the shape is wrong: expected {exp_shape} ({', '.join(_axes(sid, expected))}), "
                           f"got {'a ragged array' if got_shape is None else list(got_shape)}"}
    return None


def _stage_result(sid: str, expected: Stage, sub: Submission, c: compare.Comparison) -> dict[str, Any]:
    """The answer's entry for a stage compared by value."""
    info = STAGE_INFO[sid]
    base = {"step": info.step, "expected_shape": list(expected.shape)}
    got_shape = sub.shapes[sid]
    assert got_shape is not None  # compared by value: the shape matched
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
                         f"the first is at {c.first} ({', '.join(_axes(sid, expected))}): expected {e_txt}, "
                         f"got {r_txt}")
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


def _hint_received(sid: str, t: Trace, sub: Submission) -> compare.Received:
    """The first wrong stage's arrays for the hints: read only when they hold as many values as the stage."""
    shape = sub.shapes.get(sid)
    if shape is None or math.prod(shape) != math.prod(t.stages[sid].shape):
        return compare.Received(None)
    return sub.received(sid)


def check(t: Trace, sub: Submission, tol: compare.Tolerance) -> dict[str, Any]:
    """Compare a submission with the reference ``t``; diagnose the first wrong stage. The answer's
    ``passed``, ``first_wrong_stage``, ``stages``, ``diagnosis`` and ``message``, in that order (/check's
    CheckResponse without its envelope). Every submitted stage must be one ``t`` has."""
    order = sub.stage_order(t)
    results = compare_stages(order, t, sub, tol)
    first_wrong = next((sid for sid in order if not results[sid]["passed"]), None)

    matches: list[str] = []
    hint_list: list[dict[str, str]] = []
    if first_wrong is not None:
        matches = diagnose(t, first_wrong, order, lambda values, affected: _matches(values, sub, affected, tol))
        if not matches and first_wrong not in TOKEN_STAGE_IDS:  # what the student's numbers show (hints.py)
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
            diag_msg = f"Your numbers match the known bug '{bug}': {ALL_BUGS[bug].summary}."
        else:
            diag_msg = ("Your numbers do not match any known bug; compare your step "
                        f"{info.step} with {t.stages[first_wrong].formula}.")
        message = f"{where}: {results[first_wrong]['message']}. {diag_msg}"
        if hint_list:
            message += " Hints: " + hints.summary(hint_list)

    return {
        "passed": first_wrong is None,
        "first_wrong_stage": first_wrong,
        "stages": results,
        "diagnosis": {"bug": bug, "summary": ALL_BUGS[bug].summary if bug else None, "matches": matches,
                      "message": diag_msg, "hints": hint_list},
        "message": message,
    }
