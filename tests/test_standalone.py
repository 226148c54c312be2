"""viewer/offline_page.py: one trace as one offline HTML file (POST /trace/html, attention-trace --html).

The file itself (through the Flask test client, every response checked against
openapi.yaml): one document, its scripts and style inlined and allowed by hash in
its own CSP, nothing referenced, the service's exact bytes embedded; the route
and the command line write the same bytes. Then the file opened from disk in
headless Chromium with the network off (a proxy that refuses, no name
resolution, and DevTools' offline mode): the maps and the walkthrough equal the
trace, picking a token or head and the SVG and JSON downloads still work, a
clicked cell is explained number by number as /explain explains it, no console
error or CSP violation, and no request leaves the page (DevTools' network log and
Resource Timing). And the page as a notebook shows a trace (the client's
``Trace._repr_html_``: an iframe whose srcdoc is this page), opened in Chromium.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from selenium.webdriver.support.ui import WebDriverWait

from viewer.offline_page import comparison_request, csp_for, export_filename, render_html, viewer_scripts
from service.routes.viewer import STATIC_DIR
from viewer_browser_support import (  # the viewer's own helpers: the page's rounding and its maps
    MINUS, WAIT, as_cells, chromium, clear_downloads, explain_rows, fixed, heatmap_labels, heatmap_values, js_small,
    pct, wait_download, wait_until, walkthrough_row,
)

BODY = {"sentence": "the cat sat on the mat", "d_model": 24, "num_heads": 4, "seed": 0, "scale": True,
        "causal": True, "positional_encoding": "sinusoidal"}


def post(client, path: str, body: dict):
    # The body's bytes as given (the page embeds the request as sent, in its key order).
    return client.post(path, data=json.dumps(body), content_type="application/json", buffered=True)


class Parsed(HTMLParser):
    """Tags with their attributes, and the text of each <script> and <style>, with the script's type."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.blocks: list[tuple[str, str | None, str]] = []  # (tag, type, text)
        self._open: tuple[str, str | None] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag in ("script", "style"):
            self._open, self._text = (tag, attrs.get("type")), []

    def handle_endtag(self, tag):
        if self._open and tag == self._open[0]:
            self.blocks.append((*self._open, "".join(self._text)))
            self._open = None

    def handle_data(self, data):
        if self._open:
            self._text.append(data)


def parse(page: str) -> Parsed:
    p = Parsed()
    p.feed(page)
    p.close()
    return p


def restore(embedded: str) -> str:
    """What the page (api.js) does to the embedded JSON: \\u003c back to "<" where the escape is not itself escaped."""
    return re.sub(r"(\\*)\\u003c", lambda m: m.group(1) + "<" if len(m.group(1)) % 2 == 0 else m.group(0), embedded)


def sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


# ---------------------------------------------------------------- the file


def test_one_self_contained_file_with_a_hash_only_csp(client):
    resp = post(client, "/trace/html", BODY)
    assert resp.status_code == 200
    page = resp.data.decode("utf-8")
    p = parse(page)
    scripts = [(t, text) for tag, t, text in p.blocks if tag == "script"]
    styles = [text for tag, _, text in p.blocks if tag == "style"]
    code = [text for t, text in scripts if t is None]
    data = {attrs["id"]: attrs.get("type") for tag, attrs in p.tags if tag == "script" and attrs.get("id")}
    # The viewer's own scripts, each inlined verbatim, in the order index.html loads them, after the data.
    names = viewer_scripts()
    assert names[0] == "format.js" and names[-1] == "app.js"
    assert code == [(STATIC_DIR / name).read_text(encoding="utf-8") for name in names]
    assert styles == [(STATIC_DIR / "style.css").read_text(encoding="utf-8")]
    assert data == {"trace-data": "application/json", "trace-json": "application/json"}
    assert len(scripts) == 2 + len(names)
    assert [t for t, _ in scripts] == ["application/json"] * 2 + [None] * len(names)

    metas = [a for tag, a in p.tags if tag == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert len(metas) == 1
    csp = dict((d.split()[0], d.split()[1:]) for d in metas[0]["content"].split("; "))
    # Each inline script by its hash, and nothing else: no 'unsafe-inline', no 'self', no host.
    assert csp == {"default-src": ["'none'"], "script-src": [sha256(c) for c in code], "style-src": [sha256(styles[0])],
                   "img-src": ["data:"], "base-uri": ["'none'"], "form-action": ["'none'"]}
    assert metas[0]["content"] == csp_for(code, styles[0])
    assert "unsafe" not in metas[0]["content"]
    # The policy comes before anything it governs.
    assert page.index('http-equiv="Content-Security-Policy"') < page.index("<style>") < page.index("<script")

    # Nothing is referenced: no src, every href a data: URI or a fragment; no other origin named.
    for tag, attrs in p.tags:
        assert "src" not in attrs, tag
        href = attrs.get("href")
        assert href is None or href.startswith(("data:", "#")), (tag, href)
        assert not [a for a in attrs if a.startswith("on")], tag
    text = page.replace("'http://www.w3.org/2000/svg'", "")  # an XML namespace name in svg.js, never fetched
    assert not re.search(r"https?:|//[a-z0-9.-]+\.[a-z]{2,}/", text, re.I)

    # The service's exact bytes are embedded: the page's "Download trace JSON" saves them.
    trace = post(client, "/trace", BODY).data
    alt = post(client, "/trace", comparison_request(BODY)).get_json()
    blocks = {t_id: text for (tag, _, text), t_id in zip(
        [b for b in p.blocks if b[0] == "script" and b[1]], ["trace-data", "trace-json"])}
    assert restore(blocks["trace-json"]).encode("utf-8") == trace
    meta = json.loads(blocks["trace-data"])
    assert meta == {"request": BODY, "comparison": alt}
    assert list(meta["request"]) == list(BODY)
    assert resp.headers["Content-Disposition"] == \
        f'attachment; filename="{export_filename(json.loads(trace), BODY)}"'


def test_no_token_can_end_the_script_early(client):
    """Pre-split tokens can hold anything: "</script>", "<!--", quotes. The JSON escapes every "<"."""
    body = {"tokens": ["</script><script>alert(1)</script>", "<!--", "a\\u003cb", "\"'&"], "d_model": 8,
            "num_heads": 2, "context_tokens": ["</SCRIPT>", "x"]}
    resp = post(client, "/trace/html", body)
    assert resp.status_code == 200
    page = resp.data.decode("utf-8")
    p = parse(page)
    n = 2 + len(viewer_scripts())  # the two data blocks and the viewer's scripts
    assert [tag for tag, _ in p.tags].count("script") == n
    assert page.lower().count("</script") == n
    embedded = [text for tag, t, text in p.blocks if tag == "script" and t == "application/json"]
    assert restore(embedded[1]).encode("utf-8") == post(client, "/trace", body).data
    assert json.loads(embedded[0])["request"] == body
    # A sentence-less request: the file name and title come from the tokens.
    assert resp.headers["Content-Disposition"].startswith('attachment; filename="attention-trace_script-script-alert')


def test_a_partial_trace_cannot_be_drawn(client):
    doc = post(client, "/trace", {**BODY, "stages": ["weights"]}).get_json()
    with pytest.raises(ValueError, match="drop `stages`"):
        render_html(doc, {**BODY, "stages": ["weights"]})


@pytest.mark.integration
def test_the_command_line_writes_the_same_file(client, tmp_path, gunicorn_server):
    from attention_trace.cli import main

    body = {"sentence": "the cat sat", "num_heads": 4, "causal": True}
    route = post(client, "/trace/html", body).data
    for extra in ([], ["--url", gunicorn_server.url]):  # in this process (LocalClient), and through the service
        path = tmp_path / f"page{len(extra)}.html"
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["trace", "the cat sat", "--heads", "4", "--causal", "--html", str(path), *extra]) == 0
        assert path.read_bytes() == route, extra
        note = f"wrote {len(route)} bytes to {path} (the viewer's page for this trace; opens offline)\n"
        assert out.getvalue() == note


# ---------------------------------------------------------------- opened from disk, offline


@pytest.fixture(scope="module")
def dirs(browser_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """conftest's browser profile and downloads, and a directory for the saved pages."""
    return {**browser_dirs, "pages": tmp_path_factory.mktemp("standalone-pages")}


@pytest.fixture(scope="module")
def offline(dirs):
    """Headless Chromium that cannot reach any network: every request would go to a proxy that refuses, no host
    name resolves, and DevTools' network emulation is offline."""
    with chromium(dirs, "chromedriver-standalone.log",
                  ("--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
                   "--host-resolver-rules=MAP * ~NOTFOUND")) as drv:
        drv.execute_cdp_cmd("Network.enable", {})
        drv.execute_cdp_cmd("Network.emulateNetworkConditions", {"offline": True, "latency": 0,
                                                                 "downloadThroughput": -1, "uploadThroughput": -1})
        yield drv


class Watch:
    """One page's browser log and network log: console errors, CSP violations and requests."""

    def __init__(self, driver) -> None:
        self.driver = driver
        driver.get_log("browser")
        driver.get_log("performance")
        self.urls: list[str] = []

    def requests(self) -> list[str]:
        for entry in self.driver.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg.get("method") == "Network.requestWillBeSent":
                self.urls.append(msg["params"]["request"]["url"])
        return self.urls

    def check(self) -> None:
        problems = [e for e in self.driver.get_log("browser")
                    if e["level"] == "SEVERE" or "Content Security Policy" in e["message"] or "Refused" in e["message"]]
        assert problems == [], problems
        assert self.driver.execute_script("return document.documentElement.dataset.cspViolations || '0';") == "0"
        # The file itself (and in-memory blob:/data: URLs for the downloads) only: nothing went to a network.
        assert [u for u in self.requests() if not u.startswith(("file://", "blob:", "data:"))] == []
        entries = self.driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name);")
        assert [u for u in entries if not u.startswith(("blob:", "data:"))] == []


def save_page(client, dirs, body: dict) -> tuple[Path, dict, dict]:
    resp = post(client, "/trace/html", body)
    assert resp.status_code == 200
    name = resp.headers["Content-Disposition"].split('filename="')[1].rstrip('"')
    path = dirs["pages"] / name
    path.write_bytes(resp.data)
    return path, post(client, "/trace", body), post(client, "/trace", comparison_request(body)).get_json()


def open_file(driver, path: Path, fragment: str = "") -> Watch:
    driver.get("about:blank")
    watch = Watch(driver)
    driver.get(path.as_uri() + fragment)
    WebDriverWait(driver, WAIT).until(lambda d: d.execute_script(
        "return document.getElementById('main').getAttribute('aria-busy') === 'false'"
        " && !!document.querySelector('.walkthrough-table');"))
    return watch


@pytest.mark.browser
def test_the_file_renders_offline_and_sends_nothing(client, offline, dirs):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    path, resp, alt = save_page(client, dirs, BODY)
    doc = resp.get_json()
    assert path.name == "attention-trace_the-cat-sat-on-the-mat_d24_h4_seed0_causal.html"
    watch = open_file(offline, path)
    drv = offline
    S = doc["stages"]
    tokens = [t["text"] for t in doc["tokens"]]
    for stage in ("scores", "scaled_scores", "masked_scores", "weights"):
        assert heatmap_values(drv, stage) == as_cells(S[stage]["values"][0]), stage
        assert heatmap_labels(drv, stage) == (tokens, tokens)
    assert drv.find_elements(By.CSS_SELECTOR, 'table[data-stage="weights"] td.is-masked')
    assert walkthrough_row(drv, "weights")[:2] == \
        [f"{pct(w)} ({fixed(w, 4)})" for w in S["weights"]["values"][0][1][:2]]
    assert drv.find_element(By.ID, "dk-value").text == "6" and drv.find_element(By.ID, "fact-matrices").text == "13"
    status = drv.find_element(By.ID, "trace-status").text
    assert status == "6 tokens · d_model 24 · 4 heads of d_k 6 · a saved trace"
    assert drv.title == "“the cat sat on the mat” · d_model 24 · 4 heads · attention-trace"
    # The comparison is embedded: the saturation table has both traces.
    rows = drv.execute_script("""return [...document.querySelectorAll('.compare-table tbody tr[data-key]')].map(tr =>
        [...tr.querySelectorAll('td')].map(td => td.querySelector('.num').textContent));""")
    assert rows[:2] == [[pct(d["stages"]["weights"]["values"][0][1][j]) for d in (doc, alt)] for j in range(2)]
    assert rows[2:] == [["masked", "masked"]] * 4

    # Read-only: the inputs show the configuration, disabled; what needs the service is hidden (the explanation of a
    # cell does not: the page computes it from the trace).
    controls = drv.execute_script(
        "return [...document.getElementById('controls').elements].map(e => [e.id, e.disabled]);")
    assert controls and all(disabled for _, disabled in controls), controls
    assert drv.execute_script("return document.getElementById('sentence').value;") == "the cat sat on the mat"
    assert drv.find_element(By.ID, "causal").is_selected()
    assert not drv.find_element(By.ID, "download-html").is_displayed()
    assert drv.find_element(By.ID, "explain-section").is_displayed()
    assert drv.find_element(By.ID, "standalone-note").is_displayed()
    curl = drv.execute_script("return document.getElementById('curl-command').textContent;")
    assert curl.startswith('curl -s "$ATTENTION_TRACE_URL/trace" ')

    # Still interactive without the service: a head, a query token (click, keys), a cell's readout.
    drv.find_element(By.CSS_SELECTOR, "label[for=head-2]").click()
    wait_until(drv, lambda d: "head 2 of 4" in d.find_element(By.ID, "walkthrough-title").text)
    assert heatmap_values(drv, "weights") == as_cells(S["weights"]["values"][2])
    start = drv.find_element(By.CSS_SELECTOR, 'table[data-stage="weights"] td[tabindex="0"]')
    start.send_keys(Keys.ARROW_DOWN)
    drv.switch_to.active_element.send_keys(Keys.ENTER)  # that row's token becomes the query, the cell is explained
    wait_until(drv, lambda d: "“sat”" in d.find_element(By.ID, "walkthrough-title").text)
    assert walkthrough_row(drv, "scores")[:3] == [fixed(v, 4) for v in S["scores"]["values"][2][2][:3]]
    assert "q=2" in drv.current_url and "head=2" in drv.current_url

    # Downloads work from the file: the maps as SVG, the trace as the service's exact bytes.
    downloads = clear_downloads(dirs)
    drv.find_element(By.CSS_SELECTOR, 'button[data-svg="weights"]').click()
    svg = wait_download(downloads, "*.svg")
    assert svg.name == "attention-trace_the-cat-sat-on-the-mat_d24_h4_seed0_causal_weights_head2.svg"
    root = ET.fromstring(svg.read_bytes())
    texts = ["".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert all(t in texts for t in tokens)
    assert fixed(S["weights"]["values"][2][2][0], 2) in texts and "masked" in texts
    downloads = clear_downloads(dirs)
    drv.find_element(By.ID, "download-json").click()
    saved = wait_download(downloads, "*.json")
    assert saved.read_bytes() == resp.data
    watch.check()


@pytest.mark.browser
@pytest.mark.parametrize(("body", "fragment"), [
    ({"sentence": "the cat sat on the mat", "d_model": 24, "num_heads": 4, "causal": True, "decode": True,
      "window": 3, "num_kv_heads": 2, "positional_encoding": "rope"}, "#step=2&head=3"),
    ({"sentence": "the cat sat", "num_heads": 2, "context_tokens": ["le", "chat", "était assis", "</script>"]}, ""),
])
def test_the_variants_render_offline(client, offline, dirs, body, fragment):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    path, resp, _ = save_page(client, dirs, body)
    doc = resp.get_json()
    watch = open_file(offline, path, fragment)
    hd = 3 if fragment else 0
    assert heatmap_values(offline, "weights") == as_cells(doc["stages"]["weights"]["values"][hd])
    if "decode" in body:
        wait_until(offline, lambda d: d.find_element(By.ID, "decode-step").get_attribute("value") == "2")
        cache = offline.execute_script(
            "return [...document.querySelectorAll('.cache-table tbody tr')].map(tr => +tr.dataset.pos);")
        assert cache == doc["decode"][2]["cache_positions"] == [0, 1, 2]
        offline.execute_script("document.getElementById('decode-step').focus();")
        offline.switch_to.active_element.send_keys(Keys.ARROW_RIGHT)
        wait_until(offline, lambda d: d.execute_script(
            "return [...document.querySelectorAll('.cache-table tbody tr')].map(tr => +tr.dataset.pos);")
            == doc["decode"][3]["cache_positions"] == [1, 2, 3])
        assert "step=3" in offline.current_url
        assert offline.find_element(By.ID, "kv-section").is_displayed()
    else:
        assert heatmap_labels(offline, "weights")[1] == ["le", "chat", "était assis", "</script>"]
        assert offline.execute_script("return document.getElementById('context_tokens').value;") == \
            "le\nchat\nétait assis\n</script>"
    watch.check()


def test_minus_signs_and_rounding_are_the_viewers():
    # The helpers shared with the viewer's tests (a guard that the import above is what it claims).
    assert fixed(-0.125, 2) == MINUS + "0.13" and pct(0.5) == "50.0%"


# ---------------------------------------------------------------- one cell, number by number, offline


def assert_panel_is_the_services(drv, answer: dict) -> None:
    """The explain panel drawn in the page equals /explain's answer, as the page writes numbers: every step's
    formula, value and listed values, the status line, and each note (in the table or behind the toggle)."""
    rows = explain_rows(drv)
    order = drv.execute_script("return [...document.querySelectorAll('.explain-table tbody tr')].map(tr => tr.dataset.step);")
    assert order == [s["id"] for s in answer["steps"]]
    masked = answer["masked"]
    for step in answer["steps"]:
        row = rows[step["id"]]
        assert row["formula"] == step["formula"], step["id"]
        if step["value"] is None:
            assert row["eq"] is None
        elif masked and step["id"] in ("exp", "weight"):
            assert row["eq"].startswith("= masked")
        elif step["id"] == "weight":
            assert row["eq"] == f"= {js_small(step['value'])} ({pct(step['value'], 2)})"
        else:
            assert row["eq"] == f"= {js_small(step['value'])}", step["id"]
    assert rows["products"]["vec"] == [fixed(v, 4) for v in answer["steps"][0]["values"]]
    hidden = set(answer["masked_keys"])
    assert rows["denominator"]["keys"] == ["masked" if j in hidden else js_small(v)
                                           for j, v in enumerate(answer["steps"][5]["values"])]
    notes = drv.execute_script("""return Object.fromEntries([...document.querySelectorAll('.explain-table tbody tr')].map(tr =>
        [tr.dataset.step, tr.querySelector('.explain-note')?.textContent.trim() ?? null]));""")
    folded = drv.execute_script("""return Object.fromEntries([...document.querySelectorAll('.float-notes li')].map(li =>
        [li.dataset.step, li.textContent.replace(/^[^:]*: /, '')]));""")
    for step in answer["steps"]:
        assert step["note"] in (notes[step["id"]], folded.get(step["id"])), step["id"]
    key_token = answer["key_token"]
    summary = (f"masked ({answer['mask_reason']})" if masked else f"weight {pct(answer['steps'][6]['value'], 2)}")
    assert drv.find_element("id", "explain-status").text == (
        f"Head {answer['head']}: query {answer['query']} “{answer['query_token']}” → key {answer['key']} “{key_token}”: "
        f"{summary}.")
    context = drv.execute_script("return [...document.querySelectorAll('[data-part=\"explain-context\"] .vec-all .num,"
                                 " [data-part=\"explain-context\"] .vec:not(.vec-all) .num')].map(n => n.textContent);")
    assert context[-len(answer["steps"][7]["vector"]):] == [fixed(v, 4) for v in answer["steps"][7]["vector"]]


@pytest.mark.browser
@pytest.mark.parametrize(("body", "cells"), [
    (BODY, [(2, 5, 1), (1, 1, 3)]),  # a cell, and a masked one
    ({"sentence": "the cat sat on the mat", "d_model": 24, "num_heads": 4, "causal": True, "window": 3,
      "num_kv_heads": 2, "positional_encoding": "rope", "decode": True}, [(3, 5, 4), (2, 4, 0)]),
    ({"sentence": "The animal didn't cross the street because it was tired.", "d_model": 24, "num_heads": 1,
      "context_sentence": "L'animal n'a pas traversé la rue"}, [(0, 3, 2)]),
])
def test_a_saved_page_explains_a_cell_as_the_service_does(client, offline, dirs, body, cells):
    """Offline, no service: a click explains the cell, computed in the page (cell.js) and drawn by the code that
    draws the live answer (explain.js); the panel equals /explain's answer."""
    from selenium.webdriver.common.by import By

    path, _, _ = save_page(client, dirs, body)
    for head, query, key in cells:
        watch = open_file(offline, path, f"#q=0&head={head}")
        offline.find_element(By.CSS_SELECTOR, f'table[data-stage="weights"] td[data-row="{query}"][data-col="{key}"]').click()
        wait_until(offline, lambda d: d.find_elements(By.CSS_SELECTOR, ".explain-table tbody tr"))
        answer = post(client, "/explain", {**body, "head": head, "query": query, "key": key}).get_json()
        assert_panel_is_the_services(offline, answer)
        if "decode" in body:
            line = offline.find_element(By.CSS_SELECTOR, '[data-part="explain-decode"]').text
            assert line.startswith(f"KV-cache decoding: {answer['decode']['note']}")
        assert offline.find_element(By.CSS_SELECTOR, '[data-part="explain-source"]').is_displayed()
        assert offline.find_elements(By.CSS_SELECTOR, f'td.is-explained[data-row="{query}"][data-col="{key}"]')
        watch.check()


# ---------------------------------------------------------------- in a notebook


@pytest.mark.browser
def test_a_trace_shows_itself_in_a_notebook(client, offline, dirs, tmp_path):
    """No Jupyter: the client's Trace._repr_html_ is what a notebook puts in its output cell. Written into a page as a
    notebook would, and opened in Chromium: the iframe draws the viewer's page of the trace, a cell can be explained
    in it, and nothing leaves it."""
    from selenium.webdriver.common.by import By

    from attention_trace import LocalClient

    t = LocalClient().trace(BODY)
    output = t._repr_html_()
    assert output.startswith("<iframe srcdoc=\"") and 'sandbox="allow-scripts allow-downloads"' in output
    assert "<script" not in output.split('srcdoc="')[0]
    path = tmp_path / "notebook.html"
    path.write_text("<!doctype html><html lang=en><head><meta charset=utf-8><title>a notebook</title></head><body>"
                    f"<div class=output>{output}</div></body></html>", encoding="utf-8")
    offline.get("about:blank")
    watch = Watch(offline)
    offline.get(path.as_uri())
    frame = offline.find_element(By.TAG_NAME, "iframe")
    assert frame.size["height"] >= 700, "a screenful, not a thumbnail"
    offline.switch_to.frame(frame)
    try:
        WebDriverWait(offline, WAIT).until(lambda d: d.execute_script(
            "return document.getElementById('main').getAttribute('aria-busy') === 'false'"
            " && !!document.querySelector('.walkthrough-table');"))
        doc = post(client, "/trace", BODY).get_json()
        assert heatmap_values(offline, "weights") == as_cells(doc["stages"]["weights"]["values"][0])
        assert offline.find_element(By.ID, "trace-status").text == "6 tokens · d_model 24 · 4 heads of d_k 6 · a saved trace"
        assert offline.execute_script("return document.getElementById('sentence').value;") == BODY["sentence"]
        offline.find_element(By.CSS_SELECTOR, "label[for=head-1]").click()
        wait_until(offline, lambda d: "head 1 of 4" in d.find_element(By.ID, "walkthrough-title").text)
        offline.find_element(By.CSS_SELECTOR, 'table[data-stage="weights"] td[data-row="4"][data-col="2"]').click()
        wait_until(offline, lambda d: d.find_elements(By.CSS_SELECTOR, ".explain-table tbody tr"))
        assert_panel_is_the_services(offline, post(client, "/explain", {**BODY, "head": 1, "query": 4, "key": 2}).get_json())
        assert offline.execute_script("return location.href;") == "about:srcdoc"
        assert offline.execute_script("return document.documentElement.dataset.cspViolations || '0';") == "0"
    finally:
        offline.switch_to.default_content()
    problems = [e for e in offline.get_log("browser") if e["level"] == "SEVERE" or "Refused" in e["message"]]
    assert problems == []
    assert [u for u in watch.requests() if not u.startswith(("file://", "blob:", "data:", "about:"))] == []


@pytest.mark.browser
def test_a_click_in_a_saved_page_keeps_its_cell_under_the_pointer(client, offline, dirs):
    """As in the live page (tests/test_viewer_projector.py), at 1280×720: the clicked cell stays where it was, under
    the pointer, and the readout names it."""
    from test_viewer_projector import click_keeps_the_cell

    path, _, _ = save_page(client, dirs, BODY)
    offline.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 1280, "height": 720, "deviceScaleFactor": 1, "mobile": False})
    try:
        watch = open_file(offline, path, "#q=5&head=2")
        click_keeps_the_cell(offline, "weights", 3, 1, "on", "cat")
        wait_until(offline, lambda d: d.find_element("id", "explain-status").text.startswith("Head 2: query 3 “on” → key 1"))
        watch.check()
    finally:
        offline.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
