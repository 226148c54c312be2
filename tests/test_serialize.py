"""No NaN or infinity ever reaches JSON (service/serialize.py): every array of a document is checked
before it is encoded, the small ones together and the large ones each by a sum (serialize.Finite)."""

from __future__ import annotations

import dataclasses
import tracemalloc

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


@pytest.mark.parametrize("shape", [(4 * 131_072 + 1,), (3, 300_000), (9, 256, 256), (2, 3, 200, 500)])
def test_a_large_document_is_encoded_in_pieces_to_the_same_bytes(shape):
    """orjson held the interpreter lock for a whole 40 MB answer (60-170 ms, which /health
    waited for); serialize.dumps encodes a large document a piece at a time, and the bytes are orjson's."""
    rng = np.random.default_rng(1)
    values = rng.standard_normal(shape) * 10.0 ** rng.integers(-300, 300, shape)
    masked = np.where(rng.random(shape[-1]) < 0.5, None, values.reshape(-1)[:shape[-1]]).tolist()
    doc = {"schema_version": "1", "stages": {"big": {"values": values, "shape": list(shape)},
                                             "masked": {"values": [masked] * 9}, "small": np.arange(3.0)},
           "tokens": [{"text": "é\u2028<", "index": 0}], "unicode key ü": [1, 2.5, None, True]}
    assert serialize._numbers(doc) > 4 * serialize._PIECE
    assert serialize.dumps(doc) == orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def test_a_long_flat_list_is_encoded_in_slices_within_twice_its_answer():
    """A list of floats and nulls longer than a piece used to be encoded one number at a time: ~2 KB of
    orjson buffers per number, 19 GB for this document (the suite's peak). Now it is sliced like an array."""
    rng = np.random.default_rng(1)
    n = 4 * serialize._PIECE + 1
    flat = np.where(rng.random(n) < 0.5, None, rng.standard_normal(n)).tolist()
    doc = {"values": [flat] * 9}
    tracemalloc.start()
    try:
        body = serialize.dumps(doc)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert body == orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    assert peak <= 2.5 * len(body), f"{peak / 1e6:.0f} MB to encode a {len(body) / 1e6:.0f} MB answer"


def test_a_large_answer_is_the_same_bytes_as_one_orjson_call():
    t = _trace(engine.TraceConfig(d_model=54, num_heads=9, causal=True), 256)
    doc = serialize.trace_document(t, include_parameters=True)
    assert serialize._numbers(doc) > 4 * serialize._PIECE
    assert serialize.dumps(doc) == orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
