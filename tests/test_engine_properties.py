"""Properties every trace must have, and the walkthroughs' claims ("the cat sat", and the multi-head one at d_model 512, 8 heads) shown on the engine.

Hypothesis runs are derandomized (fixed seed, no example database) and bounded,
so a run is reproducible and the whole file takes a few seconds.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import engine
from engine import attention as A
from engine.params import explicit_parameters, generate_parameters, token_embedding_vector
from conftest import examples

PROPS = settings(max_examples=examples(150), deadline=None, derandomize=True)

SHAPES = [(1, 1), (3, 1), (7, 1), (8, 2), (9, 3), (12, 4), (24, 1), (24, 4), (24, 6), (25, 5), (64, 8),
          (96, 3), (128, 16)]
WORDS = ["the", "cat", "sat", "on", "mat", "dog", ",", ".", "!", "bank", "river", "café", "你", "😀", "42"]


@st.composite
def configs(draw, **fixed):
    d_model, num_heads = draw(st.sampled_from(SHAPES))
    values = dict(
        d_model=d_model,
        num_heads=num_heads,
        seed=draw(st.integers(0, 2**32 - 1)),
        scale=draw(st.booleans()),
        causal=draw(st.booleans()),
        positional_encoding=draw(st.sampled_from(["sinusoidal", "none"])),
    )
    values.update(fixed)
    return engine.TraceConfig(**values)


sentences = st.lists(st.sampled_from(WORDS), min_size=1, max_size=24).map(" ".join)


def all_arrays(tr: engine.Trace) -> dict[str, np.ndarray]:
    out = {k: s.values for k, s in tr.stages.items() if k != "tokens"}
    out["entropy"], out["max_weight"] = tr.entropy, tr.max_weight
    return out


# ---------------------------------------------------------------------------
# Shapes and stage list
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_stages_appear_in_walkthrough_order_with_documented_shapes(causal):
    tr = engine.trace(engine.TraceConfig(d_model=24, num_heads=4, causal=causal), sentence="the cat sat on the mat")
    n, h, d_k = 6, 4, 6
    expected = {
        "tokens": (n,), "token_embedding": (n, 24), "positional_encoding": (n, 24), "input": (n, 24),
        "q": (h, n, d_k), "k": (h, n, d_k), "v": (h, n, d_k), "scores": (h, n, n), "scaled_scores": (h, n, n),
        "weights": (h, n, n), "context": (h, n, d_k), "concat": (n, h * d_k), "output": (n, 24),
    }
    if causal:
        expected["masked_scores"] = (h, n, n)
    # dict order is walkthrough order; masked_scores exists only with the causal mask
    assert list(tr.stages) == [s for s in engine.STAGE_IDS if s in expected]
    assert {k: s.shape for k, s in tr.stages.items()} == expected
    assert tr.entropy.shape == tr.max_weight.shape == (h, n)


# ---------------------------------------------------------------------------
# Softmax weights
# ---------------------------------------------------------------------------

@PROPS
@given(config=configs(), sentence=sentences)
def test_weight_rows_are_distributions(config, sentence):
    w = engine.trace(config, sentence=sentence).stages["weights"].values
    assert ((w >= 0.0) & (w <= 1.0)).all()
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=0, atol=1e-12)


@PROPS
@given(config=configs(causal=True), sentence=sentences)
def test_causal_mask_gives_exact_zeros_above_the_diagonal(config, sentence):
    tr = engine.trace(config, sentence=sentence)
    w = tr.stages["weights"].values
    n = w.shape[-1]
    future = np.triu(np.ones((n, n), dtype=bool), k=1)
    assert (w[:, future] == 0.0).all()  # exactly 0, not merely tiny
    assert (w[:, 0, 0] == 1.0).all()  # the first token can only attend to itself
    masked = tr.stages["masked_scores"]
    assert np.array_equal(masked.mask, np.broadcast_to(future, w.shape))
    # Masked entries are carried by the mask (0 in values), the rest are the scaled scores untouched.
    scaled = tr.stages["scaled_scores"].values
    assert np.array_equal(masked.values, np.where(future, 0.0, scaled))


@PROPS
@given(config=configs(), sentence=sentences)
def test_scaled_scores_are_scores_divided_by_sqrt_dk_or_by_one(config, sentence):
    tr = engine.trace(config, sentence=sentence)
    scores, scaled = tr.stages["scores"].values, tr.stages["scaled_scores"].values
    divisor = math.sqrt(config.d_k) if config.scale else 1.0
    assert config.scale_factor == divisor
    assert np.array_equal(scaled, scores / divisor)  # the same single IEEE division, so bit-exact


@PROPS
@given(config=configs(), sentence=sentences)
def test_context_rows_are_convex_combinations_of_value_rows(config, sentence):
    tr = engine.trace(config, sentence=sentence)
    w, v, ctx = tr.stages["weights"].values, tr.stages["v"].values, tr.stages["context"].values
    tol = 1e-12 * max(1.0, float(np.abs(v).max()))
    for h in range(w.shape[0]):
        for i in range(w.shape[1]):
            used = w[h, i] > 0  # under the causal mask, later tokens' values must not leak in
            lo, hi = v[h, used].min(axis=0), v[h, used].max(axis=0)
            assert (ctx[h, i] >= lo - tol).all() and (ctx[h, i] <= hi + tol).all(), (h, i)
    np.testing.assert_allclose(ctx, np.einsum("hqk,hkd->hqd", w, v), rtol=1e-12, atol=tol)


# ---------------------------------------------------------------------------
# Embeddings, seeds, finiteness
# ---------------------------------------------------------------------------

def test_a_word_has_one_embedding_across_sentences_and_positions():
    config = engine.TraceConfig(d_model=24, seed=3)
    a = engine.trace(config, sentence="the cat sat on the mat")
    b = engine.trace(config, sentence="a cat")
    E_a, E_b = a.stages["token_embedding"].values, b.stages["token_embedding"].values
    assert np.array_equal(E_a[0], E_a[4])  # "the" at positions 0 and 4
    assert np.array_equal(E_a[1], E_b[1])  # "cat" in two different sentences
    # ...while position still tells them apart once PE is added.
    assert not np.array_equal(a.stages["input"].values[0], a.stages["input"].values[4])
    # Not case-folded: "The" is another token text with another embedding.
    c = engine.trace(config, sentence="The cat")
    assert not np.array_equal(c.stages["token_embedding"].values[0], E_a[0])


@PROPS
@given(config=configs(), words=st.lists(st.sampled_from(WORDS), min_size=2, max_size=12))
def test_equal_texts_have_equal_embeddings_and_different_texts_differ(config, words):
    E = engine.trace(config, tokens=words).stages["token_embedding"].values
    for i in range(len(words)):
        for j in range(len(words)):
            assert np.array_equal(E[i], E[j]) == (words[i] == words[j]), (words[i], words[j])


@PROPS
@given(config=configs(), other_seed=st.integers(0, 2**32 - 1),
       words=st.lists(st.sampled_from(WORDS), min_size=2, max_size=8, unique=True))
def test_different_seeds_give_different_weights(config, other_seed, words):
    if other_seed == config.seed:
        other_seed = (other_seed + 1) % 2**32
    a = engine.trace(config, tokens=words)
    b = engine.trace(dataclasses.replace(config, seed=other_seed), tokens=words)
    # Distinct tokens are needed: identical inputs (no PE) give uniform weights under any seed.
    assert not np.array_equal(a.stages["token_embedding"].values, b.stages["token_embedding"].values)
    assert not np.array_equal(a.stages["weights"].values, b.stages["weights"].values)
    assert a.parameters_digest != b.parameters_digest


@PROPS
@given(config=configs(), sentence=sentences)
def test_no_nan_or_inf_in_any_stage(config, sentence):
    for name, arr in all_arrays(engine.trace(config, sentence=sentence)).items():
        assert np.isfinite(arr).all(), name


# ---------------------------------------------------------------------------
# Numerically stable softmax
# ---------------------------------------------------------------------------

def test_softmax_of_huge_scores_is_finite_and_exact():
    # exp(1e6) would overflow; after subtracting the row max the winner is exp(0) = 1.
    w = A.softmax(np.array([[1e6, -1e6, 0.0], [1e6, 1e6, -1e6], [-1e6, -1e6, -1e6]]))
    assert w.tolist() == [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]]


def test_softmax_mask_excludes_a_huge_masked_score():
    # The masked 1e6 must not become the row max (it would zero out every kept key).
    w = A.softmax(np.array([[0.0, 1e6], [-1e6, 1e6]]), mask=np.array([[False, True], [False, False]]))
    assert w.tolist() == [[1.0, 0.0], [0.0, 1.0]]


@PROPS
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=3, max_side=8),
                  elements=st.floats(-1e6, 1e6, allow_nan=False)))
def test_softmax_is_stable_for_any_scores_up_to_1e6(scores):
    w = A.softmax(scores)
    assert np.isfinite(w).all() and ((w >= 0) & (w <= 1)).all()
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=0, atol=1e-12)
    # The largest score always gets the largest weight.
    assert (np.take_along_axis(w, scores.argmax(axis=-1)[..., None], -1)[..., 0] == w.max(axis=-1)).all()


@pytest.mark.parametrize("causal", [False, True])
def test_trace_with_huge_explicit_input_stays_finite(causal):
    # Identity projections and inputs of order ±1000 give raw scores of order ±1e6.
    d, n = 4, 5
    eye = np.eye(d)
    params = explicit_parameters(eye[None], eye[None], eye[None], eye, d_model=d, num_heads=1)
    x = 1000.0 * np.random.default_rng(0).standard_normal((n, d))
    tr = engine.trace(engine.TraceConfig(d_model=d, num_heads=1, scale=False, causal=causal),
                      tokens=list("abcde"), input=x, parameters=params)
    assert np.abs(tr.stages["scores"].values).max() >= 1e6
    for name, arr in all_arrays(tr).items():
        assert np.isfinite(arr).all(), name
    w = tr.stages["weights"].values
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=0, atol=1e-12)
    assert (tr.max_weight == 1.0).all()  # score gaps ≫ 745 (exp underflow): every row is exactly one-hot


# ---------------------------------------------------------------------------
# Determinism and caching
# ---------------------------------------------------------------------------

@PROPS
@given(config=configs(), sentence=sentences)
def test_same_request_gives_bit_identical_traces(config, sentence):
    a, b = engine.trace(config, sentence=sentence), engine.trace(config, sentence=sentence)
    arrays_a, arrays_b = all_arrays(a), all_arrays(b)
    assert arrays_a.keys() == arrays_b.keys()
    for name in arrays_a:
        assert np.array_equal(arrays_a[name], arrays_b[name]), name
    assert a.parameters_digest == b.parameters_digest


def test_cache_hit_equals_cache_miss():
    config = engine.TraceConfig(d_model=24, num_heads=4, seed=11, causal=True)
    generate_parameters.cache_clear()
    token_embedding_vector.cache_clear()
    miss = engine.trace(config, sentence="the cat sat on the mat")
    hit = engine.trace(config, sentence="the cat sat on the mat")
    assert generate_parameters.cache_info().hits >= 1  # the second trace really was served from the cache
    assert token_embedding_vector.cache_info().hits >= 5
    for name, arr in all_arrays(miss).items():
        assert np.array_equal(arr, all_arrays(hit)[name]), name
    # Cached arrays are shared, so they must be read-only for a hit to stay equal to a miss.
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        assert not getattr(hit.parameters, name).flags.writeable
        with pytest.raises(ValueError):
            getattr(hit.parameters, name)[(0,) * getattr(hit.parameters, name).ndim] = 1.0


# ---------------------------------------------------------------------------
# Initialisation statistics: why /√d_k
# ---------------------------------------------------------------------------

SENTENCE_16 = "the quick brown fox jumps over lazy dogs while seven tall cats watch from a wall"


@pytest.mark.parametrize("d_model, num_heads", [(64, 1), (24, 4), (96, 3), (32, 8)])
def test_q_and_k_have_unit_variance_and_raw_scores_variance_dk(d_model, num_heads):
    # Pooled over 40 seeds × 16 tokens: the docstring's var = 1/d_model makes each q, k
    # component about unit variance (x has mean square ≈ 1 with sinusoidal PE), so q·k,
    # a sum of d_k such products, has variance about d_k.
    q, k, s = [], [], []
    for seed in range(40):
        tr = engine.trace(engine.TraceConfig(d_model=d_model, num_heads=num_heads, seed=seed), sentence=SENTENCE_16)
        q.append(tr.stages["q"].values.ravel())
        k.append(tr.stages["k"].values.ravel())
        s.append(tr.stages["scores"].values.ravel())
    d_k = d_model // num_heads
    assert 0.8 <= np.var(np.concatenate(q)) <= 1.25
    assert 0.8 <= np.var(np.concatenate(k)) <= 1.25
    assert 0.8 * d_k <= np.var(np.concatenate(s)) <= 1.25 * d_k


SENTENCE_8 = "the quick brown fox jumps over lazy dogs"


def max_weights_at_dk_64(scale: bool) -> np.ndarray:
    """Every query row's max weight, 40 seeds × 8 queries, d_model 64 with 1 head (d_k = 64)."""
    return np.concatenate([
        engine.trace(engine.TraceConfig(d_model=64, num_heads=1, seed=seed, scale=scale),
                     sentence=SENTENCE_8).max_weight.ravel()
        for seed in range(40)
    ])


def test_without_scaling_softmax_saturates_at_dk_64():
    # Measured (engine 1.0.0): mean max weight 0.83 unscaled vs 0.30 scaled (uniform would
    # be 1/8 = 0.125); about half the unscaled rows are above 0.9, none of the scaled ones.
    # Raw scores have a standard deviation of √64 = 8, so softmax is driven to one winner.
    unscaled, scaled = max_weights_at_dk_64(False), max_weights_at_dk_64(True)
    assert unscaled.mean() > 0.75
    assert scaled.mean() < 0.40
    assert (unscaled > 0.9).mean() > 0.4
    assert (scaled > 0.9).mean() < 0.05


@pytest.mark.parametrize(
    "divisor, expected_percent",
    [(math.sqrt(24), [7.7, 73.3, 19.0]), (1.0, [0.0, 99.9, 0.1])],
    ids=["scaled", "unscaled"],
)
def test_first_seed_articles_softmax_table(divisor, expected_percent):
    # "the cat sat", query "cat": raw scores 3.877 / 14.905 / 8.293 with and without /√24.
    w = A.softmax(np.array([3.877, 14.905, 8.293]) / divisor)
    assert [round(100 * p, 1) for p in w.tolist()] == expected_percent


# ---------------------------------------------------------------------------
# The multi-head walkthrough: counting matrices, splitting d_model, concat not average
# ---------------------------------------------------------------------------

def test_eight_heads_at_d_model_512_use_25_matrices_and_4_d_model_squared_weights():
    p = generate_parameters(0, 512, 8)
    assert p.n_matrices == 25  # 8 × (W_Q, W_K, W_V) + W_O
    assert (p.num_heads, p.d_k, p.d_model) == (8, 64, 512)
    assert p.W_Q.shape == p.W_K.shape == p.W_V.shape == (8, 64, 512) and p.W_O.shape == (512, 512)
    assert p.n_parameters == 4 * 512**2


@pytest.mark.parametrize("d_model, num_heads", [(24, 1), (24, 4), (24, 6), (25, 5), (7, 7), (96, 12)])
def test_matrix_and_parameter_counts(d_model, num_heads):
    p = generate_parameters(1, d_model, num_heads)
    assert p.d_k == d_model / num_heads
    assert p.n_matrices == 3 * num_heads + 1
    assert p.n_parameters == 4 * d_model**2  # heads split d_model, they do not add width


@pytest.mark.parametrize("num_heads", [1, 2, 4, 6])
def test_concat_lays_the_heads_side_by_side(num_heads):
    tr = engine.trace(engine.TraceConfig(d_model=24, num_heads=num_heads, seed=2), sentence="the cat sat on the mat")
    ctx, concat = tr.stages["context"].values, tr.stages["concat"].values
    d_k = 24 // num_heads
    assert concat.shape == (6, num_heads * d_k) == (6, 24)  # not [n, d_k], as an average would be
    for i in range(num_heads):
        assert np.array_equal(concat[:, i * d_k:(i + 1) * d_k], ctx[i])  # head i owns slot i
    # and W_O mixes the full concatenation back to d_model
    np.testing.assert_allclose(tr.stages["output"].values, concat @ tr.parameters.W_O.T, rtol=1e-12, atol=1e-12)


def test_each_head_uses_its_own_projections():
    tr = engine.trace(engine.TraceConfig(d_model=24, num_heads=4), sentence="the cat sat")
    w = tr.stages["weights"].values
    # Same input, different W_Qᵢ/W_Kᵢ: no two heads produce the same pattern.
    assert all(not np.array_equal(w[i], w[j]) for i in range(4) for j in range(i + 1, 4))


# ---------------------------------------------------------------------------
# The engine is framework-free
# ---------------------------------------------------------------------------

#: the framework-free core: the engine (with its exports, recipe and checking) and the grader, which computes
#: its references and verdicts with the engine in process; each run as its users run it
CORE_USES = {
    "engine": "import engine\nengine.trace(engine.TraceConfig(), sentence='the cat sat')\n",
    "engine.export": "import engine, engine.export as x\n"
                     "x.export(engine.trace(engine.TraceConfig(), sentence='a b'), 'circuitsvis')\n",
    "engine.recipe": "import engine.recipe as r\nr.recipe(r.TraceConfig(causal=True), decode=True)\n",
    "engine.checking": "import numpy as np, engine\nfrom engine import checking\n"
                       "t = engine.trace(engine.TraceConfig(causal=True), sentence='the cat sat')\n"
                       "w = np.ones(t.stages['weights'].shape)\n"
                       "assert checking.check(t, checking.Submission.of_arrays({'weights': (w, None)}),\n"
                       "                      checking.Tolerance.default())['diagnosis']['hints']\n",
    "grader": "import grader, grader.core, grader.__main__\nfrom grader import config, reference\n"
              "c = config.load(grader.COURSE)\nreference.EngineSource().reference(c.configurations['one-head'], 1)\n",
}


@pytest.mark.integration  # starts another process
@pytest.mark.parametrize("module", list(CORE_USES))
def test_importing_engine_pulls_in_no_web_or_validation_framework(module):
    code = (
        "import importlib.util, sys\n"
        + CORE_USES[module] +
        "banned = ['flask', 'pydantic', 'werkzeug', 'requests']\n"
        # the check is only meaningful if those packages *could* have been imported
        "assert all(importlib.util.find_spec(m) for m in banned), 'a banned package is not installed'\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in banned))\n"
        "print('numpy' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["[]", "True"]
