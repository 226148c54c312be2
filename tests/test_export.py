"""Exports to the attention viewers: engine/export.py, POST /export, attention_trace.export, the CLI.

The numbers of every export must be the trace's own, bit for bit. bertviz and
CircuitsVis are installed from PyPI (requirements-dev.txt), so their own
Python APIs render our exports to HTML here and the numbers are read back out
of that HTML. Transformer Explainer has no Python package: its format is
checked against its source (github.com/poloclub/transformer-explainer at
6e2ec372b1d7c73d3cf82704ec0b878522fc4085):

* src/utils/model/model.py lines 84–100: attn = q @ kᵀ, attn_scaled = attn / √d_k,
  attn_masked = masked_fill(-inf), attn_softmax, attn_dropout, stored per head as
  ``head_{i}`` → the ONNX outputs ``block_{i}_attn_head_{j}_{suffix}``
  (src/utils/model/export_to_onnx.py lines 121–125);
* src/types/global.d.ts line 53: ``outputs: Record<string, {data: number[][]; dims: number[]; size: number}>``;
* src/components/AttentionMatrix.svelte lines 35–43: the matrices it draws are
  ``_attn``, ``_attn_masked`` and ``_attn_dropout`` (the softmax after dropout);
* src/constants/examples/ex0.js line 12555 on: masked cells are ``null`` in its JSON.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import engine
from attention_trace import LocalClient
from attention_trace.cli import main as cli_main
from attention_trace.export import bertviz_kwargs, to_bertviz, to_circuitsvis
from engine import TraceConfig, VariantConflictError
from engine.export import EXPORT_FORMATS, TE_SUFFIXES, bertviz, circuitsvis, export, transformer_explainer

SENTENCE = "the cat sat on the mat"
CONTEXT = "le chat était assis"
TEXTS = ["the", "cat", "sat", "on", "the", "mat"]


def _strict_json(body: bytes) -> dict:
    """Parse JSON refusing NaN and ±Infinity (Python's json accepts them by default)."""
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the JSON")
    return json.loads(body, parse_constant=refuse)


def _trace(**config) -> engine.Trace:
    context = config.pop("context_sentence", None)
    return engine.trace(TraceConfig(**config), sentence=SENTENCE, context_sentence=context)


CONFIGS = [
    pytest.param({"d_model": 24, "num_heads": 4}, id="bidirectional"),
    pytest.param({"d_model": 24, "num_heads": 4, "causal": True}, id="causal"),
    pytest.param({"d_model": 24, "num_heads": 4, "causal": True, "window": 2}, id="window"),
    pytest.param({"d_model": 32, "num_heads": 8, "num_kv_heads": 2, "causal": True}, id="gqa"),
    pytest.param({"d_model": 16, "num_heads": 2, "positional_encoding": "rope", "causal": True}, id="rope"),
]


# ----------------------------------------------------------------- engine/export.py


@pytest.mark.parametrize("config", CONFIGS)
def test_bertviz_is_one_layer_of_the_weights(config):
    t = _trace(**config)
    out = bertviz(t)
    assert set(out) == {"attention", "tokens"} and out["tokens"] == TEXTS
    (layer,) = out["attention"]
    h = config["num_heads"]
    assert layer.shape == (1, h, 6, 6)  # per *query* head, also when K/V heads are shared
    assert np.array_equal(layer[0], t.stages["weights"].values)


def test_bertviz_shows_cross_attention_in_its_encoder_decoder_form():
    t = _trace(d_model=24, num_heads=4, context_sentence=CONTEXT)
    out = bertviz(t)
    assert set(out) == {"cross_attention", "encoder_tokens", "decoder_tokens"}
    assert out["encoder_tokens"] == ["le", "chat", "était", "assis"] and out["decoder_tokens"] == TEXTS
    (layer,) = out["cross_attention"]
    assert layer.shape == (1, 4, 6, 4)  # [batch, head, query (sentence), key (context)]
    assert np.array_equal(layer[0], t.stages["weights"].values)


@pytest.mark.parametrize("config", CONFIGS)
def test_circuitsvis_props_are_the_weights_and_mask_the_upper_triangle_only_when_causal(config):
    t = _trace(**config)
    props = circuitsvis(t)
    h = config["num_heads"]
    assert set(props) == {"attention", "tokens", "attentionHeadNames", "maskUpperTri"}
    assert np.array_equal(props["attention"], t.stages["weights"].values) and props["attention"].shape == (h, 6, 6)
    assert props["tokens"] == TEXTS
    assert props["attentionHeadNames"] == [f"Head {i}" for i in range(h)]  # 0-based, as the trace's head axis
    assert props["maskUpperTri"] is config.get("causal", False)


@pytest.mark.parametrize("config", CONFIGS)
def test_transformer_explainer_outputs_are_the_trace_stages(config):
    t = _trace(**config)
    out = transformer_explainer(t)
    h = config["num_heads"]
    assert list(out) == [f"block_0_attn_head_{j}_{s}" for j in range(h) for s in TE_SUFFIXES]
    s = t.stages
    masked = s.get("masked_scores")
    for j in range(h):
        def get(suffix: str) -> dict:
            return out[f"block_0_attn_head_{j}_{suffix}"]
        for suffix in TE_SUFFIXES:
            assert get(suffix)["dims"] == [6, 6] and get(suffix)["size"] == 36
        assert np.array_equal(get("attn")["data"], s["scores"].values[j])
        assert np.array_equal(get("attn_scaled")["data"], s["scaled_scores"].values[j])
        assert np.array_equal(get("attn_softmax")["data"], s["weights"].values[j])
        assert np.array_equal(get("attn_dropout")["data"], s["weights"].values[j])  # dropout off at inference
        rows = get("attn_masked")["data"]
        nulls = np.array([[v is None for v in row] for row in rows])
        if masked is None:  # nothing masked: attn_masked is attn_scaled
            assert not nulls.any() and np.array_equal(rows, s["scaled_scores"].values[j])
        else:
            assert np.array_equal(nulls, masked.mask[j])
            assert np.array_equal(np.array(rows, dtype=float)[~nulls], masked.values[j][~nulls])
        if config.get("causal") and "window" not in config:
            # Transformer Explainer's maskArray (src/utils/array.ts) keeps exactly the keys j <= i
            assert np.array_equal(nulls, np.triu(np.ones((6, 6), dtype=bool), k=1))


def test_decimals_round_every_number_as_precision_does():
    t = _trace(d_model=24, num_heads=2, causal=True)
    w = t.stages["weights"].values
    assert np.array_equal(circuitsvis(t, 3)["attention"], np.round(w, 3))
    assert np.array_equal(bertviz(t, 3)["attention"][0][0], np.round(w, 3))
    te = transformer_explainer(t, 2)
    assert np.array_equal(te["block_0_attn_head_1_attn"]["data"], np.round(t.stages["scores"].values[1], 2))
    assert te["block_0_attn_head_1_attn_masked"]["data"][0][1] is None


@pytest.mark.parametrize("fmt", ["circuitsvis", "transformer-explainer"])
def test_square_viewers_refuse_cross_attention_and_name_bertviz(fmt):
    t = _trace(d_model=24, num_heads=4, context_sentence=CONTEXT)
    with pytest.raises(VariantConflictError, match="bertviz") as e:
        export(t, fmt)
    assert e.value.field == "format" and e.value.code == "export_needs_self_attention"


def test_an_unknown_format_is_refused():
    with pytest.raises(VariantConflictError, match="bertviz, circuitsvis, transformer-explainer"):
        export(_trace(), "png")


# ----------------------------------------------------------------- POST /export


def _post(client, **body):
    return client.post("/export", json={"sentence": SENTENCE, **body})


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_export_answers_the_trace_numbers_exactly(client, fmt):
    base = {"sentence": SENTENCE, "d_model": 24, "num_heads": 4, "causal": True}
    trace = client.post("/trace", json=base).get_json()
    resp = client.post("/export", json={**base, "format": fmt})  # the client checks it against openapi.yaml
    assert resp.status_code == 200 and resp.content_type == "application/json"
    doc = _strict_json(resp.get_data())
    assert doc["format"] == fmt
    for key in ("schema_version", "engine_version", "config", "tokens", "parameters_digest"):
        assert doc[key] == trace[key], key
    stages = trace["stages"]
    weights = stages["weights"]["values"]
    data = doc["data"]
    if fmt == "bertviz":
        assert data == {"attention": [[weights]], "tokens": TEXTS}
    elif fmt == "circuitsvis":
        assert data == {"attention": weights, "tokens": TEXTS, "attentionHeadNames": ["Head 0", "Head 1", "Head 2",
                                                                                     "Head 3"], "maskUpperTri": True}
    else:
        for j in range(4):
            assert data[f"block_0_attn_head_{j}_attn"]["data"] == stages["scores"]["values"][j]
            assert data[f"block_0_attn_head_{j}_attn_scaled"]["data"] == stages["scaled_scores"]["values"][j]
            assert data[f"block_0_attn_head_{j}_attn_masked"]["data"] == stages["masked_scores"]["values"][j]
            assert data[f"block_0_attn_head_{j}_attn_softmax"]["data"] == weights[j]
            assert data[f"block_0_attn_head_{j}_attn_dropout"]["data"] == weights[j]
        body = resp.get_data()
        assert b"Infinity" not in body and b"NaN" not in body
        assert data["block_0_attn_head_0_attn_masked"]["data"][0][1:] == [None] * 5  # masked cells are null


def test_mask_upper_tri_is_false_without_the_causal_mask(client):
    data = _post(client, num_heads=2, format="circuitsvis").get_json()["data"]
    assert data["maskUpperTri"] is False  # sent: CircuitsVis would mask by default


def test_export_of_cross_attention_carries_both_token_lists(client):
    base = {"sentence": SENTENCE, "context_sentence": CONTEXT, "d_model": 24, "num_heads": 2}
    trace = client.post("/trace", json=base).get_json()
    doc = client.post("/export", json={**base, "format": "bertviz"}).get_json()
    assert doc["context_tokens"] == trace["context_tokens"]
    assert doc["data"] == {"cross_attention": [[trace["stages"]["weights"]["values"]]],
                           "encoder_tokens": ["le", "chat", "était", "assis"], "decoder_tokens": TEXTS}


def test_precision_and_injected_bugs_are_carried_like_trace(client):
    base = {"sentence": SENTENCE, "num_heads": 2, "causal": True, "precision": 4, "inject_bug": "no_scale"}
    trace = client.post("/trace", json=base).get_json()
    doc = client.post("/export", json={**base, "format": "circuitsvis"}).get_json()
    assert doc["data"]["attention"] == trace["stages"]["weights"]["values"]
    assert doc["injected_bug"] == trace["injected_bug"] and doc["config"]["precision"] == 4


def _problem(resp, status: int = 422) -> dict:
    assert resp.status_code == status and resp.content_type == "application/problem+json", resp.get_data()
    return resp.get_json()


@pytest.mark.parametrize("body, pointer, kind", [
    ({"format": "png"}, "/format", "literal_error"),
    ({}, "/format", "missing"),
    ({"format": "bertviz", "sentence": ""}, "/sentence", "empty_sentence"),
    ({"format": "bertviz", "sentence": "a\x00b"}, "/sentence", "bad_character"),
    ({"format": "bertviz", "num_heads": 5}, "/num_heads", "head_division"),
    ({"format": "bertviz", "stages": ["weights"]}, "/stages", "not_exported"),
    ({"format": "bertviz", "include_parameters": True}, "/include_parameters", "not_exported"),
    ({"format": "bertviz", "decode": True, "causal": True}, "/decode", "not_exported"),
    ({"format": "circuitsvis", "context_sentence": CONTEXT}, "/format", "export_needs_self_attention"),
    ({"format": "transformer-explainer", "context_tokens": ["x"]}, "/format", "export_needs_self_attention"),
    ({"format": "bertviz", "colour": "red"}, "/colour", "extra_forbidden"),
])
def test_bad_requests_are_problems_that_say_what_to_fix(client, body, pointer, kind):
    doc = _problem(client.post("/export", json={"sentence": SENTENCE, **body}))
    assert doc["type"] == "urn:attention-trace:problem:validation-error" and doc["instance"] == "/export"
    assert [(e["pointer"], e["type"]) for e in doc["errors"]][:1] == [(pointer, kind)]
    if kind == "export_needs_self_attention":
        assert "bertviz" in doc["detail"]
    if kind == "literal_error":
        assert "bertviz" in doc["detail"] and "transformer-explainer" in doc["detail"]


def test_non_json_bodies_are_problems_too(client):
    assert _problem(client.post("/export", data=b"{", content_type="application/json"), 400)["title"] == \
        "Malformed JSON"
    _problem(client.post("/export", data=b"sentence=a", content_type="text/plain"), 415)
    _problem(client.get("/export"), 405)


def test_an_export_beyond_the_work_budget_is_refused_before_any_work(app_factory):
    from service.routes.export import ExportRequest
    from service.settings import Settings
    from service import budget

    limits = {"max_trace_values": 20_000, "max_d_model": 64}
    base = {"tokens": ["w"] * 36, "d_model": 8, "num_heads": 4}
    ctx = {"settings": Settings(**limits)}
    small = ExportRequest.model_validate({**base, "format": "bertviz"}, context=ctx)
    large = ExportRequest.model_validate({**base, "format": "transformer-explainer"}, context=ctx)
    budget_units = Settings(**limits).max_request_cost
    assert budget.cost("/trace", [small]) + small.export_value_count <= budget_units
    assert budget.cost("/trace", [large]) + large.export_value_count > budget_units  # 5 matrices a head
    client = app_factory(**limits).test_client()
    assert client.post("/export", json={**base, "format": "bertviz"}).status_code == 200
    doc = _problem(client.post("/export", json={**base, "format": "transformer-explainer"}))
    assert doc["errors"][0]["type"] == "export_too_costly" and "fewer tokens" in doc["detail"]


# ----------------------------------------------------------------- the Python helpers and the CLI


@pytest.fixture(scope="module")
def local() -> LocalClient:
    return LocalClient()


def test_to_bertviz_gives_head_views_arguments(local):
    import torch

    t = local.trace(sentence=SENTENCE, d_model=24, num_heads=4)
    attention, tokens = to_bertviz(t)
    assert tokens == TEXTS and len(attention) == 1
    assert isinstance(attention[0], torch.Tensor) and attention[0].dtype == torch.float64
    assert np.array_equal(attention[0].numpy()[0], t.array("weights"))
    for source in (t.raw, local.export(SENTENCE, format="bertviz", d_model=24, num_heads=4),
                   local.export(SENTENCE, format="circuitsvis", d_model=24, num_heads=4),
                   local.export(SENTENCE, format="transformer-explainer", d_model=24, num_heads=4)):
        again, texts = to_bertviz(source)
        assert texts == TEXTS and torch.equal(again[0], attention[0])


def test_to_bertviz_without_torch_gives_numpy(local, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch":
            raise ImportError("no torch here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    attention, _ = to_bertviz(local.trace(sentence=SENTENCE, num_heads=2))
    assert isinstance(attention[0], np.ndarray) and attention[0].shape == (1, 2, 6, 6)


def test_to_bertviz_of_cross_attention_is_the_keyword_form(local):
    t = local.trace(sentence=SENTENCE, context_sentence=CONTEXT, d_model=24, num_heads=2)
    kwargs = to_bertviz(t)
    assert isinstance(kwargs, dict) and set(kwargs) == set(bertviz_kwargs(t))
    assert kwargs["encoder_tokens"] == ["le", "chat", "était", "assis"] and kwargs["decoder_tokens"] == TEXTS
    assert np.array_equal(kwargs["cross_attention"][0].numpy()[0], t.array("weights"))
    with pytest.raises(ValueError, match="to_bertviz"):
        to_circuitsvis(t)


def test_to_circuitsvis_gives_attention_heads_arguments_and_the_react_props(local):
    t = local.trace(sentence=SENTENCE, d_model=24, num_heads=4, causal=True)
    kwargs = to_circuitsvis(t)
    assert set(kwargs) == {"attention", "tokens", "attention_head_names", "mask_upper_tri"}
    assert np.array_equal(kwargs["attention"], t.array("weights")) and kwargs["mask_upper_tri"] is True
    exported = local.export(SENTENCE, format="circuitsvis", d_model=24, num_heads=4, causal=True)
    assert to_circuitsvis(t, react=True) == exported["data"]
    assert to_circuitsvis(local.trace(sentence=SENTENCE, num_heads=2))["mask_upper_tri"] is False


def test_a_trace_without_the_weights_stage_says_so(local):
    t = local.trace(sentence=SENTENCE, stages=["scores"])
    with pytest.raises(KeyError, match="weights"):
        to_bertviz(t)
    with pytest.raises(KeyError, match="weights"):
        to_circuitsvis(t.raw)
    with pytest.raises(TypeError, match="Trace"):
        to_bertviz([[0.5]])  # type: ignore[arg-type]


def test_cli_prints_the_export(capsys):
    assert cli_main(["trace", "the cat sat", "--heads", "2", "--d-model", "4", "--causal",
                     "--export", "transformer-explainer"]) == 0
    doc = _strict_json(capsys.readouterr().out.encode())
    assert doc["format"] == "transformer-explainer" and len(doc["data"]) == 2 * len(TE_SUFFIXES)
    assert cli_main(["trace", "the cat", "--context", "le chat", "--export", "circuitsvis"]) == 2
    assert "--export (/format)" in capsys.readouterr().err


# ----------------------------------------------------------------- the real packages


def _bertviz_params(html: str) -> dict:
    """The parameters bertviz's head_view.js is given (head_view replaces PYTHON_PARAMS with json.dumps(params))."""
    m = re.search(r"const params = (\{.*?\}); // HACK", html)
    assert m, "bertviz's params not found in its HTML"
    return json.loads(m.group(1))


# bertviz 1.4.1's head_view reads head_view.js with open(...).read() and never closes it
# (bertviz/head_view.py line 230): that ResourceWarning is bertviz's, and only it is ignored.
_BERTVIZ_LEAK = "ignore:unclosed file <_io.TextIOWrapper name='[^']*bertviz/head_view\\.js':ResourceWarning"


@pytest.mark.filterwarnings(_BERTVIZ_LEAK)
@pytest.mark.parametrize("config", CONFIGS[:4])
def test_bertviz_renders_the_export_with_the_trace_numbers(local, config):
    from bertviz import head_view

    doc = local.export(SENTENCE, format="bertviz", **config)
    attention, tokens = to_bertviz(doc)
    html = head_view(attention, tokens, html_action="return")
    params = _bertviz_params(html.data)
    (view,) = params["attention"]
    assert view["left_text"] == view["right_text"] == TEXTS
    t = _trace(**config)
    assert np.array_equal(np.array(view["attn"]), t.stages["weights"].values[np.newaxis])  # [layer, head, q, k]
    w = t.stages["weights"].values
    assert repr(float(w[0, 1, 1])) in html.data  # the number itself, as text, in the page


@pytest.mark.filterwarnings(_BERTVIZ_LEAK)
def test_bertviz_renders_cross_attention(local):
    from bertviz import head_view

    t = local.trace(sentence=SENTENCE, context_sentence=CONTEXT, d_model=24, num_heads=2)
    params = _bertviz_params(head_view(**to_bertviz(t), html_action="return").data)
    (view,) = params["attention"]
    assert view["name"] == "Cross" and view["left_text"] == TEXTS
    assert view["right_text"] == ["le", "chat", "était", "assis"]
    assert np.array_equal(np.array(view["attn"])[0], t.array("weights"))


def _circuitsvis_props(html: str) -> dict:
    """The props circuitsvis passes to its render(…, AttentionHeads, props) call, the last line of its HTML
    (circuitsvis/utils/render.py: render_local and render_cdn write json.dumps of them)."""
    m = re.search(r"AttentionHeads,\s*(\{[^\n]*\})\s*\)\s*</script>\s*$", html)
    assert m, "circuitsvis' props not found in its HTML"
    return json.loads(m.group(1))


@pytest.mark.parametrize("config", CONFIGS[:4])
def test_circuitsvis_renders_the_export_with_the_trace_numbers(local, config):
    from circuitsvis.attention import attention_heads

    doc = local.export(SENTENCE, format="circuitsvis", **config)
    rendered = attention_heads(**to_circuitsvis(doc))
    # str() is the HTML that loads CircuitsVis from its CDN; local_src inlines its bundle (an offline notebook's)
    for html in (str(rendered), rendered.local_src):
        props = _circuitsvis_props(html)
        assert props == doc["data"]  # the very props /export answers (camelCase, maskUpperTri sent even when false)
    assert np.array_equal(np.array(props["attention"]), _trace(**config).stages["weights"].values)
    assert props["maskUpperTri"] is config.get("causal", False)


def test_the_react_props_render_as_circuitsvis_attention_heads_would(local):
    """/export's circuitsvis data, given to CircuitsVis' own Python API, reaches React unchanged."""
    import circuitsvis.utils.render as cv_render

    data = local.export(SENTENCE, format="circuitsvis", num_heads=2, causal=True)["data"]
    html = cv_render.render("AttentionHeads", **data)  # the props by their React names, as attention_heads sends
    assert _circuitsvis_props(str(html)) == data

