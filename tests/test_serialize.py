"""No NaN or infinity ever reaches JSON (service/serialize.py): every array of a document is checked
before it is encoded, the small ones together and the large ones each by a sum (serialize.Finite)."""

from __future__ import annotations

import dataclasses

import numpy as np
import orjson
import pytest

import engine
from service import serialize

SMALL = engine.TraceConfig(d_model=24, num_heads=4, causal=True)
LARGE = engine.TraceConfig(d_model=128, num_heads=4, causal=True)  # 64 tokens: above the one-check size


def _trace(config: engine.TraceConfig, n: int) -> engine.Trace:
    return engine.trace(config, tokens=[f"w{i}" for i in range(n)])


def _with(t: engine.Trace, sid: str, values: np.ndarray) -> engine.Trace:
    stages = dict(t.stages)
    stages[sid] = dataclasses.replace(stages[sid], values=values)
    return dataclasses.replace(t, stages=stages)


def _size(t: engine.Trace) -> int:
    return sum(s.values.size for s in t.stages.values() if isinstance(s.values, np.ndarray))


@pytest.mark.parametrize("config, n", [(SMALL, 3), (LARGE, 64)])
@pytest.mark.parametrize("sid", ["q", "scores", "masked_scores", "weights", "output"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_number_fails_the_document_and_names_its_stage(config, n, sid, bad):
    t = _trace(config, n)
    assert (_size(t) <= serialize._ONE_CHECK_MAX) == (config is SMALL)  # both paths are exercised
    values = t.stages[sid].values.copy()
    values.flat[values.size // 2 + 1] = bad  # unmasked in masked_scores: a later key of the last query
    with pytest.raises(serialize.NonFiniteError, match=f"non-finite value in {sid}$"):
        serialize.trace_document(_with(t, sid, values))


@pytest.mark.parametrize("config, n", [(SMALL, 3), (LARGE, 64)])
def test_finite_numbers_whose_sum_overflows_are_still_serialised(config, n):
    """A sum of finite numbers can overflow to inf; the elementwise test then decides (they are finite)."""
    t = _trace(config, n)
    values = np.full_like(t.stages["output"].values, 1.5e308)
    doc = orjson.loads(serialize.dumps(serialize.trace_document(_with(t, "output", values))))
    assert np.array_equal(np.array(doc["stages"]["output"]["values"]), values)


def test_the_arrays_outside_stages_are_checked_too():
    t = _trace(SMALL, 3)
    p = t.parameters
    bad = dataclasses.replace(p, W_O=np.where(np.eye(*p.W_O.shape, dtype=bool), np.nan, p.W_O))
    with pytest.raises(serialize.NonFiniteError, match="non-finite value in W_O$"):
        serialize.trace_document(dataclasses.replace(t, parameters=bad), include_parameters=True)
    with pytest.raises(serialize.NonFiniteError, match="non-finite value in out_proj.weight$"):
        serialize.trace_document(dataclasses.replace(t, parameters=bad), include_parameters=True,
                                 parameters_layout="torch")

