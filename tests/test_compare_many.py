"""compare.compare_many judges several stages as one array; it must give, field for field, what comparing
each stage on its own gave. The reference below is compare.compare as it was (c00277e), one stage at a
time, kept here as the independent check: same rule, written value by value without segments."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.checking import compare
from engine.checking.compare import (MASK_FILL, MAX_NON_FINITE_SHOWN, REL_ERROR_FLOOR, Comparison, Received, Tolerance,
                             _capped, non_finite_name, stage_scale)
from conftest import examples

CASES = settings(max_examples=examples(300), deadline=None, derandomize=True)


def reference_compare(expected: np.ndarray, mask: np.ndarray | None, received: Received, tol: Tolerance) -> Comparison:
    got, got_null = received.values, received.null
    with np.errstate(all="ignore"):
        exp_mask = mask if mask is not None else np.zeros(expected.shape, dtype=bool)
        filled = exp_mask & ~got_null & (got <= MASK_FILL)
        got_masked = got_null | filled
        non_finite = ~got_masked & ~np.isfinite(got)
        numeric = ~exp_mask & ~got_masked & ~non_finite
        diff = np.where(numeric, np.abs(got - expected), 0.0)
        ratio = np.where(numeric, diff / np.maximum(REL_ERROR_FLOOR, np.abs(got) + np.abs(expected)), 0.0)
        if tol.metric == "rel_error":
            allowed, abs_tolerance = None, None
            bad_num = ratio > tol.threshold
        else:
            abs_tolerance = tol.atol + tol.stage_rtol * stage_scale(expected, mask)
            allowed = abs_tolerance + tol.rtol * np.abs(expected)
            bad_num = numeric & (diff > allowed)
        bad = bad_num | non_finite | (exp_mask != got_masked)
        mismatches = int(np.count_nonzero(bad))
        any_numeric = bool(numeric.any())
        max_abs = _capped(diff.max()) if any_numeric else None
        nz = numeric & (expected != 0)
        max_rel = _capped((diff[nz] / np.abs(expected[nz])).max()) if nz.any() else None
        rel_error = _capped(ratio.max()) if any_numeric else None
        if mismatches and (non_finite.any() or (exp_mask != got_masked).any()):
            figure = math.inf
        elif not any_numeric:
            figure = 0.0
        elif allowed is None:
            figure = rel_error / tol.threshold if tol.threshold else (math.inf if rel_error else 0.0)
        else:
            figure = float(np.where(numeric & (diff > 0), diff / allowed, 0.0).max())
    nf_idx = np.argwhere(non_finite)
    non_finite_at = [([int(i) for i in idx], non_finite_name(float(got[tuple(idx)])))
                     for idx in nf_idx[:MAX_NON_FINITE_SHOWN]]
    first = first_exp = first_got = None
    if mismatches:
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        first = list(idx)
        first_exp = None if exp_mask[idx] else float(expected[idx])
        g = float(got[idx])
        first_got = None if got_masked[idx] else g if math.isfinite(g) else non_finite_name(g)
    return Comparison(
        passed=mismatches == 0, n_values=int(expected.size), mismatches=mismatches, max_abs_error=max_abs,
        max_rel_error=max_rel, rel_error=rel_error, abs_tolerance=abs_tolerance,
        non_finite=int(nf_idx.shape[0]), non_finite_at=non_finite_at, treated_as_masked=int(np.count_nonzero(filled)),
        first=first, first_expected=first_exp, first_received=first_got, figure=figure,
    )


def same(a: Comparison, b: Comparison) -> bool:
    """Field for field, NaN equal to NaN (a float field may be NaN when a student's numbers overflow)."""
    def eq(x, y):
        return (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)) or x == y
    return all(eq(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)


# A received value: near the expected one, far, huge, tiny, a mask fill, NaN, ±inf or null.
KINDS = ("near", "far", "huge", "tiny", "fill", "nan", "inf", "-inf", "null", "exact")


@st.composite
def stages(draw):
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    size = math.prod(shape)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    expected = rng.normal(size=shape) * draw(st.sampled_from([1e-12, 1e-3, 1.0, 1e3]))
    expected[rng.random(shape) < 0.1] = 0.0
    mask = (rng.random(shape) < 0.3) if draw(st.booleans()) else None
    kinds = rng.choice(KINDS, size=size, p=[.4, .1, .03, .03, .06, .05, .03, .03, .07, .2]).reshape(shape)
    got = np.where(kinds == "near", expected * (1 + rng.normal(size=shape) * 1e-6), expected)
    got = np.where(kinds == "far", expected + rng.normal(size=shape), got)
    got = np.where(kinds == "huge", 1.7e308 * np.sign(rng.normal(size=shape)), got)
    got = np.where(kinds == "tiny", 5e-324, got)
    got = np.where(kinds == "fill", MASK_FILL * (1 + rng.random(shape)), got)
    got = np.where(kinds == "nan", np.nan, got)
    got = np.where(kinds == "inf", np.inf, got)
    got = np.where(kinds == "-inf", -np.inf, got)
    null = kinds == "null"
    got = np.where(null, 0.0, got)
    plain = bool(np.isfinite(got).all() and not null.any())
    return expected, mask, Received(shape, got, null, plain=plain)


TOLERANCES = st.sampled_from([Tolerance.default(), Tolerance.allclose(1e-5, 1e-8), Tolerance.allclose(0.0, 0.0),
                              Tolerance.allclose(1e-3, 1e-6, 1e-2), Tolerance.rel_error(), Tolerance.rel_error(0.0)])


@CASES
@given(st.lists(stages(), min_size=1, max_size=6), TOLERANCES)
def test_stages_judged_together_answer_as_each_judged_alone(items, tol):
    together = compare.compare_many(items, tol)
    alone = [reference_compare(e, m, r, tol) for e, m, r in items]
    assert len(together) == len(alone)
    for k, (a, b) in enumerate(zip(together, alone)):
        assert same(a, b), (k, a, b)
    # and compare() and passes() are the same rule
    for (e, m, r), b in zip(items, alone):
        assert same(compare.compare(e, m, r, tol), b)
        assert compare.passes(e, m, r, tol) == b.passed


def test_small_stages_are_batched_and_large_ones_compared_alone():
    big = compare.JOIN_MAX_VALUES + 1
    assert compare.batches([10, big, 5, big * 2, 7]) == [[0, 2, 4], [1], [3]]
    assert compare.batches([big]) == [[0]]
    assert compare.batches([]) == []


@pytest.mark.parametrize("join_max", [0, 50, 10**9])  # q and output (48 values) together at 50
def test_how_stages_are_batched_changes_no_answer(client, monkeypatch, join_max):
    """/check's answer is the same whether every stage is compared alone, some together, or all at once."""
    base = {"sentence": "the cat sat on the mat", "d_model": 8, "num_heads": 2, "causal": True}
    wrong = client.post("/trace", json={**base, "inject_bug": "no_scale"}).get_json()["stages"]
    body = {**base, "submission": {sid: wrong[sid]["values"] for sid in ("q", "scores", "masked_scores", "weights",
                                                                          "output")}}
    body["submission"]["weights"][0][1][0] = float("nan")  # a non-finite value, named in the answer
    expected = client.post("/check", json=body).get_data()
    monkeypatch.setattr(compare, "JOIN_MAX_VALUES", join_max)
    assert client.post("/check", json=body).get_data() == expected
