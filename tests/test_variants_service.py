"""The attention variants through HTTP: request fields, stages, config, decode, and their 422s.

The numbers themselves are checked against independent references in tests/test_variants.py
and against torch in tests/test_variants_torch.py; here the service must carry them exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine import TraceConfig

SENTENCE = "the cat sat on the mat"
CONTEXT = "le chat était assis sur le tapis"


def _trace(client, **body):
    resp = client.post("/trace", json={"sentence": SENTENCE, **body})
    assert resp.status_code == 200, resp.get_json()
    return resp.get_json()


def test_a_request_without_variants_is_answered_as_by_engine_1_0(client):
    doc = _trace(client, d_model=24, num_heads=4, causal=True)
    assert set(doc["config"]) == {"d_model", "num_heads", "seed", "scale", "causal", "positional_encoding",
                                  "include_parameters", "stages", "precision", "d_k", "scale_factor", "n_tokens",
                                  "n_parameters", "n_matrices"}
    assert "context_tokens" not in doc and "decode" not in doc
    assert all("axis_tokens" not in st for st in doc["stages"].values())
    assert list(doc["stages"]) == [s for s in engine.STAGE_IDS]


@pytest.mark.parametrize("pairing", ["rotate_half", "interleaved"])
def test_rope_shows_q_and_k_before_and_after_the_rotation(client, pairing):
    doc = _trace(client, d_model=16, num_heads=2, positional_encoding="rope", rope_pairing=pairing, rope_base=500000)
    assert doc["config"]["rope_base"] == 500000 and doc["config"]["rope_pairing"] == pairing
    assert "positional_encoding" not in doc["stages"]
    assert {"q_rotated", "k_rotated"} <= set(doc["stages"])
    t = engine.trace(TraceConfig(d_model=16, num_heads=2, positional_encoding="rope", rope_pairing=pairing,
                                 rope_base=500000.0), sentence=SENTENCE)
    for sid in ("input", "q", "q_rotated", "k_rotated", "scores", "weights", "output"):
        assert np.array_equal(np.array(doc["stages"][sid]["values"]), t.stages[sid].values), sid
    q, q_rot = np.array(doc["stages"]["q"]["values"]), np.array(doc["stages"]["q_rotated"]["values"])
    assert np.array_equal(q[:, 0], q_rot[:, 0])  # position 0 turns by 0
    assert np.allclose(np.linalg.norm(q, axis=-1), np.linalg.norm(q_rot, axis=-1))  # a rotation keeps lengths


def test_grouped_query_attention_reports_its_sharing_and_cache(client):
    doc = _trace(client, d_model=32, num_heads=8, num_kv_heads=2, include_parameters=True)
    cfg = doc["config"]
    assert cfg["num_kv_heads"] == 2 and cfg["query_heads_of_kv_head"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    d_k = 4
    assert cfg["kv_cache_bytes_per_token"] == {"float16": 2 * 2 * d_k * 2, "float32": 2 * 2 * d_k * 4,
                                               "float64": 2 * 2 * d_k * 8}
    assert cfg["n_matrices"] == 8 + 2 * 2 + 1
    assert cfg["n_parameters"] == 2 * 32 * 32 + 2 * 2 * d_k * 32
    assert doc["stages"]["k"]["axes"] == ["kv_head", "token", "d_k"] and doc["stages"]["k"]["shape"] == [2, 6, 4]
    assert np.array(doc["parameters"]["W_K"]).shape == (2, d_k, 32)
    # MQA and MHA share W_Q and W_O at the same seed: only K and V change.
    mha = _trace(client, d_model=32, num_heads=8, include_parameters=True)
    assert mha["parameters"]["W_Q"] == doc["parameters"]["W_Q"] and mha["parameters"]["W_O"] == doc["parameters"]["W_O"]


def test_a_sliding_window_masks_keys_too_far_back(client):
    doc = _trace(client, d_model=8, num_heads=2, causal=True, window=2)
    masked = doc["stages"]["masked_scores"]["values"]
    n = 6
    for i in range(n):
        for j in range(n):
            assert (masked[0][i][j] is None) == (j > i or i - j >= 2), (i, j)
    assert doc["config"]["window"] == 2


def test_cross_attention_labels_each_axis_with_its_token_list(client):
    doc = _trace(client, d_model=16, num_heads=2, context_sentence=CONTEXT)
    assert [t["text"] for t in doc["context_tokens"]] == CONTEXT.split()
    scores = doc["stages"]["scores"]
    assert scores["axes"] == ["head", "query", "key"] and scores["shape"] == [2, 6, 7]
    assert scores["axis_tokens"] == [None, "tokens", "context_tokens"]
    assert doc["stages"]["k"]["axis_tokens"] == [None, "context_tokens", None]
    assert doc["config"]["n_context_tokens"] == 7
    assert np.allclose(np.array(doc["stages"]["weights"]["values"]).sum(-1), 1.0)


def test_check_takes_a_cross_attention_trace_whole_with_its_context_tokens(client):
    """/check compares context_tokens as text, as it does tokens (it answered 422 "'le' is not a number"
    to a grader who sent back every stage of a cross-attention trace)."""
    config = {"sentence": SENTENCE, "d_model": 16, "num_heads": 2, "context_sentence": CONTEXT}
    stages = {sid: st["values"] for sid, st in _trace(client, **config)["stages"].items()}
    assert "context_tokens" in stages
    doc = client.post("/check", json={**config, "submission": stages}).get_json()
    assert doc["passed"] is True and doc["stages"]["context_tokens"]["message"] == "the context tokens match"

    wrong = {**stages, "context_tokens": ["le", "chien", *stages["context_tokens"][2:]]}
    doc = client.post("/check", json={**config, "submission": wrong}).get_json()
    assert doc["passed"] is False and doc["first_wrong_stage"] == "context_tokens"
    entry = doc["stages"]["context_tokens"]
    assert entry["mismatches"] == 1 and entry["first_mismatch"] == {"index": [1], "expected": "chat",
                                                                      "received": "chien"}
    assert entry["message"].startswith("the context tokens differ")
    assert doc["diagnosis"]["bug"] is None and doc["diagnosis"]["hints"] == []

    resp = client.post("/check", json={**config, "submission": {**stages, "context_tokens": ["le", 5]}})
    assert resp.status_code == 422
    assert resp.get_json()["errors"][0]["message"] == "submission.context_tokens must be a list of strings"


def test_decode_steps_equal_the_full_traces_rows(client):
    doc = _trace(client, d_model=16, num_heads=4, num_kv_heads=2, causal=True, positional_encoding="rope",
                 decode=True)
    weights, output = np.array(doc["stages"]["weights"]["values"]), np.array(doc["stages"]["output"]["values"])
    assert [s["position"] for s in doc["decode"]] == list(range(6))
    for step in doc["decode"]:
        t = step["position"]
        assert step["cache_positions"] == list(range(t + 1))
        assert np.array(step["k_cache"]).shape == (2, t + 1, 4)  # the cache grows by one row per step
        np.testing.assert_allclose(step["weights"], weights[:, t, : t + 1], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(step["output"], output[t], rtol=1e-12, atol=1e-14)
    assert doc["config"]["decode"] is True


@pytest.mark.parametrize("body, pointer, code", [
    ({"num_heads": 4, "d_model": 16, "num_kv_heads": 3}, "/num_kv_heads", "kv_head_division"),
    ({"num_heads": 8, "d_model": 24, "positional_encoding": "rope"}, "/positional_encoding", "rope_odd_d_k"),
    ({"window": 2}, "/window", "window_needs_causal"),
    ({"context_sentence": CONTEXT, "causal": True}, "/causal", "cross_attention_causal"),
    ({"context_sentence": CONTEXT, "positional_encoding": "rope"}, "/positional_encoding", "cross_attention_rope"),
    ({"decode": True}, "/decode", "decode_needs_causal"),
    ({"decode": True, "causal": True, "inject_bug": "no_scale"}, "/decode", "decode_with_bug"),
    ({"stages": ["q_rotated"]}, "/stages", "stage_needs_rope"),
    ({"context_sentence": CONTEXT, "context_tokens": ["a"]}, "", "context_sentence_xor_tokens"),
    ({"context_input": [[0.0] * 24]}, "/context_input", "context_input_without_context"),
    ({"rope_base": 1}, "/rope_base", "invalid_size"),
])
def test_variant_conflicts_are_422s_that_say_what_to_fix(client, body, pointer, code):
    resp = client.post("/trace", json={"sentence": SENTENCE, **body})
    assert resp.status_code == 422 and resp.mimetype == "application/problem+json"
    errors = resp.get_json()["errors"]
    assert errors[0]["pointer"] == pointer and errors[0]["type"] == code, errors


def test_a_large_decode_is_bounded_before_any_array_exists(app_factory):
    client = app_factory(max_trace_values=20_000).test_client()
    resp = client.post("/trace", json={"tokens": ["a"] * 40, "d_model": 32, "num_heads": 4, "causal": True,
                                       "decode": True})
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["type"] == "trace_too_large"


def test_check_grades_a_variant_and_names_a_bug(client):
    body = {"sentence": SENTENCE, "d_model": 16, "num_heads": 4, "num_kv_heads": 2, "causal": True, "window": 3}
    ref = client.post("/trace", json=body).get_json()["stages"]
    good = {sid: ref[sid]["values"] for sid in ("k", "scores", "masked_scores", "weights", "output")}
    doc = client.post("/check", json=body | {"submission": good}).get_json()
    assert doc["passed"], doc["message"]
    wrong = client.post("/trace", json=body | {"inject_bug": "no_scale"}).get_json()["stages"]
    bad = {sid: wrong[sid]["values"] for sid in ("scores", "scaled_scores", "weights")}
    doc = client.post("/check", json=body | {"submission": bad}).get_json()
    assert doc["diagnosis"]["bug"] == "no_scale"


@pytest.mark.parametrize("causal", [False, True])
def test_torch_layout_loads_into_nn_multihead_attention(client, causal):
    import torch  # a test dependency (requirements-dev.txt): missing, it fails here, never skips
    body = {"sentence": SENTENCE, "d_model": 16, "num_heads": 4, "causal": causal, "include_parameters": True,
            "parameters_layout": "torch"}
    doc = _trace(client, **{k: v for k, v in body.items() if k != "sentence"})
    assert doc["config"]["parameters_layout"] == "torch" and set(doc["parameters"]) == {"in_proj_weight",
                                                                                        "out_proj.weight"}
    mha = torch.nn.MultiheadAttention(16, 4, bias=False, batch_first=True, dtype=torch.float64)
    state = {k: torch.tensor(v, dtype=torch.float64) for k, v in doc["parameters"].items()}
    mha.load_state_dict(state)
    x = torch.tensor(doc["stages"]["input"]["values"], dtype=torch.float64)[None]
    mask = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1) if causal else None
    with torch.no_grad():
        out, weights = mha(x, x, x, attn_mask=mask, average_attn_weights=False)
    np.testing.assert_allclose(out[0].numpy(), np.array(doc["stages"]["output"]["values"]), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weights[0].numpy(), np.array(doc["stages"]["weights"]["values"]), rtol=1e-10,
                               atol=1e-12)


def test_torch_layout_needs_the_weights_and_one_kv_head_per_query_head(client):
    for body, code in (({"parameters_layout": "torch"}, "layout_needs_parameters"),
                       ({"parameters_layout": "torch", "include_parameters": True, "num_heads": 2, "num_kv_heads": 1},
                        "layout_needs_all_kv_heads")):
        resp = client.post("/trace", json={"sentence": SENTENCE, **body})
        assert resp.status_code == 422
        assert resp.get_json()["errors"][0] == {**resp.get_json()["errors"][0], "pointer": "/parameters_layout",
                                                "type": code}
