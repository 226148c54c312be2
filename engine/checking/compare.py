"""How a student's numbers are compared with the reference (/check and the grader), free of any web framework.

* :class:`Tolerance`: the metric (``allclose`` or ``rel_error``) and its
  parameters, with the defaults that docs/checking.md derives from
  measurements (``scripts/measure-tolerance``);
* :func:`scan` and :func:`read`: a submitted stage (nested JSON lists) checked
  once and turned into float64 arrays, keeping apart what JSON keeps apart:
  ``null`` (masked), a number, and the non-finite values NaN, Infinity and
  -Infinity;
* :func:`compare`: one stage against the reference, every value at once
  (vectorised; no Python loop over values).

``report.check`` builds the verdicts from these, and the measuring script
uses the very same functions, so what it measures is what /check does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Literal, cast

import numpy as np

Metric = Literal["allclose", "rel_error"]
METRICS: tuple[str, ...] = ("allclose", "rel_error")

#: numpy.isclose's defaults: what rtol and atol were in schema 1.0.0, and what
#: an rtol or atol that the request leaves out still means when it gives the other
NUMPY_RTOL = 1e-5
NUMPY_ATOL = 1e-8
#: The default tolerance (docs/checking.md, measured by scripts/measure-tolerance):
#: numpy's rtol and atol plus an absolute term of DEFAULT_STAGE_RTOL times the
#: stage's largest |expected|. float32 implementations' errors scale with the
#: stage's magnitude, not with each value's.
DEFAULT_RTOL = NUMPY_RTOL
DEFAULT_ATOL = NUMPY_ATOL
DEFAULT_STAGE_RTOL = 1e-4
#: the rel_error metric's threshold when the request gives none
DEFAULT_THRESHOLD = 1e-3
#: CS231n's floor on the denominator of rel_error
REL_ERROR_FLOOR = 1e-8

#: in masked_scores, a received value at most this (or -Infinity) where the
#: reference masks counts as masked: students fill masked scores with -1e9 or -inf
MASK_FILL = -1e9
#: the strings accepted in a submission for the values JSON cannot write
#: (Jackson, .NET and protobuf's JSON mapping write them so)
NON_FINITE_NAMES: dict[str, float] = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
#: how many non-finite indices a stage's answer and message name
MAX_NON_FINITE_SHOWN = 5
#: one attention layer's stages are at most 3-dimensional ([head, query, key])
MAX_DEPTH = 3
#: a stack of blocks' stages gain a leading layer axis ([layer, head, query, key])
MAX_STACK_DEPTH = 4


def _g(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class Tolerance:
    """One way of deciding that a received value is close enough to the expected one."""

    metric: Metric
    rtol: float | None = None
    atol: float | None = None
    stage_rtol: float | None = None
    threshold: float | None = None

    @classmethod
    def allclose(cls, rtol: float, atol: float, stage_rtol: float = 0.0) -> Tolerance:
        return cls("allclose", rtol=rtol, atol=atol, stage_rtol=stage_rtol)

    @classmethod
    def rel_error(cls, threshold: float = DEFAULT_THRESHOLD) -> Tolerance:
        return cls("rel_error", threshold=threshold)

    @classmethod
    def default(cls) -> Tolerance:
        return cls.allclose(DEFAULT_RTOL, DEFAULT_ATOL, DEFAULT_STAGE_RTOL)

    @classmethod
    def resolve(cls, metric: str | None, rtol: float | None, atol: float | None, stage_rtol: float | None,
                threshold: float | None) -> Tolerance:
        """The tolerance a request asks for (None = not given); the model has checked the combination.

        * nothing given: the default;
        * ``metric: rel_error``: CS231n's rel_error against ``threshold`` (default DEFAULT_THRESHOLD);
        * otherwise allclose: with none of rtol, atol, stage_rtol given, the default's; with any of them
          given, the others are numpy's (rtol 1e-5, atol 1e-8, stage_rtol 0), so rtol and atol alone
          mean exactly numpy.isclose's rule, as in schema 1.0.0.
        """
        if metric == "rel_error":
            return cls.rel_error(DEFAULT_THRESHOLD if threshold is None else threshold)
        if rtol is None and atol is None and stage_rtol is None:
            return cls.default()
        return cls.allclose(NUMPY_RTOL if rtol is None else rtol, NUMPY_ATOL if atol is None else atol,
                            0.0 if stage_rtol is None else stage_rtol)

    @property
    def rule(self) -> str:
        if self.metric == "rel_error":
            return "|received − expected| / max(1e-8, |received| + |expected|) ≤ threshold"
        if not self.stage_rtol:
            return "|received − expected| ≤ atol + rtol·|expected|"  # numpy.isclose's rule, as in 1.0.0
        return "|received − expected| ≤ atol + rtol·|expected| + stage_rtol·max|expected of the stage|"

    def document(self) -> dict[str, Any]:
        """The answer's ``tolerance``: the metric, every parameter (null where it does not apply) and the rule."""
        return {"metric": self.metric, "rtol": self.rtol, "atol": self.atol, "stage_rtol": self.stage_rtol,
                "threshold": self.threshold, "rule": self.rule}

    def allowance(self, magnitude: float, scale: float) -> float:
        """About how far a value of this magnitude may be off, in a stage whose largest |value| is ``scale``."""
        if self.metric == "rel_error":
            return 2.0 * (self.threshold or 0.0) * magnitude  # |r − e| ≤ t·(|r| + |e|) ≈ 2t·|e|
        return (self.atol or 0.0) + (self.rtol or 0.0) * magnitude + (self.stage_rtol or 0.0) * scale

    def describe(self) -> str:
        if self.metric == "rel_error":
            return f"rel_error ≤ {_g(self.threshold or 0.0)}"
        return (f"rtol {_g(self.rtol or 0.0)}, atol {_g(self.atol or 0.0)}"
                + (f", stage_rtol {_g(self.stage_rtol)}" if self.stage_rtol else ""))


# ------------------------------------------------------------- reading a submission


class SubmissionTypeError(ValueError):
    """A submitted stage holds something that is no number: a 422 at its pointer."""


_LEAF_TYPES = frozenset({float, int, type(None), str})


def scan(values: list[Any], max_depth: int = MAX_DEPTH) -> tuple[int, ...] | None:
    """Check that a stage's values hold only numbers, null or the names in NON_FINITE_NAMES, at most
    ``max_depth`` levels deep (MAX_STACK_DEPTH in a stack of blocks); return their shape, or None when the
    lists are ragged.

    Level by level, never value by value in Python: each level's types and
    lengths are collected at C speed (``set(map(type, …))``), so a stage of a
    million values costs a few passes over them. Raises SubmissionTypeError.
    """
    shape = [len(values)]
    regular = True
    lists: list[list[Any]] = [values]  # the lists at this depth, across all parents
    for depth in range(1, max_depth + 1):
        items = chain.from_iterable(lists)
        types = set(map(type, items))
        if list not in types:
            _check_leaves(lists, types)
            return tuple(shape) if regular else None
        if depth == max_depth:
            raise SubmissionTypeError(f"nested deeper than any stage ({max_depth} levels)")
        if types == {list}:
            inner = list(chain.from_iterable(lists))
        else:  # lists next to numbers: ragged, but every value is still checked
            regular = False
            mixed = list(chain.from_iterable(lists))
            leaves = [v for v in mixed if type(v) is not list]
            _check_leaves([leaves], set(map(type, leaves)))
            inner = [v for v in mixed if type(v) is list]
        lengths = set(map(len, inner))
        if len(lengths) == 1:
            shape.append(lengths.pop())
        else:
            regular = False
        lists = inner
    raise AssertionError("unreachable")  # pragma: no cover


def _check_leaves(lists: list[list[Any]], types: set[type]) -> None:
    """The values of ``lists`` (whose types are ``types``) are all numbers, null or non-finite names."""
    if not types <= _LEAF_TYPES:  # bool, dict, ...: `type(True) is bool`, not int
        bad = next(v for v in chain.from_iterable(lists) if type(v) not in _LEAF_TYPES)
        raise SubmissionTypeError(f"{str(bad)[:40]!r} is not a number or null")
    if str in types:
        for v in chain.from_iterable(lists):
            if type(v) is str and v not in NON_FINITE_NAMES:
                raise SubmissionTypeError(f"{v[:40]!r} is not a number or null (the only strings accepted are "
                                          '"NaN", "Infinity" and "-Infinity")')


@dataclass(frozen=True)
class Received:
    """A submitted numeric stage as arrays: ``values`` (float64; NaN and ±inf as sent, 0 where null)
    and ``null``, both of ``shape``; all None when the lists are ragged."""

    shape: tuple[int, ...] | None
    values: np.ndarray | None = field(default=None, repr=False)
    null: np.ndarray | None = field(default=None, repr=False)
    #: every value a finite number (no null, NaN or ±inf): the common case, judged by passes' fast path
    plain: bool = False


def read(values: list[Any], shape: tuple[int, ...] | None) -> Received:
    """A stage that :func:`scan` accepted (with the shape it found), as float64 arrays."""
    if shape is None:
        return Received(None)
    try:
        a = np.array(values, dtype=np.float64)  # the common case: numbers only, converted in C
        null = np.zeros(a.shape, dtype=bool)
        if not np.isnan(a).any():
            return Received(shape, a, null, plain=bool(np.isfinite(a).all()))
    except (TypeError, ValueError, OverflowError):  # null, a non-finite name, or an integer beyond float64
        pass
    obj = np.array(values, dtype=object)  # [shape]: the lists are regular (scan said so)
    # numpy's stubs take no None as an operand; comparing an object array with None element by element is meant
    null = np.equal(obj, None)  # type: ignore[call-overload]  # None, element by element (above)
    filled = np.where(null, 0.0, obj)
    try:
        a = filled.astype(np.float64)  # "NaN", "Infinity", "-Infinity" -> float
    except OverflowError:  # a JSON integer beyond float64 (over 308 digits) is an infinity
        a = np.frompyfunc(_to_float, 1, 1)(filled).astype(np.float64)
    return Received(shape, a, null)


def _to_float(v: Any) -> float:
    try:
        return float(v)
    except OverflowError:  # only an int can be too large for a float
        return math.inf if v > 0 else -math.inf


def received_npz(values: np.ndarray, mask: np.ndarray | None) -> Received:
    """A stage sent as an npz member (service/npz.py): its array as float64, null where ``mask`` is true
    (the answers' layout: NaN there, or anything), and NaN or ±inf elsewhere as sent."""
    a = values if values.dtype == np.float64 and values.dtype.isnative else values.astype(np.float64)
    if mask is None:
        null = np.zeros(a.shape, dtype=bool)
    else:
        null = np.asarray(mask, dtype=bool)
        a = np.where(null, 0.0, a)  # as read() fills a JSON null
    return Received(a.shape, a, null, plain=not null.any() and bool(np.isfinite(a).all()))


def received_array(values: Any) -> Received:
    """A numpy array or nested lists (not yet scanned) as a Received stage: for scripts and tests."""
    if isinstance(values, np.ndarray):
        a = values.astype(np.float64)
        return Received(a.shape, a, np.zeros(a.shape, dtype=bool))
    return read(values, scan(values))


# ---------------------------------------------------------------- comparing


def non_finite_name(x: float) -> str:
    """How a non-finite value is written in JSON submissions (and in answers, as a string)."""
    return "NaN" if math.isnan(x) else "Infinity" if x > 0 else "-Infinity"


@dataclass(frozen=True)
class Comparison:
    """One submitted stage against the reference (shapes equal)."""

    passed: bool
    n_values: int
    mismatches: int
    max_abs_error: float | None  # over pairs of finite numbers
    max_rel_error: float | None  # |received − expected| / |expected| where expected ≠ 0
    rel_error: float | None  # CS231n's, over pairs of finite numbers
    abs_tolerance: float | None  # allclose: atol + stage_rtol·max|expected|
    non_finite: int  # received NaN or ±inf that fail the stage
    non_finite_at: list[tuple[list[int], str]]  # the first few: (index, "NaN" | "Infinity" | "-Infinity")
    treated_as_masked: int  # fills ≤ MASK_FILL or -inf where the reference masks
    first: list[int] | None  # the first failing index, row-major
    first_expected: float | None  # None: masked
    first_received: float | str | None  # None: null; str: a non-finite value's name
    #: the largest |error| as a multiple of what the tolerance allows (a stage fails above 1;
    #: infinite for a non-finite value or a masked/number disagreement); for measuring
    figure: float


def _capped(x: Any) -> float:
    """A finite float for the answer (JSON has no infinity): at most float64's largest."""
    return float(min(float(x), np.finfo(np.float64).max))


def stage_scale(expected: np.ndarray, mask: np.ndarray | None) -> float:
    """max|expected| over the entries that are not masked."""
    if expected.size == 0:
        return 0.0
    a = np.abs(expected) if mask is None else np.where(mask, 0.0, np.abs(expected))
    return float(a.max())


@dataclass(frozen=True)
class _Judgement:
    exp_mask: np.ndarray  # where the reference masks
    filled: np.ndarray  # fills (≤ MASK_FILL, -inf) taken as masked where the reference masks
    got_masked: np.ndarray  # where the student masks (null, -inf, ≤ MASK_FILL where the reference masks)
    non_finite: np.ndarray  # NaN or ±inf that fail the stage
    numeric: np.ndarray  # pairs of finite numbers
    diff: np.ndarray  # |received − expected| on those pairs, else 0
    ratio: np.ndarray  # CS231n's relative error on those pairs, else 0
    allowed: np.ndarray | None  # allclose: what each value may be off by
    bad: np.ndarray  # every failing entry


def _judge(expected: np.ndarray, exp_mask: np.ndarray, got: np.ndarray, got_null: np.ndarray, tol: Tolerance,
           abs_tolerance: float | np.ndarray | None) -> _Judgement:
    """The one rule a submitted value passes by, value by value (callers silence numpy's floating-point
    warnings). ``abs_tolerance``: allclose's atol + stage_rtol·max|expected| of each value's stage (one
    number, or one per value when several stages are judged at once); None for rel_error."""
    filled = exp_mask & ~got_null & (got <= MASK_FILL)  # includes -inf; NaN compares False
    got_masked = got_null | filled
    non_finite = ~got_masked & ~np.isfinite(got)
    numeric = ~exp_mask & ~got_masked & ~non_finite  # pairs of finite numbers
    diff = np.where(numeric, np.abs(got - expected), 0.0)
    ratio = np.where(numeric, diff / np.maximum(REL_ERROR_FLOOR, np.abs(got) + np.abs(expected)), 0.0)
    if tol.metric == "rel_error":
        allowed = None
        bad_num = ratio > tol.threshold
    else:
        allowed = abs_tolerance + tol.rtol * np.abs(expected)
        bad_num = numeric & (diff > allowed)
    bad = bad_num | non_finite | (exp_mask != got_masked)
    return _Judgement(exp_mask, filled, got_masked, non_finite, numeric, diff, ratio, allowed, bad)


def _abs_tolerance(tol: Tolerance, scale: float) -> float | None:
    """allclose's absolute allowance for a stage whose largest |expected| is ``scale``; None for rel_error."""
    if tol.metric == "rel_error":
        return None
    assert tol.atol is not None and tol.stage_rtol is not None  # allclose sets both
    return tol.atol + tol.stage_rtol * scale


def passes(expected: np.ndarray, mask: np.ndarray | None, received: Received, tol: Tolerance) -> bool:
    """``compare(...).passed``, without the report: what diagnosis asks of every known bug.

    Where nothing is masked and every received value is a finite number, ``_judge``'s rule reduces
    to its last comparison (every pair is numeric), done here directly; elsewhere ``_judge`` decides.
    """
    assert received.values is not None and received.null is not None  # a regular stage (scan accepted it)
    with np.errstate(all="ignore"):
        if mask is None and received.plain:
            diff = np.abs(received.values - expected)
            if tol.metric == "rel_error":
                ratio = diff / np.maximum(REL_ERROR_FLOOR, np.abs(received.values) + np.abs(expected))
                return not (ratio > tol.threshold).any()
            assert tol.atol is not None and tol.stage_rtol is not None  # allclose sets both
            allowed = tol.atol + tol.stage_rtol * stage_scale(expected, None) + tol.rtol * np.abs(expected)
            return not (diff > allowed).any()
        exp_mask = mask if mask is not None else np.zeros(expected.shape, dtype=bool)
        j = _judge(expected, exp_mask, received.values, received.null, tol,
                   _abs_tolerance(tol, stage_scale(expected, mask)))
        return not j.bad.any()


def compare(expected: np.ndarray, mask: np.ndarray | None, received: Received, tol: Tolerance) -> Comparison:
    """Compare every value of one stage at once. ``mask``: where the reference masks (True), or None.

    Where the reference masks, null, -Infinity and any value ≤ MASK_FILL count
    as masked; anything else there is wrong. A NaN or ±Infinity anywhere else
    fails the stage. Elsewhere each pair of finite numbers is judged by ``tol``.
    """
    return compare_many([(expected, mask, received)], tol)[0]


def compare_many(stages: list[tuple[np.ndarray, np.ndarray | None, Received]], tol: Tolerance) -> list[Comparison]:
    """``[compare(expected, mask, received, tol) for ...]``, judged as one array.

    The stages' values are joined end to end and ``_judge`` runs once over them
    (the same elementwise rule, so the same bits); each stage's figures are then
    reductions over its own segment (``ufunc.reduceat``), and only a failing
    stage is looked at on its own, for the indices its answer names. /check
    compares up to 13 stages of a few dozen numbers: a few numpy calls in all
    instead of ~50 per stage.
    """
    for expected, _, received in stages:
        assert received.values is not None and received.null is not None and received.values.shape == expected.shape
    sizes = [int(e.size) for e, _, _ in stages]
    if not stages or 0 in sizes:  # reduceat cannot give an empty segment: judge such a list stage by stage
        return [_compare_empty(tol) if e.size == 0 else compare_many([(e, m, r)], tol)[0] for e, m, r in stages]
    starts = np.cumsum([0, *sizes[:-1]])  # [stages]: each segment's first index
    expected = _joined([np.asarray(e, dtype=np.float64).reshape(-1) for e, _, _ in stages])  # -> [total]
    exp_mask = _joined([np.zeros(e.size, dtype=bool) if m is None else np.asarray(m, dtype=bool).reshape(-1)
                        for e, m, _ in stages])  # -> [total]
    got = _joined([cast(np.ndarray, r.values).reshape(-1) for _, _, r in stages])  # -> [total] (asserted above)
    got_null = _joined([cast(np.ndarray, r.null).reshape(-1) for _, _, r in stages])  # -> [total]

    def per_stage(ufunc: np.ufunc, a: np.ndarray, dtype: Any = None) -> list[Any]:
        per: list[Any] = ufunc.reduceat(a, starts, dtype=dtype).tolist()  # [total] -> [stages]
        return per

    # A student may send ±1.8e308: no operation below may warn (overflow to inf only makes a value fail).
    with np.errstate(all="ignore"):
        scales = per_stage(np.maximum, np.where(exp_mask, 0.0, np.abs(expected)))  # stage_scale of each
        abs_tolerances = [_abs_tolerance(tol, s) for s in scales]
        spread: np.ndarray | None = None if tol.metric == "rel_error" else np.repeat(cast(list[float], abs_tolerances), sizes)  # [stages] -> [total]
        j = _judge(expected, exp_mask, got, got_null, tol, spread)
        nz = j.numeric & (expected != 0)
        mismatches = per_stage(np.add, j.bad, np.intp)
        n_numeric = per_stage(np.add, j.numeric, np.intp)
        n_nz = per_stage(np.add, nz, np.intp)
        n_non_finite = per_stage(np.add, j.non_finite, np.intp)
        n_filled = per_stage(np.add, j.filled, np.intp)
        mask_disagrees = per_stage(np.add, j.exp_mask != j.got_masked, np.intp)
        max_abs = per_stage(np.maximum, j.diff)
        max_rel = per_stage(np.maximum, np.where(nz, j.diff / np.abs(expected), -np.inf))  # a subnormal may overflow
        rel_error = per_stage(np.maximum, j.ratio)
        used = None if j.allowed is None else per_stage(np.maximum, np.where(j.numeric & (j.diff > 0),
                                                                               j.diff / j.allowed, 0.0))

    out = []
    for k, (e, _, _) in enumerate(stages):
        seg = slice(int(starts[k]), int(starts[k]) + sizes[k])
        # What the tolerance allows, used up: for measuring margins (scripts/measure-tolerance).
        if mismatches[k] and (n_non_finite[k] or mask_disagrees[k]):
            figure = math.inf
        elif not n_numeric[k]:
            figure = 0.0
        elif used is None:
            capped = _capped(rel_error[k])
            figure = capped / tol.threshold if tol.threshold else (math.inf if capped else 0.0)
        else:
            figure = float(used[k])
        non_finite_at: list[tuple[list[int], str]] = []
        if n_non_finite[k]:
            stage_got = got[seg].reshape(e.shape)
            non_finite_at = [([int(i) for i in idx], non_finite_name(float(stage_got[tuple(idx)])))
                             for idx in np.argwhere(j.non_finite[seg].reshape(e.shape))[:MAX_NON_FINITE_SHOWN]]
        first = first_exp = first_got = None
        if mismatches[k]:
            at = int(starts[k]) + int(np.argmax(j.bad[seg]))  # the first failing value, row-major
            first = [int(i) for i in np.unravel_index(at - int(starts[k]), e.shape)]
            first_exp = None if j.exp_mask[at] else float(expected[at])
            g = float(got[at])
            first_got = None if j.got_masked[at] else g if math.isfinite(g) else non_finite_name(g)
        out.append(Comparison(
            passed=mismatches[k] == 0, n_values=sizes[k], mismatches=mismatches[k],
            max_abs_error=_capped(max_abs[k]) if n_numeric[k] else None,
            max_rel_error=_capped(max_rel[k]) if n_nz[k] else None,
            rel_error=_capped(rel_error[k]) if n_numeric[k] else None, abs_tolerance=abs_tolerances[k],
            non_finite=n_non_finite[k], non_finite_at=non_finite_at, treated_as_masked=n_filled[k],
            first=first, first_expected=first_exp, first_received=first_got, figure=figure,
        ))
    return out


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """The parts end to end; one part as it is (a view when it is contiguous: no copy)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


#: stages at most this large are compared together; a larger one alone (numpy's per-call cost is
#: negligible there, and joining would copy it)
JOIN_MAX_VALUES = 65_536


def batches(sizes: list[int]) -> list[list[int]]:
    """The indices of stages to compare together, in order of first appearance: all the small ones
    (≤ JOIN_MAX_VALUES values) as one batch, each larger one alone."""
    small = [k for k, n in enumerate(sizes) if n <= JOIN_MAX_VALUES]
    return ([small] if small else []) + [[k] for k, n in enumerate(sizes) if n > JOIN_MAX_VALUES]


def _compare_empty(tol: Tolerance) -> Comparison:
    """A stage of no values passes (no figure, nothing to name)."""
    return Comparison(passed=True, n_values=0, mismatches=0, max_abs_error=None, max_rel_error=None, rel_error=None,
                      abs_tolerance=_abs_tolerance(tol, 0.0), non_finite=0, non_finite_at=[], treated_as_masked=0,
                      first=None, first_expected=None, first_received=None, figure=0.0)
