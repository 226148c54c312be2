"""A stack of blocks, explained cell by cell (a norm's value, an FFN unit, an attention cell in any layer) and
exported to the viewers: bertviz's model_view gets every layer, Transformer Explainer one block per layer."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

import engine
from engine import TraceConfig
from engine.errors import InvalidSizeError, VariantConflictError
from engine.explain import explain_cell, explain_ffn_cell, explain_norm_cell
from engine.export import bertviz, circuitsvis, export, export_value_count, transformer_explainer

POST = TraceConfig(d_model=8, num_heads=2, block="vaswani2017", num_layers=2, norm_weights="seeded")
GPT2 = TraceConfig.preset_config("gpt2", d_model=8, num_heads=2, num_layers=3, norm_weights="seeded")
LLAMA = TraceConfig.preset_config("llama", d_model=8, num_heads=2, num_kv_heads=1, d_ff=16, num_layers=2)
SENTENCE = "the cat sat on"


@pytest.mark.parametrize("config", [POST, GPT2, LLAMA], ids=["post", "gpt2", "llama"])
def test_a_norm_cell_walks_from_the_statistics_to_the_stage_value(config):
    t = engine.trace(config, sentence=SENTENCE)
    norms = ("norm1", "norm2") + (("final_norm",) if config.final_norm else ())
    for which in norms:
        for layer in range(config.num_layers if which != "final_norm" else 1):
            e = explain_norm_cell(t, which, 2, 5, layer=layer)
            steps = {s["id"]: s for s in e["steps"]}
            index = (2,) if which == "final_norm" else (layer, 2)
            assert steps["scaled"]["value"] == t.stages[which].values[(*index, 5)]
            assert math.isclose(steps["scaled"]["recomputed"], steps["scaled"]["value"], rel_tol=1e-12,
                                abs_tol=1e-14)
            stat = "mean" if config.norm_kind == "layer_norm" else "mean_square"
            assert steps[stat]["value"] == t.stages[f"{which}_{stat}"].values[index]
            assert math.isclose(steps[stat]["recomputed"], steps[stat]["value"], rel_tol=1e-12, abs_tol=1e-14)
            # the input it shows is the stage the norm reads
            src = t.stages[e["source_stage"]].values[tuple(e["source_index"])]
            x = steps[stat]["values"] if stat == "mean" else None
            if x is not None:
                assert x == src.tolist()
            assert e["steps"][-1]["gamma"] == (t.parameters.final_norm.gamma if which == "final_norm"
                                               else getattr(t.parameters.layers[layer], which).gamma)[5]


def test_the_norm_reads_the_stream_in_pre_norm_and_the_sum_in_post_norm():
    pre = explain_norm_cell(engine.trace(GPT2, sentence=SENTENCE), "norm1", 0, 0, layer=2)
    assert (pre["source_stage"], pre["source_index"]) == ("residual_stream", [2, 0])
    post = explain_norm_cell(engine.trace(POST, sentence=SENTENCE), "norm1", 0, 0, layer=1)
    assert (post["source_stage"], post["source_index"]) == ("residual1", [1, 0])
    final = explain_norm_cell(engine.trace(GPT2, sentence=SENTENCE), "final_norm", 1, 0)
    assert (final["source_stage"], final["source_index"]) == ("residual_stream", [3, 1]) and "layer" not in final


@pytest.mark.parametrize("config", [POST, GPT2, LLAMA, TraceConfig(d_model=8, num_heads=2, ffn="gelu")],
                         ids=["relu", "gelu_tanh", "swiglu", "gelu"])
def test_an_ffn_cell_walks_from_the_products_to_the_units_share_of_the_output(config):
    t = engine.trace(config, sentence=SENTENCE)
    layer = config.num_layers - 1
    e = explain_ffn_cell(t, 1, 3, layer=layer)
    steps = {s["id"]: s for s in e["steps"]}
    cell = (layer, 1, 3)
    assert steps["pre_activation"]["value"] == t.stages["ffn_pre_activation"].values[cell]
    assert steps["activation"]["value"] == t.stages["ffn_activation"].values[cell]
    for sid in ("pre_activation", "activation") + (("up", "gated") if config.gated else ()):
        assert math.isclose(steps[sid]["recomputed"], steps[sid]["value"], rel_tol=1e-12, abs_tol=1e-14), sid
    # the units' shares add up to the output row
    total = sum(np.array(explain_ffn_cell(t, 1, u, layer=layer)["steps"][-1]["values"]) for u in range(config.ff_width))
    np.testing.assert_allclose(total, t.stages["ffn_output"].values[layer, 1], rtol=1e-12, atol=1e-13)


def test_an_attention_cell_of_any_layer_is_that_layers_numbers():
    t = engine.trace(GPT2, sentence=SENTENCE)
    for layer in range(3):
        e = explain_cell(t, 1, 3, 2, layer=layer)
        assert e["layer"] == layer
        weight = next(s for s in e["steps"] if s["id"] == "weight")
        assert weight["value"] == t.stages["weights"].values[layer, 1, 3, 2]
    masked = explain_cell(t, 0, 1, 2, layer=1)
    assert masked["masked"] and masked["steps"][-2]["value"] == 0.0
    assert "layer" not in explain_cell(engine.trace(TraceConfig(d_model=8, num_heads=2), sentence="a b"), 0, 0, 1)


@pytest.mark.parametrize("call, code", [
    (lambda t: explain_norm_cell(t, "norm3", 0, 0), "norm_not_in_block"),
    (lambda t: explain_norm_cell(t, "norm1", 0, 8), "feature_out_of_range"),
    (lambda t: explain_norm_cell(t, "norm1", 4, 0), "token_out_of_range"),
    (lambda t: explain_ffn_cell(t, 0, 32), "unit_out_of_range"),
    (lambda t: explain_ffn_cell(t, 0, 0, layer=2), "layer_out_of_range"),
    (lambda t: explain_cell(t, 0, 0, 0, layer=-1), "layer_out_of_range"),
])
def test_a_cell_out_of_range_is_refused_with_its_field(call, code):
    with pytest.raises(InvalidSizeError) as e:
        call(engine.trace(POST, sentence=SENTENCE))
    assert e.value.code == code
    with pytest.raises(InvalidSizeError, match="this stack's norms"):  # a post-norm stack has no final norm
        explain_norm_cell(engine.trace(POST, sentence=SENTENCE), "final_norm", 0, 0)
    with pytest.raises(VariantConflictError):
        explain_ffn_cell(engine.trace(TraceConfig(d_model=8, num_heads=2), sentence="a"), 0, 0)


def test_bertviz_gets_every_layer_and_transformer_explainer_one_block_per_layer():
    t = engine.trace(GPT2, sentence=SENTENCE)
    w = t.stages["weights"].values  # [layer, head, query, key]
    doc = bertviz(t)
    assert len(doc["attention"]) == 3 and all(np.array_equal(a[0], w[i]) for i, a in enumerate(doc["attention"]))
    te = transformer_explainer(t)
    assert {k.split("_attn")[0] for k in te} == {"block_0", "block_1", "block_2"}
    assert te["block_2_attn_head_1_attn_softmax"]["data"].tolist() == w[2, 1].tolist()
    assert te["block_1_attn_head_0_attn_masked"]["data"][0][1] is None  # masked: null, never -inf
    assert export_value_count("bertviz", GPT2, 4) == 3 * 2 * 4 * 4
    with pytest.raises(VariantConflictError) as e:
        export(t, "circuitsvis")
    assert e.value.code == "export_needs_one_layer"
    one = engine.trace(TraceConfig(d_model=8, num_heads=2, block="gpt2"), sentence=SENTENCE)
    assert np.array_equal(circuitsvis(one)["attention"], one.stages["weights"].values[0])


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # bertviz reads its JavaScript without closing the file
def test_bertviz_model_view_renders_every_layer():
    torch = pytest.importorskip("torch")
    from bertviz import model_view

    t = engine.trace(GPT2, sentence=SENTENCE)
    doc = bertviz(t)
    attention = tuple(torch.from_numpy(a) for a in doc["attention"])
    html = model_view(attention, doc["tokens"], html_action="return").data
    params = json.loads(re.search(r"const params = (\{.*?\}); // HACK", html).group(1))
    (view,) = params["attention"]
    assert np.array_equal(np.array(view["attn"]), t.stages["weights"].values)  # [layer, head, query, key]
    assert view["left_text"] == [tok.text for tok in t.tokens]
