"""One cell explained (engine/explain.py, POST /explain, Client.explain, the CLI's --explain): every step's
number is the trace's own, for every variant; the first seed's "the cat sat" worked example; masked cells;
out-of-range cells; the command line's lines."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

import engine
from attention_trace import LocalClient
from attention_trace.cli import main
from engine import TraceConfig
from engine.attention import softmax_parts
from engine.explain import STEP_IDS, check_cell, explain_cell
from test_grader import seed_article_request  # the seed's worked example, built once

D = 24

# (name, config, sentence, context sentence): every variant the engine has, with 1, 2 and 4 heads.
CONFIGS = [
    ("h1", TraceConfig(d_model=8, num_heads=1), None),
    ("h2", TraceConfig(d_model=8, num_heads=2), None),
    ("h4", TraceConfig(d_model=24, num_heads=4), None),
    ("h4-causal", TraceConfig(d_model=24, num_heads=4, causal=True), None),
    ("h2-unscaled", TraceConfig(d_model=8, num_heads=2, scale=False), None),
    ("h2-unscaled-causal", TraceConfig(d_model=8, num_heads=2, scale=False, causal=True), None),
    ("h2-rope", TraceConfig(d_model=8, num_heads=2, positional_encoding="rope"), None),
    ("h4-rope-interleaved-causal", TraceConfig(d_model=16, num_heads=4, positional_encoding="rope",
                                               rope_pairing="interleaved", causal=True), None),
    ("h4-gqa2", TraceConfig(d_model=16, num_heads=4, num_kv_heads=2), None),
    ("h4-mqa", TraceConfig(d_model=16, num_heads=4, num_kv_heads=1, causal=True), None),
    ("h4-gqa2-rope-window", TraceConfig(d_model=16, num_heads=4, num_kv_heads=2, positional_encoding="rope",
                                        causal=True, window=2), None),
    ("h1-window1", TraceConfig(d_model=8, num_heads=1, causal=True, window=1), None),
    ("h2-window3", TraceConfig(d_model=8, num_heads=2, causal=True, window=3), None),
    ("h2-no-pe", TraceConfig(d_model=8, num_heads=2, positional_encoding="none"), None),
    ("h2-cross", TraceConfig(d_model=8, num_heads=2), "le chat était assis sur le tapis"),
    ("h4-cross-gqa", TraceConfig(d_model=16, num_heads=4, num_kv_heads=2), "le chat"),
    ("h1-cross-unscaled", TraceConfig(d_model=8, num_heads=1, scale=False), "un"),
]
WORDS = "the cat sat on the mat and purred".split()


def sentence(n: int) -> str:
    return " ".join(WORDS[:n])


def stage_at(t: engine.Trace, sid: str, index: list[int]) -> float:
    return float(t.state[sid][tuple(index)])


def check_every_cell(t: engine.Trace) -> dict[str, int]:
    """Every step of every cell against the trace's own arrays; returns how many recomputations were exact."""
    cfg, st = t.config, t.state
    G = cfg.num_heads // cfg.kv_heads
    keys = t.context_tokens if t.cross else t.tokens
    m = len(keys)
    excluded = st.get("excluded")
    exact = {"score": 0, "contributions": 0, "cells": 0}
    for h, i, j in itertools.product(range(cfg.num_heads), range(t.n_tokens), range(m)):
        d = explain_cell(t, h, i, j)
        s = {step["id"]: step for step in d["steps"]}
        assert [step["id"] for step in d["steps"]] == list(STEP_IDS)
        assert (d["head"], d["query"], d["key"], d["kv_head"]) == (h, i, j, h // G)
        assert d["query_token"] == t.tokens[i].text and d["key_token"] == keys[j].text
        assert d["key_tokens"] == [k.text for k in keys]
        assert d["key_source"] == ("context_tokens" if t.cross else "tokens")
        assert d["d_k"] == cfg.d_k and d["scale"] == cfg.scale
        assert d["scale_factor"] == st["scale_factor"] == (math.sqrt(cfg.d_k) if cfg.scale else 1.0)
        masked = bool(excluded[h, i, j]) if excluded is not None else False
        assert d["masked"] is masked
        assert d["masked_keys"] == ([] if excluded is None else [int(x) for x in np.flatnonzero(excluded[h, i])])

        # products: the vectors actually dotted (RoPE's rotated ones; the query head's K/V head)
        q_sid, k_sid = ("q_rotated", "k_rotated") if cfg.rope else ("q", "k")
        p = s["products"]
        assert (p["stage"], p["k_stage"], p["index"], p["k_index"]) == (q_sid, k_sid, [h, i], [h // G, j])
        assert p["q"] == st[q_sid][h, i].tolist() and p["k"] == st[k_sid][h // G, j].tolist()
        assert p["values"] == (st[q_sid][h, i] * st[k_sid][h // G, j]).tolist() and len(p["values"]) == cfg.d_k
        assert p["value"] is None

        # the trace's own numbers, bit for bit, where a step is a stage entry
        for sid in ("score", "scaled", "weight"):
            assert s[sid]["value"] == stage_at(t, s[sid]["stage"], s[sid]["index"]), sid
        assert s["score"]["value"] == st["scores"][h, i, j]
        assert s["scaled"]["value"] == st["scaled_scores"][h, i, j]
        assert s["weight"]["value"] == st["weights"][h, i, j]  # exactly
        assert s["scaled"]["divisor"] == st["scale_factor"]
        assert s["scaled"]["exact"] is True  # one IEEE division, as the engine's
        # products summed in order vs BLAS's matmul: equal to float64 rounding, not always bit for bit
        score = s["score"]["value"]
        assert s["score"]["recomputed"] == pytest.approx(score, rel=1e-12, abs=1e-12 * np.abs(p["values"]).sum())
        assert s["score"]["exact"] == (s["score"]["recomputed"] == score)
        exact["score"] += s["score"]["exact"]

        # row_max: the max over the row's unmasked keys, read from masked_scores (scaled_scores without a mask)
        r = s["row_max"]
        visible = np.ones(m, bool) if excluded is None else ~excluded[h, i]
        assert r["stage"] == ("scaled_scores" if excluded is None else "masked_scores")
        assert r["value"] == st["scaled_scores"][h, i][visible].max() == stage_at(t, r["stage"], r["index"])
        assert visible[r["key"]] and r["index"] == [h, i, r["key"]] and r["key_token"] == keys[r["key"]].text

        # exp and the denominator: the softmax's own numbers (exp / denominator == weight, bit for bit)
        e, den, w = s["exp"], s["denominator"], s["weight"]
        assert w["recomputed"] == e["value"] / den["value"] == w["value"] and w["exact"] is True
        assert np.array_equal(np.array(den["values"]) / den["value"], st["weights"][h, i])
        assert den["recomputed"] == pytest.approx(den["value"], rel=1e-14)
        if masked:
            assert e["value"] == 0.0 and w["value"] == 0.0 and e["exponent"] is None and e["exact"] is None
            assert den["values"][j] == 0.0 and d["mask_reason"]
            assert s["contributions"]["values"][j] is None
        else:
            assert e["exponent"] == s["scaled"]["value"] - r["value"] <= 0.0
            assert e["recomputed"] == pytest.approx(e["value"], rel=1e-15)
            assert d["mask_reason"] is None
        assert den["value"] >= 1.0  # the row's max key adds exp(0) = 1

        # contributions: w_j·v_j per key, summed = context[h, i]
        c = s["contributions"]
        assert c["value"] is None and c["stage"] == "context" and c["index"] == [h, i]
        assert c["vector"] == st["context"][h, i].tolist()  # the trace's context, exactly
        assert c["weights"] == st["weights"][h, i].tolist() and c["v"] == st["v"][h // G].tolist()
        for jj in range(m):
            if visible[jj]:
                assert c["values"][jj] == (st["weights"][h, i, jj] * st["v"][h // G, jj]).tolist()
            else:
                assert c["values"][jj] is None
        # Added in key order vs BLAS's weights·V: equal to 1e-12 (about 1e-16 measured), not always bit for bit.
        np.testing.assert_allclose(c["recomputed"], c["vector"], rtol=0, atol=1e-12)
        assert c["max_abs_difference"] == np.max(np.abs(np.array(c["recomputed"]) - c["vector"]))
        assert c["exact"] == (c["recomputed"] == c["vector"])
        exact["contributions"] += c["exact"]
        exact["cells"] += 1
    return exact


@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize(("name", "config", "context"), CONFIGS, ids=[c[0] for c in CONFIGS])
def test_every_step_is_the_traces_own_number(name, config, context, n):
    t = engine.trace(config, sentence=sentence(n), context_sentence=context)
    counts = check_every_cell(t)
    assert counts["cells"] == config.num_heads * n * (len(context.split()) if context else n)


def test_softmax_parts_are_the_engines():
    # the exponentials and denominators explain.py shows are those attention.softmax divides
    for _, config, context in CONFIGS:
        t = engine.trace(config, sentence=sentence(6), context_sentence=context)
        _, e, total = softmax_parts(t.state["masked_scores"], t.state.get("excluded"))
        assert np.array_equal(e / total, t.state["weights"])


def test_explicit_input_and_parameters_work_too():
    t = engine.trace(TraceConfig(d_model=D, num_heads=1), tokens=["the", "cat", "sat"],
                     input=np.asarray(seed_article_request(True)["input"]),
                     parameters=engine.explicit_parameters(*(np.eye(D)[None],) * 3, np.eye(D), d_model=D,
                                                           num_heads=1))
    check_every_cell(t)


# ------------------------------------------------------------------ the seed's worked example


@pytest.mark.parametrize(("scale", "scaled", "percent"), [
    (True, [0.791, 3.042, 1.693], [7.7, 73.3, 19.0]),
    (False, [3.877, 14.905, 8.293], [0.0, 99.9, 0.1]),
])
def test_the_cat_sat_worked_example(client, scale, scaled, percent):
    """q·k = 3.877 / 14.905 / 8.293, ÷√24 = 4.899 → 0.791 / 3.042 / 1.693, softmax 7.7 / 73.3 / 19.0 %."""
    docs = []
    for key in range(3):
        r = client.post("/explain", json=seed_article_request(scale) | {"head": 0, "query": 1, "key": key})
        assert r.status_code == 200, r.get_json()
        docs.append(r.get_json())
    step = [{s["id"]: s for s in d["steps"]} for d in docs]
    assert [d["key_token"] for d in docs] == ["the", "cat", "sat"] and docs[0]["query_token"] == "cat"
    assert np.allclose([s["score"]["value"] for s in step], [3.877, 14.905, 8.293], rtol=1e-12)
    assert np.allclose([s["score"]["recomputed"] for s in step], [3.877, 14.905, 8.293], rtol=1e-12)
    divisor = math.sqrt(24) if scale else 1.0
    assert all(s["scaled"]["divisor"] == divisor and d["scale_factor"] == divisor for s, d in zip(step, docs))
    if scale:
        assert f"{divisor:.3f}" == "4.899" and "√d_k" in step[0]["scaled"]["formula"]
    else:
        assert "scaling off" in step[0]["scaled"]["formula"] and "divided by 1" in step[0]["scaled"]["note"]
    assert np.allclose([s["scaled"]["value"] for s in step], scaled, atol=5e-4)
    # the row's max is cat's own scaled score; exp(0) = 1 for cat; Σ = the three exponentials
    assert all(s["row_max"]["key"] == 1 and s["row_max"]["value"] == step[1]["scaled"]["value"] for s in step)
    assert step[1]["exp"]["value"] == 1.0
    exps = [s["exp"]["value"] for s in step]
    assert step[0]["denominator"]["values"] == exps
    assert step[0]["denominator"]["value"] == pytest.approx(sum(exps), rel=1e-15)
    assert [round(100 * s["weight"]["value"], 1) for s in step] == percent
    # and the same numbers as /trace's stages
    tr = client.post("/trace", json=seed_article_request(scale)).get_json()["stages"]
    assert [s["score"]["value"] for s in step] == tr["scores"]["values"][0][1]
    assert [s["scaled"]["value"] for s in step] == tr["scaled_scores"]["values"][0][1]
    assert [s["weight"]["value"] for s in step] == tr["weights"]["values"][0][1]
    assert step[0]["contributions"]["vector"] == tr["context"]["values"][0][1]


# ------------------------------------------------------------------ masked cells


def test_a_causally_masked_cell():
    t = engine.trace(TraceConfig(d_model=8, num_heads=2, causal=True), sentence="the cat sat")
    d = explain_cell(t, 1, 0, 2)  # "the" may not see "sat"
    s = {step["id"]: step for step in d["steps"]}
    assert d["masked"] is True and d["masked_keys"] == [1, 2]
    assert "causal mask" in d["mask_reason"] and "'sat' comes after query 0 'the'" in d["mask_reason"]
    assert s["score"]["value"] == t.state["scores"][1, 0, 2] != 0.0  # the score is still shown
    assert s["scaled"]["value"] == t.state["scaled_scores"][1, 0, 2]
    assert s["exp"]["value"] == 0.0 and s["weight"]["value"] == 0.0 == t.state["weights"][1, 0, 2]
    assert s["row_max"]["key"] == 0 and s["row_max"]["stage"] == "masked_scores"
    assert s["denominator"]["values"] == [1.0, 0.0, 0.0] and s["denominator"]["value"] == 1.0
    assert s["contributions"]["values"][1:] == [None, None]
    assert "masked" in s["exp"]["note"] and "masked" in s["weight"]["note"]


def test_a_cell_outside_the_sliding_window():
    t = engine.trace(TraceConfig(d_model=8, num_heads=2, causal=True, window=2), sentence="the cat sat on")
    d = explain_cell(t, 0, 3, 0)
    assert d["masked"] and d["masked_keys"] == [0, 1]
    assert d["mask_reason"].startswith("sliding window of 2: key 0 'the' is 3 positions before query 3 'on'")
    assert not explain_cell(t, 0, 3, 2)["masked"]
    assert "causal mask" in explain_cell(t, 0, 1, 2)["mask_reason"]


def test_decode_compares_the_kv_cache_step():
    t = engine.trace(TraceConfig(d_model=8, num_heads=2, causal=True, window=2), sentence="the cat sat on")
    steps = engine.decode(t)
    cached = explain_cell(t, 1, 3, 2, decode=steps)["decode"]
    assert cached["in_cache"] and cached["cache_positions"] == [2, 3] and cached["cache_index"] == 0
    assert cached["score"] == pytest.approx(t.state["scores"][1, 3, 2], abs=1e-12)
    assert cached["weight"] == pytest.approx(t.state["weights"][1, 3, 2], abs=1e-12)
    assert cached["score_difference"] <= 1e-12 and cached["weight_difference"] <= 1e-12
    evicted = explain_cell(t, 1, 3, 0, decode=steps)["decode"]
    assert not evicted["in_cache"] and evicted["weight"] is None and "left the sliding window" in evicted["note"]
    future = explain_cell(t, 1, 1, 3, decode=steps)["decode"]
    assert not future["in_cache"] and "not generated yet" in future["note"]


# ------------------------------------------------------------------ out of range


def test_engine_refuses_cells_outside_the_trace():
    cfg = TraceConfig(d_model=8, num_heads=2)
    for args, field in [((2, 0, 0), "head"), ((-1, 0, 0), "head"), ((0, 3, 0), "query"), ((0, 0, 3), "key"),
                        ((0, 0, -1), "key")]:
        with pytest.raises(engine.InvalidSizeError) as e:
            check_cell(cfg, 3, 3, *args)
        assert e.value.field == field and e.value.code == f"{field}_out_of_range"
    with pytest.raises(engine.InvalidSizeError, match=r"key 2 is out of range: key must be 0 … 1 \(2 context"):
        check_cell(cfg, 3, 2, 0, 0, 2, cross=True)


@pytest.mark.parametrize(("cell", "pointer", "needle"), [
    ({"head": 4, "query": 0, "key": 0}, "/head", "head 4 is out of range: head must be 0 … 3 (4 heads)"),
    ({"head": -1, "query": 0, "key": 0}, "/head", "head must be 0 … 3"),
    ({"head": 0, "query": 3, "key": 0}, "/query", "query 3 is out of range: query must be 0 … 2 (3 tokens)"),
    ({"head": 0, "query": 0, "key": 7}, "/key", "key 7 is out of range: key must be 0 … 2 (3 tokens)"),
    ({"head": 0, "query": 0, "key": -3}, "/key", "key must be 0 … 2"),
])
def test_out_of_range_cells_are_422_naming_the_field(client, cell, pointer, needle):
    r = client.post("/explain", json={"sentence": "the cat sat", "num_heads": 4} | cell)
    assert r.status_code == 422 and r.content_type == "application/problem+json"
    doc = r.get_json()
    assert doc["type"] == "urn:attention-trace:problem:validation-error" and doc["instance"] == "/explain"
    assert [e["pointer"] for e in doc["errors"]] == [pointer]
    assert needle in doc["errors"][0]["message"] and doc["errors"][0]["type"] == f"{pointer[1:]}_out_of_range"


def test_keys_index_the_context_under_cross_attention(client):
    body = {"sentence": "the cat sat", "context_sentence": "le chat", "head": 0, "query": 2}
    r = client.post("/explain", json=body | {"key": 2})
    assert r.status_code == 422
    err = r.get_json()["errors"][0]
    assert err["pointer"] == "/key" and "0 … 1 (2 context tokens)" in err["message"]
    doc = client.post("/explain", json=body | {"key": 1}).get_json()
    assert (doc["query_token"], doc["key_token"], doc["key_source"]) == ("sat", "chat", "context_tokens")
    assert doc["key_tokens"] == ["le", "chat"] and doc["config"]["n_context_tokens"] == 2


@pytest.mark.parametrize(("body", "pointer", "kind"), [
    ({"sentence": "the cat sat", "query": 0, "key": 0}, "/head", "missing"),
    ({"sentence": "the cat sat", "head": True, "query": 0, "key": 0}, "/head", "int_type"),
    ({"sentence": "the cat sat", "head": 0, "query": "1", "key": 0}, "/query", "int_type"),
    ({"sentence": "the cat sat", "head": 0, "query": 0, "key": 0, "inject_bug": "no_scale"}, "/inject_bug",
     "explain_with_bug"),
    ({"sentence": "the cat sat", "num_heads": 5, "head": 0, "query": 0, "key": 0}, "/num_heads", "head_division"),
    ({"sentence": "the cat sat", "head": 0, "query": 0, "key": 0, "qeury": 1}, "/qeury", "extra_forbidden"),
])
def test_bad_bodies_are_problems(client, body, pointer, kind):
    r = client.post("/explain", json=body)
    assert r.status_code == 422 and r.content_type == "application/problem+json"
    assert (r.get_json()["errors"][0]["pointer"], r.get_json()["errors"][0]["type"]) == (pointer, kind)


def test_edge_handling_is_the_services(client):
    r = client.post("/explain", data="{}", content_type="text/plain")
    assert r.status_code == 415
    r = client.post("/explain", data="{", content_type="application/json")
    assert r.status_code == 400 and r.get_json()["type"].endswith("malformed-json")
    assert client.get("/explain").status_code == 405


def test_body_limit_applies(app_factory):
    small = app_factory(max_body_bytes=64).test_client()
    r = small.post("/explain", json={"sentence": "the cat sat " * 10, "head": 0, "query": 0, "key": 0})
    assert r.status_code == 413


# ------------------------------------------------------------------ the service's answer


def test_the_answer_is_the_engines_explanation(client):
    body = {"sentence": "the cat sat on the mat", "d_model": 16, "num_heads": 4, "num_kv_heads": 2,
            "positional_encoding": "rope", "causal": True, "window": 3, "seed": 7}
    doc = client.post("/explain", json=body | {"head": 3, "query": 4, "key": 2}).get_json()
    t = engine.trace(TraceConfig(d_model=16, num_heads=4, num_kv_heads=2, positional_encoding="rope", causal=True,
                                 window=3, seed=7), sentence=body["sentence"])
    cell = json.loads(json.dumps(explain_cell(t, 3, 4, 2)))
    assert {k: doc[k] for k in cell} == cell
    assert doc["schema_version"] and doc["engine_version"] == engine.ENGINE_VERSION
    assert doc["config"]["num_kv_heads"] == 2 and doc["config"]["window"] == 3
    assert doc["parameters_digest"] == t.parameters_digest
    assert doc["kv_head"] == 1 and doc["steps"][0]["stage"] == "q_rotated"
    # the same numbers /trace returns
    tr = client.post("/trace", json=body).get_json()["stages"]
    s = {step["id"]: step for step in doc["steps"]}
    assert s["score"]["value"] == tr["scores"]["values"][3][4][2]
    assert s["weight"]["value"] == tr["weights"]["values"][3][4][2]
    assert s["contributions"]["vector"] == tr["context"]["values"][3][4]
    assert s["products"]["q"] == tr["q_rotated"]["values"][3][4]
    assert s["products"]["k"] == tr["k_rotated"]["values"][1][2]  # K/V head ⌊3 / 2⌋ = 1


def test_precision_rounds_like_trace(client):
    body = {"sentence": "the cat sat", "num_heads": 2, "precision": 4}
    doc = client.post("/explain", json=body | {"head": 1, "query": 2, "key": 0}).get_json()
    tr = client.post("/trace", json=body).get_json()["stages"]
    s = {step["id"]: step for step in doc["steps"]}
    assert s["weight"]["value"] == tr["weights"]["values"][1][2][0]
    assert s["score"]["value"] == tr["scores"]["values"][1][2][0]
    assert doc["config"]["precision"] == 4


def test_decode_in_the_answer(client):
    body = {"sentence": "the cat sat", "causal": True, "decode": True, "head": 0, "query": 2, "key": 1}
    doc = client.post("/explain", json=body).get_json()
    assert doc["decode"]["in_cache"] and doc["decode"]["weight"] == pytest.approx(doc["steps"][6]["value"], abs=1e-12)
    assert "decode" not in client.post("/explain", json=body | {"decode": False}).get_json()


def test_local_client_explain():
    with LocalClient() as c:
        e = c.explain("the cat sat", head=0, query=1, key=2, d_model=24)
        assert (e.query_token, e.key_token, e.masked) == ("cat", "sat", False)
        assert e.step("weight")["value"] == c.trace(sentence="the cat sat").array("weights")[0, 1, 2]
        body = {"tokens": ["a", "b"], "causal": True}
        assert c.explain(body, head=0, query=0, key=1).masked is True
        with pytest.raises(KeyError, match="no step 'nope'"):
            e.step("nope")


# ------------------------------------------------------------------ the command line


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_prints_formula_equals_numbers(capsys):
    code, out, err = run_cli(capsys, "trace", "the cat sat", "--explain", "cat,sat", "--color", "never")
    assert code == 0, err
    with LocalClient() as c:
        e = c.explain("the cat sat", head=0, query=1, key=2)
    s = {step["id"]: step for step in e.steps}
    lines = {line.split()[0]: line for line in out.splitlines()[2:] if line.startswith("  ") and line.split()}
    assert out.startswith("\"the cat sat\": head 0, query 1 'cat', key 2 'sat'")
    assert lines["score"].endswith(f"= {s['score']['value']:.3f}   [scores]")
    sf, sv = s["scaled"]["divisor"], s["scaled"]["value"]
    assert f"= {s['score']['value']:.3f} / {sf:.3f} = {sv:.3f}   [scaled_scores]" in lines["scaled"]
    assert f"exp({sv:.3f} − {s['row_max']['value']:.3f}) = {s['exp']['value']:.3f}" in lines["exp"]
    w = s["weight"]["value"]
    assert f"= {s['exp']['value']:.3f} / {s['denominator']['value']:.3f} = {w:.3f} ({100 * w:.1f}%)" in lines["weight"]
    assert lines["products"].endswith("[q, k]") and "(24 products)" in lines["products"]
    assert "context[0, 1] = Σ = [" in out


def test_cli_json_and_indices(capsys):
    code, out, _ = run_cli(capsys, "the cat sat", "--explain", "1,2", "--heads", "2", "--head", "1", "--json")
    assert code == 0
    doc = json.loads(out)
    with LocalClient() as c:
        assert doc == c.explain("the cat sat", head=1, query=1, key=2, num_heads=2).raw


def test_cli_masked_cross_and_errors(capsys):
    code, out, _ = run_cli(capsys, "the cat sat", "--explain", "the,2", "--causal", "--color", "never")
    assert code == 0 and "masked: causal mask" in out and "exp(−∞) = 0 (masked)" in out
    code, out, _ = run_cli(capsys, "the cat sat", "--explain", "sat,chat", "--context", "le chat")
    assert code == 0 and "key 1 'chat'" in out and "keys from the context" in out
    code, _, err = run_cli(capsys, "the cat sat", "--explain", "sat,chien", "--context", "le chat")
    assert code == 2 and "--explain key 'chien' is not a token of the context" in err
    code, _, err = run_cli(capsys, "the cat sat", "--explain", "cat")
    assert code == 2 and "give QUERY,KEY" in err
    code, _, err = run_cli(capsys, "the cat sat", "--explain", "cat,sat", "--head", "2")
    assert code == 2 and "--head (/head): head 2 is out of range" in err
    # a comma is a token too: "a , b" has the tokens a, ",", b
    code, out, _ = run_cli(capsys, "a , b", "--explain", ",,b", "--json")
    assert code == 0 and (json.loads(out)["query_token"], json.loads(out)["key_token"]) == (",", "b")
