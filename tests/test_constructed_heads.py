"""Constructed heads (engine.constructed): each head's job, measured on generated sentences.

The thresholds are the promise docs/engine.md ("Constructed heads") makes: previous-token, first-token and
same-token heads put at least 0.9 of each query's weight where their job says, on sentences of up to 64
tokens, d_model ≥ 32; an induction pair finds the B after the first A on ≥ 95 % of random "… A B … A" (d_model 128),
and at d_model 256 every query without an earlier copy of its token puts its largest weight on the first token.
Hypothesis runs are derandomized and bounded; the induction sentences come from a fixed numpy seed.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import EngineError, trace
from engine.constructed import (
    POSITION_PAIRS,
    TOKEN_GAIN,
    layout_token_embeddings,
)
from engine.layer import TraceConfig
from engine.params import generate_parameters, generated_parameters_digest
from conftest import examples

PROPS = settings(max_examples=examples(40), deadline=None, derandomize=True)
#: a small vocabulary, so sentences repeat tokens (same-token heads need copies)
WORDS = [f"w{i}" for i in range(40)]
#: (d_model, num_heads) with d_k wide enough for every kind
SHAPES = [(32, 1), (48, 1), (64, 2), (96, 3)]

sentences = st.lists(st.sampled_from(WORDS), min_size=2, max_size=64)


def _weights(kind: str, d_model: int, num_heads: int, words: list[str], causal: bool, sharpness: float = 10.0):
    kinds = [kind] + ["seeded"] * (num_heads - 1)
    t = trace(TraceConfig(d_model=d_model, num_heads=num_heads, head_weights=kinds, causal=causal, sharpness=sharpness),
              sentence=" ".join(words))
    assert [tok.text for tok in t.tokens] == words
    return t.stages["weights"].values[0]  # [query, key] of head 0


# ------------------------------------------------------------------ the patterns


@PROPS
@given(shape=st.sampled_from(SHAPES), words=sentences, causal=st.booleans())
def test_previous_token_head_puts_at_least_0_9_on_the_previous_token(shape, words, causal):
    w = _weights("previous_token", *shape, words, causal)
    n = len(words)
    assert w[np.arange(1, n), np.arange(n - 1)].min() >= 0.9


@PROPS
@given(shape=st.sampled_from([(32, 1), (32, 4), (64, 2), (48, 6)]), words=sentences, causal=st.booleans(),
       pairing=st.sampled_from(["rotate_half", "interleaved"]), base=st.sampled_from([10000.0, 500000.0]))
def test_previous_token_head_under_rope_puts_at_least_0_9_on_the_previous_token(shape, words, causal, pairing, base):
    d_model, num_heads = shape
    cfg = TraceConfig(d_model=d_model, num_heads=num_heads, causal=causal, positional_encoding="rope",
                      rope_pairing=pairing, rope_base=base, head_weights=["previous_token"] + ["seeded"] * (num_heads - 1))
    t = trace(cfg, sentence=" ".join(words))
    n = len(words)
    assert t.stages["weights"].values[0][np.arange(1, n), np.arange(n - 1)].min() >= 0.9
    # the closed form, written out again: sharpness·mean_p cos((j − i + 1)·θ_p) / margin
    d_k = d_model // num_heads
    theta = base ** (-np.arange(0, d_k, 2) / d_k)
    kernel = lambda delta: np.cos(np.multiply.outer(delta, theta)).mean(axis=-1)  # noqa: E731 (a formula)
    margin = 1 - kernel(np.arange(1, 257)).max()
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    np.testing.assert_allclose(t.stages["scaled_scores"].values[0], 10 * kernel(j - i + 1) / margin, atol=1e-8)


@PROPS
@given(shape=st.sampled_from(SHAPES), words=sentences, causal=st.booleans())
def test_first_token_head_puts_at_least_0_9_on_position_0(shape, words, causal):
    w = _weights("first_token", *shape, words, causal)
    assert w[:, 0].min() >= 0.9


@PROPS
@given(shape=st.sampled_from(SHAPES), words=sentences)
def test_same_token_head_puts_at_least_0_9_on_earlier_copies(shape, words):
    w = _weights("same_token", *shape, words, causal=True)
    checked = 0
    for i, word in enumerate(words):
        earlier = [j for j in range(i) if words[j] == word]
        if earlier:
            assert w[i, earlier].sum() >= 0.9, (i, word)
            checked += 1
    assert checked or len(set(words)) == len(words)


def test_same_token_head_without_the_causal_mask_attends_to_every_other_copy():
    """Documented: without the mask, later copies count as much as earlier ones (the query itself is not one)."""
    words = "w1 w2 w1 w3 w1".split()
    w = _weights("same_token", 32, 1, words, causal=False)
    assert w[2, [0, 4]].sum() >= 0.99 and abs(w[2, 0] - w[2, 4]) < 0.01
    assert w[2, 2] < 1e-3


@pytest.mark.parametrize("kind, sharpness, floor, ceiling", [
    # sharpness scales the scores: the worst query's weight, measured on 8, 64 and 256 tokens
    ("previous_token", 2.0, 0.5, 0.6), ("previous_token", 5.0, 0.98, 1.0),
    ("first_token", 2.0, 0.5, 0.6), ("first_token", 5.0, 0.98, 1.0),
])
def test_sharpness_sets_how_peaked_the_pattern_is(kind, sharpness, floor, ceiling):
    rng = np.random.default_rng(5)
    worst = 1.0
    for n in (8, 64, 256):
        words = list(rng.choice(WORDS, n))
        w = trace(TraceConfig(d_model=32, head_weights=[kind], causal=True, sharpness=sharpness, max_tokens=256),
                  sentence=" ".join(words)).stages["weights"].values[0]
        rows = np.arange(1, n)
        target = w[rows, rows - 1] if kind == "previous_token" else w[:, 0]
        worst = min(worst, target.min())
    assert floor <= worst <= ceiling


# ------------------------------------------------------------------ the closed forms, independently


def _code(n: int) -> np.ndarray:
    """The position code written out again: (sin(π·pos/2^f), cos(π·pos/2^f)) for f < 8."""
    pos = np.arange(n)[:, None]
    angle = math.pi * pos / 2.0 ** np.arange(8)  # [n, 8]
    return np.stack([np.sin(angle), np.cos(angle)], axis=-1).reshape(n, 16)  # [n, 8, 2] -> [n, 16]


def test_scores_are_sharpness_times_the_closed_forms():
    words = "the cat sat on the mat and the dog sat on the cat".split()
    n, s = len(words), 3.0
    code = _code(n)
    kernel = code @ code.T  # [n, n]: K(i − j) = PE(i)·PE(j)
    shifted = np.vstack([_code(n + 1)[:1] * 0, code[:-1]])  # PE(i − 1), row 0 unused
    t = trace(TraceConfig(d_model=96, num_heads=3, head_weights=["previous_token", "first_token", "same_token"],
                          causal=True, sharpness=s), sentence=" ".join(words))
    scaled = t.stages["scaled_scores"].values  # [head, query, key]
    np.testing.assert_allclose(scaled[0, 1:], s * shifted[1:] @ code.T / 2, atol=1e-9)
    np.testing.assert_allclose(scaled[1], s * np.broadcast_to(kernel[0], (n, n)) / 2, atol=1e-9)
    E = t.stages["token_embedding"].values  # [n, d_model]: unit vectors in the token subspace
    np.testing.assert_allclose(np.linalg.norm(E, axis=1), 1.0)
    cos = E @ E.T
    np.testing.assert_allclose(scaled[2], s * (TOKEN_GAIN * cos - kernel / 2), atol=1e-8)
    # the code tells positions apart: K(0) = 8, every other |δ| < 256 at most 6
    far = _code(256) @ _code(256)[0]
    assert far[0] == pytest.approx(POSITION_PAIRS) and far[1:].max() <= POSITION_PAIRS - 2 + 1e-9


def test_the_trace_carries_the_constructed_matrices_and_says_which_heads_they_are():
    cfg = TraceConfig(d_model=64, num_heads=4, head_weights=["previous_token", "first_token", "seeded", "seeded"],
                      sharpness=2.0)
    t = trace(cfg, sentence="a b c d")
    assert t.config.head_weights == ("previous_token", "first_token", "seeded", "seeded") and t.config.constructed
    seeded = generate_parameters(0, 64, 4)
    d_k, s = 16, 2.0 * 4.0  # gain = sharpness · √d_k
    for name in ("W_Q", "W_K", "W_V"):  # the seeded heads keep their seeded rows
        np.testing.assert_array_equal(getattr(t.parameters, name)[2:], getattr(seeded, name)[2:])
    np.testing.assert_array_equal(t.parameters.W_O[:, 2 * d_k:], seeded.W_O[:, 2 * d_k:])
    lay = cfg.layout
    p0 = lay.position.start
    W_Q = t.parameters.W_Q[0]  # previous-token: a rotation by −ω_f in each pair, times the pair's sign
    for f, sign in enumerate([1, 1, -1, -1, 1, -1, 1, -1]):
        w = math.pi / 2**f
        block = W_Q[2 * f:2 * f + 2, p0 + 2 * f:p0 + 2 * f + 2]
        turn = np.array([[math.cos(w), -math.sin(w)], [math.sin(w), math.cos(w)]])
        np.testing.assert_allclose(block, sign * s / 2 * turn)
    assert not W_Q[:, :lay.zero].any() and not W_Q[16:].any()  # only the code (and the zero), in 16 coordinates
    for name in ("W_Q", "W_K", "W_V"):  # every constructed row is blind to 1: a LayerNorm's centring changes nothing
        assert np.abs(getattr(t.parameters, name)[:2] @ np.ones(64)).max() < 1e-12
    np.testing.assert_array_equal(t.parameters.W_Q[1][:8, lay.one], s / 2)  # first-token: reads the constant 1
    assert t.parameters_digest != generated_parameters_digest(0, 64, 4)


# ------------------------------------------------------------------ induction


#: the induction sentences' words; the copied output is compared with each one's embedding
VOCABULARY = [f"v{i}" for i in range(1000)]


def _induction_sentences(count: int, seed: int = 3):
    """Random "… A B … A": A once before the end, B after it, fillers that are not A."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.integers(4, 65))
        a = int(rng.integers(0, n - 2))
        A, B, *rest = rng.choice(VOCABULARY, n + 2, replace=False)
        words = list(rest[:n])
        words[a], words[a + 1], words[-1] = A, B, A
        yield words, a, B


@pytest.mark.slow  # 3–7 s each on a shared 2-core machine
@pytest.mark.parametrize("block, causal, floor", [
    ("vaswani2017", True, 0.95), ("vaswani2017", False, 0.95), ("gpt2", True, 0.95), ("gpt2", False, 0.95),
    ("llama", True, 0.99),
])
def test_induction_head_attends_to_the_token_after_the_first_copy_and_copies_it(block, causal, floor):
    cfg = TraceConfig(d_model=128, num_heads=1, head_weights=["induction"], num_layers=2, block=block, causal=causal)
    table = layout_token_embeddings(cfg.seed, cfg.layout, VOCABULARY)  # [vocabulary, d_model]
    table /= np.linalg.norm(table, axis=1, keepdims=True)
    found = copied = total = 0
    for words, a, B in _induction_sentences(100):
        t = trace(cfg, sentence=" ".join(words))
        w = t.stages["weights"].values[1, 0, -1]  # layer 1, head 0, the last A's row
        found += int(np.argmax(w) == a + 1)
        out = t.stages["output"].values[1, -1]  # layer 1's attention output at the last A
        copied += int(VOCABULARY[int(np.argmax(table @ out))] == B)
        total += 1
    print(f"{block} causal={causal}: top weight on B {found}/{total}, output closest to B {copied}/{total}")
    assert found / total >= floor and copied / total >= floor, (found, copied, total)


def _induction_rows(words: list[str]) -> tuple[list[int], dict[int, set[int]]]:
    """The queries without an earlier copy of their token, and each query's keys an induction head may pick: the
    token after an earlier copy, before the query, and not a copy itself (on "… A A" the token after the first A is
    the query's own token, which the head's match subtracts: such a query has no target)."""
    unmatched, targets = [], {}
    for i, w in enumerate(words):
        copies = [j for j in range(i) if words[j] == w]
        if not copies:
            unmatched.append(i)
        keys = {j + 1 for j in copies if j + 1 < i and words[j + 1] != w}
        if keys:
            targets[i] = keys
    return unmatched, targets


@pytest.mark.slow
@pytest.mark.parametrize("block", ["vaswani2017", "gpt2", "llama"])
def test_induction_head_sends_a_query_without_an_earlier_copy_to_the_first_token(block):
    """Trained induction heads park a query that matches nothing on the first token (an attention sink): so does
    this one, on 100 random sentences of 4-48 tokens from 25 words (tokens repeat); a query with a target attends
    to one of them. Raw scores stay within 20·√d_k (the closed form is at most sharpness·1.6)."""
    cfg = TraceConfig(d_model=256, num_heads=1, head_weights=["induction"], num_layers=2, block=block, causal=True)
    rng = np.random.default_rng(11)
    sinks = matched = 0
    for _ in range(100):
        words = list(rng.choice(WORDS[:25], int(rng.integers(4, 49))))
        t = trace(cfg, sentence=" ".join(words))
        w = t.stages["weights"].values[1, 0]  # layer 1, head 0: [query, key]
        unmatched, targets = _induction_rows(words)
        for i in unmatched:
            assert np.argmax(w[i]) == 0, (words, i, w[i].round(3))
        for i, keys in targets.items():
            assert int(np.argmax(w[i])) in keys, (words, i, keys, w[i].round(3))
        sinks += len(unmatched)
        matched += len(targets)
        raw = np.nan_to_num(t.stages["scores"].values[1, 0])
        assert np.abs(raw).max() < 20 * math.sqrt(cfg.d_k)
    assert sinks > 1200 and matched > 800, (sinks, matched)


def test_the_induction_preset_finds_potter_and_parks_the_rest_on_the_first_token():
    """The viewer's preset (service/static/heads.js): every row but the last "harry" on "harry", that one on
    "potter"; scaled scores about sharpness × the closed form, not thousands."""
    words = "harry potter went to the shop and then harry".split()
    for block in ("gpt2", "vaswani2017", "llama"):
        t = trace(TraceConfig(d_model=128, num_heads=1, head_weights=["induction"], num_layers=2, block=block,
                              causal=True), sentence=" ".join(words))
        w = t.stages["weights"].values[1, 0]
        assert [words[int(np.argmax(r))] for r in w] == ["harry"] * 8 + ["potter"], block
        assert w.max(axis=1).min() > 0.9, block
        assert np.nanmax(np.abs(t.stages["scaled_scores"].values[1])) < 15, block


def test_induction_layers_zero_the_feed_forward_network():
    t = trace(TraceConfig(d_model=64, head_weights=["induction"], num_layers=2, block="gpt2"), sentence="a b c a")
    for layer in t.parameters.layers:
        assert not layer.W_1.any() and not layer.W_2.any()
    np.testing.assert_allclose(t.stages["ffn_output"].values, 0.0)


# ------------------------------------------------------------------ mixing, defaults


@PROPS
@given(words=sentences)
def test_constructed_and_seeded_heads_mix(words):
    cfg = TraceConfig(d_model=96, num_heads=3, head_weights=["previous_token", "same_token", "seeded"], causal=True)
    w = trace(cfg, sentence=" ".join(words)).stages["weights"].values
    n = len(words)
    assert w[0, np.arange(1, n), np.arange(n - 1)].min() >= 0.9
    for i, word in enumerate(words):
        earlier = [j for j in range(i) if words[j] == word]
        if earlier:
            assert w[1, i, earlier].sum() >= 0.9


def test_a_request_without_heads_is_unchanged():
    sentence = "the quick brown fox jumps over the lazy dog"
    base = TraceConfig(d_model=24, num_heads=4)
    t = trace(base, sentence=sentence)
    assert base.head_weights is None and not base.constructed
    assert t.parameters_digest == generated_parameters_digest(0, 24, 4)
    every_seeded = trace(TraceConfig(d_model=24, num_heads=4, head_weights=["seeded"] * 4, sharpness=3.0),
                         sentence=sentence)
    assert every_seeded.parameters_digest == t.parameters_digest
    for sid, stage in t.stages.items():
        other = every_seeded.stages[sid].values
        assert other == stage.values if sid == "tokens" else np.array_equal(other, stage.values)


# ------------------------------------------------------------------ the rules


@pytest.mark.parametrize("fields, code, field", [
    ({"num_heads": 2, "head_weights": ["previous_token", "bogus"]}, "unknown_head_kind", "head_weights/1"),
    ({"num_heads": 2, "head_weights": ["previous_token"]}, "heads_length", "head_weights"),
    ({"head_weights": ["induction"]}, "induction_needs_layers", "head_weights"),
    ({"d_model": 24, "head_weights": ["previous_token"]}, "d_model_too_small", "d_model"),
    ({"d_model": 64, "num_heads": 4, "head_weights": ["same_token"] + ["seeded"] * 3}, "d_k_too_small", "head_weights/0"),
    ({"head_weights": ["first_token"], "positional_encoding": "rope"}, "constructed_needs_pe", "head_weights/0"),
    ({"head_weights": ["previous_token"], "positional_encoding": "rope", "rope_base": 1.0001}, "rope_base_blurs_positions",
     "rope_base"),
    ({"num_heads": 2, "num_kv_heads": 1, "head_weights": ["first_token", "seeded"]}, "constructed_needs_mha", "head_weights"),
    ({"head_weights": ["first_token"], "sharpness": 0.0}, "invalid_size", "sharpness"),
    ({"head_weights": ["first_token"], "sharpness": float("inf")}, "invalid_size", "sharpness"),
])
def test_bad_heads_are_refused_with_a_typed_error(fields, code, field):
    with pytest.raises(EngineError) as caught:
        TraceConfig(**{"d_model": 32, **fields})
    assert caught.value.code == code and caught.value.field == field
    assert caught.value.message  # says what to fix


def test_constructed_heads_refuse_an_explicit_input_or_weights():
    cfg = TraceConfig(d_model=32, head_weights=["previous_token"])
    with pytest.raises(EngineError) as caught:
        trace(cfg, sentence="a b", input=np.zeros((2, 32)))
    assert caught.value.code == "constructed_input"
    p = generate_parameters(0, 32, 1)
    with pytest.raises(EngineError) as caught:
        trace(cfg, sentence="a b", parameters=p)
    assert caught.value.code == "constructed_parameters"


# ------------------------------------------------------------------ over HTTP: /trace and /check


def test_trace_over_http_echoes_the_constructed_heads_and_carries_their_weights(client):
    body = {"sentence": "the cat sat on the mat", "d_model": 64, "num_heads": 2, "causal": True,
            "head_weights": ["previous_token", "seeded"], "sharpness": 5.0, "include_parameters": True}
    answer = client.post("/trace", json=body).get_json()
    assert answer["config"]["head_weights"] == ["previous_token", "seeded"] and answer["config"]["sharpness"] == 5.0
    engine_trace = trace(TraceConfig(d_model=64, num_heads=2, causal=True, head_weights=["previous_token", "seeded"],
                                     sharpness=5.0), sentence="the cat sat on the mat")
    assert answer["parameters_digest"] == engine_trace.parameters_digest
    np.testing.assert_allclose(answer["parameters"]["W_Q"], engine_trace.parameters.W_Q, rtol=1e-12, atol=1e-12)
    w = np.array(answer["stages"]["weights"]["values"])[0]  # [query, key] of the previous-token head
    assert w[np.arange(1, 6), np.arange(5)].min() >= 0.9
    plain = client.post("/trace", json={"sentence": "the cat sat"}).get_json()["config"]
    assert "head_weights" not in plain and "sharpness" not in plain  # seeded answers keep their shape


@pytest.mark.parametrize("fields, pointer, code", [
    ({"head_weights": ["previous_token", "bogus"], "num_heads": 2}, "/head_weights/1", "unknown_head_kind"),
    ({"head_weights": ["previous_token"], "num_heads": 2}, "/head_weights", "heads_length"),
    ({"head_weights": ["previous_token"], "sharpness": 0}, "/sharpness", "invalid_size"),
    ({"head_weights": ["previous_token"], "d_model": 24}, "/d_model", "d_model_too_small"),
    ({"head_weights": ["previous_token"], "input": [[0.0] * 32] * 3}, "/input", "constructed_input"),
])
def test_bad_head_weights_over_http_are_the_engines_422(client, fields, pointer, code):
    resp = client.post("/trace", json={"sentence": "the cat sat", "d_model": 32, **fields})
    assert resp.status_code == 422 and resp.mimetype == "application/problem+json"
    errors = resp.get_json()["errors"]
    assert (errors[0]["pointer"], errors[0]["type"]) == (pointer, code), errors
    assert errors[0]["message"]


def _students_previous_token_weights(x: np.ndarray, sharpness: float, rotate: bool = True) -> np.ndarray:
    """A student's previous-token head, written from docs/engine.md's closed form: W_Q turns each pair of the
    position code back by ω_f = π/2^f, W_K reads it; scores /√d_k, the causal mask, softmax."""
    n, d_model = x.shape
    d_k = d_model
    start = d_model - 1 - 16  # the position code sits just before the constant 1
    W_Q, W_K = np.zeros((d_k, d_model)), np.zeros((d_k, d_model))
    for f in range(8):
        w = math.pi / 2**f
        turn = np.array([[math.cos(w), -math.sin(w)], [math.sin(w), math.cos(w)]]) if rotate else np.eye(2)
        W_Q[2 * f:2 * f + 2, start + 2 * f:start + 2 * f + 2] = sharpness * math.sqrt(d_k) / 2 * turn
        W_K[2 * f:2 * f + 2, start + 2 * f:start + 2 * f + 2] = np.eye(2)
    scores = (x @ W_Q.T) @ (x @ W_K.T).T / math.sqrt(d_k)
    scores[np.triu_indices(n, 1)] = -np.inf
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True))[None]  # [1, n, n]


def test_check_grades_a_hand_built_previous_token_head_correct(client):
    body = {"sentence": "the cat sat on the mat", "d_model": 32, "causal": True,
            "head_weights": ["previous_token"], "sharpness": 3.0}
    x = np.array(client.post("/trace", json={**body, "stages": ["input"]}).get_json()["stages"]["input"]["values"])
    right = _students_previous_token_weights(x, 3.0)
    answer = client.post("/check", json={**body, "submission": {"weights": right.tolist()}}).get_json()
    assert answer["passed"] is True, answer["message"]
    wrong = _students_previous_token_weights(x, 3.0, rotate=False)  # forgot the rotation: attends to itself
    answer = client.post("/check", json={**body, "submission": {"weights": wrong.tolist()}}).get_json()
    assert answer["passed"] is False and answer["first_wrong_stage"] == "weights"


@pytest.mark.integration  # starts another process
def test_the_cli_asks_for_constructed_heads_and_labels_them():
    run = subprocess.run([sys.executable, "-m", "attention_trace.cli", "the cat sat on the mat", "--d-model", "32",
                          "--heads", "2", "--head-weights", "previous_token", "seeded", "--sharpness", "4",
                          "--causal", "--query", "mat", "--head", "0", "--layout", "table"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "head weights previous_token, seeded (sharpness 4)" in run.stdout
    rows = [line.split() for line in run.stdout.splitlines() if re.match(r"^\s+\d+\s", line)]
    w = trace(TraceConfig(d_model=32, num_heads=2, head_weights=["previous_token", "seeded"], sharpness=4.0,
                          causal=True), sentence="the cat sat on the mat").stages["weights"].values[0, 5]
    assert [float(r[-1].rstrip("%")) for r in rows] == [round(100 * v, 1) for v in w]
    assert max(rows, key=lambda r: float(r[-1].rstrip("%")))[1] == "the"  # "mat" looks at the token before it
    bad = subprocess.run([sys.executable, "-m", "attention_trace.cli", "a b", "--d-model", "32", "--head-weights",
                          "bogus"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "/head_weights/0" in bad.stderr


def test_docs_give_these_check_values():
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "engine.md").read_text(encoding="utf-8")
    section = doc.split("## Constructed heads", 1)[1].split("\n## ", 1)[0]
    sentence = "the cat sat on the mat"
    for seed in (0, 7):  # every matrix is constructed: the seed moves the embeddings only
        t = trace(TraceConfig(d_model=32, head_weights=["previous_token"], causal=True, seed=seed), sentence=sentence)
        assert f"`{t.parameters_digest}`" in section
        np.testing.assert_allclose(t.stages["scaled_scores"].values[0, 2],
                                   [23.027253, 40, 23.027253, 23.028759, 12.252268, 23.034782], atol=1e-6)
        assert round(t.stages["weights"].values[0, 2, 1], 8) == 0.99999991
    first = trace(TraceConfig(d_model=32, head_weights=["first_token"], causal=True), sentence=sentence)
    assert f"`{first.parameters_digest}`" in section and first.stages["scaled_scores"].values[0, 5, 0] == pytest.approx(40.0)
    for value in ("23.027253, 40, 23.027253, 23.028759, 12.252268, 23.034782", "0.99999991", "K(±1) = 4.6055"):
        assert value in section
