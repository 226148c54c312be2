"""Interpretable heads in the viewer: headless Chromium against real gunicorn on loopback.

The browser, server and console fixtures of tests/conftest.py (every test fails on a console error or a CSP
violation). One click on a preset (service/static/heads.js) sets a sentence and a configuration: the page
asks /trace for the constructed heads (head_weights and sharpness in the request it sends), draws their weights,
numbers equal to /trace's for the same request, shows the preset's caption with the maps and says which heads are
constructed; the previous-token head's rows peak just left of the diagonal, the induction head's last "harry" in
layer 1 at "potter"; the address brings the same view back; the service's 422s about the heads show at their
controls, in the page's words.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import requests
from selenium.webdriver.common.by import By

from viewer_browser_support import (
    choose, clear_requests, heatmap_values, js, open_page, service_trace, set_field, trace_requests, wait_ready,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.browser]

#: what the previous-token preset sends (heads.js's table, url-state.js's key order)
PREVIOUS_TOKEN = {"sentence": "the cat sat on the mat and the cat ran", "d_model": 64, "num_heads": 2, "seed": 0,
                  "scale": True, "causal": True, "positional_encoding": "sinusoidal",
                  "head_weights": ["previous_token", "seeded"], "sharpness": 10}
INDUCTION = {"sentence": "harry potter went to the shop and then harry", "d_model": 128, "num_heads": 1, "seed": 0,
             "scale": True, "causal": True, "positional_encoding": "sinusoidal", "block": "gpt2", "num_layers": 2,
             "head_weights": ["induction"], "sharpness": 10}


def sent_body(driver) -> dict:
    """The request the page sent for the trace on screen (its curl command)."""
    return json.loads(js(driver, "return document.getElementById('curl-command').textContent").split(" -d ")[1][1:-1])


def click_preset(driver, preset: str) -> None:
    clear_requests(driver)
    driver.find_element(By.CSS_SELECTOR, f"#head-presets button[data-preset='{preset}']").click()
    wait_until(driver, lambda d: d.find_element(By.ID, "preset-caption").get_attribute("data-preset") == preset)
    wait_ready(driver)


def shown_weights(driver) -> np.ndarray:
    """The weights map on screen, from the numbers the page stores in its cells (data-value)."""
    return np.array([[float(v) for v in row] for row in heatmap_values(driver, "weights")])


def same_cells(driver, matrix) -> bool:
    """Whether the weights map on screen holds these numbers, cell for cell (the page stores each as JavaScript
    writes it, which parses back to the same double)."""
    shown = shown_weights(driver)
    want = np.array(matrix, dtype=float)
    return shown.shape == want.shape and bool(np.allclose(shown, want, rtol=1e-15, atol=0))


def caption(driver) -> str:
    el = driver.find_element(By.ID, "preset-caption")
    return el.text if el.is_displayed() else ""


def test_the_previous_token_preset_draws_the_services_previous_token_head(driver, server, console):
    open_page(driver, server)
    assert caption(driver) == "", "seeded heads: no caption"
    click_preset(driver, "previous_token")
    assert sent_body(driver) == PREVIOUS_TOKEN
    assert len(trace_requests(driver)) >= 1
    doc = service_trace(server, PREVIOUS_TOKEN)
    W = doc["stages"]["weights"]["values"]  # [head, query, key]
    # The page's numbers are /trace's for the same request, cell for cell, and they are the construction's.
    assert same_cells(driver, W[0])
    shown = shown_weights(driver)
    n = len(doc["tokens"])
    assert [int(shown[i].argmax()) for i in range(1, n)] == list(range(n - 1)), "each word looks at the one before"
    assert all(shown[i, i - 1] > 0.9 for i in range(1, n))
    # The caption is shown with the maps, and the heads say which is constructed.
    text = caption(driver)
    assert text.startswith("Previous token") and "each word looks at the word before it" in text
    assert "head 0 of 2 · previous-token" in driver.find_element(By.ID, "maps-title").text
    chips = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#head-options .chip-text")]
    assert chips == ["0 · previous-token", "1"]
    assert driver.find_element(By.CSS_SELECTOR, "#head-presets button[data-preset='previous_token']") \
        .get_attribute("aria-pressed") == "true"
    kinds = [e.get_attribute("value") for e in driver.find_elements(By.CSS_SELECTOR, "#head-kinds select")]
    assert kinds == ["previous_token", "seeded"]
    # The seeded head beside it, for contrast: /trace's numbers too, and no such pattern.
    driver.find_element(By.CSS_SELECTOR, "label[for='head-1']").click()
    wait_until(driver, lambda d: "head 1 of 2" in d.find_element(By.ID, "maps-title").text)
    assert same_cells(driver, W[1])
    assert "previous-token" not in driver.find_element(By.ID, "maps-title").text


def test_the_address_brings_the_preset_and_its_caption_back(driver, server, console):
    open_page(driver, server)
    click_preset(driver, "previous_token")
    address = driver.current_url
    fragment = address[address.index("#"):]
    assert "hw=previous_token%2Cseeded" in fragment
    open_page(driver, server, fragment)
    assert driver.current_url == address
    assert sent_body(driver) == PREVIOUS_TOKEN
    assert caption(driver).startswith("Previous token")
    assert same_cells(driver, service_trace(server, PREVIOUS_TOKEN)["stages"]["weights"]["values"][0])
    # A sharpness of the user's joins the address and the request, and comes back with it.
    set_field(driver, "sharpness", "2")
    body2 = {**PREVIOUS_TOKEN, "sharpness": 2}
    wait_until(driver, lambda d: sent_body(d) == body2)
    wait_ready(driver)
    wait_until(driver, lambda d: same_cells(d, service_trace(server, body2)["stages"]["weights"]["values"][0]))
    assert "sharpness=2" in driver.current_url
    assert "Constructed heads" in caption(driver) and "head 0 · previous-token" in caption(driver), \
        "no longer the preset: a line a constructed head"
    again = driver.current_url
    open_page(driver, server, again[again.index("#"):])
    assert sent_body(driver) == body2
    assert driver.find_element(By.ID, "sharpness").get_attribute("value") == "2"


def test_the_induction_preset_looks_from_the_last_a_to_the_b_after_the_first(driver, server, console):
    open_page(driver, server)
    click_preset(driver, "induction")
    assert sent_body(driver) == INDUCTION
    doc = service_trace(server, INDUCTION)
    W = doc["stages"]["weights"]["values"]  # [layer, head, query, key]
    assert driver.find_element(By.ID, "layer-1").is_selected(), "the preset opens on layer 1, the match"
    assert same_cells(driver, W[1][0])
    shown = shown_weights(driver)
    tokens = [t["text"] for t in doc["tokens"]]
    last = len(tokens) - 1
    assert tokens[last] == tokens[0] == "harry" and tokens[1] == "potter"
    assert int(shown[last].argmax()) == 1 and shown[last, 1] > 0.9, "the last harry looks at potter"
    assert [int(r.argmax()) for r in shown[:last]] == [0] * last and shown[:last, 0].min() > 0.9, \
        "every word without an earlier copy looks at the first token (the sink)"
    assert "first token" in caption(driver) and "attention sink" in caption(driver)
    scaled = np.array(doc["stages"]["scaled_scores"]["values"][1][0], dtype=float)
    assert np.nanmax(np.abs(scaled)) < 15, "scores about sharpness × the closed form, not thousands"
    assert "layer 1 of 2" in driver.find_element(By.ID, "maps-title").text
    assert "induction" in driver.find_element(By.ID, "maps-title").text
    assert '"potter"' in caption(driver) and "copies" in caption(driver)
    # The query token is the last harry (query 8): the walkthrough is its row.
    assert driver.find_element(By.ID, "query-8").is_selected()
    # Layer 0: the previous-token half, each word looking at the one before.
    driver.find_element(By.CSS_SELECTOR, "label[for='layer-0']").click()
    wait_until(driver, lambda d: "layer 0 of 2" in d.find_element(By.ID, "maps-title").text)
    assert same_cells(driver, W[0][0])
    layer0 = shown_weights(driver)
    assert [int(layer0[i].argmax()) for i in range(1, len(tokens))] == list(range(len(tokens) - 1))


def test_a_head_kind_chosen_by_hand_and_the_services_422_at_its_control(driver, server, console):
    console.allow(r"/trace - Failed to load resource: the server responded with a status of 422")
    open_page(driver, server, "#sentence=the+cat+sat+on+the+mat&d_model=64&num_heads=4&causal=1")
    assert [e.get_attribute("value") for e in driver.find_elements(By.CSS_SELECTOR, "#head-kinds select")] == ["seeded"] * 4
    assert "head_weights" not in sent_body(driver), "all seeded: the plain request"
    # Same-token needs d_k ≥ 28, and 64 / 4 = 16: the service says so, at head 2's choice, in the page's words.
    choose(driver, "head-kind-2", "same_token")
    error = driver.find_element(By.ID, "head_weights-error")
    wait_until(driver, lambda d: error.is_displayed())
    assert error.text == ("head 2 (same-token) needs d_k ≥ 28, and d_k = d_model / h = 16: use fewer heads or a "
                          "larger d_model")
    assert driver.find_element(By.ID, "head-kind-2").get_attribute("aria-invalid") == "true"
    assert sent_body(driver)["head_weights"] == ["seeded", "seeded", "same_token", "seeded"]
    # Two heads: d_k 32; the choices follow the slider (head 2 goes), so pick same-token again for head 1.
    js(driver, "const s = document.getElementById('num_heads'); s.value = '2';"
               "s.dispatchEvent(new Event('input', {bubbles: true}));")
    wait_until(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#head-kinds select")) == 2)
    choose(driver, "head-kind-1", "same_token")
    wait_until(driver, lambda d: not error.is_displayed())
    wait_ready(driver)
    body = sent_body(driver)
    assert body["head_weights"] == ["seeded", "same_token"] and body["sharpness"] == 10
    W = service_trace(server, body)["stages"]["weights"]["values"]
    driver.find_element(By.CSS_SELECTOR, "label[for='head-1']").click()
    wait_until(driver, lambda d: "head 1 of 2 · same-token" in d.find_element(By.ID, "maps-title").text)
    assert same_cells(driver, W[1])
    assert "head 1 · same-token" in caption(driver)
    # A sharpness the service refuses: its message at the sharpness control.
    set_field(driver, "sharpness", "5000")
    sharp_error = driver.find_element(By.ID, "sharpness-error")
    wait_until(driver, lambda d: sharp_error.is_displayed())
    assert sharp_error.text.startswith("Sharpness must be a number above 0 and at most 1000")
    assert driver.find_element(By.ID, "sharpness").get_attribute("aria-invalid") == "true"


def test_the_offline_page_shows_the_caption_and_the_heads(driver, server, console, tmp_path):
    page = requests.post(server.url + "/trace/html", json=PREVIOUS_TOKEN, timeout=30)
    assert page.status_code == 200
    path = tmp_path / "heads.html"
    path.write_bytes(page.content)
    driver.get("about:blank")
    driver.get(path.as_uri() + "#q=3&head=0")
    wait_ready(driver)
    assert caption(driver).startswith("Previous token")
    assert same_cells(driver, service_trace(server, PREVIOUS_TOKEN)["stages"]["weights"]["values"][0])
    assert "previous-token" in driver.find_element(By.ID, "maps-title").text
    assert driver.find_element(By.ID, "head-kind-0").get_attribute("disabled") is not None, "a saved page's inputs are fixed"
    assert not driver.find_element(By.ID, "head-presets").is_displayed(), "no preset can ask for another trace"


def test_the_command_lines_handout_of_a_preset_opens_at_its_layer_and_caption(driver, server, console, tmp_path):
    """`attention-trace … --html` sends only the options given (no seed, scale or sharpness; the mask from the
    block): the saved page still knows the preset by its trace's config, and opens on its layer, query and caption."""
    path = tmp_path / "induction.html"
    run = subprocess.run([sys.executable, "-m", "attention_trace.cli", INDUCTION["sentence"], "--d-model", "128",
                          "--block", "gpt2", "--layers", "2", "--head-weights", "induction", "--html", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    driver.get("about:blank")
    driver.get(path.as_uri())
    wait_ready(driver)
    assert driver.find_element(By.ID, "layer-1").is_selected(), "the preset's layer, the match"
    assert driver.find_element(By.ID, "query-8").is_selected(), "the preset's query, the last harry"
    assert caption(driver).startswith("Induction (2 layers)") and "attention sink" in caption(driver)
    shown = shown_weights(driver)
    assert int(shown[8].argmax()) == 1 and [int(r.argmax()) for r in shown[:8]] == [0] * 8


def test_present_mode_shows_the_caption_with_the_maps(driver, server, console):
    open_page(driver, server)
    click_preset(driver, "first_token")
    address = driver.current_url
    open_page(driver, server, address[address.index("#"):] + "&present=1&slide=weights")
    assert js(driver, "return document.documentElement.classList.contains('is-present')")
    # A busy stage is shown one figure a step (its walkthrough row first): on to its map, which has the caption.
    mapped = "return !!document.querySelector('figure.heatmap[data-stage=\"weights\"]')?.offsetParent"
    for _ in range(4):
        if js(driver, mapped):
            break
        driver.find_element(By.ID, "present-next").click()
    wait_until(driver, lambda d: js(d, mapped))
    assert "slide=weights" in driver.current_url
    assert caption(driver).startswith("First token") and "attention sink" in caption(driver)
    shown = shown_weights(driver)
    assert [int(r.argmax()) for r in shown] == [0] * len(shown)
