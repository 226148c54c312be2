"""End to end: the viewer page in headless Chromium against real gunicorn on loopback.

Debian's chromium and chromedriver (scripts/install-browser), driven by
Selenium with both paths given explicitly, so Selenium Manager never runs and
nothing is downloaded. Every test fails on a console error or a CSP
violation, except the failed /trace loads a test itself provokes (a 422 is
logged by Chromium as a failed resource load).

Screenshots go to artifacts/ (gitignored). To refresh the ones in docs/, run
with ATTENTION_TRACE_UPDATE_DOCS=1.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest
import requests

from conftest import ROOT, Gunicorn

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

pytestmark = pytest.mark.integration

# `make test` installs both (scripts/install-browser); without them these
# tests fail rather than skip, so a missing browser can never pass silently.
assert CHROMIUM.exists() and CHROMEDRIVER.exists(), \
    "needs Debian's chromium and chromedriver: run scripts/install-browser (make test does)"

from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

ARTIFACTS = ROOT / "artifacts"
DOCS = ROOT / "docs"
MINUS = "\u2212"
WAIT = 15  # seconds; a trace takes milliseconds, this only absorbs a loaded CI machine


# ---------------------------------------------------------------- numbers as the page writes them


def fixed(x: float, digits: int) -> str:
    """JavaScript's x.toFixed(digits) (exact value, ties away from zero), as the page shows it:
    a real minus sign, and no negative zero."""
    s = f"{Decimal(x).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP):.{digits}f}"
    if s.startswith("-"):
        s = s[1:] if set(s[1:]) <= set("0.") else MINUS + s[1:]
    return s


def pct(w: float, digits: int = 1) -> str:
    return fixed(w * 100, digits) + "%"


def test_fixed_matches_javascript_rounding():
    # 0.125 and 2.5 are exact binary ties: JavaScript rounds them away from zero.
    assert fixed(0.125, 2) == "0.13" and fixed(-0.125, 2) == MINUS + "0.13"
    assert fixed(2.5, 0) == "3" and fixed(1.005, 2) == "1.00"  # 1.005 is below the tie in binary
    assert fixed(-0.00001, 4) == "0.0000" and pct(0.9990000000000001) == "99.9%"


# ---------------------------------------------------------------- fixtures


class Server(Gunicorn):
    """conftest's real gunicorn, patient with a loaded machine: its start-up loop retries refused
    connections only, and a worker still importing numpy can make /health time out instead."""

    def __init__(self) -> None:
        try:
            super().__init__(workers=2)
        except requests.Timeout:
            deadline = time.monotonic() + 60
            while not self._healthy():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            return requests.get(self.url + "/health", timeout=5).ok
        except requests.RequestException:
            return False


@pytest.fixture(scope="module")
def server() -> Iterator[Gunicorn]:
    srv = Server()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def browser_dirs() -> Iterator[dict[str, Path]]:
    base = Path(tempfile.mkdtemp(prefix="viewer-browser-"))
    dirs = {"profile": base / "profile", "downloads": base / "downloads"}
    for d in dirs.values():
        d.mkdir()
    try:
        yield dirs
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def driver(browser_dirs):
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={browser_dirs['profile']}", "--window-size=1280,900", "--hide-scrollbars",
                "--force-color-profile=srgb", "--lang=en-US", "--disable-extensions", "--no-default-browser-check"):
        options.add_argument(arg)
    options.add_experimental_option("prefs", {
        "download.default_directory": str(browser_dirs["downloads"]),
        "download.prompt_for_download": False,
    })
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    ARTIFACTS.mkdir(exist_ok=True)
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(ARTIFACTS / "chromedriver.log"))
    from selenium.webdriver.common.selenium_manager import SeleniumManager

    def refuse(*args, **kwargs):
        raise AssertionError("Selenium Manager must not run: it would download a browser or driver")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SeleniumManager, "binary_paths", refuse)
        drv = webdriver.Chrome(service=service, options=options)
    try:
        drv.set_script_timeout(WAIT)
        drv.execute_cdp_cmd("Browser.setDownloadBehavior",
                            {"behavior": "allow", "downloadPath": str(browser_dirs["downloads"])})
        yield drv
    finally:
        drv.quit()


class Console:
    """The browser log of one test: errors and CSP violations fail it."""

    def __init__(self, driver) -> None:
        self.driver = driver
        self.allowed: list[re.Pattern[str]] = []
        self.entries: list[dict] = []

    def allow(self, pattern: str) -> None:
        self.allowed.append(re.compile(pattern))

    def read(self) -> list[dict]:
        self.entries += self.driver.get_log("browser")
        return self.entries

    def problems(self) -> list[str]:
        bad = []
        for e in self.read():
            msg = e["message"]
            csp = "Content Security Policy" in msg or "Refused to" in msg
            if (e["level"] == "SEVERE" or csp) and (csp or not any(p.search(msg) for p in self.allowed)):
                bad.append(f"{e['level']} {e.get('source', '')}: {msg}")
        return bad


@pytest.fixture()
def console(driver, server) -> Iterator[Console]:
    driver.get_log("browser")  # start from an empty log
    con = Console(driver)
    yield con
    problems = con.problems()
    try:
        violations = driver.execute_script("return document.documentElement.dataset.cspViolations || '0'")
    except Exception:  # noqa: BLE001 - the page may be gone; the log above still counts
        violations = "0"
    assert not problems, "browser console:\n" + "\n".join(problems)
    assert violations == "0", f"{violations} CSP violation(s)"


# ---------------------------------------------------------------- page helpers


def trace(server: Gunicorn, **body) -> requests.Response:
    full = {"sentence": "the cat sat", "d_model": 24, "num_heads": 1, "seed": 0, "scale": True, "causal": False,
            "positional_encoding": "sinusoidal", **body}
    return requests.post(server.url + "/trace", json=full, timeout=10)


def open_page(driver, server: Gunicorn, fragment: str = "") -> None:
    driver.get("about:blank")  # a fresh load even when only the #fragment differs
    driver.get(f"{server.url}/{fragment}")
    wait_ready(driver)


def wait_ready(driver) -> None:
    WebDriverWait(driver, WAIT).until(lambda d: d.execute_script(
        "const m = document.getElementById('main');"
        "return m.getAttribute('aria-busy') === 'false' && !!document.querySelector('.walkthrough-table');"))


def wait_until(driver, predicate, message: str = ""):
    """Wait for predicate(driver) to be truthy; ignore transient errors while the page re-renders."""
    from selenium.common.exceptions import StaleElementReferenceException

    return WebDriverWait(driver, WAIT, ignored_exceptions=(StaleElementReferenceException, IndexError, KeyError,
                                                           AssertionError)).until(predicate, message)


def js(driver, script: str, *args):
    return driver.execute_script(script, *args)


def walkthrough_row(driver, stage: str) -> list[str]:
    """The per-key numbers of one walkthrough stage, in key order."""
    return js(driver, "return [...document.querySelectorAll(`.walkthrough-table tr[data-stage=\"${arguments[0]}\"] "
                      "ul.keys > li`)].map(li => li.querySelector('.num').textContent);", stage)


def walkthrough_vector(driver, part: str) -> list[str]:
    """All values of a vector in the walkthrough (the expanded list when it is long)."""
    return js(driver, """
        const line = document.querySelector(`.walkthrough-table [data-part="${arguments[0]}"]`);
        const all = line.querySelector('.vec-all') || line.querySelector('.vec');
        return [...all.querySelectorAll('.num')].map(n => n.textContent);""", part)


def set_field(driver, element_id: str, text: str) -> None:
    """Select the field's text and type over it (no empty value in between)."""
    el = driver.find_element(By.ID, element_id)
    el.click()
    el.send_keys(Keys.CONTROL, "a")
    el.send_keys(text)


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

    slider = driver.find_element(By.ID, "num_heads")
    for _ in range(4):
        slider.send_keys(Keys.ARROW_RIGHT)  # 1 -> 5, as a keyboard user would
    assert driver.find_element(By.ID, "dk-value").text == "4.8"  # live, before the service answers
    wait_until(driver, lambda d: "is-invalid" in card.get_attribute("class"), "the card turns red")

    problem = trace(server, num_heads=5)
    assert problem.status_code == 422
    message = problem.json()["errors"][0]["message"]
    assert "d_k would be 4.8" in message
    assert driver.find_element(By.ID, "dk-message").text == message
    wait_until(driver, lambda d: card.value_of_css_property("border-top-color") == "rgba(164, 22, 26, 1)")
    assert slider.get_attribute("aria-invalid") == "true"
    assert message in driver.find_element(By.ID, "problem").text
    # Nothing else breaks: the last valid trace stays, marked stale; the controls still work.
    assert "is-stale" in driver.find_element(By.ID, "results").get_attribute("class")
    assert walkthrough_row(driver, "scores")
    assert driver.find_element(By.ID, "download-json").get_attribute("disabled") == "true"

    slider.send_keys(Keys.ARROW_LEFT)  # 4 heads: 24 / 4 = 6
    wait_until(driver, lambda d: "is-valid" in card.get_attribute("class"), "a valid split clears the card")
    assert driver.find_element(By.ID, "dk-value").text == "6"
    assert driver.find_element(By.ID, "problem").get_attribute("hidden") == "true"
    assert "is-stale" not in driver.find_element(By.ID, "results").get_attribute("class")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#head-options input")) == 4
    assert driver.find_element(By.ID, "fact-matrices").text == "13"


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
    wait_until(driver, lambda d: "head 3 of 4" in d.find_element(By.ID, "walkthrough-title").text)
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

    downloads = browser_dirs["downloads"]
    for old in downloads.iterdir():
        old.unlink()
    driver.find_element(By.ID, "download-json").click()
    deadline = time.monotonic() + WAIT
    while not [p for p in downloads.glob("*.json")] and time.monotonic() < deadline:
        time.sleep(0.1)
    files = list(downloads.glob("*.json"))
    assert [p.name for p in files] == ["attention-trace_it-s-a-cat_d8_h2_seed7_causal.json"]
    assert files[0].read_bytes() == expected.content  # the exact response: every float in full


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


# ---------------------------------------------------------------- accessibility and layout


def test_keyboard_reaches_everything_and_controls_are_labelled(driver, server, console):
    open_page(driver, server)
    unnamed = js(driver, """return [...document.querySelectorAll('input, select, button, [tabindex="0"]')]
        .filter(el => el.offsetParent !== null || el.type === 'radio' || el.type === 'checkbox')
        .filter(el => !((el.labels && el.labels.length) || el.getAttribute('aria-label') || el.textContent.trim()))
        .map(el => el.outerHTML.slice(0, 80));""")
    assert unnamed == []

    seen = []
    for _ in range(40):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        el = driver.switch_to.active_element
        seen.append(el.get_attribute("id") or el.get_attribute("class") or el.tag_name)
    for want in ("sentence", "d_model", "seed", "num_heads", "positional_encoding", "scale", "causal", "copy-curl",
                 "download-json", "query-1", "head-0"):
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
    emulate_width(driver, width, mobile=width < 600)
    try:
        open_page(driver, server, "#sentence=the+cat+sat&d_model=24&num_heads=4&seed=0&q=1&head=1")
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
                             " input[type=number], select')].map(el => el.getBoundingClientRect().height);")
        assert min(targets) >= 40, "touch targets of at least 40 px"
        screenshot(driver, ARTIFACTS / f"viewer-{name}.png")
        if os.environ.get("ATTENTION_TRACE_UPDATE_DOCS") == "1":
            shutil.copyfile(ARTIFACTS / f"viewer-{name}.png", DOCS / docs_name)
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
