"""The viewer's JavaScript helpers, under Node: its own unit tests, and the helpers against their Python twins.

``tests/js/*.test.js`` run with Node's built-in test runner (``node --test``): the pure scripts (format.js,
trace.js, url-state.js, svg.js) and api.js's unescaping, loaded as the page loads them (classic scripts evaluated
in order into one namespace, tests/js/load.js), with no bundler and no npm package. This file runs them and fails
with their output. Then the parts that have a Python twin are compared with it on the same inputs: the export
file name (service/offline_page.py's export_filename), the comparison request (comparison_request), and an SVG
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
from service.offline_page import comparison_request, export_filename

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
]


@needs_node
def test_export_names_match_the_services():
    """The page names its downloads (JSON, SVG) as the service names the HTML file (Content-Disposition)."""
    names = run_node("const T = load('format.js', 'trace.js').trace;"
                     "console.log(JSON.stringify(input.map(([doc, body]) => T.exportName(doc, body))));",
                     EXPORT_CASES)
    assert names == [export_filename(doc, body, ext="html")[:-len(".html")] for doc, body in EXPORT_CASES]


@needs_node
def test_the_comparison_request_matches_the_services():
    """The saved page's comparison trace is the service's comparison_request; the page asks for the same one."""
    bodies = [{"sentence": "the cat sat", "scale": True, "decode": True, "causal": True},
              {"sentence": "the cat sat", "scale": False},
              {"decode": True, "sentence": "x"},  # no scale: the service's default, true, flipped
              {"tokens": ["a", "b"], "num_heads": 2}]
    got = run_node("const U = load('format.js', 'url-state.js').urlState;"
                   "console.log(JSON.stringify(input.map((b) => JSON.stringify(U.comparisonBody(b)))));", bodies)
    assert got == [json.dumps(comparison_request(b), separators=(",", ":"), ensure_ascii=False) for b in bodies]


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


@needs_node
def test_the_pairwise_sum_is_numpys():
    """cell.js's pairwiseSum equals numpy's sum of a float64 row, bit for bit, at every length the maps can have."""
    import numpy as np

    rng = np.random.default_rng(7)
    rows = [np.exp(rng.normal(size=n) * 3).tolist() for n in [*range(1, 40), 64, 127, 128, 129, 200, 256, 300]]
    got = run_node("const C = load('format.js', 'trace.js', 'cell.js').cell;"
                   "console.log(JSON.stringify(input.map((r) => C.pairwiseSum(r))));", rows)
    assert got == [float(np.sum(np.array(r))) for r in rows]
