"""The Chromium tests' shared harness: the viewer in headless Chromium against real gunicorn on loopback.

Debian's chromium and chromedriver (scripts/install-browser), driven by Selenium with both paths given explicitly,
so Selenium Manager never runs and nothing is downloaded. tests/conftest.py's ``server``, ``browser_dirs``,
``driver`` and ``console`` fixtures are built from this module; here too are the page's rounding (``fixed``,
``pct``) and the helpers that read the page, for tests/test_viewer_browser.py, test_viewer_projector.py,
test_viewer_block_browser.py, test_viewer_heads_browser.py and test_standalone.py.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from urllib.parse import urlencode

import pytest
import requests
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from conftest import ARTIFACTS
from tools.server import Gunicorn

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
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


def js_number(x: float) -> str:
    if x == int(x) and abs(x) < 1e21:
        return str(int(x))
    r = repr(x)
    if "e" in r:  # JavaScript writes 1e-7 as 1e-7 and 1.5e-7 as 1.5e-7, with an explicit sign on the exponent
        mant, exp = r.split("e")
        return f"{mant}e{'+' if not exp.startswith('-') else '-'}{exp.lstrip('+-').lstrip('0') or '0'}"
    return r


def as_cells(matrix) -> list[list[str]]:
    """A matrix as the page stores it in data-value (JavaScript's String(x), which round-trips like repr)."""
    return [["null" if v is None else js_number(v) for v in row] for row in matrix]


def js_small(x: float) -> str:
    """The explanation's numbers as the page writes them: 4 decimals, or toExponential(3) below 0.001."""
    if x != 0 and abs(x) < 0.001:
        d = Decimal(abs(x))
        e = d.adjusted()
        n = d.scaleb(-e).quantize(Decimal("1.000"), rounding=ROUND_HALF_UP)
        if n >= 10:
            n, e = (n / 10).quantize(Decimal("1.000"), rounding=ROUND_HALF_UP), e + 1
        return f"{MINUS if x < 0 else ''}{n}e{'+' if e >= 0 else MINUS}{abs(e)}"
    return fixed(x, 4)


# ---------------------------------------------------------------- the browser


@dataclass(frozen=True)
class ChromiumOptions:
    """What a test file's browser adds to chromium()'s: Chromium flags, and a screen size to emulate (None: the
    1280×900 window). Override the ``chromium_options`` fixture in a test file to change them."""

    #: no QUIC (loopback HTTP only), no scroll bars (stable screenshots), one colour profile (stable pixels)
    args: tuple[str, ...] = ("--disable-quic", "--hide-scrollbars", "--force-color-profile=srgb")
    size: tuple[int, int] | None = None


@contextlib.contextmanager
def chromium(dirs: dict[str, Path], log_name: str, extra_args: tuple[str, ...] = ()) -> Iterator[webdriver.Chrome]:
    """Debian's headless Chromium through its chromedriver (never one Selenium Manager downloads), with its
    profile and downloads in ``dirs``, the browser and DevTools network logs on, quit on exit."""
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.selenium_manager import SeleniumManager

    # `make test` installs both (scripts/install-browser); without them a browser test fails rather than
    # skips, so a missing browser can never pass silently. (`make check` leaves browser tests out.)
    assert CHROMIUM.exists() and CHROMEDRIVER.exists(), \
        "needs Debian's chromium and chromedriver: run scripts/install-browser (make test does)"
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-extensions", "--no-default-browser-check",
                f"--user-data-dir={dirs['profile']}", "--window-size=1280,900", "--lang=en-US", *extra_args):
        options.add_argument(arg)
    options.add_experimental_option("prefs", {"download.default_directory": str(dirs["downloads"]),
                                              "download.prompt_for_download": False})
    # "performance": the DevTools network events, to count the requests the page sends (not only those answered).
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(ARTIFACTS / log_name))

    def refuse(*args, **kwargs):
        raise AssertionError("Selenium Manager must not run: it would download a browser or driver")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SeleniumManager, "binary_paths", refuse)
        drv = webdriver.Chrome(service=service, options=options)
    try:
        drv.execute_cdp_cmd("Browser.setDownloadBehavior",
                            {"behavior": "allow", "downloadPath": str(dirs["downloads"])})
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

    def check(self) -> None:
        """No console error (but those allowed) and no CSP violation, in the log or counted by the page."""
        problems = self.problems()
        assert not problems, "browser console:\n" + "\n".join(problems)
        violations = js(self.driver, "return document.documentElement.dataset.cspViolations || '0'")
        assert violations == "0", f"{violations} CSP violation(s)"


# ---------------------------------------------------------------- the page


def js(driver, script: str, *args):
    return driver.execute_script(script, *args)


def trace(server: Gunicorn, **body) -> requests.Response:
    full = {"sentence": "the cat sat", "d_model": 24, "num_heads": 1, "seed": 0, "scale": True, "causal": False,
            "positional_encoding": "sinusoidal", **body}
    return requests.post(server.url + "/trace", json=full, timeout=10)


def service_trace(server: Gunicorn, body: dict) -> dict:
    """The service's answer to this exact request, which must succeed."""
    resp = requests.post(server.url + "/trace", json=body, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.json()


def fragment(**view) -> str:
    """The page's address for a view (the sentence with + for spaces, as the page writes it)."""
    return "#" + urlencode(view)


def png_size(path: Path) -> tuple[int, int]:
    """A PNG file's width and height (its IHDR chunk), after checking its signature."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


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


def walkthrough_row(driver, stage: str) -> list[str]:
    """The per-key numbers of one walkthrough stage, in key order."""
    return js(driver, "return [...document.querySelectorAll(`.walkthrough-table tr[data-stage=\"${arguments[0]}\"] "
                      "ul.keys > li`)].map(li => li.querySelector('.num').textContent);", stage)


def set_field(driver, element_id: str, text: str) -> None:
    """Select the field's text and type over it (no empty value in between)."""
    el = driver.find_element(By.ID, element_id)
    el.click()
    el.send_keys(Keys.CONTROL, "a")
    el.send_keys(text)


def choose(driver, element_id: str, value: str) -> None:
    """Pick an option of a <select> as a user would (Selenium's Select fires the change event)."""
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, element_id)).select_by_value(value)


def _sent_requests(driver) -> list[tuple[str, str | None]]:
    """(url, body) of every request the page has sent since the last clear_requests, answered or not (DevTools'
    Network.requestWillBeSent, from the performance log, which each read empties: kept on the driver)."""
    seen = driver.__dict__.setdefault("_sent_requests", [])
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            req = msg["params"]["request"]
            seen.append((req["url"], req.get("postData")))
    return seen


def sent(driver, path: str) -> list[str]:
    """The requests for `path` the page has sent since the last clear_requests, answered or not."""
    return [u for u, _ in _sent_requests(driver) if requests.utils.urlparse(u).path == path]


def posted(driver, path: str) -> list[dict]:
    """The JSON bodies of the POSTs to `path` the page has sent since the last clear_requests."""
    return [json.loads(body) for u, body in _sent_requests(driver)
            if requests.utils.urlparse(u).path == path and body is not None]


def trace_requests(driver) -> list[str]:
    """The /trace requests the page has made since the last clear_requests (Resource Timing)."""
    return js(driver, "return performance.getEntriesByType('resource').map(e => e.name)"
                      ".filter(u => new URL(u).pathname === '/trace');")


def clear_requests(driver) -> None:
    js(driver, "performance.clearResourceTimings();")
    _sent_requests(driver)
    driver.__dict__["_sent_requests"] = []


def heatmap_labels(driver, stage: str) -> tuple[list[str], list[str]]:
    """(row labels, column labels) of one attention map."""
    return tuple(js(driver, """const t = document.querySelector(`table[data-stage="${arguments[0]}"]`);
        return [[...t.querySelectorAll('th.hm-row .hm-label')].map(e => e.textContent),
                [...t.querySelectorAll('th.hm-col .hm-label')].map(e => e.textContent)];""", stage))


def heatmap_values(driver, stage: str) -> list[list[str]]:
    return js(driver, """return [...document.querySelectorAll(`table[data-stage="${arguments[0]}"] tbody tr`)].map(tr =>
        [...tr.querySelectorAll('td.hm-cell')].map(td => td.dataset.value));""", stage)


def explain_rows(driver) -> dict[str, dict]:
    return js(driver, """return Object.fromEntries([...document.querySelectorAll('.explain-table tbody tr')].map(tr => [
        tr.dataset.step, {
          formula: tr.querySelector('.wt-op code').textContent,
          eq: tr.querySelector('.explain-eq')?.textContent ?? null,
          keys: [...tr.querySelectorAll('.explain-keys > li')].map(li => li.querySelector(
                ':scope > .num, :scope > .vec-wrap, :scope > .vec').textContent.replace(/\\s+/g, ' ').trim()),
          vec: tr.querySelector('.wt-result > .vec-wrap .vec-all, .wt-result > .vec') ?
               [...tr.querySelector('.wt-result > .vec-wrap .vec-all, .wt-result > .vec').querySelectorAll('.num')]
                 .map(n => n.textContent) : null,
        }]));""")


def clear_downloads(browser_dirs) -> Path:
    downloads = browser_dirs["downloads"]
    for old in downloads.iterdir():
        old.unlink()
    return downloads


def wait_download(downloads: Path, pattern: str) -> Path:
    """The one finished download matching `pattern`.

    Chromium first reserves the final name with an empty file, writes the bytes to a
    .crdownload beside it and renames that over the placeholder when it is complete, so a
    file of that name is not yet a download: it is finished when it has bytes and no
    .crdownload is left.
    """
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        files = list(downloads.glob(pattern))
        if files and not list(downloads.glob("*.crdownload")):
            assert len(files) == 1, files
            if files[0].stat().st_size > 0:
                return files[0]
        time.sleep(0.05)
    raise AssertionError(f"no finished download matching {pattern} in {WAIT} s: {[p.name for p in downloads.iterdir()]}")


def next_token_bars(driver) -> list[tuple[str, float]]:
    """The next-token panel's bars, highest first: each row's token and the probability it stores (data-prob)."""
    return [
        (token, float(p))
        for token, p in js(
            driver,
            "return [...document.querySelectorAll('#next-token-body .nt-row')]"
            ".map(li => [li.dataset.token, li.dataset.prob]);",
        )
    ]
