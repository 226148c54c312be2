"""General hints: what a student's numbers show when no known bug reproduces them.

Computed on the first wrong stage only, from the student's own numbers, every
check vectorised and at most O(N log N) in the stage's size:

* ``non_finite``: NaN or ±Infinity in the stage;
* ``rows_do_not_sum_to_1`` (weights): a softmax row always sums to 1;
* ``diagonal_masked`` (masked_scores, weights): each query's own key is masked;
* ``transposed``: the values are the expected ones with the last two axes swapped;
* ``permutation``: the same numbers in another order (or shape);
* ``constant_factor``: the expected values times one constant c, named when it is
  close to √d_k, d_k, √d_model, 1/√d_k and the like.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..layer import STAGE_INFO, TOKEN_STAGE_IDS, TraceConfig
from .compare import MASK_FILL, Received, Tolerance, compare, stage_scale

HINT_CODES: tuple[str, ...] = ("non_finite", "rows_do_not_sum_to_1", "diagonal_masked", "transposed", "permutation",
                               "constant_factor")

#: a constant factor this close (relatively) to a named one is called by that name
FACTOR_MATCH = 1e-3
#: significant digits of c that the thresholds read: c comes from BLAS dot products, whose last bits differ
#: between CPUs, so a factor right at a threshold (1.001 against FACTOR_MATCH) must not flip with the CPU
FACTOR_DIGITS = 12


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def _hint(code: str, message: str) -> dict[str, str]:
    assert code in HINT_CODES
    return {"code": code, "message": message}


def hints(sid: str, expected: np.ndarray, mask: np.ndarray | None, received: Received, config: TraceConfig,
          tol: Tolerance, *, cross: bool = False) -> list[dict[str, str]]:
    """What the student's numbers for stage ``sid`` show, most specific first (possibly nothing).
    ``cross``: cross-attention, whose keys are the context's tokens (no query has an own key)."""
    if received.values is None or received.null is None or sid in TOKEN_STAGE_IDS:
        return []
    with np.errstate(all="ignore"):  # a student's 1e308 may overflow a sum: the checks then simply do not hold
        return _hints(sid, expected, mask, received, config, tol, cross)


def _hints(sid: str, expected: np.ndarray, mask: np.ndarray | None, received: Received, config: TraceConfig,
           tol: Tolerance, cross: bool = False) -> list[dict[str, str]]:
    assert received.values is not None and received.null is not None
    got, null = received.values, received.null
    out: list[dict[str, str]] = []
    if got.shape == expected.shape:
        out += _non_finite(sid, got, null, mask)
        if sid == "weights":
            out += _row_sums(got, expected, tol)
        if sid in ("masked_scores", "weights") and not cross:  # a query's own key: self-attention only
            out += _diagonal(sid, got, null, expected, config, tol)
    transposed = _transposed(sid, expected, mask, received, tol)
    out += transposed
    if not transposed:
        out += _permutation(sid, expected, mask, received, config, tol)
    if got.shape == expected.shape:
        out += _constant_factor(expected, mask, received, config, tol)
    return out


def _masked_like(got: np.ndarray, null: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return null | (got <= MASK_FILL)


def _non_finite(sid: str, got: np.ndarray, null: np.ndarray, mask: np.ndarray | None) -> list[dict[str, str]]:
    bad = ~null & ~np.isfinite(got)
    if mask is not None:
        bad &= ~(mask & (got == -np.inf))  # -inf where the reference masks counts as masked
    if not bad.any():
        return []
    count = int(np.count_nonzero(bad))
    where = [int(i) for i in np.argwhere(bad)[0]]
    if sid in ("weights", "context", "concat", "output"):
        why = ("a NaN in the weights (and everything after them) usually comes from a softmax over a row whose "
               "every key is masked (exp(−inf) / 0), or from exp() overflowing because the row's maximum was not "
               "subtracted first")
    else:
        why = "a NaN or infinity usually comes from an overflow, or from 0/0 or ∞ − ∞, in this step or an earlier one"
    what = "1 value is" if count == 1 else f"{count} values are"
    return [_hint("non_finite", f"{what} NaN or infinite, the first at {where}: {why}.")]


def _row_sums(got: np.ndarray, expected: np.ndarray, tol: Tolerance) -> list[dict[str, str]]:
    rows = got.sum(axis=-1)  # [(layer,) head, query]
    eps = max(1e-6, tol.allowance(1.0, 1.0)) * math.sqrt(got.shape[-1])
    with np.errstate(invalid="ignore"):
        off = np.isfinite(rows) & (np.abs(rows - 1.0) > eps)
    if not off.any():
        return []
    first = tuple(int(i) for i in np.argwhere(off)[0])
    row = ", ".join(f"{axis} {i}" for axis, i in zip(("layer", "head", "query")[-len(first):], first, strict=True))
    message = (f"The rows of your weights do not sum to 1: {int(np.count_nonzero(off))} of {rows.size} rows are "
               f"off, e.g. [{row}] sums to {_fmt(float(rows[first]))}. A softmax "
               "normalises each query's row over the keys (the last axis), so every row sums to 1")
    cols = got.sum(axis=-2)
    with np.errstate(invalid="ignore"):
        if np.isfinite(cols).all() and (np.abs(cols - 1.0) <= eps).all():
            message += "; yours sum to 1 down the columns: the softmax ran over the queries (axis −2)"
    return [_hint("rows_do_not_sum_to_1", message + ".")]


def _diagonal(sid: str, got: np.ndarray, null: np.ndarray, expected: np.ndarray, config: TraceConfig,
              tol: Tolerance) -> list[dict[str, str]]:
    n = got.shape[-1]
    if n < 2:
        return []
    i = np.arange(1, n)  # row 0: with its only key masked, students' rows hold anything
    if sid == "masked_scores":
        masked = _masked_like(got, null)[..., i, i]
        if not masked.all():
            return []
        what = "null, −inf or ≤ −1e9"
    else:
        eps = max(1e-12, tol.allowance(0.0, 1.0))
        diag, want = got[..., i, i], expected[..., i, i]
        if not (np.isfinite(diag).all() and (np.abs(diag) <= eps).all()) or not (want > 10 * eps).any():
            return []
        what = "a weight of 0"
    why = ("A causal mask hides only the keys after the query (key > query, np.triu(…, k=1))" if config.causal
           else "Without causal: true nothing is masked")
    return [_hint("diagonal_masked", f"The diagonal is masked: every query's own key (query i, key i) has {what} "
                                     f"in your {sid}. {why}; a query always sees itself.")]


def _received(values: np.ndarray, null: np.ndarray) -> Received:
    return Received(values.shape, values, null)


def _transposed(sid: str, expected: np.ndarray, mask: np.ndarray | None, received: Received,
                tol: Tolerance) -> list[dict[str, str]]:
    assert received.values is not None and received.null is not None
    if expected.ndim < 2 or received.values.shape != expected.swapaxes(-1, -2).shape:
        return []
    exp_t = expected.swapaxes(-1, -2)
    mask_t = None if mask is None else mask.swapaxes(-1, -2)
    if not compare(np.ascontiguousarray(exp_t), mask_t, received, tol).passed:
        return []
    axes = STAGE_INFO[sid].axes
    how = {"scores": "compute q·kᵀ (queries on the rows, keys on the columns), not k·qᵀ",
           "scaled_scores": "the scores are q·kᵀ: queries on the rows, keys on the columns",
           "weights": "each row is one query's distribution over the keys"}.get(sid, "check for a missing or extra .T")
    return [_hint("transposed", f"Your values are the transposes of the expected ones: the last two axes "
                                f"({axes[-2]} and {axes[-1]}) are swapped; {how}.")]


def _permutation(sid: str, expected: np.ndarray, mask: np.ndarray | None, received: Received, config: TraceConfig,
                 tol: Tolerance) -> list[dict[str, str]]:
    assert received.values is not None and received.null is not None
    got, null = received.values, received.null
    if got.size != expected.size or got.size < 2:
        return []
    got_masked = _masked_like(got, null) if mask is not None else null
    want_masked = mask if mask is not None else np.zeros(expected.shape, dtype=bool)
    if np.count_nonzero(got_masked) != np.count_nonzero(want_masked) or not np.isfinite(got[~got_masked]).all():
        return []
    a = np.sort(got[~got_masked])
    b = np.sort(expected[~want_masked])
    if a.size == 0 or np.array_equal(a, a[:1].repeat(a.size)):
        return []  # nothing, or one repeated number: no order to get wrong
    if not compare(b, None, _received(a, np.zeros(a.shape, dtype=bool)), tol).passed:
        return []
    shape = ("" if got.shape == expected.shape else
             f" and shape {list(got.shape)} instead of {list(expected.shape)}")
    how = {
        "concat": "put the heads side by side within each token: context.transpose(1, 0, 2).reshape(n, h·d_k) "
                  "(a reshape of [h, n, d_k] alone mixes tokens and heads)",
        "q": "split the heads as x·Wᵀ reshaped to [n, h, d_k], then transposed to [h, n, d_k]",
        "k": "split the heads as x·Wᵀ reshaped to [n, h, d_k], then transposed to [h, n, d_k]",
        "v": "split the heads as x·Wᵀ reshaped to [n, h, d_k], then transposed to [h, n, d_k]",
    }.get(sid, "check the order of your reshapes and transposes")
    return [_hint("permutation", f"Your {sid} holds the expected numbers in another order{shape}; {how}.")]


def _named_factors(config: TraceConfig) -> list[tuple[str, float]]:
    d_k, d_model, h = config.d_k, config.d_model, config.num_heads
    names = [(f"√d_k = √{d_k}", math.sqrt(d_k)), (f"d_k = {d_k}", float(d_k)), (f"1/√d_k = 1/√{d_k}", 1 / math.sqrt(d_k)),
             (f"1/d_k = 1/{d_k}", 1 / d_k), (f"√d_model = √{d_model}", math.sqrt(d_model)),
             (f"1/√d_model = 1/√{d_model}", 1 / math.sqrt(d_model)), (f"h = {h}", float(h)), (f"1/h = 1/{h}", 1 / h),
             (f"√h = √{h}", math.sqrt(h)), (f"1/√h = 1/√{h}", 1 / math.sqrt(h)), ("−1", -1.0)]
    return [(name, v) for name, v in names if v != 1.0]


def _constant_factor(expected: np.ndarray, mask: np.ndarray | None, received: Received, config: TraceConfig,
                     tol: Tolerance) -> list[dict[str, str]]:
    assert received.values is not None and received.null is not None
    got = received.values
    pairs = ~received.null & np.isfinite(got)
    if mask is not None:
        pairs &= ~mask
    e, r = expected[pairs], got[pairs]
    ee = float(e @ e)
    if e.size < 2 or ee == 0.0 or stage_scale(expected, mask) == 0.0:
        return []
    c = float(e @ r) / ee  # least squares: r ≈ c·e
    if math.isfinite(c):
        c = float(f"{c:.{FACTOR_DIGITS}g}")
    if not math.isfinite(c) or c == 0.0 or abs(c - 1.0) <= FACTOR_MATCH:
        return []
    if not compare(c * expected, mask, received, tol).passed:
        return []
    named = [name for name, v in _named_factors(config) if abs(c - v) <= FACTOR_MATCH * abs(v)]
    which = f" (c ≈ {' = '.join(named)})" if named else ""
    advice = ("; look for where that factor enters this step: missing, applied twice or inverted" if named else "")
    return [_hint("constant_factor", f"Your values are the expected ones times a constant c = {_fmt(c)}{which}"
                                     f"{advice}.")]


def summary(hint_list: list[dict[str, Any]]) -> str:
    """The hints as one sentence group for the overall message."""
    return " ".join(h["message"] for h in hint_list)
