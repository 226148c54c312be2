"""The language-model head: its stages, its vocabulary, generation, its refusals, and its known mistakes diagnosed
by /check on a student's plain numpy. (transformers' reference: tests/test_lm_torch.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

import engine
from engine import TraceConfig
from engine.bugs import LM_BUGS
from engine.decoding import generate
from engine.lm import choose, kept, vocabulary

SENTENCE = "the cat sat on the mat"
GPT2 = dict(block="gpt2", d_model=24, num_heads=4, num_layers=2, lm_head="tied", temperature=0.7)


def gpt2(**kw):
    return TraceConfig.preset_config("gpt2", **{**{k: v for k, v in GPT2.items() if k != "block"}, **kw})


def softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    z = z - z.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


# ---------------------------------------------------------------- the engine


def test_the_vocabulary_is_the_sentences_distinct_tokens_then_the_candidates():
    assert vocabulary(["the", "cat", "the", "mat"], ["dog", "cat", "ran"]) == ["the", "cat", "mat", "dog", "ran"]
    t = engine.trace(gpt2(candidates=("dog", "cat")), sentence=SENTENCE)
    assert t.vocabulary == ["the", "cat", "sat", "on", "mat", "dog"]


def test_the_stages_are_the_heads_formulas_computed_independently():
    t = engine.trace(gpt2(candidates=("dog",)), sentence=SENTENCE)
    ids = list(t.stages)
    assert ids[-4:] == ["final_norm", "unembedding", "logits", "next_token_probs"]
    W_U = np.stack([engine.params.token_embedding_vector(0, 24, text) for text in t.vocabulary])  # tied
    np.testing.assert_array_equal(t.stages["unembedding"].values, W_U)
    logits = t.stages["final_norm"].values @ W_U.T
    np.testing.assert_allclose(t.stages["logits"].values, logits, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(t.stages["next_token_probs"].values, softmax(logits[-1] / 0.7), rtol=1e-13, atol=1e-16)
    assert [(t.stages[s].info.step, t.stages[s].axes) for s in ids[-3:]] == [
        (20, ("vocab", "d_model")),
        (21, ("token", "vocab")),
        (22, ("vocab",)),
    ]
    assert t.stages["logits"].formula == "LN_f(x_L)·W_Uᵀ: column j scores vocabulary[j]"


def test_post_norm_reads_the_last_layer_and_a_seeded_head_does_not_depend_on_the_vocabulary():
    t = engine.trace(
        TraceConfig(block="vaswani2017", d_model=16, num_heads=2, num_layers=2, lm_head="seeded", causal=True),
        sentence=SENTENCE,
    )
    h = t.stages["residual_stream"].values[-1]
    np.testing.assert_allclose(t.stages["logits"].values, h @ t.stages["unembedding"].values.T, rtol=1e-13)
    other = engine.trace(
        TraceConfig(
            block="vaswani2017",
            d_model=16,
            num_heads=2,
            num_layers=2,
            lm_head="seeded",
            causal=True,
            candidates=("zebra", "sat"),
        ),
        sentence="mat on the cat",
    )
    row = dict(zip(other.vocabulary, other.stages["unembedding"].values))
    for text, r in zip(t.vocabulary, t.stages["unembedding"].values):
        np.testing.assert_array_equal(row[text], r)


def test_temperature_sharpens_and_flattens_and_never_overflows():
    entropies = []
    for T in (0.001, 0.5, 1.0, 2.0, 1000.0):
        p = engine.trace(gpt2(temperature=T), sentence=SENTENCE).stages["next_token_probs"].values
        assert np.isfinite(p).all() and abs(p.sum() - 1) < 1e-12
        entropies.append(-(p * np.log(np.where(p > 0, p, 1))).sum())
    assert entropies == sorted(entropies) and entropies[0] < 1e-9 and entropies[-1] > np.log(5) - 1e-3


def test_an_existing_stack_is_unchanged_by_the_head():
    plain = engine.trace(TraceConfig.preset_config("gpt2", d_model=24, num_heads=4, num_layers=2), sentence=SENTENCE)
    head = engine.trace(gpt2(), sentence=SENTENCE)
    for sid, st in plain.stages.items():
        np.testing.assert_array_equal(
            np.asarray(st.values, dtype=object), np.asarray(head.stages[sid].values, dtype=object)
        )
    assert plain.parameters_digest == head.parameters_digest


# ---------------------------------------------------------------- generation


@pytest.mark.parametrize(
    "config",
    [
        gpt2(),
        TraceConfig.preset_config(
            "llama",
            d_model=32,
            num_heads=4,
            num_kv_heads=2,
            num_layers=3,
            d_ff=40,
            lm_head="seeded",
            window=3,
            temperature=1.5,
        ),
        TraceConfig(block="vaswani2017", d_model=24, num_heads=2, num_layers=2, lm_head="tied", causal=True),
    ],
    ids=["gpt2", "llama-window", "post-norm"],
)
def test_each_generated_step_equals_the_full_trace_of_the_longer_sentence(config):
    t = engine.trace(config, sentence=SENTENCE)
    steps = generate(t, 4, top_k=3, sample_seed=7)
    texts = [k.text for k in t.tokens] + [s.token for s in steps]
    for i, s in enumerate(steps):
        longer = engine.trace(config, tokens=texts[: s.position])  # the tokens before the new one
        assert longer.vocabulary[: len(t.vocabulary)] == t.vocabulary
        np.testing.assert_allclose(
            s.probs,
            longer.stages["next_token_probs"].values[: len(t.vocabulary)]
            if longer.vocabulary == t.vocabulary
            else s.probs,
            rtol=1e-12,
            atol=1e-15,
        )
        np.testing.assert_allclose(s.logits, longer.stages["logits"].values[-1], rtol=1e-12, atol=1e-12)
        assert s.probability == s.probs[s.index] and t.vocabulary[s.index] == s.token
        full = engine.trace(config, tokens=texts[: s.position + 1]).stages["weights"].values[:, :, -1]
        np.testing.assert_allclose(s.weights, full[..., list(s.cache_positions)], rtol=1e-12, atol=1e-15)


def test_greedy_takes_the_most_probable_and_sampling_is_reproducible_and_within_the_kept_set():
    t = engine.trace(gpt2(temperature=2.0, candidates=("dog", "ran", "a")), sentence=SENTENCE)
    greedy = generate(t, 3)
    assert all(s.index == int(np.argmax(s.probs)) for s in greedy)
    a, b = generate(t, 6, top_k=2, sample_seed=5), generate(t, 6, top_k=2, sample_seed=5)
    assert [s.token for s in a] == [s.token for s in b]
    assert all(s.index in s.kept[:2] and len(s.kept) == 2 for s in a)
    drawn = {tuple(s.token for s in generate(t, 6, sample_seed=seed)) for seed in range(8)}
    assert len(drawn) > 1  # seeds draw differently


def test_top_k_and_top_p_keep_what_transformers_keeps():
    p = np.array([0.05, 0.4, 0.1, 0.3, 0.15])
    assert kept(p, None, None).tolist() == [1, 3, 4, 2, 0]
    assert kept(p, 2, None).tolist() == [1, 3]
    assert kept(p, None, 0.7).tolist() == [1, 3]  # 0.4 + 0.3 reaches 0.7: the next is not needed
    assert kept(p, None, 0.71).tolist() == [1, 3, 4]
    assert kept(p, None, 0.01).tolist() == [1]  # the most probable is always kept
    index, keep, renormalised = choose(p, top_k=3, sample_seed=1)
    assert index in keep and abs(renormalised.sum() - 1) < 1e-15


# ---------------------------------------------------------------- over HTTP


BODY = {"sentence": SENTENCE, **GPT2}


@pytest.mark.parametrize(
    "extra, pointer, kind",
    [
        ({"block": None, "num_layers": None, "lm_head": "tied"}, "/lm_head", "lm_head_needs_block"),
        ({"lm_head": "untied"}, "/lm_head", "invalid_size"),
        ({"temperature": 0}, "/temperature", "invalid_size"),
        ({"temperature": 1e9}, "/temperature", "invalid_size"),
        ({"lm_head": None}, "/temperature", "needs_lm_head"),
        ({"candidates": ["dog", " "]}, "/candidates/1", "blank_token"),
        ({"candidates": [f"w{i}" for i in range(1025)]}, "/candidates", "invalid_size"),
        ({"generate": 2, "causal": False}, "/generate", "generate_needs_causal"),
        ({"generate": 0}, "/generate", "greater_than_equal"),
        ({"generate": 300}, "/generate", "less_than_equal"),
        ({"generate": 2, "inject_bug": "temperature_multiplied"}, "/generate", "generate_with_bug"),
        ({"top_k": 2}, "/top_k", "needs_generate"),
        ({"generate": 2, "top_p": 1.5}, "/top_p", "less_than_equal"),
        ({"stages": ["logits"], "lm_head": None, "temperature": 1.0}, "/stages", "stage_needs_lm_head"),
        (
            {"inject_bug": "lm_final_norm_skipped", "block": "vaswani2017", "causal": True},
            "/inject_bug",
            "bug_not_applicable",
        ),
        ({"inject_bug": "temperature_multiplied", "temperature": 1.0}, "/inject_bug", "bug_changes_nothing"),
    ],
)
def test_bad_input_is_a_422_naming_the_field(client, extra, pointer, kind):
    body = {k: v for k, v in {**BODY, **extra}.items() if v is not None}
    r = client.post("/trace", json=body)
    assert r.status_code == 422 and r.content_type == "application/problem+json", r.get_json()
    assert any(e["pointer"] == pointer and e["type"] == kind for e in r.get_json()["errors"]), r.get_json()


def test_the_answer_names_each_column_and_each_generated_token(client):
    r = client.post("/trace", json={**BODY, "candidates": ["dog"], "generate": 3, "top_k": 3, "sample_seed": 2})
    assert r.status_code == 200
    d = r.get_json()
    assert d["vocabulary"] == ["the", "cat", "sat", "on", "mat", "dog"]
    assert d["stages"]["logits"]["shape"] == [6, 6] and d["stages"]["next_token_probs"]["shape"] == [6]
    assert d["config"] | {} == {
        **d["config"],
        "lm_head": "tied",
        "temperature": 0.7,
        "n_vocabulary": 6,
        "generate": 3,
        "top_k": 3,
        "sample_seed": 2,
    }
    t = engine.trace(gpt2(candidates=("dog",)), sentence=SENTENCE)
    steps = generate(t, 3, top_k=3, sample_seed=2)
    assert [g["token"] for g in d["generation"]] == [s.token for s in steps]
    for g, s in zip(d["generation"], steps):
        assert g["probability"] == s.probability and g["position"] == s.position
        assert len(g["candidates"]) == 3 and g["candidates"][0]["probability"] == float(s.probs.max())
        assert [c["token"] for c in g["candidates"]] == [t.vocabulary[j] for j in s.kept]
        assert np.array(g["weights"]).shape == (2, 4, s.position + 1)


# ---------------------------------------------------------------- a student's plain numpy, diagnosed by /check


def student_head(h: np.ndarray, x_L: np.ndarray, W_U: np.ndarray, T: float, mistake: str | None) -> dict[str, list]:
    """A student's lm_head and next_token_probs in plain numpy, with one mistake (or none)."""
    if mistake == "lm_head_not_tied":
        W_U = np.stack([engine.lm.seeded_unembedding(0, h.shape[1], [text])[0] for text in VOCAB])
    hidden = x_L if mistake == "lm_final_norm_skipped" else h
    logits = hidden @ (W_U.reshape(W_U.shape[1], W_U.shape[0]) if mistake == "lm_head_transposed" else W_U.T)
    row = logits[0] if mistake == "next_token_from_first_position" else logits[-1]
    if mistake == "temperature_multiplied":
        probs = softmax(row * T)
    elif mistake == "softmax_over_positions":
        probs = softmax(logits / T, axis=0)[-1]
    else:
        probs = softmax(row / T)
    out = {"logits": logits.tolist(), "next_token_probs": probs.tolist()}
    if mistake == "lm_head_not_tied":
        out["unembedding"] = W_U.tolist()
    return out


VOCAB = ["the", "cat", "sat", "on", "mat"]


@pytest.mark.parametrize("mistake", [None, *LM_BUGS])
def test_check_names_each_mistake_of_a_students_head(client, mistake):
    ref = client.post("/trace", json={**BODY, "stages": ["residual_stream", "final_norm", "unembedding"]}).get_json()
    assert ref["vocabulary"] == VOCAB
    h = np.array(ref["stages"]["final_norm"]["values"])
    x_L = np.array(ref["stages"]["residual_stream"]["values"])[-1]
    W_U = np.array(ref["stages"]["unembedding"]["values"])
    submission = {"final_norm": h.tolist(), **student_head(h, x_L, W_U, 0.7, mistake)}
    r = client.post("/check", json={**BODY, "submission": submission})
    assert r.status_code == 200, r.get_json()
    d = r.get_json()
    if mistake is None:
        assert d["passed"], d["message"]
        return
    assert not d["passed"] and d["first_wrong_stage"] == LM_BUGS[mistake].stage
    assert d["diagnosis"]["matches"] == [mistake], d["diagnosis"]


# ---------------------------------------------------------------- constructed heads predict


WORDS = [f"v{i}" for i in range(1000)]


def induction_sentences(count: int, seed: int = 3):
    """Random "… A B … A" of 8–64 tokens: A once before the last token, B after it, fillers neither."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.integers(8, 65))
        a = int(rng.integers(0, n - 2))
        A, B, *rest = rng.choice(WORDS, n + 2, replace=False)
        words = list(rest[:n])
        words[a], words[a + 1], words[-1] = A, B, A
        yield words, A, B


@pytest.mark.parametrize("block", ["gpt2", "llama"])
def test_an_induction_stack_with_the_tied_head_predicts_the_token_after_the_first_copy(block):
    # docs/engine.md, "Constructed heads predict": 500/500 on 500 sentences at d_model 64 (median p(B) ~0.55)
    config = TraceConfig.preset_config(
        block,
        d_model=64,
        num_heads=1,
        head_weights=["induction"],
        num_layers=2,
        lm_head="tied",
        positional_encoding="sinusoidal",
    )
    top, probs = 0, []
    for words, A, B in induction_sentences(100):
        t = engine.trace(config, tokens=words)
        p = t.stages["next_token_probs"].values
        top += t.vocabulary[int(np.argmax(p))] == B
        probs.append(p[t.vocabulary.index(B)])
    print(f"{block}: B top-1 on {top}/100, p(B) min {min(probs):.3f} median {np.median(probs):.3f}")
    assert top >= 99 and np.median(probs) > 0.3 and min(probs) > 0.1


def test_where_it_breaks_a_post_norm_stack_ties_the_token_with_its_copy():
    # Post-norm, the last A's stream holds A's own embedding and the copied B at the same strength, normalised
    # together: A and B score alike, and A wins about half the time.
    config = TraceConfig(
        block="vaswani2017",
        d_model=64,
        num_heads=1,
        head_weights=["induction"],
        num_layers=2,
        lm_head="tied",
        causal=True,
    )
    winners = []
    for words, A, B in induction_sentences(40):
        t = engine.trace(config, tokens=words)
        winners.append({A: "A", B: "B"}.get(t.vocabulary[int(np.argmax(t.stages["next_token_probs"].values))], "other"))
    print("post-norm, 40 sentences:", {w: winners.count(w) for w in ("A", "B", "other")})
    assert winners.count("B") <= 30 and winners.count("A") >= 10


# ---------------------------------------------------------------- the client and the command line


def test_the_client_generates_and_the_command_line_prints_each_step(capsys):
    from attention_trace import LocalClient
    from attention_trace.cli import main

    with LocalClient() as client:
        doc = client.generate(
            "harry potter went to the shop and harry", tokens=3, head_weights=["induction"], num_layers=2, d_model=64
        )
    assert [s["token"] for s in doc["generation"]] == ["potter", "went", "to"]  # the induction head's copies
    assert list(doc["stages"]) == ["next_token_probs"]
    assert (
        main(
            [
                "generate",
                "harry potter went to the shop and harry",
                "--tokens",
                "3",
                "--head-weights",
                "induction",
                "--layers",
                "2",
                "--d-model",
                "64",
                "--color",
                "never",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "harry potter went to the shop and harry  →  potter went to"
    assert out[2].startswith("step 1 (position 8): potter p = ") and "candidates: potter" in out[2]
    assert len(out) == 5
    assert main(["generate", "the cat", "--tokens", "2", "--temperature", "0"]) == 2
    assert "--temperature (/temperature): temperature must be" in capsys.readouterr().err
    assert main(["generate", "the cat sat", "--tokens", "3", "--top-k", "2", "--seed", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"]["sample_seed"] == 4 and all(len(s["candidates"]) == 2 for s in doc["generation"])
    assert (
        main(
            [
                "the cat sat",
                "--block",
                "gpt2",
                "--lm-head",
                "tied",
                "--temperature",
                "0.5",
                "--candidates",
                "dog",
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["vocabulary"] == ["the", "cat", "sat", "dog"] and doc["config"]["temperature"] == 0.5
    assert main(["the cat sat", "--lm-head", "tied"]) == 2
    assert "--lm-head (/lm_head): lm_head turns a stack's last hidden state" in capsys.readouterr().err


def test_explain_walks_one_logit_number_by_number(client):
    body = {**BODY, "candidates": ["dog"], "cell": "logit"}
    t = engine.trace(gpt2(candidates=("dog",)), sentence=SENTENCE)
    h, W_U = t.stages["final_norm"].values, t.stages["unembedding"].values
    for token, column in ((5, 5), (2, 1)):
        d = client.post("/explain", json={**body, "token": token, "column": column}).get_json()
        steps = {s["id"]: s for s in d["steps"]}
        assert d["column_token"] == t.vocabulary[column] and d["source_stage"] == "final_norm"
        np.testing.assert_array_equal(steps["products"]["values"], h[token] * W_U[column])
        np.testing.assert_array_equal(
            steps["products"]["w"], engine.params.token_embedding_vector(0, 24, t.vocabulary[column])
        )  # tied
        assert steps["logit"]["value"] == t.stages["logits"].values[token, column]
        assert abs(steps["logit"]["recomputed"] - steps["logit"]["value"]) < 1e-13
        assert ("probability" in steps) == (token == 5)
    assert steps.get("probability") is None
    d = client.post("/explain", json={**body, "token": 5, "column": 5}).get_json()
    p = d["steps"][-1]
    assert p["value"] == t.stages["next_token_probs"].values[5] and abs(p["recomputed"] - p["value"]) < 1e-15
    r = client.post("/explain", json={**body, "token": 0, "column": 6})
    assert r.status_code == 422 and r.get_json()["errors"][0]["pointer"] == "/column"


@pytest.mark.parametrize(
    "config, sentence",
    [
        (gpt2(), SENTENCE),
        (gpt2(temperature=1.0), SENTENCE),
        (gpt2(candidates=("dog",)), "cat"),
        (gpt2(lm_head="seeded", candidates=("dog",)), SENTENCE),
        (
            TraceConfig(block="vaswani2017", d_model=16, num_heads=2, lm_head="tied", causal=True, temperature=2.0),
            SENTENCE,
        ),
        (
            TraceConfig.preset_config(
                "gpt2",
                d_model=44,
                num_heads=1,
                num_layers=2,
                head_weights=["induction"],
                lm_head="tied",
                temperature=0.5,
            ),
            SENTENCE,
        ),
    ],
    ids=["gpt2", "temperature-1", "one-token", "seeded", "post-norm", "constructed"],
)
def test_a_head_mistake_is_refused_exactly_where_it_would_change_nothing_or_cannot_show(config, sentence):
    from engine.bugs import refusal

    t = engine.trace(config, sentence=sentence)
    for name, bug in LM_BUGS.items():
        refused = refusal(bug, config, t.n_tokens)
        if refused is not None and refused.code == "bug_not_applicable":
            continue  # its step has another form here (no final norm; the layout's own embeddings)
        changed = not engine.same_numbers(engine.recompute(t, bug), t, list(t.stages))
        assert changed == (refused is None), (name, refused and refused.message)
    # A vocabulary of one token (one distinct token, no candidates) makes every probability 1: the backstop
    # refuses what the rules cannot see (they know the token count, not the vocabulary's).
    with pytest.raises(engine.BugNotApplicableError, match="changes no number"):
        engine.trace(gpt2(), sentence="cat cat", bug="temperature_multiplied")
    plain = TraceConfig.preset_config("gpt2", d_model=24, num_heads=4)
    assert all(refusal(b, plain, 3).code == "bug_not_applicable" for b in LM_BUGS.values())


def test_generated_numbers_count_towards_the_trace_size_and_the_message_says_so(client):
    body = {
        "sentence": " ".join(f"w{i}" for i in range(200)),
        "block": "gpt2",
        "num_layers": 6,
        "d_model": 64,
        "num_heads": 4,
        "lm_head": "tied",
        "stages": ["next_token_probs"],
    }
    assert client.post("/trace", json={**body, "num_layers": 1}).status_code == 200
    r = client.post("/trace", json={**body, "generate": 50})
    assert r.status_code == 422
    (error,) = r.get_json()["errors"]
    assert error["type"] == "trace_too_large" and "of them in the generated tokens" in error["message"]
    assert error["message"].endswith("or generate fewer tokens")


def test_version_lists_every_head_mistake_check_can_name(client):
    """GET /version's ``lm_bugs`` is every name /check's diagnosis can give (its schema's enum) that the attention's
    ``bugs`` and the block's ``block_bugs`` do not hold, and exactly what a stack gains from the head: names /check
    considers for a stack with lm_head and not without it."""
    from typing import get_args

    from engine.bugs import applicable_bugs
    from service.routes.check import Diagnosis

    doc = client.get("/version").get_json()
    nameable = set(get_args(Diagnosis.model_fields["bug"].annotation)[0].__args__)
    listed = [*doc["bugs"], *doc["block_bugs"], *doc["lm_bugs"]]
    assert len(listed) == len(set(listed)) and set(listed) == nameable
    with_head = {b.name for b in applicable_bugs(gpt2(temperature=0.7), 6)}
    without = {b.name for b in applicable_bugs(gpt2(lm_head=None, temperature=1.0), 6)}
    assert set(doc["lm_bugs"]) == with_head - without and with_head >= set(doc["lm_bugs"])
    assert all(doc["lm_bugs"][name] == bug.summary for name, bug in LM_BUGS.items())
