"""The viewer's next-token panel: headless Chromium on the offline page of a stack with the language-model head.

The panel's bars are the answer's next_token_probs at its temperature, each named by its vocabulary token; the
temperature slider redraws them as softmax(logits / T) of the answer's logits, with no request (the offline page
has no service, and its CSP allows none); "Generate a token" appends the answer's generated tokens one by one,
each with the distribution it was chosen from and its new row of attention.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import requests
from selenium.webdriver.common.by import By

from viewer_browser_support import js, service_trace, wait_ready, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.browser]

BODY = {
    "sentence": "harry potter went to the shop and harry",
    "d_model": 64,
    "num_heads": 1,
    "block": "gpt2",
    "num_layers": 2,
    "head_weights": ["induction"],
    "lm_head": "tied",
    "candidates": ["wand"],
}


def bars(driver) -> list[tuple[str, float]]:
    return [
        (token, float(p))
        for token, p in js(
            driver,
            "return [...document.querySelectorAll('#next-token-body .nt-row')]"
            ".map(li => [li.dataset.token, li.dataset.prob]);",
        )
    ]


def test_the_next_token_panel_shows_the_answers_probabilities_and_redraws_with_the_temperature(
    driver, server, console, tmp_path: Path
):
    page = requests.post(server.url + "/trace/html", json=BODY, timeout=30)
    assert page.status_code == 200
    doc = service_trace(server, BODY)
    path = tmp_path / "lm.html"
    path.write_bytes(page.content)
    driver.get("about:blank")
    driver.get(path.as_uri())
    wait_ready(driver)
    section = driver.find_element(By.ID, "next-token-section")
    assert section.is_displayed()
    probs, vocab = np.array(doc["stages"]["next_token_probs"]["values"]), doc["vocabulary"]
    order = sorted(range(len(vocab)), key=lambda j: (-probs[j], j))
    assert bars(driver) == [(vocab[j], probs[j]) for j in order]  # the answer's numbers, exactly
    assert bars(driver)[0][0] == "potter"  # the induction head's copy
    # The slider: softmax(logits[n − 1] / T) of the answer's logits, computed in the page, no request.
    slider = driver.find_element(By.ID, "lm-temperature")
    js(driver, "arguments[0].value = '0.5'; arguments[0].dispatchEvent(new Event('input'));", slider)
    wait_until(driver, lambda d: d.find_element(By.ID, "lm-temperature-value").text == "0.50")
    row = np.array(doc["stages"]["logits"]["values"][-1]) / 0.5
    expected = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
    shown = bars(driver)
    assert [t for t, _ in shown] == [vocab[j] for j in sorted(range(len(vocab)), key=lambda j: (-expected[j], j))]
    np.testing.assert_allclose([p for _, p in shown], [expected[vocab.index(t)] for t, _ in shown], rtol=1e-12)
    assert shown[0][1] > probs.max()  # a lower temperature sharpens
    assert js(driver, "return document.documentElement.dataset.cspViolations || '0'") == "0"


def test_generate_appends_the_answers_tokens_and_shows_each_new_row_of_attention(
    driver, server, console, tmp_path: Path
):
    body = {**BODY, "generate": 3}
    page = requests.post(server.url + "/trace/html", json=body, timeout=30)
    assert page.status_code == 200
    doc = service_trace(server, body)
    path = tmp_path / "gen.html"
    path.write_bytes(page.content)
    driver.get("about:blank")
    driver.get(path.as_uri())
    wait_ready(driver)
    button = driver.find_element(By.ID, "lm-generate")
    assert button.is_displayed()
    vocab = doc["vocabulary"]
    prompt = [t["text"] for t in doc["tokens"]]
    for k, step in enumerate(doc["generation"], 1):
        button.click()
        wait_until(
            driver,
            lambda d: (
                d.find_element(By.CSS_SELECTOR, "#next-token-body .nt-sequence").text
                == " ".join(prompt + [s["token"] for s in doc["generation"][:k]])
            ),
        )
        chosen = js(driver, "return document.querySelector('#next-token-body .nt-row.is-chosen').dataset.token;")
        assert chosen == step["token"] == vocab[step["index"]]
        shown = dict(bars(driver))
        assert shown[step["token"]] == step["probability"]  # the distribution it was chosen from, exactly
        weights = js(
            driver,
            "return [...document.querySelectorAll('#next-token-body .nt-attention li')]"
            ".map(li => [Number(li.dataset.pos), Number(li.dataset.weight)]);",
        )
        layer = js(
            driver,
            "return Number((document.getElementById('maps-title').textContent.match(/layer (\\d+)/) || [0, 0])[1]);",
        )
        row = step["weights"][layer][0]
        assert weights == [[pos, w] for pos, w in zip(step["cache_positions"], row)]
    assert [s["token"] for s in doc["generation"]] == ["potter", "went", "to"]
    assert not button.is_enabled()
    driver.find_element(By.ID, "lm-generate-reset").click()
    wait_until(
        driver, lambda d: d.find_element(By.CSS_SELECTOR, "#next-token-body .nt-sequence").text == " ".join(prompt)
    )
    assert js(driver, "return document.documentElement.dataset.cspViolations || '0'") == "0"


def test_present_mode_has_a_slide_for_the_next_token(driver, server, console, tmp_path: Path):
    """At 1280×720 every step up to the head's slide fits at a projector's text size (test_viewer_present.py's
    measures), the last one the next token's bars; at 1024×768 that slide fits too."""
    from test_viewer_present import assert_fits, assert_projector_text, fit, screen, text_px

    page = requests.post(server.url + "/trace/html", json=BODY, timeout=30)
    path = tmp_path / "present.html"
    path.write_bytes(page.content)
    screen(driver, 1280, 720)
    driver.get("about:blank")
    driver.get(path.as_uri() + "#present=1")
    wait_ready(driver)
    visible = (
        "return ['maps', 'block-section', 'residual-section', 'walkthrough', 'next-token-section'].filter(id => { "
        "const el = document.getElementById(id); return !el.hidden && el.getClientRects().length > 0; });"
    )
    title = lambda: " ".join(driver.find_element(By.ID, "present-where").text.split())  # noqa: E731
    for _ in range(60):  # to the last slide, the head's (a busy stage one figure a step)
        assert_fits(title(), fit(driver))
        assert_projector_text(title(), text_px(driver))
        if "Predict the next token" in title():
            break
        before = title()
        driver.find_element(By.ID, "present-next").click()
        wait_until(driver, lambda d, before=before: title() != before)
    wait_until(driver, lambda d: js(d, visible) == ["next-token-section"])
    assert "Predict the next token" in title(), title()
    assert bars(driver)[0][0] == "potter"
    screen(driver, 1024, 768)
    wait_until(driver, lambda d: fit(d)["height"] == 768)
    assert_fits("the next token at 1024x768", fit(driver))
    assert_projector_text("the next token at 1024x768", text_px(driver))


def test_the_live_page_asks_for_the_head_and_the_slider_sends_no_request(driver, server, console):
    from viewer_browser_support import clear_requests, open_page, posted, trace_requests

    open_page(
        driver,
        server,
        "#sentence=harry+potter+went+to+the+shop+and+harry&d_model=64&num_heads=1&block=gpt2"
        "&layers=2&causal=1&hw=induction&lm=tied&q=0&head=0",
    )
    section = driver.find_element(By.ID, "next-token-section")
    wait_until(driver, lambda d: section.is_displayed() and bars(d))
    assert driver.find_element(By.ID, "lm_head").get_attribute("value") == "tied"  # the declared choice's select
    body = {
        "sentence": "harry potter went to the shop and harry",
        "d_model": 64,
        "num_heads": 1,
        "block": "gpt2",
        "num_layers": 2,
        "head_weights": ["induction"],
        "lm_head": "tied",
    }
    doc = service_trace(server, body)
    probs, vocab = doc["stages"]["next_token_probs"]["values"], doc["vocabulary"]
    assert bars(driver)[0] == ("potter", max(probs)) and vocab[probs.index(max(probs))] == "potter"
    clear_requests(driver)
    slider = driver.find_element(By.ID, "lm-temperature")
    js(driver, "arguments[0].value = '2'; arguments[0].dispatchEvent(new Event('input'));", slider)
    wait_until(driver, lambda d: d.find_element(By.ID, "lm-temperature-value").text == "2.00")
    assert bars(driver)[0][1] < max(probs)  # flatter
    assert trace_requests(driver) == [] and posted(driver, "/trace") == []
    # Off: the request is as before, and the panel goes.
    js(
        driver,
        "const s = document.getElementById('lm_head'); s.value = ''; s.dispatchEvent(new Event('change', {bubbles: true}));",
    )
    wait_until(driver, lambda d: not d.find_element(By.ID, "next-token-section").is_displayed())
    assert "lm_head" not in posted(driver, "/trace")[-1]
