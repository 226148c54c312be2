"""The attention variants: RoPE, GQA/MQA, the sliding window, cross-attention, KV-cache decoding.

Each variant is configuration that chooses steps (engine/layer.py). These tests hold:

* engine 1.0's requests keep their steps, weights and numbers (the goldens pin the numbers);
* every variant agrees with the loop-by-loop reference of tests/engine_reference.py,
  written from the papers, to 1e-10;
* the property each variant is taught for (RoPE: the score depends only on the offset;
  GQA: heads in a group share K/V; the window: nothing beyond it is seen; cross-attention:
  keys from the context; decoding: each step's row is the full trace's row);
* trace_value_count and stage_ids describe every variant's trace exactly;
* every new rule has its error class, code, field and a message that says what to fix;
* a known bug is refused exactly when it would change no number, under every variant.

The torch comparison is in tests/test_variants_torch.py.
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine
from engine import BUGS, TraceConfig
from engine import attention as A
from engine.bugs import refusal
from engine.checks import check_trace_size, divisors
from engine.decoding import decode, decode_value_count
from engine.layer import (
    ALL_STAGE_IDS,
    STAGE_IDS,
    VARIANT_STAGE_IDS,
    check_stages,
    formulas,
    initial_state,
    layer_steps,
    run,
    stage_ids,
    stage_shape,
    trace_value_count,
)
from engine.params import explicit_parameters, generate_parameters
from engine_reference import reference_attention, reference_parameters, reference_trace
from conftest import examples

ROOT = Path(__file__).resolve().parent.parent
SWEEP = settings(max_examples=examples(120), deadline=None, derandomize=True)
FEW = settings(max_examples=examples(40), deadline=None, derandomize=True)
VOCAB = ["the", "cat", "sat", "on", "mat", ".", "😀", "café", "你", "x", "le", "chat", "tapis"]
# (d_model, num_heads): odd and even d_k, one head, d_k = 1 and 2, up to 8 heads.
SHAPES = [(1, 1), (2, 1), (4, 2), (5, 1), (6, 3), (8, 2), (8, 4), (9, 3), (12, 3), (12, 6), (16, 4), (24, 4),
          (24, 6), (32, 8)]


def assert_close(actual: np.ndarray, expected, what: str, tol: float = 1e-10) -> None:
    """rtol ``tol`` plus atol ``tol`` × the stage's largest magnitude (≥ 1), as test_engine_reference.assert_matches."""
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    atol = tol * max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=atol, err_msg=what)


def numbers(t: engine.Trace) -> dict[str, np.ndarray]:
    return {sid: s.values for sid, s in t.stages.items() if not isinstance(s.values, list)}


# ------------------------------------------------------------------ engine 1.0 unchanged


def test_the_default_layer_is_engine_1_0s_steps_exactly():
    steps = layer_steps(TraceConfig(causal=True))
    assert [(s.name, s.fn.__qualname__, s.inputs, s.formula, s.note) for s in steps] == [
        ("token_embedding", "token_embeddings", ("seed", "d_model", "tokens"), "E[token] (seeded, context-free)", ""),
        ("positional_encoding", "_sinusoidal", ("n", "d_model"),
         "PE(pos, 2i) = sin(pos/10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos/10000^(2i/d_model))", ""),
        ("input", "add_positional_encoding", ("token_embedding", "positional_encoding"), "x = E + PE", ""),
        ("q", "project", ("input", "W_Q"), "Qᵢ = x·W_Qᵢᵀ", ""),
        ("k", "project", ("input", "W_K"), "Kᵢ = x·W_Kᵢᵀ", ""),
        ("v", "project", ("input", "W_V"), "Vᵢ = x·W_Vᵢᵀ", ""),
        ("scores", "attention_scores", ("q", "k"), "QKᵀ", ""),
        ("scale_factor", "scale_factor", ("d_k", "scale"), "/√d_k", ""),
        ("scaled_scores", "scale_scores", ("scores", "scale_factor"), "{scores}{scale_factor}", ""),
        ("mask", "_causal_mask", ("n",), "", ""),
        ("masked_scores", "apply_mask", ("scaled_scores", "mask"), "mask({scaled_scores})",
         ": keys after the query are excluded"),
        ("weights", "softmax", ("masked_scores", "excluded"), "softmax({masked_scores})", ""),
        ("context", "weighted_values", ("weights", "v"), "{weights}V", ""),
        ("concat", "concat_heads", ("context",), "Concat(head₁, …, head_h)", ""),
        ("output", "output_projection", ("concat", "W_O"), "{concat}·W_Oᵀ", ""),
    ]


@pytest.mark.parametrize("causal", [False, True])
def test_settings_that_change_nothing_choose_the_very_same_steps_and_weights(causal):
    plain = TraceConfig(d_model=24, num_heads=4, causal=causal)
    same = TraceConfig(d_model=24, num_heads=4, causal=causal, num_kv_heads=4, rope_base=500000.0,
                       rope_pairing="interleaved")  # RoPE settings are unused without RoPE
    assert layer_steps(plain) is layer_steps(same)
    a, b = engine.trace(plain, sentence="the cat sat"), engine.trace(same, sentence="the cat sat")
    assert a.parameters_digest == b.parameters_digest
    assert all(np.array_equal(a.stages[s].values, b.stages[s].values) for s in numbers(a))
    assert all(np.array_equal(getattr(generate_parameters(3, 24, 4, 4), w), getattr(generate_parameters(3, 24, 4), w))
               for w in ("W_Q", "W_K", "W_V", "W_O"))


def test_the_published_stage_ids_are_engine_1_0s_and_the_variants_add_their_own():
    assert STAGE_IDS == ("tokens", "token_embedding", "positional_encoding", "input", "q", "k", "v", "scores",
                         "scaled_scores", "masked_scores", "weights", "context", "concat", "output")
    assert VARIANT_STAGE_IDS == ("context_tokens", "context_token_embedding", "context_positional_encoding",
                                 "context_input", "q_rotated", "k_rotated")
    assert set(ALL_STAGE_IDS) == set(STAGE_IDS) | set(VARIANT_STAGE_IDS)
    for sid in STAGE_IDS:  # an engine 1.0 trace keeps its axis names
        t = engine.trace(TraceConfig(d_model=8, num_heads=2, causal=True), sentence="a b")
        if sid in t.stages:
            assert t.stages[sid].axes == engine.STAGE_INFO[sid].axes


# ----------------------------------------------------------- against the reference


@st.composite
def variant_requests(draw):
    # One variant in focus, so each gets its share of examples; the others are mixed in at random.
    focus = draw(st.sampled_from(["rope", "gqa", "window", "cross", "any"]))
    shapes = {"rope": [s for s in SHAPES if (s[0] // s[1]) % 2 == 0],
              "gqa": [s for s in SHAPES if s[1] > 1]}.get(focus, SHAPES)
    d_model, num_heads = draw(st.sampled_from(shapes))
    d_k = d_model // num_heads
    cross = focus == "cross" or (focus == "any" and draw(st.booleans()))
    causal = focus == "window" or (not cross and focus != "any" and draw(st.booleans()))
    encodings = ["sinusoidal", "none"] + (["rope"] if d_k % 2 == 0 and not cross else [])
    kv = divisors(num_heads)[:-1] if focus == "gqa" else [None, *divisors(num_heads)]
    return dict(
        texts=draw(st.lists(st.sampled_from(VOCAB), min_size=1, max_size=7)),
        context_texts=draw(st.lists(st.sampled_from(VOCAB), min_size=1, max_size=7)) if cross else None,
        d_model=d_model,
        num_heads=num_heads,
        num_kv_heads=draw(st.sampled_from(kv)),
        seed=draw(st.integers(0, 2**32 - 1)),
        scale=draw(st.booleans()),
        causal=causal,
        window=draw(st.sampled_from([1, 2, 3, 5] if focus == "window" else [None, 1, 2, 3, 5])) if causal else None,
        positional_encoding="rope" if focus == "rope" else draw(st.sampled_from(encodings)),
        rope_base=draw(st.sampled_from([10000.0, 500000.0, 100.0])),
        rope_pairing=draw(st.sampled_from(["rotate_half", "interleaved"])),
    )


def _trace(req: dict) -> engine.Trace:
    config = {k: v for k, v in req.items() if k not in ("texts", "context_texts")}
    return engine.trace(TraceConfig(**config), tokens=req["texts"], context_tokens=req["context_texts"])


def _compare(t: engine.Trace, ref: dict) -> None:
    for sid, values in numbers(t).items():
        assert_close(values, ref[sid], sid)
    if "masked_scores" in t.stages:
        assert np.array_equal(t.stages["masked_scores"].mask, np.array(ref["mask"])), "mask"
    assert_close(t.entropy, ref["entropy"], "entropy")
    assert_close(t.max_weight, ref["max_weight"], "max_weight")


@SWEEP
@given(req=variant_requests())
def test_every_variant_matches_the_reference_written_from_the_papers(req):
    t = _trace(req)
    ref = reference_trace(req["texts"], **{k: v for k, v in req.items() if k != "texts"})
    _compare(t, ref)
    # The generated K/V weights follow the documented stream keys bit for bit.
    ref_params = reference_parameters(req["seed"], req["d_model"], req["num_heads"], req["num_kv_heads"])
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        assert np.array_equal(getattr(t.parameters, name), np.array(ref_params[name])), name


@FEW
@given(shape=st.sampled_from([(4, 2), (8, 4), (12, 6), (16, 4), (24, 6)]), n=st.integers(1, 6), m=st.integers(1, 6),
       rng_seed=st.integers(0, 2**32 - 1), data=st.data())
def test_explicit_inputs_and_grouped_weights_match_the_reference(shape, n, m, rng_seed, data):
    d_model, h = shape
    d_k = d_model // h
    g = data.draw(st.sampled_from(divisors(h)))
    cross = data.draw(st.booleans())
    rope = None if cross else data.draw(st.sampled_from([None, (10000.0, "rotate_half"), (50.0, "interleaved")]))
    causal = not cross and data.draw(st.booleans())
    window = data.draw(st.sampled_from([None, 1, 2])) if causal else None
    rng = np.random.default_rng(rng_seed)
    x, x_ctx = rng.standard_normal((n, d_model)), rng.standard_normal((m, d_model))
    W = {"W_Q": rng.standard_normal((h, d_k, d_model)), "W_K": rng.standard_normal((g, d_k, d_model)),
         "W_V": rng.standard_normal((g, d_k, d_model)), "W_O": rng.standard_normal((d_model, h * d_k))}
    W = {k: v / math.sqrt(d_model) for k, v in W.items()}
    params = explicit_parameters(**W, d_model=d_model, num_heads=h, num_kv_heads=g)
    config = TraceConfig(d_model=d_model, num_heads=h, num_kv_heads=g, causal=causal, window=window,
                         positional_encoding="rope" if rope else "sinusoidal",
                         **(dict(rope_base=rope[0], rope_pairing=rope[1]) if rope else {}))
    t = engine.trace(config, tokens=[f"t{i}" for i in range(n)], input=x, parameters=params,
                     context_tokens=[f"c{i}" for i in range(m)] if cross else None,
                     context_input=x_ctx if cross else None)
    ref = reference_attention(x.tolist(), {k: v.tolist() for k, v in W.items()}, scale=True, causal=causal,
                              window=window, context=x_ctx.tolist() if cross else None, rope=rope)
    ref["input"], ref["context_input"] = x, x_ctx
    _compare(t, ref)


# ----------------------------------------------------------------------------- RoPE


def _offset_pairs(texts: list[str]):
    """Pairs of (query, key) positions with the same two token texts and the same offset."""
    n = len(texts)
    groups: dict[tuple, list] = {}
    for i, j in itertools.product(range(n), repeat=2):
        groups.setdefault((texts[i], texts[j], j - i), []).append((i, j))
    return [g for g in groups.values() if len(g) > 1]


@pytest.mark.parametrize("pairing", ["rotate_half", "interleaved"])
@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_rope_scores_depend_only_on_the_offset_between_query_and_key(pairing, base):
    # RoPE's reason to exist: with the same query and key content, q_m·k_n depends on n − m alone.
    texts = ["a", "b", "c", "a", "b", "a", "b", "c", "a", "b"]
    config = TraceConfig(d_model=16, num_heads=2, positional_encoding="rope", rope_base=base, rope_pairing=pairing)
    scores = engine.trace(config, tokens=texts).stages["scores"].values  # [head, query, key]
    groups = _offset_pairs(texts)
    assert len(groups) >= 10
    for group in groups:
        first = scores[:, group[0][0], group[0][1]]
        for i, j in group[1:]:
            assert_close(scores[:, i, j], first, f"offset {j - i}", tol=1e-12)
    # Additive sinusoidal encodings do not have the property: the same pairs differ.
    sin = engine.trace(TraceConfig(d_model=16, num_heads=2), tokens=texts).stages["scores"].values
    assert max(np.abs(sin[:, i, j] - sin[:, g[0][0], g[0][1]]).max() for g in groups for i, j in g) > 1e-2


def test_rope_is_a_rotation_position_zero_is_untouched_and_x_has_no_additive_encoding():
    config = TraceConfig(d_model=16, num_heads=4, positional_encoding="rope")
    t = engine.trace(config, sentence="the cat sat on the mat")
    assert "positional_encoding" not in t.stages
    assert np.array_equal(t.stages["input"].values, t.stages["token_embedding"].values)
    for raw, rot in (("q", "q_rotated"), ("k", "k_rotated")):
        before, after = t.stages[raw].values, t.stages[rot].values
        assert np.array_equal(after[:, 0], before[:, 0])  # cos 0 = 1, sin 0 = 0: exactly unchanged
        assert_close(np.linalg.norm(after, axis=-1), np.linalg.norm(before, axis=-1), f"{rot} norms", tol=1e-13)
    assert np.array_equal(t.stages["scores"].values,
                          A.attention_scores(t.stages["q_rotated"].values, t.stages["k_rotated"].values))


def test_the_two_pairings_are_the_same_rotation_with_the_coordinates_permuted():
    # Interleaved pair i is (2i, 2i+1); rotate-half pair i is (i, i + d/2). Moving coordinates 2i -> i and
    # 2i+1 -> i + d/2 turns one into the other exactly (why checkpoints permute W_Q, W_K rows to convert).
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 5, 8))  # [h, n, d_k]
    angles = A.rope_angles(np.arange(5), 8, 10000.0)
    perm = np.r_[0:8:2, 1:8:2]  # interleaved order -> halves
    assert np.array_equal(A.rotate_half(x[..., perm], angles), A.rotate_interleaved(x, angles)[..., perm])


def test_rope_angles_are_the_documented_ones():
    angles = A.rope_angles(np.arange(3), 8, 10000.0)
    assert angles.shape == (3, 4)
    assert angles[1].tolist() == [1.0 / 10000.0 ** (i / 8) for i in (0, 2, 4, 6)]
    assert angles[2, 1] == 2.0 * (1.0 / 10000.0 ** 0.25)


# ----------------------------------------------------------------------- GQA and MQA


@pytest.mark.parametrize("g", [1, 2, 4])
def test_grouped_query_heads_share_their_kv_head(g):
    config = TraceConfig(d_model=32, num_heads=8, num_kv_heads=g, causal=True)
    t = engine.trace(config, sentence="the cat sat on the mat")
    k, v = t.stages["k"].values, t.stages["v"].values
    assert k.shape == v.shape == (g, 6, 4) and t.stages["k"].axes == ("kv_head", "token", "d_k")
    assert config.kv_head_of_query_head == tuple(i // (8 // g) for i in range(8))
    assert config.query_heads_of_kv_head == tuple(tuple(range(j * 8 // g, (j + 1) * 8 // g)) for j in range(g))
    for i, j in enumerate(config.kv_head_of_query_head):
        assert np.array_equal(t.state["k_shared"][i], k[j]) and np.array_equal(t.state["v_shared"][i], v[j])
        # Query head i's scores are its queries against K/V head ⌊i / G⌋'s keys.
        assert_close(t.stages["scores"].values[i], t.stages["q"].values[i] @ k[j].T, f"head {i}", tol=1e-13)
    # W_Q and W_O are the multi-head layer's: only the keys and values are shared.
    mha = engine.trace(TraceConfig(d_model=32, num_heads=8, causal=True), sentence="the cat sat on the mat")
    assert np.array_equal(t.parameters.W_Q, mha.parameters.W_Q) and np.array_equal(t.parameters.W_O, mha.parameters.W_O)
    assert np.array_equal(t.stages["q"].values, mha.stages["q"].values)
    assert (t.parameters_digest == mha.parameters_digest) == (g == 8)


@pytest.mark.parametrize("h, g", [(8, 8), (8, 2), (8, 1), (4, 2), (1, 1)])
def test_matrix_parameter_and_kv_cache_counts(h, g):
    config = TraceConfig(d_model=32, num_heads=h, num_kv_heads=g)
    p = generate_parameters(0, 32, h, g)
    d_k = 32 // h
    assert p.n_matrices == config.n_matrices == h + 2 * g + 1
    assert p.n_parameters == config.n_parameters == 2 * 32 * 32 + 2 * g * d_k * 32
    assert config.kv_cache_values_per_token == 2 * g * d_k
    assert config.kv_cache_bytes_per_token == {"float16": 4 * g * d_k, "float32": 8 * g * d_k, "float64": 16 * g * d_k}


def test_the_kv_cache_saving_is_a_number():
    # Llama-2-70B's attention: d_model 8192, 64 query heads, 8 K/V heads of 128: 8× less cache than 64 K/V heads.
    gqa = TraceConfig(d_model=8192, num_heads=64, num_kv_heads=8)
    mha = TraceConfig(d_model=8192, num_heads=64)
    assert gqa.kv_cache_bytes_per_token["float16"] == 4096 and mha.kv_cache_bytes_per_token["float16"] == 32768
    assert TraceConfig(d_model=8192, num_heads=64, num_kv_heads=1).kv_cache_values_per_token == 256  # MQA


def test_gqa_stream_keys_name_num_kv_heads_only_when_it_differs():
    import hashlib

    key = "attention-trace:v1:W_K:seed=0:d_model=8:num_heads=4:num_kv_heads=2:head=1"
    r = int.from_bytes(hashlib.shake_256(key.encode()).digest(8), "little")
    assert generate_parameters(0, 8, 4, 2).W_K[1, 0, 0] == (2 * (r >> 11) + 1 - 2**53) / 2**53 * math.sqrt(3 * (1 / 8))
    assert np.array_equal(generate_parameters(0, 8, 4, 4).W_K, generate_parameters(0, 8, 4).W_K)


# -------------------------------------------------------------------- sliding window


@pytest.mark.parametrize("window", [1, 2, 3])
def test_the_window_masks_keys_window_or_more_positions_back(window):
    t = engine.trace(TraceConfig(d_model=8, num_heads=2, causal=True, window=window), sentence="a b c d e f")
    n = 6
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    hidden = (j > i) | (i - j >= window)
    masked = t.stages["masked_scores"]
    assert np.array_equal(masked.mask, np.broadcast_to(hidden, masked.values.shape))
    assert (t.stages["weights"].values[:, hidden] == 0.0).all()
    np.testing.assert_allclose(t.stages["weights"].values.sum(-1), 1.0, rtol=0, atol=1e-12)
    assert masked.formula.startswith("mask_window(QKᵀ/√d_k): keys after the query, and keys window or more")
    if window == 1:  # every query sees only itself
        assert (t.stages["weights"].values == np.eye(n)).all()
        assert np.array_equal(t.stages["context"].values, t.stages["v"].values)


def test_a_window_at_least_as_long_as_the_sentence_is_the_causal_mask():
    causal = engine.trace(TraceConfig(d_model=8, num_heads=2, causal=True), sentence="a b c d")
    for window in (4, 10):
        windowed = engine.trace(TraceConfig(d_model=8, num_heads=2, causal=True, window=window), sentence="a b c d")
        assert engine.same_numbers(windowed, causal, list(causal.stages))


# ------------------------------------------------------------------ cross-attention


def test_cross_attention_takes_keys_and_values_from_the_context():
    config = TraceConfig(d_model=24, num_heads=4)
    t = engine.trace(config, sentence="the cat sat on the mat", context_sentence="le chat était assis sur le tapis")
    n, m = 6, 7
    assert [tok.text for tok in t.context_tokens] == "le chat était assis sur le tapis".split()
    assert t.stages["context_tokens"].values == "le chat était assis sur le tapis".split()
    shapes = {sid: s.shape for sid, s in t.stages.items()}
    assert shapes["q"] == (4, n, 6) and shapes["k"] == shapes["v"] == (4, m, 6)
    assert shapes["scores"] == shapes["weights"] == (4, n, m) and shapes["output"] == (n, 24)
    assert t.stages["scores"].axis_tokens == (None, "tokens", "context_tokens")
    assert t.stages["k"].axis_tokens == (None, "context_tokens", None)
    assert t.stages["context_input"].axis_tokens == ("context_tokens", None)
    assert t.stages["q"].axis_tokens == (None, "tokens", None)
    # The context has its own positions 0 … m − 1 and its own embeddings.
    assert np.array_equal(t.stages["context_positional_encoding"].values, A.sinusoidal_positional_encoding(m, 24))
    assert np.array_equal(t.stages["context_token_embedding"].values[1],
                          engine.params.token_embedding_vector(0, 24, "chat"))
    # The queries are the sentence's alone: another context changes k and v, never q.
    other = engine.trace(config, sentence="the cat sat on the mat", context_tokens=["un", "chien"])
    assert np.array_equal(other.stages["q"].values, t.stages["q"].values)
    assert other.stages["k"].shape == (4, 2, 6)


def test_cross_attention_to_the_sentence_itself_is_self_attention():
    config = TraceConfig(d_model=24, num_heads=4, num_kv_heads=2)
    self_attn = engine.trace(config, sentence="the cat sat on the mat")
    cross = engine.trace(config, sentence="the cat sat on the mat", context_sentence="the cat sat on the mat")
    assert engine.same_numbers(cross, self_attn, list(self_attn.stages))


# ------------------------------------------------------------------ KV-cache decoding

DECODE_CONFIGS = [
    dict(d_model=24, num_heads=4),
    dict(d_model=24, num_heads=4, scale=False, positional_encoding="none"),
    dict(d_model=16, num_heads=4, positional_encoding="rope"),
    dict(d_model=16, num_heads=2, positional_encoding="rope", rope_pairing="interleaved", rope_base=100.0),
    dict(d_model=32, num_heads=8, num_kv_heads=2, positional_encoding="rope"),
    dict(d_model=24, num_heads=4, num_kv_heads=1, window=3),
    dict(d_model=16, num_heads=4, num_kv_heads=2, window=1, positional_encoding="rope"),
    dict(d_model=5, num_heads=1),
]


def _decode_rows_equal(t: engine.Trace, step: engine.DecodeStep) -> None:
    # Not bit-identical: step t projects one row (BLAS matrix-vector) where the full trace multiplies
    # matrices, and the two kernels may sum in another order; they agree to rounding, ~1e-15.
    pos, cached = step.position, list(step.cache_positions)
    s = t.stages
    k_full = s["k_rotated"] if "k_rotated" in s else s["k"]
    rows = {
        "q": (step.q, s["q"].values[:, pos]), "k": (step.k, s["k"].values[:, pos]),
        "v": (step.v, s["v"].values[:, pos]),
        "k_cache": (step.k_cache, k_full.values[:, cached]), "v_cache": (step.v_cache, s["v"].values[:, cached]),
        "scores": (step.scores, s["scores"].values[:, pos, cached]),
        "scaled_scores": (step.scaled_scores, s["scaled_scores"].values[:, pos, cached]),
        "weights": (step.weights, s["weights"].values[:, pos, cached]),
        "context": (step.context, s["context"].values[:, pos]), "output": (step.output, s["output"].values[pos]),
    }
    if "q_rotated" in s:
        rows["q_rotated"] = (step.q_rotated, s["q_rotated"].values[:, pos])
        rows["k_rotated"] = (step.k_rotated, s["k_rotated"].values[:, pos])
    else:
        assert step.q_rotated is None and step.k_rotated is None
    for name, (row, full) in rows.items():
        assert_close(row, full, f"step {pos} {name}", tol=1e-12)
    # The keys outside the cache are exactly the ones the full trace gave weight 0.
    outside = [j for j in range(t.n_tokens) if j not in cached]
    assert (s["weights"].values[:, pos, outside] == 0.0).all()


@pytest.mark.parametrize("kwargs", DECODE_CONFIGS, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
def test_each_decoding_step_equals_the_full_causal_traces_row(kwargs):
    config = TraceConfig(causal=True, **kwargs)
    t = engine.trace(config, sentence="the cat sat on the mat because it was warm")
    steps = decode(t)
    assert [s.position for s in steps] == list(range(t.n_tokens)) and steps[3].token == t.tokens[3]
    for step in steps:
        cached = step.position + 1 if config.window is None else min(step.position + 1, config.window)
        assert step.cache_positions == tuple(range(step.position + 1 - cached, step.position + 1))
        assert step.k_cache.shape == step.v_cache.shape == (config.kv_heads, cached, config.d_k)
        assert step.weights.shape == (config.num_heads, cached)
        _decode_rows_equal(t, step)
    # The cache grows one row per token (until the window), and earlier rows never change.
    for before, after in zip(steps, steps[1:]):
        kept = len(before.cache_positions) - (len(after.cache_positions) - 1)
        assert np.array_equal(after.k_cache[:, :-1], before.k_cache[:, kept:])
    count = sum(a.size for s in steps for a in vars(s).values() if isinstance(a, np.ndarray))
    assert count == decode_value_count(config, t.n_tokens)


def test_decoding_an_explicit_input_with_explicit_grouped_weights():
    rng = np.random.default_rng(3)
    W = {"W_Q": rng.standard_normal((4, 2, 8)), "W_K": rng.standard_normal((2, 2, 8)),
         "W_V": rng.standard_normal((2, 2, 8)), "W_O": rng.standard_normal((8, 8))}
    config = TraceConfig(d_model=8, num_heads=4, num_kv_heads=2, causal=True, positional_encoding="rope")
    t = engine.trace(config, tokens=list("abcde"), input=rng.standard_normal((5, 8)),
                     parameters=explicit_parameters(**W, d_model=8, num_heads=4, num_kv_heads=2))
    for step in decode(t):
        _decode_rows_equal(t, step)


@pytest.mark.parametrize("kwargs, code", [
    (dict(config=TraceConfig(), sentence="a b"), "decode_needs_causal"),
    (dict(config=TraceConfig(), sentence="a b", context_sentence="c"), "decode_cross_attention"),
    (dict(config=TraceConfig(d_model=8, num_heads=2, causal=True), sentence="a b", bug="no_scale"), "decode_with_bug"),
])
def test_decoding_refuses_what_it_cannot_rerun(kwargs, code):
    config = kwargs.pop("config")
    t = engine.trace(config, **kwargs)
    with pytest.raises(engine.DecodeUnavailableError) as exc:
        decode(t)
    assert exc.value.code == code and exc.value.field == "decode"


# ---------------------------------------------------------- stages and their counts

COUNT_CASES = [
    (dict(), None), (dict(causal=True), None), (dict(positional_encoding="rope"), None),
    (dict(positional_encoding="rope", causal=True, window=2, num_kv_heads=1), None),
    (dict(num_kv_heads=2), None), (dict(num_kv_heads=2), 5), (dict(positional_encoding="none"), 1),
    (dict(num_heads=1), 9),
]


@pytest.mark.parametrize("kwargs, m", COUNT_CASES)
@pytest.mark.parametrize("explicit", [False, True])
def test_value_count_stage_ids_and_shapes_describe_every_variant_exactly(kwargs, m, explicit):
    config = TraceConfig(d_model=16, **{"num_heads": 4, **kwargs})
    n = 3
    rng = np.random.default_rng(0)
    context = None if m is None else [f"c{i}" for i in range(m)]
    t = engine.trace(config, tokens=["a", "b", "c"], context_tokens=context,
                     input=rng.standard_normal((n, 16)) if explicit else None,
                     context_input=rng.standard_normal((m, 16)) if explicit and m else None)
    assert list(t.stages) == list(stage_ids(config, explicit_input=explicit, cross=m is not None))
    for sid, stage in t.stages.items():
        assert stage.shape == stage_shape(sid, config, n, m), sid
        assert len(stage.axes) == len(stage.axis_tokens) == len(stage.shape)
    returned = sum(v.size for v in numbers(t).values()) + t.entropy.size + t.max_weight.size
    assert trace_value_count(config, n, with_parameters=False, n_context=m, explicit_input=explicit) == returned
    assert (trace_value_count(config, n, with_parameters=True, n_context=m, explicit_input=explicit)
            == returned + t.parameters.n_parameters)


def test_engine_1_0s_value_count_is_unchanged():
    # What the service has bounded requests with since 1.0 (explicit input counted as generated).
    for h, causal, n in ((1, False, 3), (4, True, 6), (8, True, 256)):
        config = TraceConfig(d_model=64, num_heads=h, causal=causal)
        # E, PE, x, q, k, v, context, concat, output: 9·n·d_model; scores, scaled, (masked), weights: h·n² each
        stages = 9 * n * 64 + (3 + causal) * h * n * n
        assert trace_value_count(config, n, with_parameters=True) == stages + 2 * h * n + 4 * 64 * 64


@pytest.mark.parametrize("wanted, config, cross, code", [
    (["q_rotated"], TraceConfig(), False, "stage_needs_rope"),
    (["positional_encoding"], TraceConfig(positional_encoding="rope"), False, "stage_not_computed"),
    (["context_input"], TraceConfig(), False, "stage_needs_context"),
    (["masked_scores"], TraceConfig(), True, "stage_needs_causal"),
])
def test_a_stage_the_variant_does_not_compute_is_refused(wanted, config, cross, code):
    with pytest.raises(engine.StageUnavailableError) as exc:
        check_stages(wanted, config, explicit_input=False, field="submission", keyed=True, cross=cross)
    assert exc.value.code == code and exc.value.field == f"submission/{wanted[0]}"
    for ok in stage_ids(config, cross=cross):
        check_stages([ok], config, explicit_input=False, field="stages", cross=cross)


def test_a_too_large_cross_attention_trace_names_both_token_counts():
    config = TraceConfig(d_model=512, num_heads=64)
    count = trace_value_count(config, 256, with_parameters=False, n_context=256)
    with pytest.raises(engine.TraceTooLargeError, match=r"\(256 tokens, 256 context tokens, d_model 512, 64 heads\)"):
        check_trace_size(count, 2_500_000, n=256, d_model=512, num_heads=64, n_context=256)


# ---------------------------------------------------------------------- the rules

RULES = [
    (lambda: TraceConfig(d_model=24, num_heads=8, num_kv_heads=3), engine.KVHeadDivisionError, "kv_head_division",
     "num_kv_heads", "num_heads 8 is not divisible by num_kv_heads 3, so the query heads cannot share the K/V heads "
     "evenly; choose num_kv_heads among the divisors of num_heads: 1, 2, 4, 8"),
    (lambda: TraceConfig(d_model=24, num_heads=4, num_kv_heads=8), engine.KVHeadDivisionError, "kv_head_division",
     "num_kv_heads", "num_heads 4 is not divisible by num_kv_heads 8, so the query heads cannot share the K/V heads "
     "evenly; choose num_kv_heads among the divisors of num_heads: 1, 2, 4"),
    (lambda: TraceConfig(num_kv_heads=0), engine.InvalidSizeError, "invalid_size", "num_kv_heads",
     "num_kv_heads must be a positive integer (or null for num_heads), got 0"),
    (lambda: TraceConfig(d_model=24, num_heads=8, positional_encoding="rope"), engine.RotaryDimensionError,
     "rope_odd_d_k", "positional_encoding",
     "RoPE rotates the coordinates of each head in pairs, so d_k must be even, but d_k = d_model / num_heads = "
     "24 / 8 = 3; choose num_heads among 1, 2, 3, 4, 6, 12 (d_k even), or use positional_encoding \"sinusoidal\""),
    (lambda: TraceConfig(d_model=5, num_heads=1, positional_encoding="rope"), engine.RotaryDimensionError,
     "rope_odd_d_k", "positional_encoding",
     "RoPE rotates the coordinates of each head in pairs, so d_k must be even, but d_k = d_model / num_heads = "
     "5 / 1 = 5; choose an even d_model, or use positional_encoding \"sinusoidal\""),
    (lambda: TraceConfig(rope_base=1.0), engine.InvalidSizeError, "invalid_size", "rope_base",
     "rope_base must be a finite number greater than 1 and at most 1e+12 (10000 in RoFormer and Llama 2, "
     "500000 in Llama 3), got 1.0"),
    (lambda: TraceConfig(rope_base=float("inf")), engine.InvalidSizeError, "invalid_size", "rope_base", None),
    (lambda: TraceConfig(rope_pairing="neox"), engine.InvalidSizeError, "invalid_size", "rope_pairing",
     "rope_pairing must be \"rotate_half\" or \"interleaved\", got 'neox'"),
    (lambda: TraceConfig(positional_encoding="alibi"), engine.InvalidSizeError, "invalid_size",
     "positional_encoding", "positional_encoding must be \"sinusoidal\" or \"none\" or \"rope\", got 'alibi'"),
    (lambda: TraceConfig(window=3), engine.VariantConflictError, "window_needs_causal", "window",
     "a sliding window limits how far back a query looks under the causal mask, so it needs causal: true; "
     "set causal: true or drop window"),
    (lambda: TraceConfig(causal=True, window=0), engine.InvalidSizeError, "invalid_size", "window",
     "window must be a positive integer (how many keys a query sees, its own included) or null, got 0"),
    (lambda: engine.trace(TraceConfig(causal=True), sentence="a", context_sentence="b"), engine.VariantConflictError,
     "cross_attention_causal", "causal",
     "cross-attention has no causal mask: its keys are the context's tokens, not earlier tokens of the sentence, so "
     "every query sees the whole context (as in the Transformer decoder's cross-attention); set causal: false"),
    (lambda: engine.trace(TraceConfig(d_model=8, causal=True, window=2), sentence="a", context_sentence="b"),
     engine.VariantConflictError, "cross_attention_causal", "causal", None),
    (lambda: engine.trace(TraceConfig(d_model=8, positional_encoding="rope"), sentence="a", context_tokens=["b"]),
     engine.VariantConflictError, "cross_attention_rope", "positional_encoding",
     "RoPE encodes the offset between a query and a key of one sequence, but the sentence and the context are two "
     "sequences, each with its own positions; cross-attention adds each one's own encoding instead: use "
     "positional_encoding \"sinusoidal\" or \"none\""),
    (lambda: engine.trace(TraceConfig(), sentence="a", context_sentence="b", context_tokens=["b"]),
     engine.EmptyInputError, "context_sentence_xor_tokens", None,
     "give at most one of `context_sentence` (a string) or `context_tokens` (a list of strings), not both"),
    (lambda: engine.trace(TraceConfig(), sentence="a", context_sentence=" "), engine.EmptyInputError,
     "empty_sentence", "context_sentence",
     "the context sentence is only whitespace: give at least one word or punctuation mark"),
    (lambda: engine.trace(TraceConfig(), sentence="a", context_tokens=[]), engine.EmptyInputError, "empty_tokens",
     "context_tokens", "the context token list is empty: give at least one token"),
    (lambda: engine.trace(TraceConfig(), sentence="a", context_tokens=["b", " "]), engine.EmptyInputError,
     "blank_token", "context_tokens/1", "context_tokens[1] is only whitespace"),
    (lambda: engine.trace(TraceConfig(max_tokens=2), sentence="a", context_tokens=["b"] * 3),
     engine.TooManyTokensError, "too_many_tokens", "context_tokens", "3 tokens is more than the limit of 2"),
    (lambda: engine.trace(TraceConfig(max_tokens=2), sentence="a", context_sentence="b c d"),
     engine.TooManyTokensError, "too_many_tokens", "context_sentence",
     "the context sentence has more than 2 tokens (the limit); shorten it"),
    (lambda: engine.trace(TraceConfig(d_model=2), sentence="a", context_input=np.zeros((1, 2))),
     engine.VariantConflictError, "context_input_without_context", "context_input",
     "context_input is the context's x, used only in cross-attention: give context_sentence or context_tokens, "
     "or drop context_input"),
    (lambda: engine.trace(TraceConfig(d_model=2), sentence="a", input=np.zeros((1, 2)), context_sentence="b"),
     engine.VariantConflictError, "explicit_input_pair", "context_input",
     "in cross-attention give your own x for both the sentence and the context, or for neither: add context_input "
     "[context token, d_model]"),
    (lambda: engine.trace(TraceConfig(d_model=2), sentence="a", context_sentence="b c", input=np.zeros((1, 2)),
                          context_input=np.zeros((1, 2))),
     engine.ShapeError, "array_shape", "context_input",
     "context_input has shape [1, 2] but must be [2, 2] [context token, d_model]"),
    (lambda: explicit_parameters(np.zeros((4, 2, 8)), np.zeros((4, 2, 8)), np.zeros((4, 2, 8)), np.zeros((8, 8)),
                                 d_model=8, num_heads=4, num_kv_heads=2),
     engine.ShapeError, "array_shape", "parameters/W_K",
     "parameters.W_K has shape [4, 2, 8] but must be [2, 2, 8] [kv_head, d_k, d_model]"),
]


@pytest.mark.parametrize("call, cls, code, field, message", RULES, ids=[f"{r[2]}-{i}" for i, r in enumerate(RULES)])
def test_each_new_rule_has_its_error_code_field_and_a_message_that_says_what_to_fix(call, cls, code, field, message):
    with pytest.raises(cls) as exc:
        call()
    assert isinstance(exc.value, engine.EngineError)
    assert (exc.value.code, exc.value.field) == (code, field)
    if message is not None:
        assert exc.value.message == message


def test_every_new_error_class_has_its_own_code_and_field():
    for cls in (engine.KVHeadDivisionError, engine.RotaryDimensionError, engine.DecodeUnavailableError):
        assert issubclass(cls, engine.EngineError) and cls.code != engine.EngineError.code and cls.field
    assert engine.VariantConflictError.code != engine.EngineError.code


# ------------------------------------------------------------------- the known bugs

VARIANT_CASES = [
    *[(dict(d_model=d, num_heads=h, positional_encoding="rope", rope_pairing=p, causal=c, scale=s), None)
      for (d, h), p, c, s in itertools.product([(8, 2), (8, 1), (2, 1)], ["rotate_half", "interleaved"],
                                               [False, True], [True, False])],
    *[(dict(d_model=d, num_heads=h, num_kv_heads=g, causal=c), None)
      for (d, h, g), c in itertools.product([(24, 4, 2), (24, 4, 1), (4, 4, 1), (8, 8, 2)], [False, True])],
    *[(dict(d_model=d, num_heads=h, causal=True, window=w, num_kv_heads=g), None)
      for (d, h, g), w in itertools.product([(24, 4, None), (6, 2, 1)], [1, 2])],
    *[(dict(d_model=d, num_heads=h, num_kv_heads=g, scale=s, positional_encoding=pe), ctx)
      for (d, h, g), s, pe, ctx in itertools.product([(24, 4, None), (24, 4, 2), (1, 1, None)], [True, False],
                                                     ["sinusoidal", "none"], [["le"], ["le", "chat", "."]])],
]


@pytest.mark.parametrize("kwargs, context", VARIANT_CASES,
                         ids=lambda v: "" if v is None else "-".join(map(str, v.values() if isinstance(v, dict)
                                                                         else v)))
@pytest.mark.parametrize("sentence", ["a", "the cat sat"])
def test_a_bug_is_refused_exactly_when_it_would_change_no_number_under_every_variant(kwargs, context, sentence):
    # tests/test_engine_design.py's rule, over the variants: each bug's own rule (refuse) against
    # the numbers themselves, both ways; a bug the variant cannot show is refused with its reason.
    config = TraceConfig(**kwargs)
    t = engine.trace(config, sentence=sentence, context_tokens=context)
    m = None if context is None else len(context)
    for bug in BUGS.values():
        refused = refusal(bug, config, t.n_tokens, n_context=m)
        if refused is not None and refused.code != "bug_changes_nothing":
            assert refused.code == "bug_not_applicable" or (refused.code == "bug_needs_causal" and not config.causal)
            with pytest.raises(engine.BugNotApplicableError, match=re.escape(refused.message)):
                engine.trace(config, sentence=sentence, context_tokens=context, bug=bug.name)
            continue
        wrong = engine.recompute(t, bug)
        assert all(np.isfinite(v).all() for v in numbers(wrong).values()), bug.name
        unchanged = engine.same_numbers(wrong, t, list(t.stages))
        assert (refused is not None) == unchanged, (bug.name, refused)
        if refused is None:
            assert engine.trace(config, sentence=sentence, context_tokens=context, bug=bug.name).bug == bug.name
        else:
            with pytest.raises(engine.BugNotApplicableError):
                engine.trace(config, sentence=sentence, context_tokens=context, bug=bug.name)


@pytest.mark.parametrize("kwargs, context", [
    (dict(d_model=16, num_heads=4, positional_encoding="rope", causal=True), None),
    (dict(d_model=16, num_heads=4, num_kv_heads=2, causal=True, window=2), None),
    (dict(d_model=16, num_heads=4, num_kv_heads=1), ["le", "chat", "noir"]),
])
def test_recomputing_a_bug_under_a_variant_equals_a_full_run_of_the_swapped_steps(kwargs, context):
    config = TraceConfig(**kwargs)
    t = engine.trace(config, sentence="the cat sat on the mat", context_tokens=context)
    cross = context is not None
    for bug in engine.applicable_bugs(config, t.n_tokens, n_context=None if context is None else len(context)):
        wrong = engine.recompute(t, bug)
        swap = {s.name: s for s in bug.replaces}
        steps = tuple(swap.get(s.name, s) for s in layer_steps(config, cross=cross))
        state = initial_state(config, t.state["tokens"], vars(t.parameters), context_texts=context)
        run(steps, state)
        for sid, stage in wrong.stages.items():
            if not isinstance(stage.values, list):
                assert np.array_equal(stage.values, state[sid]), (bug.name, sid)
            assert stage.formula == formulas(steps)[sid]


def test_the_diagonal_mistake_keeps_the_window():
    t = engine.trace(TraceConfig(d_model=8, num_heads=2, causal=True, window=2), sentence="a b c d",
                     bug="mask_includes_diagonal")
    i, j = np.arange(4)[:, None], np.arange(4)[None, :]
    assert np.array_equal(t.stages["masked_scores"].mask[0], (j >= i) | (i - j >= 2))


@pytest.mark.parametrize("kwargs, context, bug, reason", [
    (dict(d_model=8, num_heads=2, positional_encoding="rope"), None, "positional_encoding_missing",
     "with RoPE no positional encoding is added to x"),
    (dict(d_model=8, num_heads=2), ["b"], "positional_encoding_twice",
     "in cross-attention the sentence and the context"),
    (dict(d_model=8, num_heads=2), ["b"], "heads_split_without_transpose",
     "in cross-attention the keys and values are projected from the context"),
    (dict(d_model=8, num_heads=4, num_kv_heads=2), None, "projection_not_transposed",
     "with 2 K/V heads the stacked W_K is [4, 8], not square"),
])
def test_a_bug_a_variant_cannot_show_is_refused_with_the_reason(kwargs, context, bug, reason):
    with pytest.raises(engine.BugNotApplicableError) as exc:
        engine.trace(TraceConfig(**kwargs), sentence="a b", context_tokens=context, bug=bug)
    assert exc.value.code == "bug_not_applicable" and reason in exc.value.message


# ------------------------------------------------------------------ finite everywhere


@FEW
@given(req=variant_requests())
def test_no_nan_or_inf_in_any_stage_of_any_variant(req):
    t = _trace(req)
    for sid, values in numbers(t).items():
        assert values.dtype == np.float64 and np.isfinite(values).all(), sid
    assert np.isfinite(t.entropy).all() and np.isfinite(t.max_weight).all()
    if req["causal"]:
        for step in decode(t):
            assert all(np.isfinite(a).all() for a in vars(step).values() if isinstance(a, np.ndarray))


# ------------------------------------------------------------ docs/engine.md check values


def check_values() -> dict[str, float]:
    """The exact numbers docs/engine.md quotes for each variant (d_model 8, 2 heads, seed 0, "the cat sat")."""
    base = dict(d_model=8, num_heads=2, seed=0)
    rope = engine.trace(TraceConfig(**base, positional_encoding="rope"), sentence="the cat sat")
    inter = engine.trace(TraceConfig(**base, positional_encoding="rope", rope_pairing="interleaved"),
                         sentence="the cat sat")
    gqa = engine.trace(TraceConfig(d_model=8, num_heads=4, num_kv_heads=2), sentence="the cat sat")
    window = engine.trace(TraceConfig(**base, causal=True, window=2), sentence="the cat sat")
    cross = engine.trace(TraceConfig(**base), sentence="the cat sat", context_sentence="le chat")
    return {
        "rope q_rotated[0, 1, 0]": rope.stages["q_rotated"].values[0, 1, 0],
        "rope scores[0, 2, 1]": rope.stages["scores"].values[0, 2, 1],
        "interleaved q_rotated[0, 1, 0]": inter.stages["q_rotated"].values[0, 1, 0],
        "gqa W_K[1, 0, 0]": gqa.parameters.W_K[1, 0, 0],
        "gqa weights[3, 0, 2]": gqa.stages["weights"].values[3, 0, 2],
        "window weights[0, 2, 1]": window.stages["weights"].values[0, 2, 1],
        "cross weights[1, 2, 0]": cross.stages["weights"].values[1, 2, 0],
        "cross output[0, 0]": cross.stages["output"].values[0, 0],
    }


def test_the_check_values_in_docs_engine_md_are_the_engines():
    doc = (ROOT / "docs" / "engine.md").read_text(encoding="utf-8")
    for name, value in check_values().items():
        match = re.search(rf"`{re.escape(name)}` *\| *`([-0-9.e]+)`", doc)
        assert match, f"docs/engine.md does not quote {name}"
        assert float(match.group(1)) == pytest.approx(value, rel=1e-12, abs=1e-15), name
