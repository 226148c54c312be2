"""Ablating a head in the viewer: headless Chromium against real gunicorn on loopback.

On the induction preset, layer 0 (the previous-token half) picked, "Ablate this head" sends the same request with
`interventions` (that head's output zeroed); the maps then show the intervened trace, number for number what
/trace answers for that request (layer 1's head no longer finds the B after the first A), and the comparison panel
gives each stage's largest change from the baseline as the answer's `intervention.max_abs_delta`. Unticking it
brings the baseline back.
(The offline handout's panel: tests/test_standalone_ablate.py, which needs its own browser profile.)
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import requests
from selenium.webdriver.common.by import By

from test_viewer_heads_browser import INDUCTION, click_preset, same_cells, sent_body, shown_weights
from viewer_browser_support import js, next_token_bars, open_page, service_trace, wait_ready, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.browser]

ABLATED = {**INDUCTION, "interventions": [{"target": "head_output", "layer": 0, "head": 0}]}


def panel_rows(driver) -> dict[str, str]:
    return json.loads(
        js(
            driver,
            "return JSON.stringify(Object.fromEntries([...document.querySelectorAll("
            "'#intervention-body tr[data-stage]')].map((r) => [r.dataset.stage, "
            "r.querySelector('td').textContent])))",
        )
    )


def test_ablating_a_head_shows_the_intervened_maps_and_the_change(driver, server, console):
    open_page(driver, server)
    click_preset(driver, "induction")
    baseline = service_trace(server, INDUCTION)
    driver.find_element(By.CSS_SELECTOR, "label[for='layer-0']").click()
    wait_until(driver, lambda d: "layer 0 of 2" in d.find_element(By.ID, "maps-title").text)
    assert driver.find_element(By.ID, "intervention").get_attribute("hidden") is not None
    driver.find_element(By.ID, "ablate-head").click()
    wait_until(driver, lambda d: d.find_element(By.ID, "intervention").is_displayed())
    assert sent_body(driver) == ABLATED
    doc = service_trace(server, ABLATED)
    W = doc["stages"]["weights"]["values"]  # [layer, head, query, key]
    assert "Ablated: layer 0, head 0" in driver.find_element(By.ID, "ablate-label").text
    assert "layer 0 head 0 output" in driver.find_element(By.ID, "intervention-body").text
    # the comparison: each stage's largest change, as the service gives it (4 decimals)
    rows = panel_rows(driver)
    delta = doc["intervention"]["max_abs_delta"]
    assert rows["context"] == " · ".join(f"{x:.4f}" for x in delta["context"]) and delta["context"][0] > 0
    assert "weights" in rows and "token_embedding" not in rows  # stages that did not move are left out
    # layer 1's map: the intervened weights, no longer on "potter" from the last "harry"
    driver.find_element(By.CSS_SELECTOR, "label[for='layer-1']").click()
    wait_until(driver, lambda d: "layer 1 of 2" in d.find_element(By.ID, "maps-title").text)
    assert same_cells(driver, W[1][0])
    assert not same_cells(driver, baseline["stages"]["weights"]["values"][1][0])
    assert shown_weights(driver)[-1, 1] < 0.5, "the last harry no longer looks at potter"
    # untick: the baseline again, and the panel goes
    driver.find_element(By.ID, "ablate-head").click()
    wait_until(driver, lambda d: not d.find_element(By.ID, "intervention").is_displayed())
    wait_until(driver, lambda d: same_cells(d, baseline["stages"]["weights"]["values"][1][0]))
    assert sent_body(driver) == INDUCTION
    assert np.isfinite(shown_weights(driver)).all()


STACK = "#sentence=the+cat+sat+on&d_model=8&num_heads=2&seed=0&scale=1&causal=1&block=gpt2&layers=2&q=1&head=1"


def test_ablating_an_mlp_in_the_block_changes_what_follows_it(driver, server, console):
    open_page(driver, server, STACK + "&layer=1")
    body = sent_body(driver)
    driver.find_element(By.ID, "ablate-mlp").click()
    wait_until(driver, lambda d: d.find_element(By.ID, "intervention").is_displayed())
    want = {**body, "interventions": [{"target": "mlp_output", "layer": 1}]}
    assert sent_body(driver) == want
    # the address keeps the ablation: opened again, the page ticks it and asks for the same intervened trace
    address = driver.current_url.split("#", 1)[1]
    assert "ablate_mlp=1" in address.split("&") and "ablate=" not in address
    open_page(driver, server, "#" + address)
    wait_until(driver, lambda d: d.find_element(By.ID, "intervention").is_displayed())
    assert driver.find_element(By.ID, "ablate-mlp").is_selected() and sent_body(driver) == want
    doc = service_trace(server, want)
    assert "Ablated: layer 1's MLP" in driver.find_element(By.ID, "ablate-mlp-label").text
    rows = panel_rows(driver)
    delta = doc["intervention"]["max_abs_delta"]
    assert rows["ffn_output"] == f"{delta['ffn_output'][0]:.4f} · {delta['ffn_output'][1]:.4f}"
    assert delta["ffn_output"] == [0.0, delta["ffn_output"][1]] and delta["ffn_output"][1] > 0
    assert "weights" not in rows, "layer 1's MLP comes after every attention map"
    assert rows["final_norm"] == f"{delta['final_norm']:.4f}"
    driver.find_element(By.ID, "ablate-mlp").click()
    wait_until(driver, lambda d: not d.find_element(By.ID, "intervention").is_displayed())
    assert sent_body(driver) == body


def top_of(doc: dict) -> tuple[str, float]:
    """The answer's most likely next token (the first of equals, as the panel orders them) and its probability."""
    probs, vocab = doc["stages"]["next_token_probs"]["values"], doc["vocabulary"]
    j = min(range(len(vocab)), key=lambda i: (-probs[i], i))
    return vocab[j], probs[j]


def test_ablating_the_previous_token_head_changes_the_prediction_to_the_services(driver, server, console):
    """The induction preset with the tied head predicts "potter" after the last "harry"; with layer 0's
    previous-token head zeroed, the bars are the intervened answer's next_token_probs, number for number."""
    open_page(driver, server)
    click_preset(driver, "induction")
    js(
        driver,
        "const s = document.getElementById('lm_head'); s.value = 'tied';"
        " s.dispatchEvent(new Event('change', {bubbles: true}));",
    )
    wait_until(driver, lambda d: sent_body(d).get("lm_head") == "tied" and next_token_bars(d))
    wait_ready(driver)
    body = sent_body(driver)
    assert body == {**INDUCTION, "lm_head": "tied"}
    baseline = service_trace(server, body)
    assert next_token_bars(driver)[0] == top_of(baseline)
    assert top_of(baseline)[0] == "potter", "the induction head copies the token after the earlier harry"
    potter = dict(next_token_bars(driver))["potter"]
    driver.find_element(By.CSS_SELECTOR, "label[for='layer-0']").click()
    wait_until(driver, lambda d: "layer 0 of 2" in d.find_element(By.ID, "maps-title").text)
    driver.find_element(By.ID, "ablate-head").click()
    wait_until(driver, lambda d: d.find_element(By.ID, "intervention").is_displayed())
    ablated = {**body, "interventions": [{"target": "head_output", "layer": 0, "head": 0}]}
    assert sent_body(driver) == ablated
    assert "ablate=0.0" in driver.current_url.split("#", 1)[1].split("&")  # a shared link asks for the same
    doc = requests.post(server.url + "/trace", json=ablated, timeout=30)
    assert doc.status_code == 200, doc.text
    intervened = doc.json()
    wait_until(driver, lambda d: next_token_bars(d)[0] == top_of(intervened))
    vocab, probs = intervened["vocabulary"], intervened["stages"]["next_token_probs"]["values"]
    shown = next_token_bars(driver)
    assert shown == [(t, probs[vocab.index(t)]) for t, _ in shown]  # every bar the intervened answer's, exactly
    assert top_of(intervened)[0] != "potter"
    after = probs[vocab.index("potter")]
    assert after < potter / 2, f"potter {potter} -> {after}: without the previous token, no copy"
    assert dict(shown).get("potter", after) == after
    target = driver.find_element(By.ID, "intervention-target").text  # the answer's own before and after
    assert target.startswith('Next token "potter"') and intervened["intervention"]["target"]["token"] == "potter"
    # untick: the baseline's bars again
    driver.find_element(By.ID, "ablate-head").click()
    wait_until(driver, lambda d: not d.find_element(By.ID, "intervention").is_displayed())
    wait_until(driver, lambda d: next_token_bars(d)[0] == top_of(baseline))
    assert dict(next_token_bars(driver))["potter"] == potter
    assert sent_body(driver) == body
    assert "ablate" not in driver.current_url
