"""The viewer in a lecture hall: headless Chromium at a projector's 1280×720, against real gunicorn on loopback.

What a lecturer needs, each checked in the page as drawn: the first screen holds the inputs, the d_k card and a
heatmap; a 27-token sentence's maps fit their box (and a map too wide for its box scrolls with a visible scroll
bar, its query axis in view); the sticky query bar stays under 15% of the screen; a clicked cell stays under the
pointer and is the one the readout names; no "null" anywhere; every control has an accessible name; present mode
steps through the stages; the colour scale, Q · Kᵀ, every head side by side, the demonstration of √d_k, and the
service's words in the page's.

This browser keeps its scroll bars (the other browser tests hide them for stable screenshots), so that "a visible
scroll bar" can be measured. Screenshots at 1280×720 go to the test artifacts directory; with
ATTENTION_TRACE_UPDATE_DOCS=1 they refresh docs/viewer-long.png and docs/viewer-present.png (docs/viewer.png, the
first screen, is test_viewer_browser.py's).
"""

from __future__ import annotations

import base64
import os
import re
import shutil

import pytest
import requests
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from conftest import ARTIFACTS, ROOT
from viewer_browser_support import (
    ChromiumOptions, clear_downloads, fixed, fragment, js, open_page, pct, trace, wait_download, wait_ready,
    wait_until, walkthrough_row,
)

pytestmark = [pytest.mark.integration, pytest.mark.browser]

DOCS = ROOT / "docs"
WIDTH, HEIGHT = 1280, 720
#: the reported long sentence (13 tokens) and one of 27 tokens
LONG = "The animal didn't cross the street because it was tired."
LONGER = ("The animal didn't cross the street because it was too tired, and the dog that followed it home was so "
          "very tired too.")


@pytest.fixture(scope="module")
def chromium_options() -> ChromiumOptions:
    """A 1280×720 screen, scroll bars as drawn (no --hide-scrollbars)."""
    return ChromiumOptions(args=("--force-color-profile=srgb", "--disable-quic"), size=(WIDTH, HEIGHT))


def open_view(driver, server, view: str = "") -> None:
    open_page(driver, server, view)
    wait_until(driver, lambda d: js(d, "return !document.getElementById('saturation').classList.contains('is-updating');"))


def rect(driver, selector: str) -> dict:
    return js(driver, "const r = document.querySelector(arguments[0]).getBoundingClientRect();"
                      "return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, width: r.width, height: r.height};",
              selector)


def viewport_shot(driver, name: str, docs_name: str | None = None) -> None:
    """The screen as the projector shows it, 1280×720; refreshes docs/ with ATTENTION_TRACE_UPDATE_DOCS=1."""
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
    path = ARTIFACTS / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))
    if docs_name and os.environ.get("ATTENTION_TRACE_UPDATE_DOCS") == "1":
        shutil.copyfile(path, DOCS / docs_name)


# ---------------------------------------------------------------- the first screen


@pytest.mark.parametrize(("view", "dk", "shot"), [
    (fragment(sentence="the cat sat", d_model=64, num_heads=4, q=1, head=2), "16", "viewer-projector.png"),  # = docs/viewer.png
    (fragment(sentence=LONG, d_model=24, num_heads=1), "24", None),  # the reported address
])
def test_the_first_screen_shows_the_inputs_the_dk_card_and_a_heatmap(driver, server, console, view, dk, shot):
    open_view(driver, server, view)
    assert js(driver, "return [innerWidth, innerHeight];") == [WIDTH, HEIGHT]
    assert js(driver, "return scrollY;") == 0
    for selector in ("#sentence", "#d_model", "#seed", "#num_heads", "#dk-card"):
        r = rect(driver, selector)
        assert 0 <= r["top"] and r["bottom"] <= HEIGHT, (selector, r)
    assert driver.find_element(By.ID, "dk-value").text == dk
    # A heatmap: its title, its key labels and at least its first rows of cells are on the first screen.
    first = rect(driver, "figure.heatmap")
    cell = rect(driver, "figure.heatmap td.hm-cell")
    assert first["top"] >= 0 and cell["bottom"] <= HEIGHT, (first, cell)
    assert rect(driver, "figure.heatmap tbody tr:nth-child(2)")["bottom"] <= HEIGHT
    # The sticky query bar: under 15% of the screen.
    assert rect(driver, ".picker-bar")["height"] <= 0.15 * HEIGHT
    if shot:  # docs/viewer.png is this screen too (test_viewer_browser.py's test_layout_and_screenshots)
        viewport_shot(driver, shot)


def test_the_sticky_bar_stays_small_and_never_covers_a_map_title(driver, server, console):
    open_view(driver, server, fragment(sentence=LONGER, d_model=24, num_heads=4, causal=1))
    assert len(driver.find_elements(By.CSS_SELECTOR, "#token-options .chip")) == 27
    bar = rect(driver, ".picker-bar")
    assert bar["height"] <= 0.15 * HEIGHT, bar  # 27 chips in one row that scrolls sideways, not 4 rows
    chips = js(driver, "const c = document.getElementById('token-options'); return [c.scrollWidth, c.clientWidth,"
                       " c.offsetHeight - c.clientHeight];")
    assert chips[0] > chips[1] and chips[2] > 0, "the chips scroll sideways, with a visible scroll bar"
    # Scrolled to each map (as a link or the keyboard would), its title is below the bar, not under it.
    for stage in ("scores", "weights"):
        js(driver, "document.querySelector(`figure[data-stage=\"${arguments[0]}\"]`).scrollIntoView();", stage)
        bar = rect(driver, ".picker-bar")
        title = rect(driver, f'figure[data-stage="{stage}"] figcaption')
        # (less a sub-pixel: scrolling lands on whole device pixels, the header's height need not be one)
        assert bar["top"] == 0 and title["top"] >= bar["bottom"] - 0.5, (stage, bar, title)
    # The inputs stay on screen beside the results.
    assert rect(driver, "#dk-card")["bottom"] <= HEIGHT and rect(driver, "#sentence")["top"] >= 0


# ---------------------------------------------------------------- long sentences


def test_a_27_token_map_fits_its_box_with_readable_labels(driver, server, console):
    open_view(driver, server, fragment(sentence=LONGER, d_model=24, num_heads=4, causal=1, q=3))
    doc = trace(server, sentence=LONGER, num_heads=4, causal=True).json()
    tokens = [t["text"] for t in doc["tokens"]]
    assert len(tokens) == 27
    for stage in ("scores", "scaled_scores", "masked_scores", "weights"):
        box = rect(driver, f'figure[data-stage="{stage}"] .hm-scroll')
        last = rect(driver, f'table[data-stage="{stage}"] thead th:last-child')
        cell = rect(driver, f'table[data-stage="{stage}"] td[data-row="26"][data-col="26"]')
        assert last["right"] <= box["right"] + 0.5 and cell["right"] <= box["right"] + 0.5, (stage, box, last)
        assert 10 <= cell["width"] and 10 <= cell["height"], cell
        # Every label whole: no ellipsis, no clipped text, on either axis.
        clipped = js(driver, """return [...document.querySelectorAll(`table[data-stage="${arguments[0]}"] .hm-label`)]
            .filter(l => l.scrollWidth > l.clientWidth + 1 || l.scrollHeight > l.clientHeight + 1).map(l => l.textContent);""",
                     stage)
        assert clipped == [], (stage, clipped)
        labels = js(driver, """return [...document.querySelectorAll(`table[data-stage="${arguments[0]}"] th.hm-col`)]
            .map(th => th.textContent);""", stage)
        assert labels == tokens
        assert not js(driver, "return document.querySelector(`figure[data-stage=\"${arguments[0]}\"]`)"
                              ".classList.contains('is-overflowing');", stage)
    # Scrolled to the weights, the whole map is on the screen below the query bar: both token axes in view.
    js(driver, "document.querySelector('figure[data-stage=\"weights\"]').scrollIntoView();")
    bar = rect(driver, ".picker-bar")
    assert rect(driver, 'table[data-stage="weights"]')["top"] >= bar["bottom"]
    assert rect(driver, 'table[data-stage="weights"] td[data-row="26"][data-col="0"]')["bottom"] <= HEIGHT
    # On each row's own scale the pattern shows at 27 tokens (0 … 1 leaves it pale).
    driver.find_element(By.CSS_SELECTOR, "#colour-scale option[value=row]").click()
    wait_until(driver, lambda d: "colour=row" in d.current_url)
    js(driver, "document.querySelector('figure[data-stage=\"weights\"]').scrollIntoView();")
    viewport_shot(driver, "viewer-long.png", "viewer-long.png")
    driver.find_element(By.CSS_SELECTOR, "#colour-scale option[value=abs]").click()


def test_a_map_wider_than_its_box_scrolls_with_a_visible_bar_and_keeps_the_query_axis(driver, server, console):
    # 48 keys in an 800 px window: the cells would be under 10 px, so the box scrolls sideways.
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 800, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False})
    try:
        words = "+".join(f"w{i}" for i in range(48))
        open_view(driver, server, f"#sentence={words}&d_model=24&num_heads=1&q=5")
        box = "figure[data-stage=\"weights\"] .hm-scroll"
        js(driver, "document.querySelector('table[data-stage=\"weights\"] tr[data-row=\"5\"]').scrollIntoView({block: 'center'});")
        sizes = js(driver, "const b = document.querySelector(arguments[0]);"
                           "return [b.scrollWidth, b.clientWidth, b.offsetHeight - b.clientHeight];", box)
        assert sizes[0] > sizes[1], "wider than its box"
        assert sizes[2] >= 8, "a scroll bar that takes room (always shown, not an overlay)"
        assert driver.find_element(By.CSS_SELECTOR, 'figure[data-stage="weights"] .hm-more').is_displayed()
        assert js(driver, "return document.documentElement.scrollWidth;") <= 800, "the page itself does not scroll sideways"
        # Scrolled to its end, the last column is reachable and the query axis (the row labels) is still in view.
        js(driver, "const b = document.querySelector(arguments[0]); b.scrollLeft = b.scrollWidth;", box)
        b = rect(driver, box)
        last = rect(driver, 'table[data-stage="weights"] td[data-row="5"][data-col="47"]')
        label = rect(driver, 'table[data-stage="weights"] tr[data-row="5"] th.hm-row')
        assert b["left"] <= last["left"] and last["right"] <= b["right"] + 0.5, (b, last)
        assert abs(label["left"] - b["left"]) <= 1, "the row labels stick to the left edge"
        assert js(driver, "const r = document.querySelector('table[data-stage=\"weights\"] tr[data-row=\"5\"] th.hm-row')"
                          ".getBoundingClientRect(); return document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2)"
                          ".closest('th')?.classList.contains('hm-row');")
    finally:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False})


def test_at_150_percent_zoom_the_inputs_stay_beside_the_results(driver, server, console):
    """A laptop at 150% zoom has 853 CSS px: still two columns, not one column of the whole page."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 853, "height": 480, "deviceScaleFactor": 1.5, "mobile": False})
    try:
        open_view(driver, server, fragment(sentence=LONG, d_model=24, num_heads=1))
        assert len(js(driver, "return getComputedStyle(document.querySelector('.layout')).gridTemplateColumns;")
                   .split()) == 2
        assert rect(driver, "#maps")["left"] > rect(driver, ".sidebar")["right"]
        assert js(driver, "return document.documentElement.scrollWidth;") <= 853
        last = rect(driver, 'table[data-stage="weights"] thead th:last-child')
        assert last["right"] <= rect(driver, 'figure[data-stage="weights"] .hm-scroll')["right"] + 0.5
    finally:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False})


def test_a_27_token_svg_has_no_overlapping_labels_and_the_typed_sentence(driver, server, console, browser_dirs):
    """The map downloaded as SVG and drawn by Chromium: no two key labels (or row labels) overlap, the caption is
    the sentence as typed, and the legend is in the cells' unit on the chosen colour scale."""
    import xml.etree.ElementTree as ET

    open_view(driver, server, fragment(sentence=LONGER, d_model=24, num_heads=4, causal=1, colour="row"))
    downloads = clear_downloads(browser_dirs)
    driver.find_element(By.CSS_SELECTOR, 'figure[data-stage="weights"] button[data-svg="weights"]').click()
    path = wait_download(downloads, "*.svg")
    ns = "{http://www.w3.org/2000/svg}"
    root = ET.fromstring(path.read_bytes())
    texts = ["".join(t.itertext()) for t in root.iter(ns + "text")]
    assert texts[1] == f"“{LONGER}”", "the sentence as typed, not the tokens put back together"
    assert "row max (each row on its own scale)" in texts and "0.00" in texts
    driver.get(path.as_uri())
    try:
        for group in ("col-labels", "row-labels"):
            boxes = js(driver, """return [...document.querySelectorAll(`g.${arguments[0]} text`)].map(t => {
                const r = t.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; });""", group)
            assert len(boxes) == 27
            overlaps = [(i, j) for i in range(27) for j in range(i + 1, 27)
                        if min(boxes[i][2], boxes[j][2]) - max(boxes[i][0], boxes[j][0]) > 0.5
                        and min(boxes[i][3], boxes[j][3]) - max(boxes[i][1], boxes[j][1]) > 0.5]
            assert overlaps == [], (group, overlaps[:5])
        # Nor do the key labels run into the grid or the caption.
        grid_top = js(driver, "return document.querySelector('g.cells rect').getBoundingClientRect().top;")
        caption = js(driver, "return [...document.querySelectorAll('svg > text')].slice(0, 3)"
                             ".map(t => t.getBoundingClientRect().bottom);")
        tops = js(driver, "return [...document.querySelectorAll('g.col-labels text')].map(t => {"
                          " const r = t.getBoundingClientRect(); return [r.top, r.bottom]; });")
        assert all(bottom <= grid_top + 0.5 and top >= max(caption) for top, bottom in tops)
    finally:
        driver.get("about:blank")


# ---------------------------------------------------------------- a click


def click_keeps_the_cell(driver, stage: str, row: int, col: int, query_text: str, key_text: str) -> None:
    """Put the cell mid-screen, move the pointer onto it and click: the page is redrawn for the new query, and the
    cell under the pointer is still that one, outlined as hovered, and the readout names it."""
    sel = f'table[data-stage="{stage}"] td[data-row="{row}"][data-col="{col}"]'
    js(driver, "document.querySelector(arguments[0]).scrollIntoView({block: 'center'});", sel)
    cell = driver.find_element(By.CSS_SELECTOR, sel)
    before = rect(driver, sel)
    x, y = before["left"] + before["width"] / 2, before["top"] + before["height"] / 2
    ActionChains(driver).move_to_element(cell).click().perform()
    wait_until(driver, lambda d: f"“{query_text}”" in d.find_element(By.ID, "walkthrough-title").text)
    after = rect(driver, sel)
    assert abs(after["top"] - before["top"]) < 0.5 and abs(after["left"] - before["left"]) < 0.5, (before, after)
    def under(d):
        return js(d, "const el = document.elementFromPoint(arguments[0], arguments[1]).closest('td');"
                     "return [el.closest('table').dataset.stage, el.dataset.row, el.dataset.col, el.matches(':hover')];",
                  x, y)

    assert under(driver)[:3] == [stage, str(row), str(col)]
    wait_until(driver, lambda d: under(d) == [stage, str(row), str(col), True], "the hover outline is on that cell")
    readout = driver.find_element(By.ID, "maps-readout").text
    assert f"query “{query_text}” → key “{key_text}”" in readout, readout


def test_clicking_a_cell_leaves_it_under_the_pointer_and_named_by_the_readout(driver, server, console):
    # As reported: query "mat", head 2; click Weights, row "on", column "cat".
    open_view(driver, server, fragment(sentence="the cat sat on the mat", d_model=24, num_heads=4, causal=1, q=5, head=2))
    click_keeps_the_cell(driver, "weights", 3, 1, "on", "cat")
    wait_until(driver, lambda d: d.find_element(By.ID, "explain-status").text.startswith("Head 2: query 3 “on” → key 1 “cat”"))
    assert driver.find_elements(By.CSS_SELECTOR, 'table[data-stage="weights"] td.is-explained[data-row="3"][data-col="1"]')
    # And on a long sentence, where the walkthrough's rows change the most from one query to the next.
    open_view(driver, server, fragment(sentence=LONGER, d_model=24, num_heads=4, causal=1, q=1))
    click_keeps_the_cell(driver, "scaled_scores", 20, 4, "home", "t")


# ---------------------------------------------------------------- what the page writes


def test_no_null_text_and_the_decoding_section_starts_at_step_0(driver, server, console):
    open_view(driver, server, fragment(sentence="the cat sat on the mat", d_model=24, num_heads=4, causal=1, decode=1,
                                       window=3, kv=2, pe="rope"))
    slider = driver.find_element(By.ID, "decode-step")
    assert slider.get_attribute("value") == "0" and "step=" not in driver.current_url
    for t in range(6):
        if t:
            slider.send_keys(Keys.ARROW_RIGHT)
        wait_until(driver, lambda d, t=t: d.find_element(By.ID, "decode-step-value").text == str(t))
        text = js(driver, "return document.body.innerText;")
        assert not re.search(r"\bnull\b", text), [line for line in text.splitlines() if "null" in line]
    # The cache table's headers are words on one line each ("weight", not "weig / ht").
    heads = js(driver, """return [...document.querySelectorAll('.cache-table thead th')].map(th => {
        const r = document.createRange(); r.selectNodeContents(th);
        return [th.textContent, r.getClientRects().length]; });""")
    assert [h for h, lines in heads if lines != 1] == [], heads
    # The one-head concat reads [head₀], not [head₀ | … | head_0].
    open_view(driver, server, fragment(sentence="the cat sat", d_model=24, num_heads=1))
    concat = driver.find_element(By.CSS_SELECTOR, '.walkthrough-table tr[data-stage="concat"] code').text
    assert concat == "[head₀]"
    assert not re.search(r"\bnull\b", js(driver, "return document.body.innerText;"))


def test_every_control_has_an_accessible_name(driver, server, console):
    """Chromium's computed name of every control, with every variant's controls shown (RoPE, decoding, GQA)."""
    open_view(driver, server, fragment(sentence="the cat sat on the mat", d_model=24, num_heads=4, causal=1, decode=1,
                                       kv=2, pe="rope"))
    want = {"rope_base": "RoPE base", "rope_pairing": "RoPE pairing", "decode-step": "Decoding step t",
            "colour-scale": "Colour scale", "present-toggle": "Present"}
    assert {i: driver.find_element(By.ID, i).accessible_name for i in want} == want
    controls = driver.find_elements(By.CSS_SELECTOR, "input, select, textarea, button, [tabindex='0'], summary")
    assert len(controls) > 40
    unnamed = [c.get_attribute("outerHTML")[:90] for c in controls if c.is_displayed() and not c.accessible_name.strip()]
    assert unnamed == []
    # In present mode, its own controls too.
    driver.find_element(By.ID, "present-toggle").click()
    for i, name in (("present-prev", "◀ Previous"), ("present-next", "Next ▶"), ("present-exit", "End present mode")):
        assert driver.find_element(By.ID, i).accessible_name == name
    driver.find_element(By.ID, "present-exit").click()


def test_the_page_speaks_in_its_own_words_and_says_when_the_service_is_down(driver, server, console):
    console.allow(r"/trace - Failed to load resource")
    console.allow(r"net::ERR_INTERNET_DISCONNECTED")
    open_view(driver, server, fragment(sentence="the cat sat", d_model=24, num_heads=2))
    js(driver, "const w = document.getElementById('window'); w.value = '2';"
               "w.dispatchEvent(new Event('input', {bubbles: true}));")
    err = driver.find_element(By.ID, "window-error")
    wait_until(driver, lambda d: err.is_displayed())
    assert err.text.endswith("so it needs the causal mask; switch the causal mask on or clear Sliding window")
    assert "causal: true" not in err.text and "drop window" not in err.text
    assert "causal: true" not in driver.find_element(By.ID, "problem").text
    # The service unreachable (the browser offline): the status line says so, not "fix the request".
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": True, "latency": 0, "downloadThroughput": -1,
                                                                "uploadThroughput": -1})
    try:
        js(driver, "const w = document.getElementById('window'); w.value = '';"
                   "w.dispatchEvent(new Event('input', {bubbles: true}));")
        status = driver.find_element(By.ID, "trace-status")
        wait_until(driver, lambda d: "not answering" in status.text)
        assert status.text.startswith("The service is not answering: the numbers update when it is back.")
        assert "Fix the request" not in status.text
        assert "Could not reach the service" in driver.find_element(By.ID, "problem").text
    finally:
        driver.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": False, "latency": 0,
                                                                    "downloadThroughput": -1, "uploadThroughput": -1})
        driver.execute_cdp_cmd("Network.disable", {})


# ---------------------------------------------------------------- present mode


def visible_parts(driver) -> dict:
    return js(driver, """const shown = (el) => el && el.offsetParent !== null;
        return {
          rows: [...document.querySelectorAll('.walkthrough-table tbody > tr[data-stage]')].filter(shown).map(tr => tr.dataset.stage),
          maps: [...document.querySelectorAll('figure.heatmap')].filter(shown).map(f => f.dataset.stage),
          parts: [...document.querySelectorAll('#results [data-present]')].filter(shown).map(el => el.dataset.present),
        };""")


def test_present_mode_steps_through_the_stages(driver, server, console):
    open_view(driver, server, fragment(sentence="the cat sat on the mat", d_model=24, num_heads=4, causal=1, q=2, head=1))
    root_font = js(driver, "return parseFloat(getComputedStyle(document.documentElement).fontSize);")
    driver.find_element(By.ID, "present-toggle").click()
    assert "is-present" in driver.find_element(By.TAG_NAME, "html").get_attribute("class")
    assert js(driver, "return parseFloat(getComputedStyle(document.documentElement).fontSize);") >= 1.2 * root_font
    assert not driver.find_element(By.CSS_SELECTOR, ".sidebar").is_displayed(), "the inputs fold away"
    expected = [
        ("input", ["input"], [], "Embed the tokens"),
        ("project", ["project"], [], "Project to Q, K and V"),
        ("scores", ["scores"], ["scores"], "Score: Q·Kᵀ"),
        ("scaled_scores", ["scaled_scores"], ["scaled_scores"], "Scale by √d_k"),
        ("masked_scores", ["masked_scores"], ["masked_scores"], "Mask (causal)"),
        ("weights", ["weights"], ["weights"], "Softmax: the weights"),
        ("context", ["context"], [], "Weight the values: Σ w·V"),
        ("concat", ["concat", "output"], [], "Concatenate the heads, then W_O"),
    ]
    doc = trace(server, sentence="the cat sat on the mat", num_heads=4, causal=True).json()

    def bar() -> str:
        return " ".join(driver.find_element(By.ID, "present-where").text.split())

    # A presenter's clicker (Page Down) through every step: a stage too busy for a projector's text is shown one
    # figure a step ("Score: Q·Kᵀ — Kᵀ (3 of 5)"), so a stage's parts are the union over its steps.
    steps = []
    for _ in range(60):
        steps.append((bar(), driver.current_url, visible_parts(driver)))
        if steps[-1][2]["maps"] == ["scores"] and "slide=scores" in driver.current_url:
            viewport_shot(driver, "viewer-present.png", "viewer-present.png")  # the score stage's map
        if driver.find_element(By.ID, "present-next").get_attribute("disabled") == "true":
            break
        before = bar()
        ActionChains(driver).send_keys(Keys.PAGE_DOWN).perform()
        wait_until(driver, lambda d, before=before: bar() != before)
    for i, (slide, rows, maps, title) in enumerate(expected):
        head = f"Stage {i + 1} of {len(expected)}: {title}"
        mine = [st for st in steps if st[0] == head or st[0].startswith(head + " — ")]
        assert mine and all(f"present=1&slide={slide}" in url for _, url, _ in mine), (slide, [st[0] for st in steps])
        shown = {k: list(dict.fromkeys(x for _, _, parts in mine for x in parts[k])) for k in ("rows", "maps", "parts")}
        assert shown["rows"] == rows and shown["maps"] == maps, (slide, shown)
        if slide == "scores":
            assert "matrices" in shown["parts"]
            assert walkthrough_row(driver, "scores") == [fixed(v, 4) for v in doc["stages"]["scores"]["values"][1][2]]
        if slide == "weights":
            assert "heads" in shown["parts"] and "explain" in shown["parts"]
        if slide == "concat":
            assert shown["parts"] == ["walkthrough", "multihead"]
    assert len(steps) >= len(expected) and steps[-1][0].startswith(f"Stage {len(expected)} of")
    driver.find_element(By.ID, "present-prev").click()
    wait_until(driver, lambda d: bar() == steps[-2][0])
    # A reload keeps the slide: present mode and the slide are in the address.
    driver.get("about:blank")
    driver.get(f"{server.url}/{fragment(sentence='the cat sat on the mat', d_model=24, num_heads=4, causal=1, q=2, head=1, present=1, slide='scaled_scores')}")
    wait_ready(driver)
    wait_until(driver, lambda d: bar().startswith("Stage 4 of 8: Scale by √d_k"))
    assert visible_parts(driver)["rows"] == ["scaled_scores"]
    if visible_parts(driver)["maps"] != ["scaled_scores"]:
        ActionChains(driver).send_keys(Keys.PAGE_DOWN).perform()  # the stage's map, the figure after its row
    wait_until(driver, lambda d: visible_parts(d)["maps"] == ["scaled_scores"])
    ActionChains(driver).send_keys(Keys.ESCAPE).perform()
    wait_until(driver, lambda d: "is-present" not in d.find_element(By.TAG_NAME, "html").get_attribute("class"))
    assert "present=" not in driver.current_url
    assert len(visible_parts(driver)["maps"]) == 4 and driver.find_element(By.CSS_SELECTOR, ".sidebar").is_displayed()


# ---------------------------------------------------------------- colour, matrices, heads, the √d_k demonstration


def test_the_colour_scale_shows_structure_and_its_legend_is_in_the_cells_unit(driver, server, console):
    open_view(driver, server, fragment(sentence=LONG, d_model=24, num_heads=1))
    doc = trace(server, sentence=LONG).json()
    W = doc["stages"]["weights"]["values"][0]

    def shades():
        return js(driver, """return [...document.querySelectorAll('table[data-stage="weights"] tbody tr')].map(tr =>
            [...tr.querySelectorAll('td.hm-cell')].map(td => Number(td.style.getPropertyValue('--t'))));""")

    def legend():
        return js(driver, "return [...document.querySelectorAll('figure[data-stage=\"weights\"] .legend-end')]"
                          ".map(e => e.textContent);")

    # Automatic (the default): above 12 tokens each row on its own scale, and the legend says so.
    assert legend() == ["0.00", "row max"]
    assert js(driver, "return document.querySelector('figure[data-stage=\"weights\"] .legend').dataset.auto") == "true"
    # Absolute: a cell's colour is its weight; at 13 tokens most weights are small, so the map is pale.
    driver.find_element(By.CSS_SELECTOR, "#colour-scale option[value=abs]").click()
    wait_until(driver, lambda d: legend() == ["0.00", "1.00"])
    top = max(max(r) for r in W)
    absolute = shades()
    assert max(max(r) for r in absolute) == pytest.approx(top, abs=1e-4)
    pale = sum(sum(r) for r in absolute) / 169
    assert pale < 0.15, pale
    for mode, want_legend in (("map", ["0.00", fixed(top, 2)]), ("row", ["0.00", "row max"])):
        driver.find_element(By.CSS_SELECTOR, f"#colour-scale option[value={mode}]").click()
        wait_until(driver, lambda d, want_legend=want_legend: legend() == want_legend)
        assert f"colour={mode}" in driver.current_url
        t = shades()
        assert sum(sum(r) for r in t) / 169 > pale, "more contrast than 0 … 1"
        if mode == "map":
            assert max(max(r) for r in t) == 1
            assert t[0][0] == pytest.approx(W[0][0] / top, abs=1e-4)
        else:  # each row's largest weight is the darkest colour
            assert all(max(r) == 1 for r in t)
            assert t[3][5] == pytest.approx(W[3][5] / max(W[3]), abs=1e-4)
        # The cells still say their weight; the legend's unit is theirs (fractions, not percentages).
        assert driver.find_element(By.CSS_SELECTOR, 'table[data-stage="weights"] td[data-row="0"][data-col="0"]').get_attribute(
            "aria-label").endswith(f"{fixed(W[0][0], 4)} ({pct(W[0][0], 2)})")
        # Every head's weights side by side follow the same scale.
        assert not driver.find_elements(By.CSS_SELECTOR, ".thumb")  # one head: nothing to set beside it
    driver.find_element(By.CSS_SELECTOR, "#colour-scale option[value=abs]").click()


def test_q_k_and_the_scores_as_matrices_and_every_head_side_by_side(driver, server, console):
    open_view(driver, server, fragment(sentence="the cat sat on the mat", d_model=24, num_heads=4, causal=1, q=2, head=1))
    doc = trace(server, sentence="the cat sat on the mat", num_heads=4, causal=True).json()
    S = doc["stages"]

    def matrix(name):
        return js(driver, """return [...document.querySelectorAll(`table[data-matrix="${arguments[0]}"] tbody tr`)].map(tr =>
            [...tr.querySelectorAll('td')].map(td => td.textContent));""", name)

    assert matrix("Q") == [[fixed(v, 2) for v in row] for row in S["q"]["values"][1]]
    assert matrix("KT") == [[fixed(row[c], 2) for row in S["k"]["values"][1]] for c in range(6)]
    assert matrix("scores") == [[fixed(v, 2) for v in row] for row in S["scores"]["values"][1]]
    assert driver.find_element(By.ID, "matrices-title").text == "Q · Kᵀ = scores, head 1"
    # Pointing at a score lights its row of Q and its column of Kᵀ.
    ActionChains(driver).move_to_element(driver.find_element(
        By.CSS_SELECTOR, 'table[data-matrix="scores"] td[data-row="2"][data-col="4"]')).perform()
    lit = js(driver, "return [...document.querySelectorAll('#matrices-body .is-pointed')].map(td =>"
                     " td.closest('table').dataset.matrix + ':' + td.dataset.row + ',' + td.dataset.col);")
    assert sorted(lit) == sorted([f"Q:2,{c}" for c in range(6)] + [f"KT:{r},4" for r in range(6)] + ["scores:2,4"])
    assert driver.find_element(By.ID, "matrices-readout").text.endswith(fixed(S["scores"]["values"][1][2][4], 4))

    # Every head, side by side, labelled, with its numbers (6 tokens), at a readable size.
    thumbs = driver.find_elements(By.CSS_SELECTOR, ".thumb")
    assert len(thumbs) == 4
    for h, thumb in enumerate(thumbs):
        cells = js(driver, "return [...arguments[0].querySelectorAll('.thumb-cell')].map(c => c.textContent);", thumb)
        W, M = S["weights"]["values"][h], S["masked_scores"]["values"][h]
        assert cells == ["" if M[i][j] is None else fixed(W[i][j], 2) for i in range(6) for j in range(6)]
        labels = js(driver, "return [...arguments[0].querySelectorAll('.thumb-row')].map(c => c.textContent);", thumb)
        assert labels == [t["text"] for t in doc["tokens"]]
        size = js(driver, "const c = arguments[0].querySelector('.thumb-cell').getBoundingClientRect();"
                          "return [c.width, c.height];", thumb)
        assert min(size) >= 24, size
    tops = {round(t.rect["y"]) for t in thumbs}
    assert len(tops) == 1, "four heads in one row at 1280 px"
    thumbs[3].click()
    wait_until(driver, lambda d: "head 3 of 4" in d.find_element(By.ID, "walkthrough-title").text)


def test_the_saturation_section_offers_a_configuration_that_makes_the_point(driver, server, console):
    # The README's 4-head example: with d_k 6 the contrast is weak (38.2% → 43.9% for "cat", head 0).
    open_view(driver, server, fragment(sentence="the cat sat", d_model=24, num_heads=4, q=1, head=0))
    text = driver.find_element(By.CSS_SELECTOR, "#saturation-body .explain").text
    assert "from 38.2% to 43.9%" in text
    demo = driver.find_element(By.ID, "saturation-demo")
    assert demo.text == "Show it with d_k = 64 (d_model 64, one head)"
    demo.click()
    wait_until(driver, lambda d: "from 44.1% to 94.6%" in d.find_element(By.CSS_SELECTOR, "#saturation-body .explain").text)
    assert "d_model=64" in driver.current_url and "num_heads=1" in driver.current_url
    assert driver.find_element(By.ID, "dk-value").text == "64"
    assert not driver.find_elements(By.ID, "saturation-demo"), "no offer where the point is made"


def test_the_explain_panel_shows_the_context_vector_and_folds_the_floating_point_notes(driver, server, console):
    body = {"sentence": "the cat sat", "d_model": 24, "num_heads": 2, "seed": 0, "scale": True, "causal": False,
            "positional_encoding": "sinusoidal"}
    open_view(driver, server, fragment(sentence="the cat sat", d_model=24, num_heads=2, head=1))
    driver.find_element(By.CSS_SELECTOR, 'table[data-stage="weights"] td[data-row="1"][data-col="2"]').click()
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".explain-table tbody tr"))
    answer = requests.post(server.url + "/explain", json={**body, "head": 1, "query": 1, "key": 2}, timeout=10).json()
    contributions = answer["steps"][7]
    shown = js(driver, "return [...document.querySelectorAll('[data-part=\"explain-context\"] .vec-all .num')]"
                       ".map(n => n.textContent);")
    assert shown == [fixed(v, 4) for v in contributions["vector"]]
    assert driver.find_element(By.CSS_SELECTOR, '[data-part="explain-context"] .vec-name').text == "context[1, 1] = Σ ="
    notes = driver.find_element(By.CSS_SELECTOR, ".float-notes")
    assert notes.get_attribute("open") is None, "closed until asked for"
    table = driver.find_element(By.CSS_SELECTOR, ".explain-table").text
    assert "BLAS" not in table and "numpy" not in table
    notes.find_element(By.TAG_NAME, "summary").click()
    listed = js(driver, "return [...document.querySelectorAll('.float-notes li')].map(li => li.dataset.step);")
    assert listed == ["score", "exp", "denominator", "contributions"]
    assert "BLAS" in notes.text
