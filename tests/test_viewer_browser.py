"""End to end: the viewer page in headless Chromium against real gunicorn on loopback.

The browser, the server and the console come from tests/conftest.py (built from tests/viewer_browser_support.py).
Every test fails on a console error or a CSP violation, except the failed /trace loads a test itself provokes (a
422 is logged by Chromium as a failed resource load).

Screenshots go to the test artifacts directory (conftest.ARTIFACTS, outside the tree). To refresh the ones in
docs/, run with ATTENTION_TRACE_UPDATE_DOCS=1.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import requests
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from conftest import ARTIFACTS, ROOT
from viewer_browser_support import (
    MINUS, as_cells, choose, clear_downloads, clear_requests, explain_rows, fixed, heatmap_labels,
    heatmap_values, js, js_number, js_small, open_page, pct, posted, sent, set_field, trace, trace_requests, wait_download,
    wait_ready, wait_until, walkthrough_row,
)

pytestmark = [pytest.mark.integration, pytest.mark.browser]

DOCS = ROOT / "docs"


def test_fixed_matches_javascript_rounding():
    # 0.125 and 2.5 are exact binary ties: JavaScript rounds them away from zero.
    assert fixed(0.125, 2) == "0.13" and fixed(-0.125, 2) == MINUS + "0.13"
    assert fixed(2.5, 0) == "3" and fixed(1.005, 2) == "1.00"  # 1.005 is below the tie in binary
    assert fixed(-0.00001, 4) == "0.0000" and pct(0.9990000000000001) == "99.9%"


# ---------------------------------------------------------------- page helpers


def walkthrough_vector(driver, part: str) -> list[str]:
    """All values of a vector in the walkthrough (the expanded list when it is long)."""
    return js(driver, """
        const line = document.querySelector(`.walkthrough-table [data-part="${arguments[0]}"]`);
        const all = line.querySelector('.vec-all') || line.querySelector('.vec');
        return [...all.querySelectorAll('.num')].map(n => n.textContent);""", part)


def section_vector(driver, part: str) -> list[str]:
    """All values of a vector anywhere on the page (the decoding section's, for instance)."""
    return js(driver, """
        const line = document.querySelector(`[data-part="${arguments[0]}"]`);
        const all = line.querySelector('.vec-all') || line.querySelector('.vec');
        return [...all.querySelectorAll('.num')].map(n => n.textContent);""", part)


def press(driver, element_id: str, *keys: str) -> None:
    """Focus a control and type keys into it, as a keyboard user would (works for the visually
    hidden native inputs behind the switches and chips, which Selenium will not type into)."""
    js(driver, "document.getElementById(arguments[0]).focus();", element_id)
    ActionChains(driver).send_keys(*keys).perform()


def pick_token(driver, text: str) -> None:
    chip = driver.find_element(By.XPATH, f"//div[@id='token-options']/label[span[@class='chip-text' and text()='{text}']]")
    chip.click()


def screenshot(driver, path: Path) -> None:
    """A full-page PNG at the current layout width."""
    size = js(driver, "return [document.documentElement.scrollWidth, document.documentElement.scrollHeight];")
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True, "fromSurface": True,
        "clip": {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1},
    })
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))


CARD_NUMBERS_JS = """
    const t = (id) => document.getElementById(id).textContent;
    const card = document.getElementById('dk-card');
    return {dmodel: t('dk-dmodel'), heads: t('dk-heads'), dk: t('dk-value'), matrices: t('fact-matrices'),
            params: t('fact-params'), scale: t('fact-scale'),
            scaleLabel: document.querySelector('#fact-scale-label .visually-hidden') ? '√d_k'
                        : t('fact-scale-label')};"""


def card_numbers(driver) -> dict[str, str]:
    return js(driver, CARD_NUMBERS_JS)


def watch_card(driver) -> None:
    """Record every state the d_k card is drawn in (one record per task that changed it) in window.__cardStates."""
    js(driver, """
        window.__cardStates = [];
        const card = document.getElementById('dk-card');
        const snap = () => {
            const numbers = (() => {""" + CARD_NUMBERS_JS + """})();
            const cls = ['valid', 'invalid', 'pending'].find((k) => card.classList.contains('is-' + k));
            window.__cardStates.push({...numbers, cls, status: document.getElementById('dk-status').textContent,
                                      message: document.getElementById('dk-message').textContent});
        };
        window.__cardObserver?.disconnect();
        window.__cardObserver = new MutationObserver(snap);
        window.__cardObserver.observe(card, {subtree: true, childList: true, characterData: true, attributes: true});
    """)


def assert_card_consistent(s: dict[str, str], messages: dict[int, str], d_model: int = 24) -> None:
    """One state of the card describes one configuration: the typed d_model and h (scaling on, no K/V heads)."""
    h = int(s["heads"])
    assert s["dmodel"] == str(d_model), s
    assert s["matrices"] == str(3 * h + 1) and s["params"] == f"{4 * d_model * d_model:,}", s
    if d_model % h == 0:
        dk = d_model // h
        assert s["dk"] == str(dk) and s["scale"] == fixed(math.sqrt(dk), 4), s
        assert s["status"] in (f"{d_model} / {h} = {dk}: each head works in {dk} dimensions",
                               "Checking with the service…"), s
        assert s["message"] == "", s
    else:
        assert s["dk"] == str(round(d_model / h, 3)).rstrip("0").rstrip(".") and s["scale"] == "—", s
        assert s["cls"] in ("invalid", "pending") and s["message"] in ("", messages.get(h)), s


def ui_words(driver, message: str) -> str:
    """A service message as the page shows it: the request's field names in the controls' words (url-state.js's
    uiWords, pinned by tests/js/url-state.test.js)."""
    return js(driver, "return AttentionTrace.urlState.uiWords(arguments[0]);", message)


def emulate_width(driver, width: int, mobile: bool) -> None:
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": 800 if mobile else 900, "deviceScaleFactor": 1, "mobile": mobile})


# ---------------------------------------------------------------- the walkthrough


def test_walkthrough_numbers_equal_the_trace_json(driver, server, console):
    open_page(driver, server)
    set_field(driver, "sentence", "the black cat sat")
    wait_until(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#token-options label")) == 4)
    pick_token(driver, "cat")
    doc = trace(server, sentence="the black cat sat").json()
    S, q, hd = doc["stages"], 2, 0
    assert [t["text"] for t in doc["tokens"]] == ["the", "black", "cat", "sat"]

    title = driver.find_element(By.ID, "walkthrough-title")
    wait_until(driver, lambda d: "“cat”" in title.text, "the walkthrough follows the picked token")
    assert walkthrough_row(driver, "scores") == [fixed(v, 4) for v in S["scores"]["values"][hd][q]]
    assert walkthrough_row(driver, "scaled_scores") == [fixed(v, 4) for v in S["scaled_scores"]["values"][hd][q]]
    weights = S["weights"]["values"][hd][q]
    assert walkthrough_row(driver, "weights") == [f"{pct(w)} ({fixed(w, 4)})" for w in weights]
    assert walkthrough_vector(driver, "x") == [fixed(v, 3) for v in S["input"]["values"][q]]
    for part in ("q", "k", "v", "context"):
        assert walkthrough_vector(driver, part) == [fixed(v, 3) for v in S[part]["values"][hd][q]], part
    assert walkthrough_vector(driver, "concat") == [fixed(v, 3) for v in S["concat"]["values"][q]]
    assert walkthrough_vector(driver, "output") == [fixed(v, 3) for v in S["output"]["values"][q]]

    scale = driver.find_element(By.CSS_SELECTOR, '.walkthrough-table tr[data-stage="scaled_scores"]').text
    assert f"= {fixed(doc['config']['scale_factor'], 4)}" in scale and "√24" in scale
    check = {el.get_attribute("data-check"): el.text for el in driver.find_elements(By.CSS_SELECTOR, "[data-check]")}
    assert check["entropy"] == f"entropy {fixed(doc['stats']['entropy'][hd][q], 3)} nats"
    assert check["max"] == f"max {pct(doc['stats']['max_weight'][hd][q])}"
    assert check["sum"] == f"Σ = {fixed(sum(weights), 4)}"
    # The state is in the address, so the view can be shared.
    assert "q=2" in driver.current_url and "sentence=the+black+cat+sat" in driver.current_url


def test_toggling_scale_changes_the_numbers(driver, server, console):
    open_page(driver, server)
    on = trace(server).json()["stages"]
    off = trace(server, scale=False).json()["stages"]
    assert walkthrough_row(driver, "weights") == [f"{pct(w)} ({fixed(w, 4)})" for w in on["weights"]["values"][0][1]]

    press(driver, "scale", Keys.SPACE)  # the switch, from the keyboard
    want = [f"{pct(w)} ({fixed(w, 4)})" for w in off["weights"]["values"][0][1]]
    wait_until(driver, lambda d: walkthrough_row(d, "weights") == want, "weights follow scale: false")
    assert walkthrough_row(driver, "scaled_scores") == [fixed(v, 4) for v in off["scaled_scores"]["values"][0][1]]
    assert walkthrough_row(driver, "scaled_scores") == walkthrough_row(driver, "scores")  # divided by 1
    assert want != [f"{pct(w)} ({fixed(w, 4)})" for w in on["weights"]["values"][0][1]]
    assert "scale=0" in driver.current_url
    assert driver.find_element(By.ID, "fact-scale").text == "1.0000"


# ---------------------------------------------------------------- the d_k card


def test_five_heads_at_d_model_24_turns_the_card_red(driver, server, console):
    console.allow(r"/trace - Failed to load resource: the server responded with a status of 422")
    open_page(driver, server)
    card = driver.find_element(By.ID, "dk-card")
    assert "is-valid" in card.get_attribute("class")
    assert driver.find_element(By.ID, "dk-value").text == "24"

    watch_card(driver)
    slider = driver.find_element(By.ID, "num_heads")
    for _ in range(4):
        slider.send_keys(Keys.ARROW_RIGHT)  # 1 -> 5, as a keyboard user would
    assert driver.find_element(By.ID, "dk-value").text == "4.8"  # live, before the service answers
    wait_until(driver, lambda d: "is-invalid" in card.get_attribute("class"), "the card turns red")

    problem = trace(server, num_heads=5)
    assert problem.status_code == 422
    message = ui_words(driver, problem.json()["errors"][0]["message"])
    assert "d_k would be 4.8" in message and "h = 5" in message and "num_heads" not in message
    wait_until(driver, lambda d: d.find_element(By.ID, "dk-message").text == message, "the service's words")
    # Every number on the card is of 5 heads now: none of the last valid trace's (√6 for 4 heads) lingers.
    assert card_numbers(driver) == {"dmodel": "24", "heads": "5", "dk": "4.8", "matrices": "16", "params": "2,304",
                                     "scale": "—", "scaleLabel": "√d_k"}
    wait_until(driver, lambda d: card.value_of_css_property("border-top-color") == "rgba(164, 22, 26, 1)")
    assert slider.get_attribute("aria-invalid") == "true"
    assert message in driver.find_element(By.ID, "problem").text
    # Nothing else breaks: the last valid trace stays, marked stale; the controls still work.
    assert "is-stale" in driver.find_element(By.ID, "results").get_attribute("class")
    assert walkthrough_row(driver, "scores")
    assert driver.find_element(By.ID, "download-json").get_attribute("disabled") == "true"

    slider.send_keys(Keys.ARROW_LEFT)  # 4 heads: 24 / 4 = 6
    assert "is-valid" in card.get_attribute("class")  # arithmetic: the split is whole, at once
    assert driver.find_element(By.ID, "dk-value").text == "6"
    wait_until(driver, lambda d: d.find_element(By.ID, "problem").get_attribute("hidden") == "true",
               "the service agrees")
    assert "is-stale" not in driver.find_element(By.ID, "results").get_attribute("class")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#head-options input")) == 4
    assert driver.find_element(By.ID, "fact-matrices").text == "13"
    assert driver.find_element(By.ID, "fact-scale").text == fixed(math.sqrt(6), 4)
    # On the way 1 -> 5 -> 4, each state the card was drawn in was one configuration's, whole.
    states = js(driver, "return window.__cardStates;")
    assert len(states) >= 4
    messages = {5: message}
    for s in states:
        assert_card_consistent(s, messages)


# ---------------------------------------------------------------- heatmaps


def test_causal_toggle_shows_masked_cells(driver, server, console):
    open_page(driver, server, "#sentence=the+cat+sat+on+the+mat&num_heads=2")
    assert not driver.find_elements(By.CSS_SELECTOR, ".hm-cell.is-masked")
    driver.find_element(By.CSS_SELECTOR, "label[for=causal]").click()
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'table[data-stage="masked_scores"]'))
    doc = trace(server, sentence="the cat sat on the mat", num_heads=2, causal=True).json()
    masked = doc["stages"]["masked_scores"]["values"][0]
    weights = doc["stages"]["weights"]["values"][0]
    n = len(masked)
    expected = {(i, j) for i in range(n) for j in range(n) if masked[i][j] is None}
    assert len(expected) == n * (n - 1) // 2
    for stage in ("masked_scores", "weights"):
        cells = js(driver, "return [...document.querySelectorAll(`table[data-stage=\"${arguments[0]}\"] td.is-masked`)]"
                           ".map(td => [Number(td.dataset.row), Number(td.dataset.col), td.textContent,"
                           " td.getAttribute('aria-label')]);", stage)
        assert {(r, c) for r, c, _, _ in cells} == expected, stage
        assert all(text == "—" and "masked" in label for _, _, text, label in cells)
    assert all(weights[i][j] == 0 for i, j in expected)
    legend = driver.find_element(By.CSS_SELECTOR, 'figure[data-stage="weights"] .legend').text
    assert "masked" in legend
    # The walkthrough gains the mask stage; "cat" (index 1) sees only "the" and itself.
    assert walkthrough_row(driver, "masked_scores")[2:] == ["masked (−∞)"] * 4
    assert walkthrough_row(driver, "weights")[2:] == ["masked (0%)"] * 4


def test_heatmap_values_on_hover_and_keyboard(driver, server, console):
    open_page(driver, server)
    doc = trace(server).json()
    weights = doc["stages"]["weights"]["values"][0]
    readout = driver.find_element(By.ID, "maps-readout")

    cell = driver.find_element(By.CSS_SELECTOR, 'table[data-stage="weights"] td[data-row="0"][data-col="2"]')
    ActionChains(driver).move_to_element(cell).perform()
    wait_until(driver, lambda d: fixed(weights[0][2], 4) in readout.text)
    assert readout.text == f"Weights: query “the” → key “sat”: {fixed(weights[0][2], 4)} ({pct(weights[0][2], 2)})"
    assert cell.text == fixed(weights[0][2], 2)

    # One tab stop per map; arrows move inside it and the readout follows focus.
    start = driver.find_element(By.CSS_SELECTOR, 'table[data-stage="weights"] td[tabindex="0"]')
    assert (start.get_attribute("data-row"), start.get_attribute("data-col")) == ("1", "0")
    start.send_keys(Keys.ARROW_RIGHT)
    focused = driver.switch_to.active_element
    assert (focused.get_attribute("data-row"), focused.get_attribute("data-col")) == ("1", "1")
    assert readout.text.endswith(f"{fixed(weights[1][1], 4)} ({pct(weights[1][1], 2)})")
    focused.send_keys(Keys.ARROW_DOWN)
    focused = driver.switch_to.active_element
    assert (focused.get_attribute("data-row"), focused.get_attribute("data-col")) == ("2", "1")
    focused.send_keys(Keys.ENTER)  # that row's token becomes the query
    wait_until(driver, lambda d: "“sat”" in d.find_element(By.ID, "walkthrough-title").text)
    focused = driver.switch_to.active_element
    assert focused.get_attribute("data-row") == "2" and "“sat”" in focused.get_attribute("aria-label")


def luminance(css: str) -> float:
    """Relative luminance (WCAG) of a computed CSS colour: rgb(), rgba(), color(srgb …) or oklab()."""
    nums = [float(x) for x in re.findall(r"-?\d*\.?\d+(?:e-?\d+)?", css)]
    if css.startswith("oklab("):
        L, a, b = nums[:3]
        l_, m_, s_ = (L + 0.3963377774 * a + 0.2158037573 * b) ** 3, (L - 0.1055613458 * a - 0.0638541728 * b) ** 3, \
            (L - 0.0894841775 * a - 1.2914855480 * b) ** 3
        lin = [4.0767416621 * l_ - 3.3077115913 * m_ + 0.2309699292 * s_,
               -1.2684380046 * l_ + 2.6097574011 * m_ - 0.3413193965 * s_,
               -0.0041960863 * l_ - 0.7034186147 * m_ + 1.7076147010 * s_]
    else:
        rgb = nums[:3] if css.startswith("color(srgb") else [v / 255 for v in nums[:3]]
        lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def test_colour_scale_reads_in_greyscale(driver, server, console):
    open_page(driver, server, "#sentence=one+two+three+four+five&num_heads=1")
    cells = js(driver, """return [...document.querySelectorAll('table[data-stage="weights"] td.hm-cell')].map(td => {
        const cs = getComputedStyle(td);
        return [Number(td.dataset.value), cs.backgroundColor, cs.color];});""")
    assert len(cells) == 25
    ordered = sorted((value, luminance(bg)) for value, bg, _ in cells)
    lums = [lum for _, lum in ordered]
    # A sequential scale: a larger weight is never lighter (luminance alone carries the order).
    assert all(a >= b - 1e-6 for a, b in zip(lums, lums[1:]))
    assert lums[0] - lums[-1] > 0.3

    # Every number drawn on a coloured cell stays legible (WCAG AA contrast), on every scale.
    open_page(driver, server, "#sentence=one+two+three+four+five&num_heads=4&causal=1")
    inked = js(driver, """return [...document.querySelectorAll('.hm-cell:not(.is-masked), .strip-cell')].map(el => {
        const cs = getComputedStyle(el);
        return [el.textContent, cs.backgroundColor, cs.color];});""")
    assert len(inked) > 100
    for text, bg, ink in inked:
        hi, lo = sorted((luminance(bg), luminance(ink)), reverse=True)
        assert (hi + 0.05) / (lo + 0.05) >= 4.5, (text, bg, ink)


# ---------------------------------------------------------------- comparisons


def test_saturation_comparison_is_two_traces_side_by_side(driver, server, console):
    open_page(driver, server)
    scaled, unscaled = trace(server).json(), trace(server, scale=False).json()
    rows = js(driver, """return [...document.querySelectorAll('.compare-table tbody tr')].map(tr =>
        [tr.dataset.key ?? tr.dataset.stat, ...[...tr.querySelectorAll('td')].map(td =>
            (td.querySelector('.num') || td).textContent)]);""")
    q = 1
    expected = [[str(j), pct(scaled["stages"]["weights"]["values"][0][q][j]),
                 pct(unscaled["stages"]["weights"]["values"][0][q][j])] for j in range(3)]
    expected += [["entropy", fixed(scaled["stats"]["entropy"][0][q], 3), fixed(unscaled["stats"]["entropy"][0][q], 3)],
                 ["max_weight", pct(scaled["stats"]["max_weight"][0][q]), pct(unscaled["stats"]["max_weight"][0][q])]]
    assert rows == expected
    # Unscaled softmax is more peaked: the service's stats say so, and the page says it in words.
    assert unscaled["stats"]["max_weight"][0][q] > scaled["stats"]["max_weight"][0][q]
    text = driver.find_element(By.CSS_SELECTOR, "#saturation-body .explain").text
    assert f"from {pct(scaled['stats']['max_weight'][0][q])} to {pct(unscaled['stats']['max_weight'][0][q])}" in text


def test_concat_lays_heads_side_by_side_and_contrasts_the_average(driver, server, console):
    open_page(driver, server, "#sentence=the+cat+sat&d_model=24&num_heads=4&q=1")
    doc = trace(server, num_heads=4).json()
    context = [head[1] for head in doc["stages"]["context"]["values"]]
    concat = doc["stages"]["concat"]["values"][1]
    assert concat == [x for head in context for x in head]  # the service's concat is the heads in order

    def strip(selector: str) -> list[list[str]]:
        return js(driver, "return [...document.querySelectorAll(arguments[0])].map(s =>"
                          " [...s.querySelectorAll('.strip-cell')].map(c => c.textContent));", selector)

    assert strip(".mh-heads .strip") == [[fixed(v, 3) for v in head] for head in context]
    assert strip(".concat .strip") == [[fixed(v, 3) for v in concat[i * 6:(i + 1) * 6]] for i in range(4)]
    average = [sum(head[d] for head in context) / 4 for d in range(6)]  # same order of additions as the page
    assert strip('[data-part="average"] .strip') == [[fixed(v, 3) for v in average]]
    assert strip('[data-part="output"] .strip') == [[fixed(v, 3) for v in doc["stages"]["output"]["values"][1]]]
    assert "(4 × 6 = 24 = d_model)" in driver.find_element(By.CSS_SELECTOR, '[data-part="concat"] h3').text
    typical = sum(math.sqrt(sum(x * x for x in head)) for head in context) / 4
    hint = driver.find_element(By.CSS_SELECTOR, '[data-part="average"] .hint').text
    assert f"against {fixed(typical, 2)} for a typical head" in hint

    # Every head's weights, side by side; picking one re-draws the maps and the walkthrough for it.
    thumbs = driver.find_elements(By.CSS_SELECTOR, ".thumb")
    assert len(thumbs) == 4
    thumbs[2].click()
    wait_until(driver, lambda d: "head 2 of 4" in d.find_element(By.ID, "walkthrough-title").text)  # 0-based
    assert walkthrough_row(driver, "scores") == [fixed(v, 4) for v in doc["stages"]["scores"]["values"][2][1]]
    assert driver.find_element(By.ID, "head-2").is_selected()


# ---------------------------------------------------------------- actions


def test_copy_as_curl_reproduces_the_trace_and_download_saves_it(driver, server, console, browser_dirs):
    open_page(driver, server, "#sentence=it%27s+a+cat&d_model=8&num_heads=2&seed=7&causal=1")
    expected = trace(server, sentence="it's a cat", d_model=8, num_heads=2, seed=7, causal=True)
    assert expected.status_code == 200

    driver.find_element(By.ID, "copy-curl").click()
    status = driver.find_element(By.ID, "action-status")
    wait_until(driver, lambda d: status.text)
    command = js(driver, "return document.getElementById('curl-command').textContent;")
    argv = shlex.split(command)
    assert argv[:3] == ["curl", "-s", f"{server.url}/trace"]
    body = json.loads(argv[argv.index("-d") + 1])
    assert body == {"sentence": "it's a cat", "d_model": 8, "num_heads": 2, "seed": 7, "scale": True, "causal": True,
                    "positional_encoding": "sinusoidal"}
    if shutil.which("curl"):
        assert subprocess.run(argv, capture_output=True, check=True, timeout=20).stdout == expected.content

    downloads = clear_downloads(browser_dirs)
    driver.find_element(By.ID, "download-json").click()
    saved = wait_download(downloads, "*.json")
    assert saved.name == "attention-trace_it-s-a-cat_d8_h2_seed7_causal.json"
    assert saved.read_bytes() == expected.content  # the exact response: every float in full


# ---------------------------------------------------------------- errors


def test_service_errors_appear_inline(driver, server, console):
    console.allow(r"/trace - Failed to load resource: the server responded with a status of 422")
    open_page(driver, server)
    set_field(driver, "sentence", "   ")
    err = driver.find_element(By.ID, "sentence-error")
    wait_until(driver, lambda d: err.is_displayed())
    message = trace(server, sentence="   ").json()["errors"][0]["message"]
    assert err.text == message
    assert driver.find_element(By.ID, "sentence").get_attribute("aria-invalid") == "true"
    problem = driver.find_element(By.ID, "problem")
    assert problem.get_attribute("role") == "alert" and "Invalid request (HTTP 422)" in problem.text
    assert "is-stale" in driver.find_element(By.ID, "results").get_attribute("class")

    # An error about the whole request (no field) goes to the alert, in the service's words.
    js(driver, "location.hash = arguments[0];", "#sentence=" + "a+" * 200 + "&d_model=512&num_heads=64")
    too_big = trace(server, sentence="a " * 200, d_model=512, num_heads=64).json()
    assert too_big["errors"][0]["pointer"] == ""
    wait_until(driver, lambda d: too_big["errors"][0]["message"] in problem.text)
    assert driver.find_element(By.ID, "sentence-error").get_attribute("hidden") == "true"

    # And it recovers.
    set_field(driver, "sentence", "the cat sat")
    set_field(driver, "d_model", "24")
    js(driver, "const s = document.getElementById('num_heads'); s.value = '1';"
               "s.dispatchEvent(new Event('input', {bubbles: true}));")
    wait_until(driver, lambda d: problem.get_attribute("hidden") == "true")
    wait_until(driver, lambda d: "is-stale" not in d.find_element(By.ID, "results").get_attribute("class"))
    assert walkthrough_row(driver, "scores") == [fixed(v, 4) for v in trace(server).json()["stages"]["scores"]["values"][0][1]]


# ---------------------------------------------------------------- the attention variants


def test_rope_shows_q_and_k_before_and_after_rotation(driver, server, console):
    open_page(driver, server)
    assert not driver.find_element(By.ID, "rope_base").is_displayed()
    choose(driver, "positional_encoding", "rope")
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '.walkthrough-table tr[data-stage="rotate"]'))
    assert driver.find_element(By.ID, "rope_base").is_displayed()  # the RoPE settings appear with RoPE
    doc = trace(server, positional_encoding="rope", rope_base=10000, rope_pairing="rotate_half").json()
    S, q = doc["stages"], 1
    assert "positional_encoding" not in S and doc["config"]["rope_pairing"] == "rotate_half"
    assert walkthrough_vector(driver, "x") == [fixed(v, 3) for v in S["input"]["values"][q]]
    assert not js(driver, "return document.querySelector('.walkthrough-table [data-part=\"PE\"]');")
    for part, stage in (("q_before", "q"), ("q_rotated", "q_rotated"), ("k_before", "k"), ("k_rotated", "k_rotated")):
        assert walkthrough_vector(driver, part) == [fixed(v, 3) for v in S[stage]["values"][0][q]], part
    assert S["q"]["values"][0][q] != S["q_rotated"]["values"][0][q]  # position 1 does turn the vector
    assert walkthrough_row(driver, "scores") == [fixed(v, 4) for v in S["scores"]["values"][0][q]]
    rotate = driver.find_element(By.CSS_SELECTOR, '.walkthrough-table tr[data-stage="rotate"]').text
    assert "rotate-half" in rotate and "10000" in rotate
    assert "RoPE(Q)RoPE(K)ᵀ" in driver.find_element(By.CSS_SELECTOR, 'figure[data-stage="scores"] .hm-formula').text

    # The other pairing, and another base: the page follows the service.
    choose(driver, "rope_pairing", "interleaved")
    set_field(driver, "rope_base", "500000")
    doc = trace(server, positional_encoding="rope", rope_base=500000, rope_pairing="interleaved").json()
    want = [fixed(v, 3) for v in doc["stages"]["k_rotated"]["values"][0][q]]
    wait_until(driver, lambda d: walkthrough_vector(d, "k_rotated") == want, "k follows pairing and base")
    assert walkthrough_vector(driver, "q_rotated") == [fixed(v, 3) for v in doc["stages"]["q_rotated"]["values"][0][q]]
    assert walkthrough_row(driver, "weights") == [f"{pct(w)} ({fixed(w, 4)})" for w in doc["stages"]["weights"]["values"][0][q]]
    assert "interleaved" in driver.find_element(By.CSS_SELECTOR, '.walkthrough-table tr[data-stage="rotate"]').text
    assert "pe=rope" in driver.current_url and "rope_base=500000" in driver.current_url
    assert "rope_pairing=interleaved" in driver.current_url
    body = json.loads(shlex.split(js(driver, "return document.getElementById('curl-command').textContent;"))[-1])
    assert body["rope_base"] == 500000 and body["rope_pairing"] == "interleaved"

    # The address restores the view.
    open_page(driver, server, "#sentence=the+cat+sat&pe=rope&rope_base=500000&rope_pairing=interleaved&q=1")
    assert walkthrough_vector(driver, "k_rotated") == want


def test_gqa_shows_shared_kv_heads_and_cache_bytes(driver, server, console):
    open_page(driver, server, "#sentence=the+cat+sat&d_model=24&num_heads=4&q=1&head=2")
    assert not driver.find_element(By.ID, "kv-section").is_displayed()
    set_field(driver, "num_kv_heads", "2")
    section = driver.find_element(By.ID, "kv-section")
    wait_until(driver, lambda d: section.is_displayed() and d.find_elements(By.CSS_SELECTOR, ".kv-table tbody tr"))
    doc = trace(server, num_heads=4, num_kv_heads=2).json()
    cfg, S = doc["config"], doc["stages"]
    assert cfg["query_heads_of_kv_head"] == [[0, 1], [2, 3]]
    rows = js(driver, "return [...document.querySelectorAll('.kv-table tbody tr')].map(tr =>"
                      " [...tr.children].map(c => c.textContent));")
    assert rows == [[f"K/V {j}", ", ".join(str(i) for i in heads)]
                    for j, heads in enumerate(cfg["query_heads_of_kv_head"])]
    facts = js(driver, "return Object.fromEntries([...document.querySelectorAll('.kv-bytes [data-dtype]')].map(d =>"
                       " [d.dataset.dtype, d.querySelector('dd').textContent]));")
    assert facts == {k: f"{v:,} B" for k, v in cfg["kv_cache_bytes_per_token"].items()}
    assert "Multi-head attention would keep 2× as much" in section.text
    # The sidebar counts follow the service: W_K and W_V shrink.
    wait_until(driver, lambda d: d.find_element(By.ID, "fact-matrices").text == str(cfg["n_matrices"]))
    assert driver.find_element(By.ID, "fact-params").text == f"{cfg['n_parameters']:,}"
    assert "kv" in driver.find_element(By.ID, "fact-matrices-label").text
    # Query head 2 reads K/V head 1 (0-based, as in the API): the walkthrough shows that head's k and v.
    assert S["k"]["axes"] == ["kv_head", "token", "d_k"]
    assert walkthrough_vector(driver, "k") == [fixed(v, 3) for v in S["k"]["values"][1][1]]
    assert walkthrough_vector(driver, "v") == [fixed(v, 3) for v in S["v"]["values"][1][1]]
    assert walkthrough_vector(driver, "q") == [fixed(v, 3) for v in S["q"]["values"][2][1]]
    assert "K and V from K/V head 1, shared by query heads 2, 3" in \
        driver.find_element(By.CSS_SELECTOR, '.walkthrough-table tr[data-stage="project"]').text
    assert walkthrough_row(driver, "scores") == [fixed(v, 4) for v in S["scores"]["values"][2][1]]
    captions = [t.text for t in driver.find_elements(By.CSS_SELECTOR, ".thumb-caption")]
    assert [c.splitlines()[0] for c in captions] == \
        ["head 0 · K/V 0", "head 1 · K/V 0", "head 2 · K/V 1", "head 3 · K/V 1"]

    # MQA: one K/V head for all.
    set_field(driver, "num_kv_heads", "1")
    wait_until(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".kv-table tbody tr")) == 1)
    assert "Multi-query attention" in section.text
    mqa = trace(server, num_heads=4, num_kv_heads=1).json()
    assert walkthrough_vector(driver, "k") == [fixed(v, 3) for v in mqa["stages"]["k"]["values"][0][1]]


def test_invalid_kv_heads_are_explained_by_the_service_and_sent_once(driver, server, console):
    console.allow(r"/trace - Failed to load resource: the server responded with a status of 422")
    open_page(driver, server, "#sentence=the+cat+sat&d_model=24&num_heads=4")
    clear_requests(driver)
    set_field(driver, "num_kv_heads", "3")
    err = driver.find_element(By.ID, "num_kv_heads-error")
    wait_until(driver, lambda d: err.is_displayed())
    message = ui_words(driver, trace(server, num_heads=4, num_kv_heads=3).json()["errors"][0]["message"])
    assert err.text == message and "divisors of h: 1, 2, 4" in message
    assert driver.find_element(By.ID, "num_kv_heads").get_attribute("aria-invalid") == "true"
    assert message in driver.find_element(By.ID, "problem").text
    # The page has shown the 422: a comparison request would have been sent before (as it was, in parallel or
    # right after the first); the DevTools log has every request sent, answered or not.
    assert len(sent(driver, "/trace")) == 1, "an invalid request is sent once, not again with scale flipped"
    assert len(trace_requests(driver)) == 1

    clear_requests(driver)
    set_field(driver, "num_kv_heads", "4")
    wait_until(driver, lambda d: d.find_element(By.ID, "problem").get_attribute("hidden") == "true")
    wait_until(driver, lambda d: len(trace_requests(d)) == 2)  # valid: the trace and its scale-flipped comparison
    assert driver.find_element(By.ID, "num_kv_heads").get_attribute("aria-invalid") is None


def test_sliding_window_masks_far_keys(driver, server, console):
    console.allow(r"/trace - Failed to load resource: the server responded with a status of 422")
    open_page(driver, server, "#sentence=the+cat+sat+on+the+mat&num_heads=2&q=4")
    # Without the causal mask the service refuses the window, and says why, next to the field.
    set_field(driver, "window", "2")
    err = driver.find_element(By.ID, "window-error")
    wait_until(driver, lambda d: err.is_displayed())
    said = trace(server, sentence="the cat sat on the mat", num_heads=2, window=2).json()["errors"][0]["message"]
    assert said.endswith("set causal: true or drop window")  # the API's words; the page names its controls
    assert err.text == ui_words(driver, said) and err.text.endswith("switch the causal mask on or clear Sliding window")

    driver.find_element(By.CSS_SELECTOR, "label[for=causal]").click()
    wait_until(driver, lambda d: not err.is_displayed())
    wait_until(driver, lambda d: "sliding window" in d.find_element(By.CSS_SELECTOR, 'figure[data-stage="masked_scores"] figcaption').text)
    assert "keys ≥ 2 back" in driver.find_element(By.CSS_SELECTOR, 'figure[data-stage="masked_scores"] .hm-formula').text
    doc = trace(server, sentence="the cat sat on the mat", num_heads=2, causal=True, window=2).json()
    masked = doc["stages"]["masked_scores"]["values"]
    n = len(masked[0])
    for hd in (0, 1):
        assert [[masked[hd][i][j] is None for j in range(n)] for i in range(n)] == \
            [[not (i - 2 < j <= i) for j in range(n)] for i in range(n)]
    for stage in ("masked_scores", "weights"):
        cells = js(driver, "return [...document.querySelectorAll(`table[data-stage=\"${arguments[0]}\"] td.is-masked`)]"
                           ".map(td => [Number(td.dataset.row), Number(td.dataset.col)]);", stage)
        assert {tuple(c) for c in cells} == {(i, j) for i in range(n) for j in range(n) if masked[0][i][j] is None}, stage
    assert heatmap_values(driver, "weights") == as_cells(doc["stages"]["weights"]["values"][0])
    # "the" (4) sees "on" (3) and itself only.
    row = walkthrough_row(driver, "masked_scores")
    assert row == [("masked (−∞)" if v is None else fixed(v, 4)) for v in masked[0][4]]
    assert row.count("masked (−∞)") == 4
    mask = driver.find_element(By.CSS_SELECTOR, '.walkthrough-table tr[data-stage="masked_scores"]').text
    assert "sliding window of 2" in mask
    assert "window=2" in driver.current_url


def test_cross_attention_labels_keys_with_the_context(driver, server, console):
    console.allow(r"/trace - Failed to load resource: the server responded with a status of 422")
    open_page(driver, server, "#sentence=the+cat+sat+on+the+mat&num_heads=2&q=1")
    set_field(driver, "context_sentence", "le chat était assis")
    wait_until(driver, lambda d: "context" in d.find_element(By.ID, "trace-status").text)
    doc = trace(server, sentence="the cat sat on the mat", num_heads=2, context_sentence="le chat était assis").json()
    S = doc["stages"]
    ctx = [t["text"] for t in doc["context_tokens"]]
    sentence = [t["text"] for t in doc["tokens"]]
    assert ctx == ["le", "chat", "était", "assis"]
    assert S["weights"]["axis_tokens"] == [None, "tokens", "context_tokens"]
    for stage in ("scores", "scaled_scores", "weights"):  # every map: sentence down the side, context across
        assert heatmap_labels(driver, stage) == (sentence, ctx), stage
        assert heatmap_values(driver, stage) == as_cells(S[stage]["values"][0]), stage
    assert not driver.find_elements(By.CSS_SELECTOR, 'table[data-stage="masked_scores"]')
    readout = driver.find_element(By.ID, "maps-readout")
    ActionChains(driver).move_to_element(
        driver.find_element(By.CSS_SELECTOR, 'table[data-stage="weights"] td[data-row="1"][data-col="1"]')).perform()
    w = S["weights"]["values"][0][1][1]
    wait_until(driver, lambda d: readout.text == f"Weights: query “cat” → context key “chat”: {fixed(w, 4)} ({pct(w, 2)})")

    # The walkthrough: the context embedded on its own, keys and values from it, scores over its tokens.
    assert walkthrough_row(driver, "scores") == [fixed(v, 4) for v in S["scores"]["values"][0][1]]
    assert walkthrough_row(driver, "weights") == [f"{pct(w)} ({fixed(w, 4)})" for w in S["weights"]["values"][0][1]]
    tokens_in_keys = js(driver, "return [...document.querySelectorAll('.walkthrough-table tr[data-stage=\"weights\"] .tok')]"
                                ".map(e => e.textContent);")
    assert tokens_in_keys == ctx
    # Four context tokens: each list folds behind a summary; opened, it shows every token's vector.
    folded = driver.find_elements(By.CSS_SELECTOR, ".walkthrough-table details.ctx-vectors")
    assert len(folded) == 3 and not any(d.get_attribute("open") for d in folded)
    for d in folded:  # from the keyboard (the sticky picker bar may cover a summary scrolled to the top)
        js(driver, "arguments[0].focus();", d.find_element(By.TAG_NAME, "summary"))
        ActionChains(driver).send_keys(Keys.ENTER).perform()
    assert all(d.get_attribute("open") is not None for d in folded)
    assert driver.find_element(By.CSS_SELECTOR, '.walkthrough-table [data-part="k:3"]').is_displayed()
    for j in range(4):
        assert walkthrough_vector(driver, f"x_ctx:{j}") == [fixed(v, 3) for v in S["context_input"]["values"][j]]
        assert walkthrough_vector(driver, f"k:{j}") == [fixed(v, 3) for v in S["k"]["values"][0][j]]
        assert walkthrough_vector(driver, f"v:{j}") == [fixed(v, 3) for v in S["v"]["values"][0][j]]
    assert walkthrough_vector(driver, "context") == [fixed(v, 3) for v in S["context"]["values"][0][1]]
    # The saturation comparison lists the context's keys too.
    keys = js(driver, "return [...document.querySelectorAll('.compare-table tbody tr[data-key] th')].map(e => e.textContent);")
    assert keys == ctx
    assert "context=le+chat" in driver.current_url

    # A causal mask makes no sense here: the service says so, next to the switch.
    driver.find_element(By.CSS_SELECTOR, "label[for=causal]").click()
    err = driver.find_element(By.ID, "causal-error")
    wait_until(driver, lambda d: err.is_displayed())
    assert err.text == ui_words(driver, trace(server, sentence="the cat sat on the mat", num_heads=2, causal=True,
                                              context_sentence="le chat était assis").json()["errors"][0]["message"])
    assert driver.find_element(By.ID, "causal").get_attribute("aria-invalid") == "true"


def test_kv_cache_decoding_steps_grow_the_cache(driver, server, console):
    console.allow(r"/trace - Failed to load resource: the server responded with a status of 422")
    open_page(driver, server, "#sentence=the+cat+sat+on+the+mat&d_model=24&num_heads=4&head=2")
    assert not driver.find_element(By.ID, "decode-section").is_displayed()
    press(driver, "decode", Keys.SPACE)  # the switch, from the keyboard
    err = driver.find_element(By.ID, "decode-error")
    wait_until(driver, lambda d: err.is_displayed())  # decoding needs the causal mask: the service's words
    assert err.text == ui_words(driver, trace(server, sentence="the cat sat on the mat", num_heads=4,
                                              decode=True).json()["errors"][0]["message"])

    press(driver, "causal", Keys.SPACE)
    section = driver.find_element(By.ID, "decode-section")
    wait_until(driver, lambda d: section.is_displayed() and d.find_elements(By.CSS_SELECTOR, ".cache-table tbody tr"))
    full = trace(server, sentence="the cat sat on the mat", num_heads=4, causal=True, decode=True).json()
    steps, hd = full["decode"], 2
    slider = driver.find_element(By.ID, "decode-step")
    # The slider starts at step 0, as generation does.
    assert slider.get_attribute("max") == str(len(steps) - 1) and slider.get_attribute("value") == "0"

    def shown():
        return js(driver, """return {
            cache: [...document.querySelectorAll('.cache-table tbody tr')].map(tr => Number(tr.dataset.pos)),
            weights: [...document.querySelectorAll('.cache-table td[data-col="weight"]')].map(td => td.textContent),
            scores: [...document.querySelectorAll('.cache-table td[data-col="score"]')].map(td => td.textContent),
            k: [...document.querySelectorAll('.cache-table td[data-col="k"]')].map(td =>
                [...(td.querySelector('.vec-all') || td.querySelector('.vec')).querySelectorAll('.num')].map(n => n.textContent)),
            roles: [...document.querySelectorAll('.cache-tok')].map(li => li.dataset.role),
        };""")

    press(driver, "decode-step", Keys.END)  # to the last step, then back with the keyboard: the cache shrinks
    for t in (5, 4, 3, 2, 1, 0):
        if t < 5:
            press(driver, "decode-step", Keys.ARROW_LEFT)
        st = steps[t]
        wait_until(driver, lambda d, t=t: shown()["cache"] == list(range(t + 1)), f"step {t}")
        got = shown()
        assert got["cache"] == st["cache_positions"]
        assert got["weights"] == [pct(w) for w in st["weights"][hd]]
        assert got["scores"] == [fixed(v, 4) for v in st["scaled_scores"][hd]]
        assert got["k"] == [[fixed(v, 3) for v in k] for k in st["k_cache"][hd]]
        assert got["roles"] == ["cached"] * t + ["new"] + ["future"] * (5 - t)
        assert section_vector(driver, "decode-q") == [fixed(v, 3) for v in st["q"][hd]]
        assert section_vector(driver, "decode-output") == [fixed(v, 3) for v in st["output"]]
        # Each step's weights are the full causal trace's row t.
        assert [pct(w) for w in full["stages"]["weights"]["values"][hd][t][:t + 1]] == got["weights"]
        assert driver.find_element(By.ID, "decode-step-value").text == str(t)
    assert "step=0" in driver.current_url
    unnamed = js(driver, """return [...document.querySelectorAll('input, select, button, [tabindex="0"]')]
        .filter(el => el.offsetParent !== null)
        .filter(el => !((el.labels && el.labels.length) || el.getAttribute('aria-label') || el.textContent.trim()))
        .map(el => el.outerHTML.slice(0, 80));""")
    assert unnamed == []
    assert slider.get_attribute("aria-valuetext") == "step 0 of 5: “the”, 1 cached token"
    assert "Same weights as row 0 of the full causal trace" in section.text

    # With a sliding window of 2, GQA and RoPE: a rolling cache of rotated keys, two entries at most.
    js(driver, "location.hash = arguments[0];",
       "#sentence=the+cat+sat+on+the+mat&d_model=24&num_heads=4&head=2&causal=1&decode=1&window=2&kv=2&pe=rope&step=4")
    both = trace(server, sentence="the cat sat on the mat", num_heads=4, causal=True, decode=True, window=2,
                 num_kv_heads=2, positional_encoding="rope").json()
    st = both["decode"][4]
    wait_until(driver, lambda d: shown()["cache"] == st["cache_positions"] == [3, 4])
    got = shown()
    assert got["roles"] == ["evicted"] * 3 + ["cached", "new", "future"]
    assert got["k"] == [[fixed(v, 3) for v in k] for k in st["k_cache"][1]]  # query head 2 reads K/V head 1
    assert got["weights"] == [pct(w) for w in st["weights"][hd]]
    assert section_vector(driver, "decode-q") == [fixed(v, 3) for v in st["q_rotated"][hd]]
    assert "RoPE(k) in k_cache" in section.text and "dropped positions before 3" in section.text
    assert f"2 × {both['config']['kv_cache_bytes_per_token']['float32']:,} B" in section.text


# ---------------------------------------------------------------- accessibility and layout


def test_keyboard_reaches_everything_and_controls_are_labelled(driver, server, console):
    open_page(driver, server)
    unnamed = js(driver, """return [...document.querySelectorAll('input, select, button, [tabindex="0"]')]
        .filter(el => el.offsetParent !== null || el.type === 'radio' || el.type === 'checkbox')
        .filter(el => !((el.labels && el.labels.length) || el.getAttribute('aria-label') || el.textContent.trim()))
        .map(el => el.outerHTML.slice(0, 80));""")
    assert unnamed == []

    seen = []
    for _ in range(50):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        el = driver.switch_to.active_element
        seen.append(el.get_attribute("id") or el.get_attribute("class") or el.tag_name)
    for want in ("sentence", "d_model", "seed", "num_heads", "positional_encoding", "scale", "causal", "num_kv_heads",
                 "window", "context_sentence", "context_tokens", "decode", "copy-curl", "download-json",
                 "download-html", "query-1", "head-0"):
        assert want in seen, f"Tab never reaches #{want}: {seen}"
    assert "skip-link" in seen[0]
    assert any("hm-cell" in s for s in seen), "the heatmaps are reachable"

    # The token picker is a radio group: arrow keys move the query.
    press(driver, "query-1", Keys.ARROW_RIGHT)
    wait_until(driver, lambda d: "“sat”" in d.find_element(By.ID, "walkthrough-title").text)
    assert driver.switch_to.active_element.get_attribute("id") == "query-2"


def test_nothing_is_loaded_from_another_origin(driver, server, console):
    open_page(driver, server)
    urls = js(driver, "return [location.href, ...performance.getEntriesByType('resource').map(e => e.name)];")
    assert len(urls) >= 5  # the page, its css, js and icon, /version and /trace
    assert all(u.startswith(server.url + "/") for u in urls), urls
    csp = requests.get(server.url + "/", timeout=5).headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe" not in csp


@pytest.mark.parametrize(("width", "name", "docs_name"), [(1280, "desktop", "viewer.png"),
                                                           (360, "mobile", "viewer-mobile.png")])
def test_layout_and_screenshots(driver, server, console, width, name, docs_name):
    """The desktop screenshot is a projector's first screen, 1280×720 (inputs, d_k card, maps); the phone's is the
    whole page. The demonstration's configuration: at d_k 16 the √d_k contrast shows (head 2: 55.1% → 94.0%)."""
    if width < 600:
        emulate_width(driver, width, mobile=True)
    else:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": width, "height": 720, "deviceScaleFactor": 1, "mobile": False})
    try:
        open_page(driver, server, "#sentence=the+cat+sat&d_model=64&num_heads=4&seed=0&q=1&head=2")
        metrics = js(driver, """return {
            inner: window.innerWidth, scroll: document.documentElement.scrollWidth,
            font: parseFloat(getComputedStyle(document.body).fontSize),
            overflowing: [...document.querySelectorAll('.panel, h1, h2, input, select, button')]
              .filter(el => el.getBoundingClientRect().right > window.innerWidth + 0.5).map(el => el.id || el.className),
            sidebarBeside: getComputedStyle(document.querySelector('.layout')).gridTemplateColumns.split(' ').length,
        };""")
        assert metrics["inner"] == width
        assert metrics["scroll"] <= width, "no sideways scrolling of the page"
        assert metrics["overflowing"] == []
        assert metrics["font"] >= 16
        assert metrics["sidebarBeside"] == (2 if width >= 960 else 1)
        targets = js(driver, "return [...document.querySelectorAll('.chip, .button, .switch, input[type=text],"
                             " input[type=number], select')].filter(el => el.offsetParent !== null)"
                             ".map(el => el.getBoundingClientRect().height);")
        assert len(targets) >= 12
        assert min(targets) >= 40, "touch targets of at least 40 px"
        if width < 600:
            screenshot(driver, ARTIFACTS / f"viewer-{name}.png")
        else:  # what the projector shows
            wait_until(driver, lambda d: js(d, "return !document.getElementById('saturation').classList"
                                               ".contains('is-updating');"))
            shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
            (ARTIFACTS / f"viewer-{name}.png").write_bytes(base64.b64decode(shot["data"]))
        if os.environ.get("ATTENTION_TRACE_UPDATE_DOCS") == "1":
            shutil.copyfile(ARTIFACTS / f"viewer-{name}.png", DOCS / docs_name)
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


@pytest.mark.parametrize("fragment", [
    "#sentence=the+cat+sat+on+the+mat&d_model=24&num_heads=4&kv=2&causal=1&window=3&decode=1&pe=rope&step=4",
    "#sentence=the+cat+sat+on+the+mat&context=le+chat+%C3%A9tait+assis+sur+le+tapis&num_heads=2",
])
def test_variants_fit_a_phone(driver, server, console, fragment):
    emulate_width(driver, 360, mobile=True)
    try:
        open_page(driver, server, fragment)
        metrics = js(driver, """return {
            scroll: document.documentElement.scrollWidth,
            overflowing: [...document.querySelectorAll('.panel, h1, h2, input, select, button, .cache-strip')]
              .filter(el => el.getBoundingClientRect().right > window.innerWidth + 0.5).map(el => el.id || el.className),
        };""")
        assert metrics["scroll"] <= 360 and metrics["overflowing"] == []
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


# ---------------------------------------------------------------- names, the card, latency, heads


def test_controls_have_readable_accessible_names(driver, server, console):
    """Chromium's computed names: no subscript runs into its base ("dmodel", "dk", "Heads h")."""
    open_page(driver, server, "#sentence=the+cat+sat&num_heads=4")
    want = {
        "d_model": "d_model (model width)", "num_heads": "Number of heads h", "scale": "Scale scores by √d_k",
        "sentence": "Sentence", "seed": "Seed", "causal": "Causal mask", "num_kv_heads": "K/V heads",
        "context_tokens": "Context tokens (pre-split, one per line)", "dk-title": "Head size d_k",
        "saturation-title": "Why divide by √d_k", "head-2": "head 2 of 4", "download-html": "Download HTML",
        "decode": "KV-cache decoding",
    }
    names = {i: driver.find_element(By.ID, i).accessible_name for i in want}
    names["dk-title"] = names["dk-title"].replace("HEAD SIZE D_K", "Head size d_k")  # a CSS text-transform
    assert names == want
    everything = js(driver, """return [...document.querySelectorAll(
        'input, select, textarea, button, h1, h2, h3, [role="grid"], [role="img"], dt, figcaption')]
        .filter(el => el.offsetParent !== null || el.type === 'radio' || el.type === 'checkbox')""")
    assert len(everything) > 40
    for el in everything:
        name = el.accessible_name
        assert not re.search(r"dmodel|\bdk\b|\bWO\b|\bWQ\b|Heads h\b", name), name
    # What a screen reader reads in the text itself (Chromium's accessibility tree): no subscript is exposed, each
    # is read from its spelled-out twin.
    tree = driver.execute_cdp_cmd("Accessibility.getFullAXTree", {})["nodes"]
    read = [n for n in tree if not n.get("ignored")]
    roles = {n.get("role", {}).get("value") for n in read}
    assert "subscript" not in roles, "a <sub> is read on its own"
    texts = {n["name"]["value"] for n in read if n.get("role", {}).get("value") == "StaticText" and n.get("name")}
    for spoken in ("d_model", "d_k", "√d_k", "4·d_model²", "W_O"):
        assert spoken in texts, spoken


def test_the_card_stays_put_while_typing_a_sentence_and_notes_a_slow_service(driver, server, console):
    open_page(driver, server)
    watch_card(driver)
    set_field(driver, "sentence", "the cat sat on the mat")  # one keystroke at a time, 22 of them
    wait_until(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#token-options label")) == 6)
    wait_ready(driver)
    assert js(driver, "return window.__cardStates;") == [], "the sentence cannot change d_k: the card never moves"

    # A field the card shows: its numbers follow at once; "Checking with the service…" appears only when the
    # answer is slow (here the network is made slow: 1.2 s a request; the note waits 400 ms).
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": False, "latency": 1200,
                                                                 "downloadThroughput": -1, "uploadThroughput": -1})
    try:
        watch_card(driver)
        press(driver, "num_heads", Keys.ARROW_RIGHT)  # 1 -> 2
        assert card_numbers(driver)["dk"] == "12"
        card = driver.find_element(By.ID, "dk-card")
        wait_until(driver, lambda d: d.find_element(By.ID, "dk-status").text == "Checking with the service…")
        wait_until(driver, lambda d: "is-valid" in card.get_attribute("class")
                   and d.find_element(By.ID, "dk-status").text.startswith("24 / 2 = 12"))
        statuses = [s["status"] for s in js(driver, "return window.__cardStates;")]
        assert statuses[0] == "24 / 2 = 12: each head works in 12 dimensions"  # at once, from the inputs
        assert "Checking with the service…" in statuses
        wait_ready(driver)
        # Slow or not, typing a sentence leaves the card alone.
        watch_card(driver)
        set_field(driver, "sentence", "the cat")
        wait_until(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#token-options label")) == 2)
        wait_ready(driver)
        assert js(driver, "return window.__cardStates;") == []
    finally:
        driver.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": False, "latency": 0,
                                                                     "downloadThroughput": -1, "uploadThroughput": -1})


KEYSTROKE_JS = """
    performance.clearResourceTimings();
    window.__m = {};
    document.getElementById('sentence').addEventListener('keydown', () => { window.__m.t0 = performance.now(); },
                                                         {once: true, capture: true});
    const want = arguments[0];
    const main = document.getElementById('main');
    const obs = new MutationObserver(() => {
        const chips = [...document.querySelectorAll('#token-options .chip-text')].map(c => c.textContent);
        if (window.__m.t1 === undefined && chips[chips.length - 1] === want) window.__m.t1 = performance.now();
        if (window.__m.t1 !== undefined && main.getAttribute('aria-busy') === 'false') {  // the comparison too
            window.__m.t2 = performance.now();
            obs.disconnect();
        }
    });
    obs.observe(main, {subtree: true, childList: true, characterData: true, attributes: true,
                       attributeFilter: ['aria-busy']});
"""


def test_keystroke_to_numbers(driver, server, console):
    """Each keystroke in the sentence: the page waits its debounce, sends the trace, draws it. Measured here
    (figures in the test artifacts' viewer-latency.json and docs/viewer.md); the debounce is asserted, not the machine's speed."""
    open_page(driver, server)
    field = driver.find_element(By.ID, "sentence")
    field.click()
    field.send_keys(Keys.END)
    rows = []
    for ch in "abcdefghijkl":
        last = js(driver, "return document.getElementById('sentence').value;").split()[-1] + ch
        js(driver, KEYSTROKE_JS, last)
        field.send_keys(ch)
        wait_until(driver, lambda d: js(d, "return window.__m.t2 !== undefined;"), "the numbers follow the key")
        m = js(driver, """const r = performance.getEntriesByType('resource')
                .filter(e => new URL(e.name).pathname === '/trace');
            return {...window.__m, start: Math.min(...r.map(e => e.startTime))};""")
        rows.append({"total_ms": m["t1"] - m["t0"], "debounce_ms": m["start"] - m["t0"],
                     "with_comparison_ms": m["t2"] - m["t0"]})
        wait_ready(driver)
    median = {k: sorted(r[k] for r in rows)[len(rows) // 2] for k in rows[0]}
    (ARTIFACTS / "viewer-latency.json").write_text(json.dumps({"median": median, "keystrokes": rows}, indent=1))
    # The request waits the debounce (no earlier: a burst of keys is one request), and not the old 300 ms.
    assert 115 <= min(r["debounce_ms"] for r in rows) < 250, rows
    # The drawing does not wait for the comparison trace: the numbers come with the first answer.
    assert all(r["total_ms"] > r["debounce_ms"] for r in rows)


def type_in_one_go(driver, element_id: str, text: str) -> None:
    """Type `text` as a burst no debounce can split: one input event per character, all in one task (the page
    listens to input events; a real keyboard's gaps depend on the machine's load)."""
    js(driver, """const el = document.getElementById(arguments[0]);
        for (const ch of arguments[1]) {
            el.value += ch;
            el.dispatchEvent(new InputEvent('input', {bubbles: true, data: ch, inputType: 'insertText'}));
        }""", element_id, text)


def test_a_burst_of_keys_sends_one_request_and_a_stale_answer_never_draws(driver, server, console):
    open_page(driver, server)
    clear_requests(driver)
    type_in_one_go(driver, "sentence", " on")  # 3 input events, faster than the debounce
    wait_until(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#token-options label")) == 4)
    wait_ready(driver)
    assert len(sent(driver, "/trace")) == 2  # the last text's trace and its comparison, nothing for the keys between

    # An answer that arrives after the inputs changed is never drawn: the page holds the first answer back (a
    # wrapper around fetch, released by the test) until the next keystroke's trace has been drawn.
    js(driver, """
        window.__drawn = [];
        new MutationObserver(() => window.__drawn.push(
            [...document.querySelectorAll('#token-options .chip-text')].map(c => c.textContent).join(' ')))
          .observe(document.getElementById('token-options'), {childList: true});
        const realFetch = window.fetch;
        let release;
        const gate = new Promise((resolve) => { release = resolve; });
        window.__release = release;
        window.__held = false;
        window.__staleDone = false;
        window.fetch = async (url, init) => {
            if (url !== 'trace' || window.__held) return realFetch(url, init);
            window.__held = true;  // the first trace request: answered, but handed over only when released
            const res = await realFetch(url, init);
            await gate;
            const text = res.text.bind(res);
            res.text = async () => {
                try { return await text(); } finally { setTimeout(() => { window.__staleDone = true; }, 0); }
            };
            return res;
        };""")
    type_in_one_go(driver, "sentence", " x")
    wait_until(driver, lambda d: js(d, "return window.__held;"), "the trace of 'the cat sat on x' is held")
    type_in_one_go(driver, "sentence", "y")
    wait_until(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#token-options label")) == 5)
    js(driver, "window.__release();")
    wait_until(driver, lambda d: js(d, "return window.__staleDone;"), "the stale answer reached the page")
    wait_ready(driver)
    assert js(driver, "return window.__drawn;") == ["the cat sat on xy"], "the trace of 'x' is never drawn"
    assert walkthrough_row(driver, "scores") == \
        [fixed(v, 4) for v in trace(server, sentence="the cat sat on xy").json()["stages"]["scores"]["values"][0][1]]


def test_heads_are_numbered_from_0_as_in_the_cli_and_the_api(driver, server, console):
    from attention_trace.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["the cat sat", "--heads", "4", "--head", "2", "--color", "never", "--decimals", "4"]) == 0
    cli_text = out.getvalue()
    assert "Head 2 of 4" in cli_text
    cli_scores = re.search(r"Score QKᵀ\s*\|\s*(.*)", cli_text).group(1)
    doc = trace(server, num_heads=4).json()
    assert [float(v) for v in re.findall(r"→\s*(\S+)", cli_scores)] == \
        [round(v, 4) for v in doc["stages"]["scores"]["values"][2][1]]

    open_page(driver, server, "#sentence=the+cat+sat&num_heads=4&head=2")
    assert "head 2 of 4" in driver.find_element(By.ID, "walkthrough-title").text  # the CLI's "Head 2 of 4"
    assert "head 2 of 4" in driver.find_element(By.ID, "maps-title").text
    assert driver.find_element(By.ID, "head-2").is_selected()
    assert driver.find_element(By.ID, "head-2").accessible_name == "head 2 of 4"
    assert [c.text for c in driver.find_elements(By.CSS_SELECTOR, "#head-options .chip-text")] == ["0", "1", "2", "3"]
    assert walkthrough_row(driver, "scores") == [fixed(v, 4) for v in doc["stages"]["scores"]["values"][2][1]]
    assert [c.text.splitlines()[0] for c in driver.find_elements(By.CSS_SELECTOR, ".thumb-caption")] == \
        ["head 0", "head 1", "head 2", "head 3"]
    assert "head=2" in driver.current_url


def test_context_tokens_are_sent_pre_split(driver, server, console):
    console.allow(r"/trace - Failed to load resource: the server responded with a status of 422")
    open_page(driver, server, "#sentence=the+cat+sat&num_heads=2")
    field = driver.find_element(By.ID, "context_tokens")
    field.click()
    field.send_keys("le", Keys.ENTER, "chat", Keys.ENTER, "était assis", Keys.ENTER)
    wait_until(driver, lambda d: heatmap_labels(d, "weights")[1] == ["le", "chat", "était assis"])
    doc = trace(server, num_heads=2, context_tokens=["le", "chat", "était assis"]).json()
    assert [t["text"] for t in doc["context_tokens"]] == ["le", "chat", "était assis"]  # as given: no splitting
    for stage in ("scores", "weights"):
        assert heatmap_values(driver, stage) == as_cells(doc["stages"][stage]["values"][0]), stage
    body = json.loads(shlex.split(js(driver, "return document.getElementById('curl-command').textContent;"))[-1])
    assert body["context_tokens"] == ["le", "chat", "était assis"] and "context_sentence" not in body
    assert "ctok=le&ctok=chat&ctok=%C3%A9tait+assis" in driver.current_url
    open_page(driver, server, driver.current_url.split("/", 3)[3])  # the address restores it
    assert js(driver, "return document.getElementById('context_tokens').value;") == "le\nchat\nétait assis"

    # An empty line is an empty token: the service says so, next to the field, naming the line.
    field = driver.find_element(By.ID, "context_tokens")
    field.click()
    field.send_keys(Keys.CONTROL, Keys.HOME)
    field.send_keys(Keys.ENTER)
    err = driver.find_element(By.ID, "context_tokens-error")
    wait_until(driver, lambda d: err.is_displayed())
    problem = trace(server, num_heads=2, context_tokens=["", "le", "chat", "était assis"]).json()["errors"][0]
    assert problem["pointer"] == "/context_tokens/0"
    assert err.text == f"line 1 (token 0): {problem['message']}"
    assert field.get_attribute("aria-invalid") == "true"


# ---------------------------------------------------------------- click to explain (POST /explain)


def test_clicking_a_cell_explains_it_number_by_number(driver, server, console):
    open_page(driver, server, "#sentence=the+cat+sat&num_heads=2&head=1")
    clear_requests(driver)
    driver.find_element(By.CSS_SELECTOR, 'table[data-stage="weights"] td[data-row="1"][data-col="2"]').click()
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".explain-table tbody tr"))
    body = {"sentence": "the cat sat", "d_model": 24, "num_heads": 2, "seed": 0, "scale": True, "causal": False,
            "positional_encoding": "sinusoidal"}
    assert posted(driver, "/explain") == [{**body, "head": 1, "query": 1, "key": 2}]  # the trace's request, plus the cell
    answer = requests.post(server.url + "/explain", json={**body, "head": 1, "query": 1, "key": 2}, timeout=10).json()
    doc = trace(server, num_heads=2).json()
    assert answer["steps"][6]["value"] == doc["stages"]["weights"]["values"][1][1][2]
    rows = explain_rows(driver)
    order = js(driver, "return [...document.querySelectorAll('.explain-table tbody tr')].map(tr => tr.dataset.step);")
    assert order == [s["id"] for s in answer["steps"]]
    for step in answer["steps"]:
        row = rows[step["id"]]
        assert row["formula"] == step["formula"], step["id"]
        if step["value"] is None:
            assert row["eq"] is None
        elif step["id"] == "weight":
            assert row["eq"] == f"= {js_small(step['value'])} ({pct(step['value'], 2)})"
        else:
            assert row["eq"] == f"= {js_small(step['value'])}", step["id"]
    assert rows["products"]["vec"] == [fixed(v, 4) for v in answer["steps"][0]["values"]]
    assert rows["denominator"]["keys"] == [js_small(v) for v in answer["steps"][5]["values"]]
    status = driver.find_element(By.ID, "explain-status").text
    assert status == f"Head 1: query 1 “cat” → key 2 “sat”: weight {pct(answer['steps'][6]['value'], 2)}."
    # The explained cell is marked in the maps of its head, and the row's token became the query.
    assert driver.find_elements(By.CSS_SELECTOR, 'td.is-explained[data-row="1"][data-col="2"]')
    assert "“cat”" in driver.find_element(By.ID, "walkthrough-title").text

    # From the keyboard: a map is one tab stop, arrows move, Enter explains the focused cell.
    clear_requests(driver)
    start = driver.find_element(By.CSS_SELECTOR, 'table[data-stage="scores"] td[tabindex="0"]')
    assert (start.get_attribute("data-row"), start.get_attribute("data-col")) == ("1", "0")  # the query's row
    start.send_keys(Keys.ARROW_DOWN)
    driver.switch_to.active_element.send_keys(Keys.ARROW_RIGHT)
    driver.switch_to.active_element.send_keys(Keys.ENTER)
    wait_until(driver, lambda d: d.find_element(By.ID, "explain-status").text.startswith(
        "Head 1: query 2 “sat” → key 1 “cat”"))
    assert posted(driver, "/explain") == [{**body, "head": 1, "query": 2, "key": 1}]
    focused = driver.switch_to.active_element
    assert (focused.get_attribute("data-row"), focused.get_attribute("data-col")) == ("2", "1")

    # New inputs: the explanation of the old trace goes.
    press(driver, "scale", Keys.SPACE)
    wait_until(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, ".explain-table"))
    assert "inputs changed" in driver.find_element(By.ID, "explain-status").text


def test_a_masked_cell_is_explained_as_masked(driver, server, console):
    open_page(driver, server, "#sentence=the+cat+sat+on&num_heads=2&causal=1&q=1")
    driver.find_element(By.CSS_SELECTOR, 'table[data-stage="weights"] td[data-row="1"][data-col="3"]').click()
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".explain-table tbody tr"))
    answer = requests.post(server.url + "/explain", json={
        "sentence": "the cat sat on", "d_model": 24, "num_heads": 2, "seed": 0, "scale": True, "causal": True,
        "positional_encoding": "sinusoidal", "head": 0, "query": 1, "key": 3}, timeout=10).json()
    assert answer["masked"] is True and answer["masked_keys"] == [2, 3]
    banner = driver.find_element(By.CSS_SELECTOR, ".explain-masked").text
    assert banner.startswith("Masked cell.") and answer["mask_reason"] in banner
    rows = explain_rows(driver)
    assert rows["weight"]["eq"].startswith("= masked") and "0.0000" not in rows["weight"]["eq"]
    assert rows["exp"]["eq"].startswith("= masked")
    assert rows["denominator"]["keys"][2:] == ["masked", "masked"]
    assert rows["contributions"]["keys"][2:] == ["masked", "masked"]
    assert rows["score"]["eq"] == f"= {js_small(answer['steps'][1]['value'])}"  # a masked cell keeps its score
    assert "masked" in driver.find_element(By.ID, "explain-status").text
    text = driver.find_element(By.ID, "explain-body").text
    assert "0.0000" not in text.replace(rows["score"]["eq"], "")


# ---------------------------------------------------------------- SVG and HTML downloads


def svg_texts(root) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(SVG + "text")]


SVG = "{http://www.w3.org/2000/svg}"


def test_heatmaps_and_the_comparison_download_as_svg(driver, server, console, browser_dirs):
    open_page(driver, server, "#sentence=the+cat+sat+on&num_heads=2&causal=1&head=1&q=2")
    doc = trace(server, sentence="the cat sat on", num_heads=2, causal=True).json()
    alt = trace(server, sentence="the cat sat on", num_heads=2, causal=True, scale=False).json()
    tokens = ["the", "cat", "sat", "on"]
    downloads = clear_downloads(browser_dirs)
    driver.find_element(By.CSS_SELECTOR, 'figure[data-stage="weights"] button[data-svg="weights"]').click()
    path = wait_download(downloads, "*.svg")
    assert path.name == "attention-trace_the-cat-sat-on_d24_h2_seed0_causal_weights_head1.svg"
    root = ET.fromstring(path.read_bytes())  # well-formed XML
    assert root.tag == SVG + "svg"
    texts = svg_texts(root)
    assert texts[0] == "Weights · head 1 of 2 · softmax: rows sum to 1"
    assert texts[1] == "“the cat sat on”"
    assert texts[2].startswith("d_model 24 · 2 heads of d_k 12 · seed 0 · scaled ÷ √12 · causal")
    cols = [t.text for t in root.find(f".//{SVG}g[@class='col-labels']")]
    rows = [t.text for t in root.find(f".//{SVG}g[@class='row-labels']")]
    assert cols == tokens and rows == tokens
    weights = doc["stages"]["weights"]["values"][1]
    masked = doc["stages"]["masked_scores"]["values"][1]
    for g in root.find(f".//{SVG}g[@class='cells']"):
        i, j = int(g.get("data-row")), int(g.get("data-col"))
        shown = g.find(SVG + "text").text
        assert shown == ("masked" if masked[i][j] is None else fixed(weights[i][j], 2)), (i, j)
        assert g.get("data-value") == js_number(weights[i][j])
    assert sum(1 for t in texts if t == "masked") == 6
    assert "colour scale" in texts and "masked: excluded from the softmax (weight 0)" in texts
    assert not [el for el in root.iter() if el.get("href") or el.get("{http://www.w3.org/1999/xlink}href")]
    # Chromium draws the file on its own (a parse error would be an error page instead).
    driver.get(path.as_uri())
    assert js(driver, "return document.documentElement.localName;") == "svg"
    assert not js(driver, "return document.getElementsByTagName('parsererror').length;")

    open_page(driver, server, "#sentence=the+cat+sat+on&num_heads=2&causal=1&head=1&q=2")
    downloads = clear_downloads(browser_dirs)
    wait_until(driver, lambda d: d.find_element(By.ID, "download-saturation-svg").is_enabled())
    driver.find_element(By.ID, "download-saturation-svg").click()
    path = wait_download(downloads, "*.svg")
    assert path.name == "attention-trace_the-cat-sat-on_d24_h2_seed0_causal_comparison_q2_head1.svg"
    root = ET.fromstring(path.read_bytes())
    texts = svg_texts(root)
    assert texts[0] == "Why divide by √d_k: the weights of “sat” (query 2), head 1"
    for k, d in (("scaled", doc), ("unscaled", alt)):
        w = d["stages"]["weights"]["values"][1][2]
        shown = [g.find(SVG + "text").text for g in root.iter(SVG + "g") if g.get("data-series") == k]
        assert shown == [pct(w[0]), pct(w[1]), pct(w[2]), "masked"], k
        stats = (f"{k}: entropy {fixed(d['stats']['entropy'][1][2], 3)} nats · "
                 f"max weight {pct(d['stats']['max_weight'][1][2])}")
        assert stats in texts
    assert [t.text for t in root.iter(SVG + "text") if t.get("data-key")] == tokens


def test_download_html_saves_the_services_standalone_page(driver, server, console, browser_dirs):
    open_page(driver, server, "#sentence=the+cat+sat&num_heads=2&causal=1")
    body = json.loads(shlex.split(js(driver, "return document.getElementById('curl-command').textContent;"))[-1])
    downloads = clear_downloads(browser_dirs)
    driver.find_element(By.ID, "download-html").click()
    path = wait_download(downloads, "*.html")
    assert path.name == "attention-trace_the-cat-sat_d24_h2_seed0_causal.html"
    expected = requests.post(server.url + "/trace/html", data=json.dumps(body),
                             headers={"Content-Type": "application/json"}, timeout=20)
    assert expected.headers["Content-Disposition"] == f'attachment; filename="{path.name}"'
    # The service's page, with the view it was saved from written in as data (the page opens on it).
    saved = path.read_bytes()
    view = re.search(rb'<script type="application/json" id="view-state">[^<]*</script>\n', saved)
    assert view is not None and b'"fragment":"q=1&head=0"' in view.group(0), saved[:200]
    assert saved.replace(view.group(0), b"") == expected.content
    assert "Saved attention-trace_the-cat-sat_d24_h2_seed0_causal.html" in \
        driver.find_element(By.ID, "action-status").text


def test_explaining_a_decoded_trace_compares_the_cache_step(driver, server, console):
    open_page(driver, server, "#sentence=the+cat+sat+on&num_heads=2&causal=1&decode=1&q=2")
    driver.find_element(By.CSS_SELECTOR, 'table[data-stage="weights"] td[data-row="2"][data-col="1"]').click()
    note = driver.find_element(By.ID, "explain-body")
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '[data-part="explain-decode"]'))
    answer = requests.post(server.url + "/explain", json={
        "sentence": "the cat sat on", "d_model": 24, "num_heads": 2, "seed": 0, "scale": True, "causal": True,
        "positional_encoding": "sinusoidal", "decode": True, "head": 0, "query": 2, "key": 1}, timeout=10).json()
    assert answer["decode"]["in_cache"] is True
    line = note.find_element(By.CSS_SELECTOR, '[data-part="explain-decode"]').text
    assert line.startswith(f"KV-cache decoding: {answer['decode']['note']} (weight difference ")


def test_an_explained_cell_fits_a_phone(driver, server, console):
    emulate_width(driver, 360, mobile=True)
    try:
        open_page(driver, server, "#sentence=the+cat+sat+on&num_heads=2&causal=1&q=1")
        js(driver, "document.querySelector('table[data-stage=\"weights\"] td[data-row=\"1\"][data-col=\"3\"]').click();")
        wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".explain-table tbody tr"))
        metrics = js(driver, """return {
            scroll: document.documentElement.scrollWidth,
            overflowing: [...document.querySelectorAll('.panel, h2, button, textarea, .explain-masked, .explain-table td')]
              .filter(el => el.getBoundingClientRect().right > window.innerWidth + 0.5).map(el => el.id || el.className),
            formula: document.querySelector('.explain-table tr[data-step="score"] .wt-op code').getBoundingClientRect().width,
        };""")
        assert metrics["scroll"] <= 360 and metrics["overflowing"] == []
        assert metrics["formula"] > 200, "the formula reads across the screen, not a letter a line"
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
