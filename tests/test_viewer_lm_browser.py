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

from viewer_browser_support import js, next_token_bars, open_page, service_trace, wait_ready, wait_until

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
    assert next_token_bars(driver) == [(vocab[j], probs[j]) for j in order]  # the answer's numbers, exactly
    assert next_token_bars(driver)[0][0] == "potter"  # the induction head's copy
    # The slider: softmax(logits[n − 1] / T) of the answer's logits, computed in the page, no request.
    slider = driver.find_element(By.ID, "lm-temperature")
    js(driver, "arguments[0].value = '0.5'; arguments[0].dispatchEvent(new Event('input'));", slider)
    wait_until(driver, lambda d: d.find_element(By.ID, "lm-temperature-value").text == "0.50")
    row = np.array(doc["stages"]["logits"]["values"][-1]) / 0.5
    expected = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
    shown = next_token_bars(driver)
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
        shown = dict(next_token_bars(driver))
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

    def title() -> str:
        return " ".join(driver.find_element(By.ID, "present-where").text.split())

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
    assert next_token_bars(driver)[0][0] == "potter"
    screen(driver, 1024, 768)
    wait_until(driver, lambda d: fit(d)["height"] == 768)
    assert_fits("the next token at 1024x768", fit(driver))
    assert_projector_text("the next token at 1024x768", text_px(driver))


def test_the_live_page_asks_for_the_head_and_the_slider_sends_no_request(driver, server, console):
    from viewer_browser_support import clear_requests, posted, trace_requests

    open_page(
        driver,
        server,
        "#sentence=harry+potter+went+to+the+shop+and+harry&d_model=64&num_heads=1&block=gpt2"
        "&layers=2&causal=1&hw=induction&lm=tied&q=0&head=0",
    )
    section = driver.find_element(By.ID, "next-token-section")
    wait_until(driver, lambda d: section.is_displayed() and next_token_bars(d))
    assert driver.find_element(By.ID, "lm_head").get_attribute("value") == "tied"  # the declared choice's select
    body = {k: v for k, v in BODY.items() if k != "candidates"}
    doc = service_trace(server, body)
    probs, vocab = doc["stages"]["next_token_probs"]["values"], doc["vocabulary"]
    assert next_token_bars(driver)[0] == ("potter", max(probs)) and vocab[probs.index(max(probs))] == "potter"
    clear_requests(driver)
    slider = driver.find_element(By.ID, "lm-temperature")
    js(driver, "arguments[0].value = '2'; arguments[0].dispatchEvent(new Event('input'));", slider)
    wait_until(driver, lambda d: d.find_element(By.ID, "lm-temperature-value").text == "2.00")
    assert next_token_bars(driver)[0][1] < max(probs)  # flatter
    assert trace_requests(driver) == [] and posted(driver, "/trace") == []
    # Off: the request is as before, and the panel goes.
    js(
        driver,
        "const s = document.getElementById('lm_head'); s.value = ''; s.dispatchEvent(new Event('change', {bubbles: true}));",
    )
    wait_until(driver, lambda d: not d.find_element(By.ID, "next-token-section").is_displayed())
    assert "lm_head" not in posted(driver, "/trace")[-1]


LIVE = (
    "#sentence=harry+potter+went+to+the+shop+and+harry&d_model=64&num_heads=1&block=gpt2"
    "&layers=2&causal=1&hw=induction&lm=tied&q=0&head=0"
)


def sequence(driver) -> str:
    return driver.find_element(By.CSS_SELECTOR, "#next-token-body .nt-sequence").text


def shown_step(driver) -> dict:
    """What the panel shows of the step on screen: the chosen token, the bars, the new row of attention."""
    return js(
        driver,
        "const b = document.getElementById('next-token-body');"
        "return {chosen: b.querySelector('.nt-row.is-chosen')?.dataset.token ?? null,"
        " bars: [...b.querySelectorAll('.nt-row')].map(li => [li.dataset.token, Number(li.dataset.prob)]),"
        " row: [...b.querySelectorAll('.nt-attention li')].map(li => [Number(li.dataset.pos), Number(li.dataset.weight)]),"
        " layer: Number((document.getElementById('maps-title').textContent.match(/layer (\\d+)/) || [0, 0])[1])};",
    )


def assert_step_is_the_answers(shown: dict, step: dict, vocab: list[str]) -> None:
    """The panel's step equals the answer's, number for number: the token, its probability, the ten bars (the
    distribution it was chosen from, most probable first) and its row of attention in the layer shown."""
    assert shown["chosen"] == step["token"] == vocab[step["index"]]
    order = sorted(range(len(vocab)), key=lambda j: (-step["probs"][j], j))[:10]
    assert shown["bars"] == [[vocab[j], step["probs"][j]] for j in order]
    assert dict(shown["bars"])[step["token"]] == step["probability"]
    row = step["weights"][shown["layer"]][0]
    assert shown["row"] == [[pos, w] for pos, w in zip(step["cache_positions"], row)]


def test_the_live_page_generates_each_step_from_the_service_and_walks_back(driver, server, console):
    from viewer_browser_support import clear_requests, posted, trace_requests

    clear_requests(driver)
    open_page(driver, server, LIVE)
    wait_until(driver, lambda d: d.find_element(By.ID, "next-token-section").is_displayed() and next_token_bars(d))
    page_body = posted(driver, "/trace")[0]  # the trace on screen: the generate request is it, plus generate
    prompt = sequence(driver).split(" ")
    button = driver.find_element(By.ID, "lm-generate")
    assert button.is_displayed() and button.is_enabled()
    assert driver.find_element(By.ID, "lm-decoding").is_displayed()
    clear_requests(driver)
    presses = 4
    for k in range(1, presses + 1):
        button.click()
        wait_until(driver, lambda d: len(sequence(d).split(" ")) == len(prompt) + k)
        sent = posted(driver, "/trace")
        assert len(sent) == 1  # the first press asked for the first tokens at once; the next ones send nothing
        request = sent[0]
        assert request == {**page_body, "stages": ["next_token_probs"], "generate": 8}
        answer = service_trace(server, request)  # the same request, asked of the API directly
        steps = answer["generation"]
        assert sequence(driver) == " ".join(prompt + [s["token"] for s in steps[:k]])
        assert_step_is_the_answers(shown_step(driver), steps[k - 1], answer["vocabulary"])
        # and the answer to a request for just k tokens is the same, number for number: its steps are a prefix
        assert service_trace(server, {**request, "generate": k})["generation"] == steps[:k]
    assert [s["token"] for s in steps[:3]] == ["potter", "went", "to"]
    # The slider still sends nothing: the step's bars redrawn from its logits.
    clear_requests(driver)
    slider = driver.find_element(By.ID, "lm-temperature")
    js(driver, "arguments[0].value = '0.5'; arguments[0].dispatchEvent(new Event('input'));", slider)
    wait_until(driver, lambda d: d.find_element(By.ID, "lm-temperature-value").text == "0.50")
    row = np.array(steps[presses - 1]["logits"]) / 0.5
    expected = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
    np.testing.assert_allclose([p for _, p in next_token_bars(driver)], np.sort(expected)[::-1][:10], rtol=1e-12)
    assert trace_requests(driver) == [] and posted(driver, "/trace") == []
    # Back to the sentence, then a press at the slider's temperature: a new request, its answer at T = 0.5.
    driver.find_element(By.ID, "lm-generate-reset").click()
    wait_until(driver, lambda d: sequence(d) == " ".join(prompt))
    assert not driver.find_element(By.ID, "lm-generate-reset").is_displayed()
    button.click()
    wait_until(driver, lambda d: len(sequence(d).split(" ")) == len(prompt) + 1)
    (request,) = posted(driver, "/trace")
    assert request == {**page_body, "temperature": 0.5, "stages": ["next_token_probs"], "generate": 8}
    answer = service_trace(server, request)
    assert_step_is_the_answers(shown_step(driver), answer["generation"][0], answer["vocabulary"])
    # Back again at the same temperature: walking the answer held sends nothing.
    driver.find_element(By.ID, "lm-generate-reset").click()
    wait_until(driver, lambda d: sequence(d) == " ".join(prompt))
    clear_requests(driver)
    button.click()
    wait_until(driver, lambda d: len(sequence(d).split(" ")) == len(prompt) + 1)
    assert posted(driver, "/trace") == []
    # Past the tokens held, the next press asks for twice as many (every step again, from the first).
    for k in range(2, 10):
        button.click()
        wait_until(driver, lambda d: len(sequence(d).split(" ")) == len(prompt) + k)
    (request,) = posted(driver, "/trace")
    assert request == {**page_body, "temperature": 0.5, "stages": ["next_token_probs"], "generate": 16}
    answer = service_trace(server, request)
    assert_step_is_the_answers(shown_step(driver), answer["generation"][8], answer["vocabulary"])
    assert sequence(driver) == " ".join(prompt + [s["token"] for s in answer["generation"][:9]])
    assert js(driver, "return document.documentElement.dataset.cspViolations || '0'") == "0"


def test_the_live_page_samples_with_its_seed_and_says_a_refusal_in_the_panel(driver, server, console):
    from viewer_browser_support import clear_requests, posted

    clear_requests(driver)
    open_page(driver, server, LIVE)
    wait_until(driver, lambda d: d.find_element(By.ID, "next-token-section").is_displayed() and next_token_bars(d))
    page_body = posted(driver, "/trace")[0]
    prompt = sequence(driver).split(" ")
    # The panel's inputs take their bounds from the declaration (engine/fields.py, GENERATE_OPTIONS, via fields.js).
    from engine.fields import GENERATE_OPTIONS

    def js_number(v: float) -> str:
        return str(int(v)) if v == int(v) else str(v)

    inputs = {
        f.name: driver.find_elements(By.CSS_SELECTOR, "input#lm-" + f.name.replace("_", "-")) for f in GENERATE_OPTIONS
    }
    assert sorted(name for name, found in inputs.items() if found) == ["sample_seed", "top_k", "top_p"]
    for f in GENERATE_OPTIONS:
        for el in inputs[f.name]:
            low = f.minimum if f.minimum is not None else f.above
            assert (el.get_attribute("min"), el.get_attribute("max")) == (js_number(low), js_number(f.maximum)), f.name
    clear_requests(driver)
    driver.find_element(By.ID, "lm-sample-seed").send_keys("1")
    driver.find_element(By.ID, "lm-top-k").send_keys("3")
    button = driver.find_element(By.ID, "lm-generate")
    for k in (1, 2):
        button.click()
        wait_until(driver, lambda d: len(sequence(d).split(" ")) == len(prompt) + k)
    (request,) = posted(driver, "/trace")
    assert request == {**page_body, "stages": ["next_token_probs"], "sample_seed": 1, "top_k": 3, "generate": 8}
    answer = service_trace(server, request)
    assert answer["config"]["sample_seed"] == 1
    assert_step_is_the_answers(shown_step(driver), answer["generation"][1], answer["vocabulary"])
    assert "(sampled)" in driver.find_element(By.CSS_SELECTOR, "#next-token-body .nt-generated").text
    # A value the service refuses: its problem document, said under the button; the sentence stays.
    console.allow(r"/trace - Failed to load resource: the server responded with a status of 422")
    top_p = driver.find_element(By.ID, "lm-top-p")
    top_p.send_keys("0")
    js(driver, "arguments[0].dispatchEvent(new Event('change'));", top_p)
    wait_until(driver, lambda d: sequence(d) == " ".join(prompt))  # another way of choosing: from the sentence
    clear_requests(driver)
    button.click()
    status = driver.find_element(By.ID, "lm-generate-status")
    wait_until(driver, lambda d: status.is_displayed() and "Not generated" in status.text)
    (refused,) = posted(driver, "/trace")  # refused for its top_p, not its size: asked once
    problem = requests.post(server.url + "/trace", json=refused, timeout=10)
    assert problem.status_code == 422 and problem.headers["Content-Type"].startswith("application/problem+json")
    assert all(e["message"] in status.text for e in problem.json()["errors"]), status.text
    assert "HTTP 422" in status.text and sequence(driver) == " ".join(prompt)
    # Fixed: the next press generates.
    js(driver, "arguments[0].value = ''; arguments[0].dispatchEvent(new Event('change'));", top_p)
    button.click()
    wait_until(driver, lambda d: len(sequence(d).split(" ")) == len(prompt) + 1)
    assert not status.is_displayed()


def test_the_live_page_says_why_it_cannot_generate_before_any_press(driver, server, console):
    """A request the service would refuse to generate from, for a rule the request on screen shows (no causal mask:
    generate_needs_causal; an ablation: interventions_conflict), disables the button and says why beside it, before
    any press; the same request with generate is refused by the service for that rule and nothing else."""
    from viewer_browser_support import clear_requests, posted

    def refused_for(body: dict) -> list[str]:
        answer = requests.post(server.url + "/trace", json={**body, "generate": 1}, timeout=30)
        assert answer.status_code == 422
        return [e["type"] for e in answer.json()["errors"]]

    def button(d):
        return d.find_element(By.ID, "lm-generate")

    def status(d):
        return d.find_element(By.ID, "lm-generate-status")

    clear_requests(driver)
    open_page(driver, server, LIVE.replace("block=gpt2", "block=vaswani2017").replace("&causal=1", ""))
    wait_until(driver, lambda d: d.find_element(By.ID, "next-token-section").is_displayed() and next_token_bars(d))
    body = posted(driver, "/trace")[0]
    assert body["block"] == "vaswani2017" and not body.get("causal")
    assert button(driver).is_displayed() and not button(driver).is_enabled()
    assert status(driver).is_displayed() and status(driver).text.startswith("Generation needs a causal mask: ")
    assert "vaswani2017" in status(driver).text and "is-refused" not in status(driver).get_attribute("class")
    assert button(driver).get_attribute("aria-describedby") == "lm-generate-status"
    assert refused_for(body) == ["generate_needs_causal"]
    # The mask on: the service would generate, and the button can.
    clear_requests(driver)
    js(driver, "document.getElementById('causal').click();")
    wait_until(driver, lambda d: button(d).is_enabled() and not status(d).is_displayed())
    body = posted(driver, "/trace")[0]
    assert body["causal"] is True
    assert requests.post(server.url + "/trace", json={**body, "generate": 1}, timeout=30).status_code == 200
    # A head ablated: off, with the head named; an MLP: the same; undone: on again.
    clear_requests(driver)
    driver.find_element(By.ID, "ablate-head").click()
    wait_until(driver, lambda d: not button(d).is_enabled() and status(d).is_displayed())
    body = posted(driver, "/trace")[0]
    (iv,) = body["interventions"]
    assert status(driver).text.startswith(
        f"Generation is off while a head is ablated (layer {iv['layer']}, head {iv['head']}): "
    ), status(driver).text
    assert refused_for(body) == ["interventions_conflict"]
    clear_requests(driver)
    driver.find_element(By.ID, "ablate-head").click()
    wait_until(driver, lambda d: button(d).is_enabled() and not status(d).is_displayed())
    driver.find_element(By.ID, "ablate-mlp").click()
    wait_until(driver, lambda d: not button(d).is_enabled() and status(d).is_displayed())
    body = [b for b in posted(driver, "/trace") if "interventions" in b][0]
    (iv,) = body["interventions"]
    assert status(driver).text.startswith(f"Generation is off while an MLP is ablated (layer {iv['layer']}'s MLP): ")
    assert refused_for(body) == ["interventions_conflict"]
    driver.find_element(By.ID, "ablate-mlp").click()
    wait_until(driver, lambda d: button(d).is_enabled() and not status(d).is_displayed())
    assert all("generate" not in b for b in posted(driver, "/trace"))  # nothing was asked of the service to refuse


def test_the_live_pages_html_download_keeps_the_tokens_generated(driver, server, console, browser_dirs):
    """The live page's "Download HTML" after k generated tokens sends the trace's request with the generation the
    panel's step asked with (generate: k, its temperature and sample seed); the saved page walks the same k steps."""
    from viewer_browser_support import clear_downloads, clear_requests, posted, wait_download

    clear_requests(driver)
    open_page(driver, server, LIVE)
    wait_until(driver, lambda d: d.find_element(By.ID, "next-token-section").is_displayed() and next_token_bars(d))
    page_body = posted(driver, "/trace")[0]
    driver.find_element(By.ID, "lm-sample-seed").send_keys("2")
    slider = driver.find_element(By.ID, "lm-temperature")
    js(driver, "arguments[0].value = '0.7'; arguments[0].dispatchEvent(new Event('input'));", slider)
    prompt = sequence(driver).split(" ")
    button = driver.find_element(By.ID, "lm-generate")
    live = []
    for k in (1, 2, 3):
        button.click()
        wait_until(driver, lambda d: len(sequence(d).split(" ")) == len(prompt) + k)
        live.append(shown_step(driver))
    shown = sequence(driver)
    clear_requests(driver)
    downloads = clear_downloads(browser_dirs)
    driver.find_element(By.ID, "download-html").click()
    path = wait_download(downloads, "*.html")
    (sent,) = posted(driver, "/trace/html")
    assert sent == {**page_body, "temperature": 0.7, "sample_seed": 2, "generate": 3}
    driver.get("about:blank")
    driver.get(path.as_uri())
    wait_ready(driver)
    assert sequence(driver) == " ".join(prompt)
    assert driver.find_element(By.ID, "lm-temperature-value").text == "0.70"  # the answer's own: the step's
    button = driver.find_element(By.ID, "lm-generate")
    for k in (1, 2, 3):
        button.click()
        wait_until(driver, lambda d: len(sequence(d).split(" ")) == len(prompt) + k)
        assert shown_step(driver) == live[k - 1]
    assert sequence(driver) == shown and not button.is_enabled()  # the same three tokens, and no more held
    assert "(sampled)" in driver.find_element(By.CSS_SELECTOR, "#next-token-body .nt-generated").text
