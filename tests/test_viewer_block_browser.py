"""A stack of Transformer blocks in the viewer: headless Chromium against real gunicorn on loopback.

The browser, server and console fixtures of tests/conftest.py (every test fails on a console error or a CSP
violation). A 3-layer GPT-2 stack: the layer picker redraws the maps from the answer on screen (no
request) with that layer's numbers; the block's diagram highlights the stage shown, and a click or Enter on a box
shows another; the residual stream's lengths are numpy's; the address brings the same layer and box back; a preset
sets its mask and positions; a clicked cell is explained by /explain in the layer shown (the offline page, which has
no service, computes the same answer itself); the offline page draws the stack under its hash-only CSP.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import requests
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from viewer_browser_support import (
    as_cells, choose, clear_requests, explain_rows, fixed, heatmap_values, js, js_small, open_page, pct, posted, sent,
    service_trace, set_field, trace_requests, wait_ready, wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.browser]

#: the request the page sends for STACK_HASH (url-state.js's key order)
STACK_BODY = {"sentence": "the cat sat on", "d_model": 8, "num_heads": 2, "seed": 0, "scale": True, "causal": True,
              "positional_encoding": "sinusoidal", "num_layers": 3, "block": "gpt2"}  # the declaration's order
STACK_HASH = "#sentence=the+cat+sat+on&d_model=8&num_heads=2&seed=0&scale=1&causal=1&block=gpt2&layers=3&q=1&head=1"


def pick_layer(driver, layer: int) -> None:
    driver.find_element(By.CSS_SELECTOR, f"label[for='layer-{layer}']").click()


def shown_box(driver) -> list[str]:
    """The boxes of the diagram marked as shown (exactly one, when it is drawn)."""
    return js(driver, "return [...document.querySelectorAll('#block-diagram [data-box][aria-pressed=\"true\"]')]"
                      ".map(b => b.dataset.box);")


def stage_values(driver, stage: str) -> list[list[str]]:
    """A block stage's table, as the page stores each cell's number (data-value)."""
    return js(driver, """return [...document.querySelectorAll(`#block-stage table[data-stage="${arguments[0]}"] tbody tr`)]
        .map(tr => [...tr.querySelectorAll('td.mx-cell')].map(td => td.dataset.value));""", stage)


def assert_panel_shows(driver, answer: dict, numbers_of: frozenset[str] | None = None) -> None:
    """The explain panel draws `answer` (an /explain answer): its steps in order, each formula, and the number of
    each step (of the steps in `numbers_of` only, when given)."""
    order = js(driver, "return [...document.querySelectorAll('.explain-table tbody tr')].map(tr => tr.dataset.step);")
    assert order == [s["id"] for s in answer["steps"]]
    rows = explain_rows(driver)
    for step in answer["steps"]:
        row = rows[step["id"]]
        assert row["formula"] == step["formula"], step["id"]
        if numbers_of is not None and step["id"] not in numbers_of:
            continue
        if step["value"] is None:
            assert row["eq"] is None, step["id"]
        elif step["id"] == "weight":
            assert row["eq"] == f"= {js_small(step['value'])} ({pct(step['value'], 2)})"
        else:
            assert row["eq"] == f"= {js_small(step['value'])}", step["id"]
    assert rows["products"]["vec"] == [fixed(v, 4) for v in answer["steps"][0]["values"]]


def test_the_layer_picker_shows_that_layers_maps_without_a_request(driver, server, console):
    doc = service_trace(server, STACK_BODY)
    W = doc["stages"]["weights"]["values"]  # [layer, head, query, key]
    open_page(driver, server, STACK_HASH)
    # The page asked for the stack itself, and draws layer 0 first.
    assert js(driver, "return document.getElementById('curl-command').textContent").endswith(
        "'" + json.dumps(STACK_BODY, separators=(",", ":")) + "'")
    assert [e.get_attribute("aria-label") for e in driver.find_elements(By.CSS_SELECTOR, "#layer-options input")] == \
        ["layer 0 of 3", "layer 1 of 3", "layer 2 of 3"]
    assert driver.find_element(By.ID, "layer-picker").is_displayed()
    assert heatmap_values(driver, "weights") == as_cells(W[0][1])
    clear_requests(driver)
    pick_layer(driver, 2)
    wait_until(driver, lambda d: "layer 2 of 3" in d.find_element(By.ID, "maps-title").text)
    assert driver.find_element(By.ID, "layer-2").is_selected()
    assert heatmap_values(driver, "weights") == as_cells(W[2][1])
    assert heatmap_values(driver, "scores") == as_cells(doc["stages"]["scores"]["values"][2][1])
    assert W[2][1] != W[0][1]
    # Every head's thumbnail and the walkthrough are layer 2's too.
    row = js(driver, "return [...document.querySelectorAll('#walkthrough-body [data-stage=\"weights\"] li .frac')]"
                     ".map(e => e.textContent)")
    assert row == [f" ({fixed(w, 4)})" for w in W[2][1][1][:2]]  # "cat" (query 1) sees "the" and itself
    Q = js(driver, "return [...document.querySelectorAll('table[data-matrix=\"Q\"] tbody tr')].map(tr => "
                   "[...tr.querySelectorAll('td')].map(td => td.textContent))")
    assert Q == [[fixed(v, 2) for v in r] for r in doc["stages"]["q"]["values"][2][1]]
    assert "layer 2" in driver.find_element(By.ID, "trace-status").text
    assert trace_requests(driver) == [] and sent(driver, "/trace") == [], "a layer is drawn from the answer on screen"
    assert "layer=2" in driver.current_url


def test_a_stacks_cell_is_explained_by_the_service_in_the_layer_shown(driver, server, console):
    doc = service_trace(server, STACK_BODY)
    W = doc["stages"]["weights"]["values"]  # [layer, head, query, key]
    open_page(driver, server, STACK_HASH)
    pick_layer(driver, 2)
    wait_until(driver, lambda d: "layer 2 of 3" in d.find_element(By.ID, "maps-title").text)
    clear_requests(driver)
    # A cell of layer 2 explained: the page asks /explain for it, with the layer on screen, and shows its answer.
    driver.find_element(By.CSS_SELECTOR, "table[data-stage='weights'] td[data-row='3'][data-col='1']").click()
    status = driver.find_element(By.ID, "explain-status")
    wait_until(driver, lambda d: status.text.startswith("Layer 2, head 1: query 3"))
    cell = {"layer": 2, "head": 1, "query": 3, "key": 1}
    assert posted(driver, "/explain") == [{**STACK_BODY, **cell}], "the trace's request, plus the layer and the cell"
    assert sent(driver, "/trace") == []
    answer = requests.post(server.url + "/explain", json={**STACK_BODY, **cell}, timeout=10).json()
    first = requests.post(server.url + "/explain", json={**STACK_BODY, **cell, "layer": 0}, timeout=10).json()
    weight = next(s for s in answer["steps"] if s["id"] == "weight")["value"]
    assert answer["layer"] == 2 and weight == W[2][1][3][1] != W[0][1][3][1]
    assert status.text == f"Layer 2, head 1: query 3 “on” → key 1 “cat”: weight {pct(weight, 2)}."
    assert_panel_shows(driver, answer)
    assert [s["value"] for s in first["steps"]] != [s["value"] for s in answer["steps"]], "layer 0's is another answer"
    assert not driver.find_elements(By.CSS_SELECTOR, "[data-part='explain-source']"), "the service's, not the page's"
    assert driver.find_elements(By.CSS_SELECTOR, "table[data-stage='weights'] td.is-explained[data-row='3'][data-col='1']")

    # Another layer: the explanation goes; a cell of layer 1 asks for layer 1's.
    pick_layer(driver, 1)
    wait_until(driver, lambda d: status.text.startswith("Layer 1 shown"))
    assert not driver.find_elements(By.CSS_SELECTOR, ".explain-table")
    clear_requests(driver)
    driver.find_element(By.CSS_SELECTOR, "table[data-stage='weights'] td[data-row='2'][data-col='0']").click()
    wait_until(driver, lambda d: status.text.startswith("Layer 1, head 1: query 2"))
    cell = {"layer": 1, "head": 1, "query": 2, "key": 0}
    assert posted(driver, "/explain") == [{**STACK_BODY, **cell}]
    answer = requests.post(server.url + "/explain", json={**STACK_BODY, **cell}, timeout=10).json()
    assert answer["layer"] == 1
    assert_panel_shows(driver, answer)
    assert sent(driver, "/trace") == []


def test_the_residual_stream_is_each_tokens_norm_at_each_depth(driver, server, console):
    doc = service_trace(server, STACK_BODY)
    want = np.linalg.norm(np.array(doc["stages"]["residual_stream"]["values"]), axis=-1)  # [depth, token]
    open_page(driver, server, STACK_HASH)
    assert driver.find_element(By.ID, "residual-section").is_displayed()
    cells = js(driver, "return [...document.querySelectorAll('#residual-body td.rs-cell')].map(td => "
                       "[Number(td.dataset.depth), Number(td.dataset.token), td.dataset.value, td.textContent])")
    assert len(cells) == want.size == 4 * 4
    for depth, token, value, text in cells:
        assert math.isclose(float(value), want[depth, token], rel_tol=1e-12), (depth, token)
        assert text == fixed(want[depth, token], 3), (depth, token)
    heads = js(driver, "return [...document.querySelectorAll('.residual-table thead th')].map(th => th.textContent)")
    assert heads == ["token", "x₀ input", "x₁ after layer 0", "x₂ after layer 1", "x₃ after layer 2"]
    rows = js(driver, "return [...document.querySelectorAll('.residual-table tbody th')].map(th => th.textContent)")
    assert rows == [t["text"] for t in doc["tokens"]]


def test_the_diagram_highlights_the_stage_shown_and_a_box_shows_its_stage(driver, server, console):
    doc = service_trace(server, STACK_BODY)
    S = doc["stages"]
    open_page(driver, server, STACK_HASH)
    pick_layer(driver, 2)
    wait_until(driver, lambda d: "layer 2 of 3" in d.find_element(By.ID, "block-title").text)
    boxes = driver.find_elements(By.CSS_SELECTOR, "#block-diagram [data-box]")
    # GPT-2 is pre-norm: the norm before each sublayer, then the final norm after the stack.
    assert [b.get_attribute("data-box") for b in boxes] == \
        ["norm1", "attention", "residual1", "norm2", "ffn", "residual2", "final_norm"]
    assert all(b.get_attribute("role") == "button" and b.get_attribute("tabindex") == "0" and b.get_attribute("aria-label")
               for b in boxes)
    svg = driver.find_element(By.CSS_SELECTOR, "#block-diagram svg")
    assert svg.get_attribute("role") == "group" and "pre-norm" in svg.get_attribute("aria-label")
    assert shown_box(driver) == ["norm1"], "the layer's first step, before any is chosen"
    assert stage_values(driver, "norm1") == as_cells(S["norm1"]["values"][2])
    means = js(driver, "return [...document.querySelectorAll('#block-stage td[data-stage=\"norm1_mean\"]')]"
                       ".map(td => td.dataset.value)")
    assert means == as_cells([S["norm1_mean"]["values"][2]])[0]
    # A click on the feed-forward box: highlighted, and its stages shown, layer 2's.
    driver.find_element(By.CSS_SELECTOR, "#block-diagram [data-box='ffn']").click()
    wait_until(driver, lambda d: shown_box(d) == ["ffn"])
    for sid in ("ffn_pre_activation", "ffn_activation", "ffn_output"):
        values = stage_values(driver, sid)
        assert values == as_cells(S[sid]["values"][2]), sid
    assert stage_values(driver, "norm1") == [], "one box's stages at a time"
    assert "bstage=ffn" in driver.current_url
    # From the keyboard: focus a box, the arrows move along the diagram, Enter shows the one focused.
    js(driver, "document.querySelector('#block-diagram [data-box=\"attention\"]').focus()")
    driver.switch_to.active_element.send_keys(Keys.ARROW_DOWN)
    assert driver.switch_to.active_element.get_attribute("data-box") == "residual1"
    driver.switch_to.active_element.send_keys(Keys.ENTER)
    wait_until(driver, lambda d: shown_box(d) == ["residual1"])
    assert stage_values(driver, "residual1") == as_cells(S["residual1"]["values"][2])
    assert driver.switch_to.active_element.get_attribute("data-box") == "residual1", "the focus stays on the box"
    # The final norm is the stack's, not a layer's.
    driver.find_element(By.CSS_SELECTOR, "#block-diagram [data-box='final_norm']").click()
    wait_until(driver, lambda d: shown_box(d) == ["final_norm"])
    assert stage_values(driver, "final_norm") == as_cells(S["final_norm"]["values"])


def test_the_address_brings_the_same_layer_and_stage_back(driver, server, console):
    doc = service_trace(server, STACK_BODY)
    open_page(driver, server, STACK_HASH)
    pick_layer(driver, 2)
    driver.find_element(By.CSS_SELECTOR, "#block-diagram [data-box='norm2']").click()
    wait_until(driver, lambda d: shown_box(d) == ["norm2"])
    address = driver.current_url
    fragment = address[address.index("#"):]
    assert "block=gpt2" in fragment and "layers=3" in fragment and "layer=2" in fragment and "bstage=norm2" in fragment
    open_page(driver, server, fragment)
    assert driver.current_url == address
    assert driver.find_element(By.ID, "layer-2").is_selected()
    assert "layer 2 of 3" in driver.find_element(By.ID, "maps-title").text
    assert driver.find_element(By.ID, "block").get_attribute("value") == "gpt2"
    assert driver.find_element(By.ID, "num_layers").get_attribute("value") == "3"
    assert shown_box(driver) == ["norm2"]
    assert heatmap_values(driver, "weights") == as_cells(doc["stages"]["weights"]["values"][2][1])
    assert stage_values(driver, "norm2") == as_cells(doc["stages"]["norm2"]["values"][2])


def test_a_preset_sets_its_mask_and_positions_and_more_layers_need_a_block(driver, server, console):
    console.allow(r"/trace - Failed to load resource: the server responded with a status of 422")
    open_page(driver, server, "#sentence=the+cat+sat&d_model=8&num_heads=2")
    assert not driver.find_element(By.ID, "layer-picker").is_displayed()
    assert not driver.find_element(By.ID, "block-section").is_displayed()
    # More than one layer without a block: the service's message, in the page's words, next to Layers.
    set_field(driver, "num_layers", "2")
    error = driver.find_element(By.ID, "num_layers-error")
    wait_until(driver, lambda d: error.is_displayed())
    assert error.text.startswith("Layers 2 stacks Transformer blocks, and no block is asked for: choose a Block")
    assert driver.find_element(By.ID, "num_layers").get_attribute("aria-invalid") == "true"
    # Llama: RoPE and the causal mask come with it, and the stack is drawn (RMSNorm, SwiGLU).
    clear_requests(driver)
    choose(driver, "block", "llama")
    wait_until(driver, lambda d: d.find_element(By.ID, "block-section").is_displayed())
    wait_ready(driver)
    assert driver.find_element(By.ID, "positional_encoding").get_attribute("value") == "rope"
    assert driver.find_element(By.ID, "causal").is_selected()
    assert not error.is_displayed()
    labels = js(driver, "return [...document.querySelectorAll('#block-diagram [data-box] .bd-label')].map(t => t.textContent)")
    assert labels == ["RMSNorm₁", "Masked multi-head attention", "+", "RMSNorm₂", "Feed-forward (SwiGLU)", "+",
                      "Final RMSNorm"]
    body = json.loads(js(driver, "return document.getElementById('curl-command').textContent").split(" -d ")[1][1:-1])
    assert body == {"sentence": "the cat sat", "d_model": 8, "num_heads": 2, "seed": 0, "scale": True, "causal": True,
                    "positional_encoding": "rope", "rope_base": 10000, "rope_pairing": "rotate_half", "block": "llama",
                    "num_layers": 2}
    assert len(driver.find_elements(By.CSS_SELECTOR, "#layer-options input")) == 2
    # Back to attention alone: the stack's sections go, and the request is the plain one.
    choose(driver, "block", "")
    set_field(driver, "num_layers", "1")
    wait_until(driver, lambda d: not d.find_element(By.ID, "block-section").is_displayed())
    wait_ready(driver)
    assert "block" not in driver.current_url and "layer" not in driver.current_url


def test_the_offline_page_draws_a_stack_under_its_csp(driver, server, console, tmp_path: Path):
    page = requests.post(server.url + "/trace/html", json=STACK_BODY, timeout=30)
    assert page.status_code == 200
    assert 'filename="attention-trace_the-cat-sat-on_d8_h2_seed0_causal_gpt2_L3.html"' in \
        page.headers["Content-Disposition"]
    doc = service_trace(server, STACK_BODY)
    path = tmp_path / "stack.html"
    path.write_bytes(page.content)
    driver.get("about:blank")
    driver.get(path.as_uri() + "#layer=1&bstage=ffn&q=2&head=0")
    wait_ready(driver)
    assert js(driver, "return document.documentElement.classList.contains('is-standalone')")
    assert "a saved trace" in driver.find_element(By.ID, "trace-status").text
    assert driver.find_element(By.ID, "layer-1").is_selected()
    assert heatmap_values(driver, "weights") == as_cells(doc["stages"]["weights"]["values"][1][0])
    assert shown_box(driver) == ["ffn"]
    assert stage_values(driver, "ffn_output") == as_cells(doc["stages"]["ffn_output"]["values"][1])
    pick_layer(driver, 2)
    wait_until(driver, lambda d: "layer 2 of 3" in d.find_element(By.ID, "maps-title").text)
    assert heatmap_values(driver, "weights") == as_cells(doc["stages"]["weights"]["values"][2][0])
    assert stage_values(driver, "ffn_output") == as_cells(doc["stages"]["ffn_output"]["values"][2])
    assert len(js(driver, "return [...document.querySelectorAll('#residual-body td.rs-cell')]")) == 16
    assert driver.find_element(By.ID, "block").get_attribute("disabled") is not None, "a saved page's inputs are fixed"
    # A cell of layer 2 explained in the page: that layer's weight.
    cell = driver.find_element(By.CSS_SELECTOR, "table[data-stage='weights'] td[data-row='2'][data-col='1']")
    cell.click()
    status = driver.find_element(By.ID, "explain-status")
    wait_until(driver, lambda d: status.text.startswith("Layer 2, head 0: query 2"))
    w = doc["stages"]["weights"]["values"][2][0][2][1]
    assert status.text.endswith(f"weight {fixed(w * 100, 2)}%.")
    # Computed in the page (it has no service), and /explain's answer for that layer: the page's exponentials may
    # differ from numpy's in their last bit, so the numbers compared are those read from the trace's stages.
    answer = requests.post(server.url + "/explain", json={**STACK_BODY, "layer": 2, "head": 0, "query": 2, "key": 1},
                           timeout=10).json()
    assert_panel_shows(driver, answer, numbers_of=frozenset({"products", "score", "scaled", "row_max", "weight"}))
    assert driver.find_element(By.CSS_SELECTOR, "[data-part='explain-source']").text.startswith("Computed in this page")
    assert js(driver, "return document.documentElement.dataset.cspViolations || '0'") == "0"


def test_present_mode_steps_through_the_block_and_the_residual_stream(driver, server, console):
    open_page(driver, server, STACK_HASH + "&layer=1&present=1&slide=block")
    visible = "return ['maps', 'block-section', 'residual-section', 'walkthrough'].filter(id => { " \
              "const el = document.getElementById(id); return !el.hidden && el.getClientRects().length > 0; });"
    wait_until(driver, lambda d: js(d, visible) == ["block-section"])
    where = driver.find_element(By.ID, "present-where").text
    assert where.startswith("Stage 9 of 10: The block"), where
    assert "layer 1 of 3" in driver.find_element(By.ID, "block-title").text
    driver.find_element(By.ID, "present-next").click()
    wait_until(driver, lambda d: js(d, visible) == ["residual-section"])
    assert "slide=residual" in driver.current_url
    assert driver.find_element(By.ID, "present-next").get_attribute("disabled") is not None, "the last stage"
    driver.find_element(By.ID, "present-prev").click()
    driver.find_element(By.ID, "present-prev").click()
    wait_until(driver, lambda d: js(d, visible) == ["walkthrough"])  # concat and W_O: the walkthrough's rows


def test_a_declared_field_without_a_control_of_its_own_gets_one_from_the_declaration(driver, server, console):
    """The block's FFN has no control in index.html: the page draws one from engine/fields.py (its choices and help,
    its error line), the address sets it, the request sends it, and choosing another asks for that trace."""
    from engine import fields

    ffn = fields.BY_NAME["ffn"]
    open_page(driver, server, STACK_HASH + "&ffn=relu")
    select = driver.find_element(By.ID, "ffn")
    assert select.tag_name == "select" and select.get_attribute("value") == "relu"
    assert [o.get_attribute("value") for o in select.find_elements(By.TAG_NAME, "option")] == ["", *ffn.choices]
    assert ffn.help in driver.find_element(By.ID, "ffn-hint").text
    assert driver.find_element(By.ID, "fields-block").is_displayed()
    assert js(driver, "return document.getElementById('curl-command').textContent").endswith(
        "'" + json.dumps({**STACK_BODY, "ffn": "relu"}, separators=(",", ":")) + "'")
    clear_requests(driver)
    choose(driver, "ffn", "swiglu")
    wait_until(driver, lambda d: any(b.get("ffn") == "swiglu" for b in posted(d, "/trace")))
    wait_until(driver, lambda d: "ffn=swiglu" in d.current_url)
    choose(driver, "norm", "rms_norm")
    wait_until(driver, lambda d: "norm=rms_norm" in d.current_url)
    # The number inputs take their bounds from the declaration (index.html copies none).
    assert driver.find_element(By.ID, "num_layers").get_attribute("max") == str(fields.BY_NAME["num_layers"].maximum)
    assert driver.find_element(By.ID, "d_ff").get_attribute("max") == str(fields.BY_NAME["d_ff"].maximum)
