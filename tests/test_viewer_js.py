"""The viewer's JavaScript helpers, under Node: its own unit tests, and the helpers against their Python twins.

``tests/js/*.test.js`` run with Node's built-in test runner (``node --test``): the pure scripts (format.js,
trace.js, url-state.js, svg.js) and api.js's unescaping, loaded as the page loads them (classic scripts evaluated
in order into one namespace, tests/js/load.js), with no bundler and no npm package. This file runs them and fails
with their output. Then the parts that have a Python twin are compared with it on the same inputs: the export
file name (viewer/offline_page.py's export_filename), the comparison request (comparison_request), and an SVG
export of a real trace with hostile tokens, read back by a real XML parser.

Needs Node 20 or later (README, "The commands"); without it these tests are skipped, saying so.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from decimal import ROUND_HALF_UP, Decimal

import pytest

from conftest import ROOT
from viewer.offline_page import comparison_request, export_filename

JS_TESTS = ROOT / "tests" / "js"
NODE = shutil.which("node")
MIN_NODE = 20


def _node_major() -> int | None:
    if NODE is None:
        return None
    out = subprocess.run([NODE, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    m = re.match(r"v(\d+)\.", out)
    return int(m.group(1)) if m else None


NODE_MAJOR = _node_major()
needs_node = pytest.mark.skipif(
    NODE_MAJOR is None or NODE_MAJOR < MIN_NODE,
    reason=(f"the viewer's JavaScript tests need Node {MIN_NODE} or later (`node --test`); "
            + ("no `node` on PATH" if NODE is None else f"found {NODE} (major version {NODE_MAJOR})")
            + ": install Debian's nodejs to run them"),
)


def run_node(script: str, data: object) -> object:
    """Run ``script`` in Node from the repository root with ``data`` as JSON on stdin; its stdout, parsed as JSON.
    The script has ``load`` (tests/js/load.js) and ``input`` (the data)."""
    prelude = ("const { load } = require('./tests/js/load.js');"
               "const input = JSON.parse(require('node:fs').readFileSync(0, 'utf8'));")
    proc = subprocess.run([NODE, "-e", prelude + script], cwd=ROOT, input=json.dumps(data), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.integration  # starts another process
@needs_node
def test_the_javascript_unit_tests_pass():
    files = sorted(JS_TESTS.glob("*.test.js"))
    assert {f.name for f in files} >= {"format.test.js", "url-state.test.js", "svg.test.js", "trace.test.js",
                                       "api.test.js", "pure.test.js"}
    proc = subprocess.run([NODE, "--test", "--test-reporter=tap", *map(str, files)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"node --test failed:\n{output}"
    counts = dict(re.findall(r"^# (pass|fail|cancelled|skipped|todo) (\d+)$", proc.stdout, re.M))
    assert counts.get("fail") == "0" and counts.get("cancelled") == "0", output
    assert int(counts.get("pass", 0)) >= 40, f"fewer tests than written ran:\n{output}"
    assert counts.get("skipped") == "0" and counts.get("todo") == "0", output


def _doc(config: dict, words: list[str], context: list[str] | None = None) -> dict:
    base = {"d_model": 24, "num_heads": 4, "seed": 0, "scale": True, "causal": False,
            "positional_encoding": "sinusoidal"}
    doc = {"config": {**base, **config}, "tokens": [{"index": i, "text": w} for i, w in enumerate(words)]}
    if context is not None:
        doc["context_tokens"] = [{"index": i, "text": w} for i, w in enumerate(context)]
    return doc


EXPORT_CASES = [
    (_doc({}, ["the", "cat", "sat"]), {"sentence": "the cat sat"}),
    (_doc({"scale": False, "causal": True, "seed": 42}, ["The", "Cat"]), {"sentence": "  The Cat!! "}),
    (_doc({"positional_encoding": "rope", "num_kv_heads": 2, "window": 3, "causal": True, "decode": True},
          ["a"]), {"sentence": "a"}),
    (_doc({}, ["the", "cat"], context=["le", "chat"]), {"sentence": "the cat", "context_sentence": "le chat"}),
    (_doc({}, ["</script>", "x"]), {"tokens": ["</script>", "x"]}),
    (_doc({}, ["été"]), {"sentence": "été à Zürich"}),
    (_doc({}, ["x"]), {"sentence": "“…”"}),
    (_doc({}, ["x"]), {"sentence": "word " * 20}),
    (_doc({"causal": True, "num_layers": 3, "block": "gpt2"}, ["the", "cat"]), {"sentence": "the cat", "block": "gpt2"}),
    (_doc({"num_layers": 1, "block": None, "norm": "rms_norm"}, ["x"]), {"sentence": "x", "norm": "rms_norm"}),
]


@pytest.mark.integration  # starts another process
@needs_node
def test_export_names_match_the_services():
    """The page names its downloads (JSON, SVG) as the service names the HTML file (Content-Disposition)."""
    names = run_node("const T = load('format.js', 'trace.js').trace;"
                     "console.log(JSON.stringify(input.map(([doc, body]) => T.exportName(doc, body))));",
                     EXPORT_CASES)
    assert names == [export_filename(doc, body, ext="html")[:-len(".html")] for doc, body in EXPORT_CASES]


@pytest.mark.integration  # starts another process
@needs_node
def test_the_comparison_request_matches_the_services():
    """The saved page's comparison trace is the service's comparison_request; the page asks for the same one."""
    bodies = [{"sentence": "the cat sat", "scale": True, "decode": True, "causal": True},
              {"sentence": "the cat sat", "scale": False},
              {"decode": True, "sentence": "x"},  # no scale: the service's default, true, flipped
              {"tokens": ["a", "b"], "num_heads": 2}]
    got = run_node("const U = load('format.js', 'fields.js', 'url-state.js').urlState;"
                   "console.log(JSON.stringify(input.map((b) => JSON.stringify(U.comparisonBody(b)))));", bodies)
    assert got == [json.dumps(comparison_request(b), separators=(",", ":"), ensure_ascii=False) for b in bodies]


@pytest.mark.integration  # starts another process
@needs_node
def test_an_svg_export_of_a_real_trace_is_well_formed_xml(client):
    """svg.js's drawing of a trace whose tokens are markup, read by ElementTree: every label comes back exactly."""
    tokens = ["</text><script>alert(1)</script>", "a&b", "\"'", "<!--", "]]>", "tab\there"]
    body = {"tokens": tokens, "d_model": 8, "num_heads": 2, "causal": True}
    resp = client.post("/trace", json=body)
    assert resp.status_code == 200
    doc = resp.get_json()
    text = run_node("""
        const AT = load('format.js', 'trace.js', 'svg.js');
        const doc = input;
        const W = doc.stages.weights.values[1];
        const masked = doc.stages.masked_scores.values[1];
        const spec = { stage: 'weights', title: 'Weights', formula: 'softmax: rows sum to 1', matrix: W,
          tokens: doc.tokens, range: [0, 1], kind: 'weight', maskRow: (i, j) => masked[i][j] === null, showMasked: true };
        console.log(JSON.stringify(AT.svg.svgFile(AT.svg.heatmapSvg(spec, { doc, head: 1 }))));""", doc)
    assert isinstance(text, str) and text.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<svg ')
    root = ET.fromstring(text.encode("utf-8"))
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == ns + "svg"
    assert [t.text for t in root.find(f"{ns}g[@class='col-labels']")] == tokens
    assert [t.text for t in root.find(f"{ns}g[@class='row-labels']")] == tokens
    assert not [el for el in root.iter() if el.tag in (ns + "script", ns + "foreignObject")]
    cells = root.find(f"{ns}g[@class='cells']")
    W = doc["stages"]["weights"]["values"][1]
    for g in cells:
        i, j = int(g.get("data-row")), int(g.get("data-col"))
        title = g.find(ns + "title").text
        assert title.startswith(f"query “{tokens[i]}” → key “{tokens[j]}”: "), title
        # toFixed(2) of a weight: the exact binary value, ties away from zero.
        shown = "masked" if j > i else str(Decimal(W[i][j]).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))
        assert g.find(ns + "text").text == shown
    assert len(cells) == len(tokens) ** 2


# ---------------------------------------------------------------- a saved page explains a cell as /explain does

#: the configurations and cells compared: plain, causal, sliding window with GQA and RoPE, cross-attention, scaling
#: off, a decoded trace, a 27-token sentence and a token that Python quotes with double quotes
EXPLAIN_CASES = [
    ({"sentence": "the cat sat", "d_model": 24, "num_heads": 1}, [(0, 1, 0), (0, 1, 2), (0, 2, 2)]),
    ({"sentence": "the cat sat on the mat", "d_model": 24, "num_heads": 4, "causal": True},
     [(2, 5, 1), (1, 1, 3), (3, 0, 0)]),
    ({"sentence": "the cat sat on the mat", "d_model": 24, "num_heads": 4, "num_kv_heads": 2, "causal": True,
      "window": 3, "positional_encoding": "rope", "rope_pairing": "interleaved"}, [(3, 5, 3), (2, 5, 1), (1, 4, 0)]),
    ({"sentence": "the cat sat", "context_sentence": "le chat était assis", "d_model": 16, "num_heads": 2},
     [(1, 2, 3), (0, 0, 1)]),
    ({"sentence": "the cat sat", "d_model": 64, "num_heads": 1, "scale": False}, [(0, 1, 2)]),
    ({"sentence": "the cat sat on", "d_model": 24, "num_heads": 2, "causal": True, "decode": True},
     [(0, 2, 1), (1, 1, 3)]),
    ({"sentence": "The animal didn't cross the street because it was too tired, and the dog that followed it home "
                  "was so very tired too.", "d_model": 24, "num_heads": 4, "causal": True},
     [(0, 26, 3), (3, 12, 2), (1, 4, 9)]),
    ({"tokens": ["it's", "a", 'say "hi"', "\u200b"], "d_model": 8, "num_heads": 2}, [(1, 0, 2), (0, 3, 0)]),
]

#: numbers computed with the browser's Math.exp (numpy's exp may round its last bit otherwise): compared to 2 ulp
NEAR = {"exp": ("value", "recomputed", "values"), "denominator": ("value", "recomputed", "values"),
        "weight": ("recomputed",)}


def _near(a, b, path: str) -> None:
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _near(x, y, f"{path}[{i}]")
        return
    if a is None or b is None:
        assert a is b, path
        return
    assert abs(a - b) <= 4.5e-16 * max(abs(a), abs(b)), (path, a, b)


@pytest.mark.integration  # starts another process
@needs_node
def test_a_saved_page_explains_a_cell_as_the_service_does(client):
    """cell.js's explainCell on a /trace answer equals /explain's answer for the same cell: every text (formulas,
    notes, mask reasons), every number read from a stage and every product and in-order sum bit for bit; the
    exponentials (and the denominator summed from them) to the last bit or the one next to it."""
    docs, cells, answers = [], [], []
    for body, picks in EXPLAIN_CASES:
        resp = client.post("/trace", json=body)
        assert resp.status_code == 200, resp.get_json()
        docs.append(resp.get_json())
        for head, query, key in picks:
            cells.append([len(docs) - 1, head, query, key])
            got = client.post("/explain", json={**body, "head": head, "query": query, "key": key})
            assert got.status_code == 200, got.get_json()
            answers.append(got.get_json())
    mine = run_node("const C = load('format.js', 'trace.js', 'cell.js').cell;"
                    "console.log(JSON.stringify(input.cells.map(([d, h, q, k]) => C.explainCell(input.docs[d], h, q, k))));",
                    {"docs": docs, "cells": cells})
    assert len(mine) == len(answers) == sum(len(p) for _, p in EXPLAIN_CASES)
    last_bit = 0
    for (doc_index, *_), x, want in zip(cells, mine, answers):
        where = f"head {want['head']} query {want['query']} key {want['key']} of {want['query_token']!r}"
        assert set(x) == set(want), where
        for field in set(want) - {"steps", "config", "decode"}:
            assert x[field] == want[field], (where, field)
        assert x["config"] == docs[doc_index]["config"]  # the trace's (/explain's omits what /trace echoes only)
        if "decode" in want:
            assert x["decode"] == want["decode"], where
        assert [s["id"] for s in x["steps"]] == [s["id"] for s in want["steps"]]
        for mine_step, step in zip(x["steps"], want["steps"]):
            near = NEAR.get(step["id"], ())
            assert set(mine_step) == set(step), (where, step["id"])
            for field, value in step.items():
                if field in near:
                    _near(mine_step[field], value, f"{where} {step['id']}.{field}")
                    last_bit += mine_step[field] != value
                elif field == "exact" and step["id"] in NEAR:
                    continue  # exp / denominator from the browser's exp may round otherwise: reported, not compared
                else:
                    assert mine_step[field] == value, (where, step["id"], field, mine_step[field], value)
    # The texts the panel shows are the same, word for word; some exponentials differ in their last bit.
    print(f"{last_bit} exp-derived numbers differ from numpy's in the last bit")


@pytest.mark.integration  # starts another process
@needs_node
def test_the_pairwise_sum_is_numpys():
    """cell.js's pairwiseSum equals numpy's sum of a float64 row, bit for bit, at every length the maps can have."""
    import numpy as np

    rng = np.random.default_rng(7)
    rows = [np.exp(rng.normal(size=n) * 3).tolist() for n in [*range(1, 40), 64, 127, 128, 129, 200, 256, 300]]
    got = run_node("const C = load('format.js', 'trace.js', 'cell.js').cell;"
                   "console.log(JSON.stringify(input.map((r) => C.pairwiseSum(r))));", rows)
    assert got == [float(np.sum(np.array(r))) for r in rows]


# ---------------------------------------------------------------- a stack of blocks

STACKS = [
    {"sentence": "the cat sat on", "d_model": 8, "num_heads": 2, "block": "gpt2", "num_layers": 3},
    {"sentence": "the cat sat on the mat", "d_model": 8, "num_heads": 2, "block": "vaswani2017", "num_layers": 2,
     "norm_weights": "seeded"},
    {"sentence": "the cat sat", "d_model": 8, "num_heads": 2, "num_kv_heads": 1, "block": "llama", "num_layers": 2,
     "d_ff": 16},
]


@pytest.mark.integration  # starts another process
@needs_node
def test_the_presets_match_the_engines():
    """url-state.js's preset table (what choosing a preset sets outside the block) and block.js's feed-forward
    networks are engine/layer.py's BLOCK_PRESETS."""
    from engine.layer import BLOCK_PRESETS, preset_fields

    got = run_node("const AT = load('format.js', 'trace.js', 'fields.js', 'url-state.js', 'svg.js', 'cell.js', 'block.js');"
                   "console.log(JSON.stringify([AT.urlState.BLOCKS, AT.urlState.PRESET_FIELDS, AT.block.PRESET_FFN]));",
                   None)
    blocks, fields, ffn = got
    assert blocks == list(BLOCK_PRESETS)
    assert fields == {name: preset_fields(name) for name in BLOCK_PRESETS}
    assert ffn == {name: p.ffn for name, p in BLOCK_PRESETS.items()}


@pytest.mark.integration  # starts another process
@needs_node
def test_the_residual_norms_are_numpys(client):
    """block.js's residualNorms of /trace's residual_stream equal numpy's norms, and blockOf reads the block (pre- or
    post-norm, the norm's kind, a final norm) from the stages alone as the service's config says it."""
    import numpy as np

    docs = []
    for body in STACKS:
        resp = client.post("/trace", json=body)
        assert resp.status_code == 200, resp.get_json()
        docs.append(resp.get_json())
    got = run_node("""
        const AT = load('format.js', 'trace.js', 'fields.js', 'url-state.js', 'svg.js', 'cell.js', 'block.js');
        console.log(JSON.stringify(input.map((doc) => {
          const bare = { ...doc, config: {} };  // the block read from its stages only
          return { norms: AT.block.residualNorms(doc.stages.residual_stream.values), block: AT.block.blockOf(bare),
                   order: AT.block.blockDiagram(AT.block.blockOf(doc)).order };
        })));""", docs)
    for doc, mine in zip(docs, got):
        want = np.linalg.norm(np.array(doc["stages"]["residual_stream"]["values"]), axis=-1)  # [depth, token]
        assert np.array(mine["norms"]).shape == (doc["config"]["num_layers"] + 1, len(doc["tokens"]))
        np.testing.assert_allclose(mine["norms"], want, rtol=1e-12, atol=0)
        cfg = doc["config"]
        assert mine["block"]["pre"] == (cfg["norm_position"] == "pre")
        assert mine["block"]["normKind"] == cfg["norm"]
        assert mine["block"]["finalNorm"] == ("final_norm" in doc["stages"])
        # The diagram's boxes are the stages' order: each box's stage comes after the one before it in the answer.
        first = {"norm1": "norm1", "attention": "output", "residual1": "residual1", "norm2": "norm2",
                 "ffn": "ffn_output", "residual2": "residual2", "final_norm": "final_norm"}
        stage_order = list(doc["stages"])
        at = [stage_order.index(first[box]) for box in mine["order"]]
        assert at == sorted(at), (cfg["norm_position"], mine["order"])


def test_the_javascript_fixture_is_the_engines(client):
    """tests/js/fixtures/gpt2-stack.json (the node tests' stack) is still what /trace answers, and its norms numpy's."""
    import numpy as np

    fixture = json.loads((JS_TESTS / "fixtures" / "gpt2-stack.json").read_text(encoding="utf-8"))
    resp = client.post("/trace", json={"sentence": "the cat sat on", "d_model": 8, "num_heads": 2, "block": "gpt2",
                                       "num_layers": 3, "causal": True})
    assert resp.status_code == 200, resp.get_json()
    doc = resp.get_json()
    assert fixture["doc"]["tokens"] == doc["tokens"]
    assert fixture["doc"]["stats"]["axes"] == doc["stats"]["axes"] == ["layer", "head", "query"]
    for sid, stage in fixture["doc"]["stages"].items():
        assert stage["axes"] == doc["stages"][sid]["axes"] and stage["shape"] == doc["stages"][sid]["shape"], sid
        np.testing.assert_allclose(stage["values"], doc["stages"][sid]["values"], rtol=1e-12, atol=1e-13, err_msg=sid)
    rs = np.array(doc["stages"]["residual_stream"]["values"])
    np.testing.assert_allclose(fixture["residual_norms"], np.linalg.norm(rs, axis=-1), rtol=1e-12, atol=0)


@pytest.mark.integration  # starts another process
@needs_node
def test_a_stacks_layer_is_explained_as_the_engine_explains_it(client):
    """A live page asks /explain with the layer shown; a saved page computes the cell with cell.js over that layer
    (trace.js's layerView). For every layer both equal the engine's explain_cell(…, layer=l), and each other: every
    field and text, the numbers read from a stage bit for bit, the exponentials to 2 ulp."""
    import engine
    from engine import TraceConfig
    from engine.explain import explain_cell
    from service import serialize

    body = STACKS[0] | {"causal": True}
    doc = client.post("/trace", json=body).get_json()
    t = engine.trace(TraceConfig.preset_config("gpt2", d_model=8, num_heads=2, num_layers=3), sentence=body["sentence"])
    assert t.parameters_digest == doc["parameters_digest"]
    cells = [(layer, head, query, key) for layer in range(3) for head, query, key in [(1, 3, 2), (0, 2, 2), (1, 1, 3)]]
    mine = run_node("const AT = load('format.js', 'trace.js', 'cell.js');"
                    "console.log(JSON.stringify(input.cells.map(([l, h, q, k]) => "
                    "AT.cell.explainCell(AT.trace.layerView(input.doc, l), h, q, k))));", {"doc": doc, "cells": cells})
    assert len(mine) == len(cells) == 9

    def same_steps(got: list[dict], want: list[dict], where: str) -> None:
        assert [s["id"] for s in got] == [s["id"] for s in want], where
        for got_step, step in zip(got, want):
            near = NEAR.get(step["id"], ())
            assert set(got_step) == set(step), (where, step["id"])
            for field, value in step.items():
                if field in near:
                    _near(got_step[field], value, f"{where} {step['id']}.{field}")
                elif not (field == "exact" and step["id"] in NEAR):
                    assert got_step[field] == value, (where, step["id"], field)

    for (layer, head, query, key), x in zip(cells, mine):
        want = json.loads(serialize.dumps(explain_cell(t, head, query, key, layer=layer)))
        where = f"layer {layer} head {head} query {query} key {key}"
        assert x["layer"] == want["layer"] == layer, where
        for field in set(want) - {"steps", "config"}:
            assert x[field] == want[field], (where, field)
        same_steps(x["steps"], want["steps"], where)
        weight = next(s for s in x["steps"] if s["id"] == "weight")
        assert weight["value"] == doc["stages"]["weights"]["values"][layer][head][query][key] or x["masked"]
        # The live page's request for this cell (explain.js): the trace's request plus layer, head, query, key.
        resp = client.post("/explain", json=body | {"layer": layer, "head": head, "query": query, "key": key})
        assert resp.status_code == 200, (where, resp.get_json())
        service = resp.get_json()
        assert set(x) == set(service), (where, set(x) ^ set(service))
        for field in set(service) - {"steps", "config"}:
            assert x[field] == service[field], (where, field)
        assert x["config"] == doc["config"]  # the trace's (/explain's omits what /trace echoes only)
        same_steps(x["steps"], service["steps"], f"{where} (/explain)")
        service_weight = next(s for s in service["steps"] if s["id"] == "weight")
        assert service_weight["value"] == doc["stages"]["weights"]["values"][layer][head][query][key] or x["masked"]
    # The layers differ: a layer-blind answer (layer 0's, for every layer) could not pass the comparisons above.
    w = doc["stages"]["weights"]["values"]
    assert w[0][1][3][2] != w[1][1][3][2] != w[2][1][3][2]
