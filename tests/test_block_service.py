"""A stack of Transformer blocks through HTTP: /trace's block fields (and /trace/html, /trace/batch, /export,
npz answers), their 422s, and the budgets of a stack. Every answer is checked against openapi.yaml by the client
fixture. The engine's numbers themselves are checked against torch and transformers in tests/test_block*.py;
here the service must carry them exactly."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

import engine
from engine import TraceConfig
from engine.layer import ALL_STAGE_IDS, BLOCK_STAGE_IDS
from service import budget
from service.routes.trace import TraceRequest

BASE = {"sentence": "the cat sat on", "d_model": 8, "num_heads": 2}


def _ok(resp):
    assert resp.status_code == 200, resp.get_data(as_text=True)[:800]
    return resp.get_json()


def _numbers(doc) -> int:
    """How many numbers a /trace answer holds: every stage's (not the tokens' texts), the stats, the weights."""
    def count(v) -> int:
        if isinstance(v, list):
            return sum(count(x) for x in v)
        return 1 if isinstance(v, (int, float)) or v is None else 0  # null: a masked score, still counted

    stages = sum(count(st["values"]) for sid, st in doc["stages"].items() if sid != "tokens")
    stats = count(doc["stats"]["entropy"]) + count(doc["stats"]["max_weight"])
    return stages + stats + sum(count(a) for a in doc.get("parameters", {}).values())


def _stack_weights(d_model: int, num_heads: int, d_ff: int, num_layers: int, *, layer_norm: bool, gated: bool,
                   pre_norm: bool) -> int:
    """A stack's weights, counted from the architecture (not from the engine): per layer W_Q, W_K, W_V, W_O
    (4·d_model² without shared K/V heads), the FFN's 2 (SwiGLU 3) matrices and two norms' γ (and β); then the
    final norm's in pre-norm."""
    norm = d_model * (2 if layer_norm else 1)
    layer = 4 * d_model * d_model + (3 if gated else 2) * d_ff * d_model + 2 * norm
    return num_layers * layer + (norm if pre_norm else 0)


def test_a_block_field_traces_the_stack_with_every_layer_on_a_leading_axis(client):
    doc = _ok(client.post("/trace", json=BASE | {"block": "llama", "num_layers": 2, "num_kv_heads": 1, "d_ff": 16,
                                                  "include_parameters": True}))
    cfg = doc["config"]
    assert {k: cfg[k] for k in ("num_layers", "block", "norm", "norm_position", "ffn", "d_ff", "norm_eps",
                                "norm_weights", "causal", "positional_encoding")} == {
        "num_layers": 2, "block": "llama", "norm": "rms_norm", "norm_position": "pre", "ffn": "swiglu", "d_ff": 16,
        "norm_eps": 1e-6, "norm_weights": "unit", "causal": True, "positional_encoding": "rope"}
    t = engine.trace(TraceConfig.preset_config("llama", d_model=8, num_heads=2, num_layers=2, num_kv_heads=1,
                                               d_ff=16), sentence=BASE["sentence"])
    assert list(doc["stages"]) == list(t.stages)
    assert {"norm1_mean_square", "ffn_up", "ffn_gated", "residual_stream", "final_norm"} <= set(doc["stages"])
    for sid, st in t.stages.items():
        out = doc["stages"][sid]
        assert out["axes"] == list(st.axes) and out["shape"] == list(st.shape), sid
        if sid not in ("tokens", "masked_scores"):
            assert np.array_equal(np.array(out["values"]), st.values), sid
    assert doc["stages"]["weights"]["axes"] == ["layer", "head", "query", "key"]
    assert doc["stages"]["residual_stream"]["shape"] == [3, 4, 8]  # the input, then each layer's output
    assert doc["stats"]["axes"] == ["layer", "head", "query"] and np.array(doc["stats"]["entropy"]).shape == (2, 2, 4)
    assert doc["parameters_digest"] == t.parameters_digest
    weights = _stack_weights(8, 2, 16, 2, layer_norm=False, gated=True, pre_norm=True) - 2 * 2 * (8 * 8 - 8 * 4)
    assert cfg["n_parameters"] == weights  # one K/V head: W_K and W_V are [1, d_k, d_model], not [2, …]
    p = doc["parameters"]
    assert np.array(p["W_3"]).shape == (2, 16, 8) and np.array(p["W_Q"]).shape == (2, 2, 4, 8)
    assert np.array(p["W_K"]).shape == (2, 1, 4, 8)
    assert "norm1_beta" not in p and np.array(p["final_norm_gamma"]).shape == (8,)
    assert sum(np.array(a).size for a in p.values()) == cfg["n_parameters"]


def test_num_layers_1_without_a_block_field_is_the_single_layer_unchanged(client):
    plain = _ok(client.post("/trace", json=BASE))
    assert _ok(client.post("/trace", json=BASE | {"num_layers": 1})) == plain
    assert not {"num_layers", "block", "norm", "ffn"} & set(plain["config"])
    assert plain["stats"]["axes"] == ["head", "query"] and plain["stages"]["weights"]["axes"][0] == "head"


def test_a_preset_sets_what_the_request_leaves_out_and_no_more(client):
    cfg = _ok(client.post("/trace", json=BASE | {"block": "gpt2", "causal": False}))["config"]
    assert cfg["causal"] is False and cfg["ffn"] == "gelu_tanh" and cfg["d_ff"] == 32
    cfg = _ok(client.post("/trace", json=BASE | {"block": "llama", "positional_encoding": "sinusoidal",
                                                 "ffn": "gelu", "d_ff": 8}))["config"]
    assert (cfg["positional_encoding"], cfg["ffn"], cfg["norm"], cfg["causal"]) == ("sinusoidal", "gelu",
                                                                                     "rms_norm", True)
    cfg = _ok(client.post("/trace", json=BASE | {"norm": "rms_norm"}))["config"]
    assert (cfg["block"], cfg["norm_position"], cfg["ffn"], cfg["causal"]) == (None, "post", "relu", False)


def test_a_custom_post_norm_stack_carries_the_engines_numbers(client):
    body = BASE | {"norm_position": "post", "ffn": "gelu_tanh", "num_layers": 3, "causal": True,
                   "norm_weights": "seeded", "norm_eps": 1e-3}
    doc = _ok(client.post("/trace", json=body))
    t = engine.trace(TraceConfig(d_model=8, num_heads=2, causal=True, num_layers=3, norm_position="post",
                                 ffn="gelu_tanh", norm_weights="seeded", norm_eps=1e-3), sentence=BASE["sentence"])
    assert doc["config"]["norm_eps"] == 1e-3 and doc["config"]["block"] is None
    assert "final_norm" not in doc["stages"]  # post-norm has none
    for sid in ("norm1_variance", "residual1", "ffn_activation", "residual_stream"):
        assert np.array_equal(np.array(doc["stages"][sid]["values"]), t.stages[sid].values), sid
    # post-norm: each layer's output is its second norm, and the next layer's input
    stream = np.array(doc["stages"]["residual_stream"]["values"])
    assert np.array_equal(stream[1:], np.array(doc["stages"]["norm2"]["values"]))


def test_stages_and_precision_apply_to_a_stack(client):
    doc = _ok(client.post("/trace", json=BASE | {"block": "gpt2", "num_layers": 2,
                                                  "stages": ["weights", "norm1_variance", "final_norm"],
                                                  "precision": 3}))
    assert list(doc["stages"]) == ["norm1_variance", "weights", "final_norm"]  # walkthrough order
    w = np.array(doc["stages"]["weights"]["values"])
    assert w.shape == (2, 2, 4, 4) and np.array_equal(w, np.round(w, 3))
    every = list(BLOCK_STAGE_IDS) + list(ALL_STAGE_IDS)  # more than one layer's 20 ids may be named in a stack
    resp = client.post("/trace", json=BASE | {"block": "gpt2", "stages": every})
    assert resp.status_code == 422 and {e["type"] for e in resp.get_json()["errors"]} >= {"stage_needs_block"}


def test_an_unknown_stage_lists_the_block_stages_only_to_a_stack(client):
    plain = client.post("/trace", json=BASE | {"stages": ["attention"]}).get_json()["errors"][0]["message"]
    stack = client.post("/trace", json=BASE | {"block": "gpt2", "stages": ["attention"]}).get_json()
    assert "'output'" in plain and "norm1" not in plain
    assert stack["errors"][0]["pointer"] == "/stages/0" and "'norm1'" in stack["errors"][0]["message"]
    assert "'final_norm'" in stack["errors"][0]["message"]


def test_npz_answers_a_stack_with_exact_arrays(client):
    body = BASE | {"block": "vaswani2017", "num_layers": 2, "norm_weights": "seeded", "include_parameters": True}
    js = _ok(client.post("/trace", json=body))
    resp = client.post("/trace", json=body, headers={"Accept": "application/x-npz"})
    assert resp.status_code == 200 and resp.mimetype == "application/x-npz"
    arrays = np.load(io.BytesIO(resp.get_data()))
    meta = json.loads(zipfile.ZipFile(io.BytesIO(resp.get_data())).read("metadata.json"))
    assert meta["config"] == js["config"]
    for sid in ("norm1_variance", "ffn_activation", "residual_stream"):
        assert np.array_equal(arrays[f"stages/{sid}/values"], np.array(js["stages"][sid]["values"])), sid
    assert np.array_equal(arrays["parameters/W_1"], np.array(js["parameters"]["W_1"]))


def test_a_batch_traces_stacks_and_single_layers_side_by_side(client):
    doc = _ok(client.post("/trace/batch", json={"items": [BASE | {"block": "gpt2", "num_layers": 2}, BASE,
                                                          BASE | {"num_layers": 2}]}))
    first, second, third = doc["results"]
    assert first["status"] == 200 and first["result"]["config"]["num_layers"] == 2
    assert second["status"] == 200 and "num_layers" not in second["result"]["config"]
    assert third["status"] == 422 and third["problem"]["errors"][0]["pointer"] == "/items/2/num_layers"


def test_the_page_and_the_exports_take_a_stack(client):
    body = BASE | {"block": "gpt2", "num_layers": 2}
    page = client.post("/trace/html", json=body)
    assert page.status_code == 200 and page.mimetype == "text/html"
    assert b'"num_layers":2' in page.get_data() and b"norm1_variance" in page.get_data()
    te = _ok(client.post("/export", json=body | {"format": "transformer-explainer"}))["data"]
    assert "block_1_attn_head_1_attn_softmax" in te
    resp = client.post("/export", json=body | {"format": "circuitsvis"})
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["type"] == "export_needs_one_layer"


@pytest.mark.parametrize("body, errors", [
    ({"num_layers": 2}, [("/num_layers", "layers_need_block")]),
    ({"block": "bert", "d_ff": 0, "norm_eps": 2}, [("/block", "invalid_size"), ("/d_ff", "invalid_size"),
                                                   ("/norm_eps", "invalid_size")]),
    ({"block": "gpt2", "num_layers": True}, [("/num_layers", "invalid_size")]),
    ({"block": "gpt2", "num_layers": 97}, [("/num_layers", "invalid_size")]),
    ({"norm": "batch_norm", "norm_position": "middle", "ffn": "tanh", "norm_weights": "random"},
     [("/norm", "invalid_size"), ("/norm_position", "invalid_size"), ("/ffn", "invalid_size"),
      ("/norm_weights", "invalid_size")]),
    ({"ffn": "gelu", "decode": True, "causal": True}, [("/decode", "decode_block")]),
    ({"block": "vaswani2017", "context_sentence": "le chat"}, [("/context_sentence", "block_cross_attention")]),
    ({"block": "gpt2", "include_parameters": True, "parameters_layout": "torch"},
     [("/parameters_layout", "layout_needs_one_layer")]),
    ({"block": "gpt2", "tokens": ["a", "b"], "sentence": None, "d_model": 2, "num_heads": 1,
      "parameters": {"W_Q": [[[1, 0]]], "W_K": [[[1, 0]]], "W_V": [[[1, 0]]], "W_O": [[1, 0], [0, 1]]}},
     [("/parameters", "block_parameters")]),
    ({"stages": ["norm1"]}, [("/stages", "stage_needs_block")]),
    ({"block": "llama", "stages": ["norm1_variance"]}, [("/stages", "stage_needs_block")]),
    ({"block": "gpt2", "d_model": 512, "num_heads": 8, "num_layers": 40}, [("", "trace_too_large")]),
])
def test_each_block_rule_is_a_422_entry_with_its_pointer(client, body, errors):
    resp = client.post("/trace", json={k: v for k, v in (BASE | body).items() if v is not None})
    assert resp.status_code == 422, resp.get_json()
    assert resp.mimetype == "application/problem+json"
    got = [(e["pointer"], e["type"]) for e in resp.get_json()["errors"]]
    assert got == errors, got


def test_a_rule_answers_the_engines_message_word_for_word(client):
    resp = client.post("/trace", json=BASE | {"norm_eps": -1})
    with pytest.raises(engine.EngineError) as e:
        TraceConfig(norm_eps=-1)
    assert resp.get_json()["errors"] == [{"pointer": "/norm_eps", "type": "invalid_size", "message": e.value.message}]


def test_a_stack_over_the_budget_is_refused_before_any_work_and_one_just_under_is_answered(app_factory,
                                                                                          monkeypatch):
    """The budget is max_trace_values + 4·max_d_model²; a stack's numbers and every layer's weights together
    must fit in it. Here the limit is set so that one stack costs exactly the budget, then one unit over it."""
    body = BASE | {"block": "gpt2", "num_layers": 3, "d_model": 16, "include_parameters": True}
    weights = _stack_weights(16, 2, 64, 3, layer_norm=True, gated=False, pre_norm=True)
    doc = _ok(app_factory().test_client().post("/trace", json=body))
    values = _numbers(doc)  # the weights are returned too: counted once as numbers, once as generated
    assert doc["config"]["n_parameters"] == weights
    cost = values + weights
    max_d_model = 16  # the budget's weight term: 4·16² = 1024, smaller than the stack's weights
    exact = app_factory(max_d_model=max_d_model, max_trace_values=cost - 4 * max_d_model ** 2)
    assert _ok(exact.test_client().post("/trace", json=body))["config"]["num_layers"] == 3

    over = app_factory(max_d_model=max_d_model, max_trace_values=cost - 4 * max_d_model ** 2 - 1)
    calls = []
    real_trace = engine.trace
    monkeypatch.setattr(engine, "trace", lambda *a, **k: calls.append(1) or real_trace(*a, **k))
    resp = over.test_client().post("/trace", json=body)
    assert resp.status_code == 422 and resp.mimetype == "application/problem+json"
    problem = resp.get_json()
    assert [(e["pointer"], e["type"]) for e in problem["errors"]] == [("", "trace_too_large")]
    assert f"generate {weights} weights" in problem["detail"] and f"{cost} in all" in problem["detail"]
    assert calls == []  # refused before anything was traced
    # the single layer of the same size is far within that budget
    _ok(over.test_client().post("/trace", json={k: v for k, v in body.items() if k not in ("block", "num_layers")}))


def test_the_request_cost_counts_every_layers_weights_once_per_stack(app):
    four = TraceRequest.model_validate(BASE | {"block": "gpt2", "num_layers": 4})
    two = TraceRequest.model_validate(BASE | {"block": "gpt2", "num_layers": 2})
    plain = TraceRequest.model_validate(BASE)
    weights = _stack_weights(8, 2, 32, 4, layer_norm=True, gated=False, pre_norm=True)
    assert budget.cost("/trace", [four]) == budget.ITEM_COST + four._value_count + weights
    # the same stack twice in a batch generates its weights once; another depth is another set
    assert budget.cost("/trace", [four, four]) == 2 * (budget.ITEM_COST + four._value_count) + weights
    assert budget.cost("/trace", [four, two]) == (budget.cost("/trace", [four]) + budget.cost("/trace", [two]))
    assert budget.cost("/trace", [plain]) == budget.ITEM_COST + plain._value_count + 4 * 8 * 8


def test_a_batch_of_stacks_over_the_budget_is_refused_as_a_whole(app_factory):
    items = [BASE | {"block": "gpt2", "num_layers": 3, "d_model": 16, "seed": s} for s in range(3)]
    weights = _stack_weights(16, 2, 64, 3, layer_norm=True, gated=False, pre_norm=True)
    # one stack fits (an item's fixed cost, its numbers, its weights), three do not
    limits = app_factory(max_d_model=16, max_trace_values=budget.ITEM_COST + 3 * weights)
    resp = limits.test_client().post("/trace/batch", json={"items": items})
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["type"] == "batch_too_costly"
    _ok(limits.test_client().post("/trace/batch", json={"items": items[:1]}))
