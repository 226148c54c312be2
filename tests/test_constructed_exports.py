"""Constructed heads outside /trace: the exports, the offline page, the Python client and the viewer's presets.

Over the Flask test client (the ``client`` fixture checks every answer against openapi.yaml): each export's
attention for a trace with constructed heads equals /trace's weights for the same request, one layer and a stack;
the offline page embeds that trace and its request; the client sends head_weights and sharpness and reads them
back; and each of the viewer's interpretable-heads presets (service/static/heads.js, read under Node) makes the
pattern its caption describes.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from test_viewer_js import needs_node, run_node

ONE_LAYER = {"sentence": "the cat sat on the mat and the cat ran", "d_model": 96, "num_heads": 3, "causal": True,
             "head_weights": ["previous_token", "first_token", "seeded"], "sharpness": 6}
STACK = {"sentence": "harry potter went to the shop and then harry", "d_model": 64, "num_heads": 1, "causal": True,
         "block": "gpt2", "num_layers": 2, "head_weights": ["induction"]}


def weights(client, body) -> np.ndarray:
    """/trace's weights: [heads, n, n], or [layers, heads, n, n] for a stack."""
    resp = client.post("/trace", json=body)
    assert resp.status_code == 200, resp.get_json()
    doc = resp.get_json()
    assert doc["config"]["head_weights"] == body["head_weights"]
    return np.array(doc["stages"]["weights"]["values"], dtype=float)


def export(client, body, fmt) -> dict:
    resp = client.post("/export", json={**body, "format": fmt})
    assert resp.status_code == 200, resp.get_json()
    doc = resp.get_json()
    assert doc["config"]["head_weights"] == body["head_weights"]
    assert doc["config"]["sharpness"] == body.get("sharpness", 10)
    return doc["data"]


def test_the_constructed_heads_are_what_these_tests_compare():
    """The request under test is a constructed one: its previous-token head peaks just left of the diagonal and its
    first-token head at key 0, which the seeded weights would not do (so an export of seeded weights fails below)."""
    from service import create_app

    c = create_app().test_client()
    W = weights(c, ONE_LAYER)
    n = W.shape[-1]
    assert [int(W[0, i].argmax()) for i in range(1, n)] == list(range(n - 1))
    assert [int(W[1, i].argmax()) for i in range(n)] == [0] * n
    seeded = np.array(c.post("/trace", json={k: v for k, v in ONE_LAYER.items() if k not in ("head_weights", "sharpness")})
                      .get_json()["stages"]["weights"]["values"])
    assert not np.allclose(seeded, W, atol=1e-3)


@pytest.mark.parametrize("body", [ONE_LAYER, STACK], ids=["one-layer", "stack"])
def test_bertviz_attention_is_the_traces_weights(client, body):
    W = weights(client, body)
    data = export(client, body, "bertviz")
    att = np.array(data["attention"], dtype=float)  # [layers, 1, heads, n, n]
    layers = W if W.ndim == 4 else W[None]
    assert att.shape == (layers.shape[0], 1, *layers.shape[1:])
    np.testing.assert_allclose(att[:, 0], layers, rtol=0, atol=1e-12)
    assert data["tokens"] == body["sentence"].split()


def test_circuitsvis_attention_is_the_traces_weights(client):
    W = weights(client, ONE_LAYER)
    data = export(client, ONE_LAYER, "circuitsvis")
    np.testing.assert_allclose(np.array(data["attention"], dtype=float), W, rtol=0, atol=1e-12)
    assert data["maskUpperTri"] is True
    assert data["attentionHeadNames"] == ["Head 0", "Head 1", "Head 2"]


@pytest.mark.parametrize("body", [ONE_LAYER, STACK], ids=["one-layer", "stack"])
def test_transformer_explainer_softmax_is_the_traces_weights(client, body):
    W = weights(client, body)
    data = export(client, body, "transformer-explainer")
    layers = W if W.ndim == 4 else W[None]
    for layer, heads in enumerate(layers):
        for head, w in enumerate(heads):
            got = data[f"block_{layer}_attn_head_{head}_attn_softmax"]
            assert got["dims"] == list(w.shape) and got["size"] == w.size
            np.testing.assert_allclose(np.array(got["data"], dtype=float), w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("body", [ONE_LAYER, STACK], ids=["one-layer", "stack"])
def test_the_offline_page_embeds_the_constructed_trace(client, body):
    """/trace/html draws the constructed trace: it embeds /trace's answer (its weights, its head kinds) and the
    request, from which the page's caption and head labels come."""
    page = client.post("/trace/html", json=body)
    assert page.status_code == 200, page.get_data(as_text=True)[:300]
    text = page.get_data(as_text=True)
    meta = json.loads(re.search(r'<script type="application/json" id="trace-data">(.*?)</script>', text, re.S).group(1))
    doc = json.loads(re.search(r'<script type="application/json" id="trace-json">(.*?)</script>', text, re.S).group(1))
    assert meta["request"] == body
    assert doc["config"]["head_weights"] == body["head_weights"]
    np.testing.assert_allclose(np.array(doc["stages"]["weights"]["values"], dtype=float), weights(client, body),
                               rtol=0, atol=1e-12)
    assert meta["comparison"]["config"]["head_weights"] == body["head_weights"], "the √d_k comparison too"
    assert 'src="static/heads.js"' not in text and "globalThis.AttentionTrace.heads = " in text, "heads.js inlined"


def test_the_client_sends_head_weights_and_sharpness(client):
    from attention_trace import LocalClient

    t = LocalClient().trace(ONE_LAYER)
    assert t.config.head_weights == ONE_LAYER["head_weights"] and t.config.sharpness == 6
    np.testing.assert_allclose(np.array(t.array("weights"), dtype=float), weights(client, ONE_LAYER), rtol=0, atol=1e-12)
    # As keyword fields, and through /export.
    kw = {k: v for k, v in ONE_LAYER.items() if k != "sentence"}
    t2 = LocalClient().trace(sentence=ONE_LAYER["sentence"], **kw)
    assert t2.request_body()["head_weights"] == ONE_LAYER["head_weights"] and t2.request_body()["sharpness"] == 6
    data = LocalClient().export(ONE_LAYER["sentence"], format="circuitsvis", **kw)["data"]
    np.testing.assert_allclose(np.array(data["attention"], dtype=float), weights(client, ONE_LAYER), rtol=0, atol=1e-12)
    plain = LocalClient().trace(sentence="the cat sat")
    assert plain.config.head_weights is None and plain.config.sharpness is None


# ------------------------------------------------------------------ the viewer's presets


def presets() -> list[dict]:
    return run_node("const AT = load('format.js', 'trace.js', 'fields.js', 'url-state.js', 'heads.js');"
                    "console.log(JSON.stringify(AT.heads.PRESETS.map(p => ({id: p.id, select: p.select, "
                    "body: AT.heads.presetBody(p)}))));", None)


def first_copy(tokens: list[str], i: int) -> int:
    return tokens.index(tokens[i])


@pytest.mark.integration  # starts another process
@needs_node
def test_each_preset_makes_the_pattern_its_caption_describes(client):
    got = {p["id"]: p for p in presets()}
    assert list(got) == ["previous_token", "same_token", "first_token", "induction", "mixed"]
    checks = {
        "previous_token": lambda i, toks: max(i - 1, 0),
        "same_token": lambda i, toks: first_copy(toks, i),
        "first_token": lambda i, toks: 0,
    }
    for pid, p in got.items():
        body = p["body"]
        W = weights(client, body)
        toks = body["sentence"].split()
        kinds = body["head_weights"]
        if pid == "induction":
            last = len(toks) - 1
            assert toks[last] == toks[0] and p["select"] == {"query": last, "head": 0, "layer": 1}
            assert int(W[1, 0, last].argmax()) == 1 and W[1, 0, last, 1] > 0.9, "the last A looks at the B after the first A"
            assert [int(W[1, 0, i].argmax()) for i in range(last)] == [0] * last and W[1, 0, :last, 0].min() > 0.9, \
                "every word without an earlier copy looks at the first token (the sink)"
            assert [int(W[0, 0, i].argmax()) for i in range(1, len(toks))] == list(range(len(toks) - 1)), \
                "layer 0: the previous token"
            continue
        for head, kind in enumerate(kinds):
            if kind == "seeded":
                assert W[head].max(axis=-1).min() < 0.5, f"{pid}: the seeded head is no sharp pattern"
                continue
            want = [checks[kind](i, toks) for i in range(len(toks))]
            assert [int(W[head, i].argmax()) for i in range(len(toks))] == want, (pid, kind)
            assert all(W[head, i, want[i]] > 0.9 for i in range(len(toks))), (pid, kind)
