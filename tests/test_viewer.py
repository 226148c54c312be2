"""The viewer page at GET / and its static files, through the Flask test client.

Every response is checked against openapi.yaml (GET / and /static/{path} are
documented there). The browser tests in test_viewer_browser.py drive the same
page in headless Chromium.
"""

from __future__ import annotations

import json
import re
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from service import API_CSP
from viewer.offline_page import viewer_scripts
from service.routes.viewer import STATIC_DIR, VIEWER_CSP, VIEWER_FILES

ROOT = Path(__file__).resolve().parent.parent
STATIC_FILES = sorted(p.name for p in STATIC_DIR.iterdir())
#: the viewer's scripts, in the order index.html loads them (format.js … app.js)
SCRIPTS = viewer_scripts()


def all_js() -> str:
    """Every script of the viewer, in load order."""
    return "\n".join((STATIC_DIR / name).read_text(encoding="utf-8") for name in SCRIPTS)
MIME = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}


@pytest.fixture(scope="module")
def web(spec_checker):
    # Checks every response against openapi.yaml, like the API's client fixture.
    from conftest import make_app

    return make_app(spec_checker).test_client()


class Page(HTMLParser):
    """Every start tag with its attributes, and the text inside <script> and <style>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.inline: list[tuple[str, str]] = []
        self._open: str | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._open = tag if tag in ("script", "style") else None

    def handle_endtag(self, tag):
        self._open = None

    def handle_data(self, data):
        if self._open and data.strip():
            self.inline.append((self._open, data))


@pytest.fixture(scope="module")
def page() -> Page:
    parser = Page()
    parser.feed((STATIC_DIR / "index.html").read_text(encoding="utf-8"))
    return parser


def test_index_is_served_with_the_viewer_csp(web):
    resp = web.get("/", buffered=True)
    assert resp.status_code == 200
    assert resp.mimetype == "text/html"
    assert resp.headers["Content-Security-Policy"] == VIEWER_CSP
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.headers["X-Frame-Options"] == "DENY"
    assert resp.headers["Referrer-Policy"] == "no-referrer"
    tags = "".join(f'<script src="static/{name}" defer></script>\n' for name in SCRIPTS)
    assert tags.encode() in resp.data  # in this order: each script uses only the ones before it
    assert SCRIPTS[0] == "format.js" and SCRIPTS[-1] == "app.js"


@pytest.mark.parametrize("name", STATIC_FILES)
def test_static_files_are_served_with_the_viewer_csp(web, name):
    resp = web.get(f"/static/{name}", buffered=True)
    assert resp.status_code == 200
    assert resp.mimetype == MIME[Path(name).suffix]
    assert resp.headers["Content-Security-Policy"] == VIEWER_CSP
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.data == (STATIC_DIR / name).read_bytes()


def test_static_files_revalidate_cheaply(web):
    first = web.get("/static/app.js", buffered=True)
    assert first.headers["Cache-Control"] == "no-cache"
    again = web.get("/static/app.js", headers={"If-None-Match": first.headers["ETag"]}, buffered=True)
    assert again.status_code == 304


@pytest.mark.parametrize("path", ["/static/nope.js", "/static/../viewer.py", "/static/..%2fviewer.py",
                                  "/static/%2e%2e/viewer.py", "/static/"])
def test_nothing_outside_the_static_folder_is_served(web, path):
    resp = web.get(path, buffered=True)
    assert resp.status_code == 404
    assert resp.mimetype == "application/problem+json"
    assert resp.get_json()["type"] == "urn:attention-trace:problem:not-found"


def test_the_page_is_read_only(web):
    resp = web.post("/", json={}, buffered=True)
    assert resp.status_code == 405
    assert resp.mimetype == "application/problem+json"
    assert "GET" in resp.headers["Allow"]


def test_the_api_keeps_its_stricter_csp(web):
    for resp in (web.get("/health", buffered=True), web.get("/nope", buffered=True),
                 web.post("/trace", json={"sentence": "the cat sat"}, buffered=True)):
        assert resp.headers["Content-Security-Policy"] == API_CSP


def test_viewer_csp_allows_only_this_origin():
    directives = dict((d.split()[0], d.split()[1:]) for d in VIEWER_CSP.split("; "))
    assert directives["default-src"] == ["'none'"]
    for name in ("script-src", "style-src", "connect-src"):
        assert directives[name] == ["'self'"], name
    assert directives["frame-ancestors"] == ["'none'"]
    assert directives["base-uri"] == ["'none'"]
    assert directives["form-action"] == ["'none'"]
    flat = " ".join(w for words in directives.values() for w in words)
    assert "unsafe" not in flat and "*" not in flat and "http" not in flat


def test_no_inline_script_style_or_handlers(page):
    assert page.inline == [], "inline <script>/<style> content would need a CSP hash"
    for tag, attrs in page.tags:
        assert tag != "style"
        assert "style" not in attrs, f"<{tag} style=...> is blocked by the CSP"
        assert not [a for a in attrs if a.startswith("on")], f"<{tag}> has an inline event handler"
        if tag == "script":
            assert attrs.get("src"), "every script is a file"
        for name in ("href", "src", "action"):
            assert not (attrs.get(name) or "").lower().startswith("javascript:")


def test_every_reference_is_same_origin_and_exists(web, page):
    refs = [attrs.get("href") or attrs.get("src") for tag, attrs in page.tags if tag in ("link", "script", "a", "img")]
    assert refs
    for ref in refs:
        assert ref and not re.match(r"^([a-z][a-z0-9+.-]*:|//)", ref, re.I), f"{ref} leaves this origin"
        if not ref.startswith("#"):
            assert web.get("/" + ref, buffered=True).status_code == 200, ref


@pytest.mark.parametrize("name", STATIC_FILES)
def test_static_files_load_nothing_from_another_origin(name):
    text = (STATIC_DIR / name).read_text(encoding="utf-8")
    # The SVG namespace is an XML namespace name (favicon.svg, and svg.js's SVG downloads), never fetched.
    text = text.replace('xmlns="http://www.w3.org/2000/svg"', "").replace("'http://www.w3.org/2000/svg'", "")
    assert not re.search(r"https?:|//[a-z0-9.-]+\.[a-z]{2,}", text, re.I)
    assert "@import" not in text


def test_the_script_uses_only_the_public_api():
    js = all_js()
    spec = yaml.safe_load((ROOT / "openapi.yaml").read_text(encoding="utf-8"))
    fetched = set(re.findall(r"fetch\('([^']+)'", js))
    assert fetched == {"trace", "version", "explain", "trace/html"}
    assert "post" in spec["paths"]["/trace"] and "get" in spec["paths"]["/version"]
    assert "post" in spec["paths"]["/explain"] and "post" in spec["paths"]["/trace/html"]
    assert len(re.findall(r"\bfetch\(", js)) == len(re.findall(r"fetch\('([^']+)'", js)), "every fetch names its path"
    assert not re.search(r"XMLHttpRequest|WebSocket|EventSource|sendBeacon|importScripts|\bimport\(", js)
    # One file talks to the network: api.js.
    assert [name for name in SCRIPTS if "fetch(" in (STATIC_DIR / name).read_text(encoding="utf-8")] == ["api.js"]


def test_the_script_never_parses_html_or_evaluates_strings():
    js = all_js()
    for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                   "setAttribute('style'", "cssText"):
        assert banned not in js, banned
    assert re.search(r"setTimeout\(\s*['\"`]", js) is None


def test_every_control_has_a_label(page):
    labelled = {attrs["for"] for tag, attrs in page.tags if tag == "label" and "for" in attrs}
    controls = [(tag, attrs) for tag, attrs in page.tags if tag in ("input", "select", "textarea")]
    assert len(controls) >= 7
    for tag, attrs in controls:
        assert attrs.get("id") in labelled or attrs.get("aria-label"), f"<{tag} id={attrs.get('id')}> has no label"
    assert ("html", {"lang": "en"}) in page.tags


def test_static_folder_is_flat_for_packaging():
    # pyproject.toml ships service/static/* (one level): no subfolders may hide files from the wheel.
    assert all((STATIC_DIR / name).is_file() for name in STATIC_FILES)
    assert {"index.html", "style.css", "favicon.svg", *SCRIPTS} <= set(STATIC_FILES)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "*" in pyproject["tool"]["setuptools"]["package-data"]["service.static"]


def test_the_static_folder_holds_what_the_page_loads_and_nothing_more(web):
    """/static/ serves the files index.html refers to (its scripts, style sheet and icon) and the page itself; the
    folder holds nothing else, and a file put there later is not served."""
    html = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    referenced = set(re.findall(r'(?:src|href)="static/([^"]+)"', html))
    assert referenced == {"style.css", "favicon.svg", *SCRIPTS}
    assert VIEWER_FILES == referenced | {"index.html"} == set(STATIC_FILES)
    for name in ("app.min.js", "style.css.map", "README.md"):
        assert name not in VIEWER_FILES
        resp = web.get(f"/static/{name}", buffered=True)
        assert resp.status_code == 404 and resp.mimetype == "application/problem+json", name


def test_each_script_uses_only_the_scripts_loaded_before_it():
    """Classic scripts sharing one namespace: each adds its part (globalThis.AttentionTrace.<part> = …) and reads
    only the parts of the scripts index.html loads before it."""
    added: list[str] = []
    for name in SCRIPTS:
        js = (STATIC_DIR / name).read_text(encoding="utf-8")
        assert not re.search(r"^\s*(import|export)\b", js, re.M), f"{name} is a classic script, not a module"
        assert js.startswith("/*") and "'use strict';" in js[:js.index("(() => {")], name
        writes = re.findall(r"globalThis\.AttentionTrace\.(\w+) = ", js)
        reads = set(re.findall(r"(?:globalThis\.AttentionTrace|\bAT)\.(\w+)\b(?! = )", js))
        assert reads <= set(added), f"{name} reads {sorted(reads - set(added))} before they are loaded"
        assert name == "app.js" or len(writes) == 1, f"{name} adds one part to the namespace: {writes}"
        added += writes


def test_blueprint_serves_static_files_without_the_apps_static_route():
    # The blueprint alone serves /static/ (create_app builds Flask with static_folder=None).
    from flask import Flask

    from service.routes.viewer import bp

    app = Flask("bare", static_folder=None)
    app.register_blueprint(bp)
    resp = app.test_client().get("/static/style.css", buffered=True)
    assert resp.status_code == 200 and resp.mimetype == "text/css"
    assert resp.headers["Content-Security-Policy"] == VIEWER_CSP
    assert resp.data == (STATIC_DIR / "style.css").read_bytes()


def test_the_variants_have_labelled_controls_and_inline_error_slots(page):
    """RoPE (base, pairing), K/V heads, window, context sentence and decoding: each a labelled control
    with a slot for the service's 422 message, tied to it by aria-describedby."""
    by_id = {attrs.get("id"): (tag, attrs) for tag, attrs in page.tags if attrs.get("id")}
    labelled = {attrs["for"] for tag, attrs in page.tags if tag == "label" and "for" in attrs}
    for name in ("rope_base", "rope_pairing", "num_kv_heads", "window", "context_sentence", "context_tokens", "decode",
                 "causal", "positional_encoding"):
        assert name in by_id and name in labelled, name
        assert f"{name}-error" in by_id, name
        assert f"{name}-error" in by_id[name][1].get("aria-describedby", "").split(), name
    options = [attrs.get("value") for tag, attrs in page.tags if tag == "option"]
    assert {"sinusoidal", "none", "rope", "rotate_half", "interleaved"} <= set(options)
    assert by_id["decode-step"][0] == "input" and "decode-step" in labelled


def test_the_script_sends_an_invalid_request_once():
    """The scale-flipped comparison is requested only after the request as set came back valid (the browser test
    test_invalid_kv_heads_are_explained_by_the_service_and_sent_once counts the requests)."""
    assert "Promise.allSettled" not in all_js() and "Promise.all(" not in all_js()
    js = (STATIC_DIR / "app.js").read_text(encoding="utf-8")
    main = js.index("main = await postJson(ENDPOINTS.trace, body, controller.signal)")
    failed = js.index("showError(err);", main)
    drawn = js.index("showTrace(main);", main)
    alt = js.index("state.alt = await postJson(ENDPOINTS.trace, comparisonBody(body), controller.signal)")
    assert main < failed < drawn < alt
    assert "return;" in js[failed:drawn], "a failed request returns before the comparison is sent"


def test_subscripts_have_readable_names(page):
    """d<sub>model</sub> would be read "dmodel": every subscript on the page is hidden from screen readers and
    spelled out beside it (the computed names are checked in Chromium, test_viewer_browser.py)."""
    html = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    for m in re.finditer(r"<sub>", html):
        before = html[:m.start()]
        opener = before.rfind('aria-hidden="true"')
        near = html[m.start() - 60:m.end()]
        assert opener >= 0 and "</span>" not in before[opener:], f"a bare subscript near {near!r}"
    by_id = {attrs.get("id"): attrs for tag, attrs in page.tags if attrs.get("id")}
    assert by_id["d_model"]["aria-label"] == "d_model (model width)"
    assert by_id["num_heads"]["aria-label"] == "Number of heads h"
    assert by_id["scale"]["aria-label"] == "Scale scores by √d_k"


# ---------------------------------------------------------------- POST /trace/html


def test_trace_html_is_a_download_of_the_standalone_page(web):
    from viewer.offline_page import export_filename, render_html

    body = {"sentence": "the cat sat", "d_model": 24, "num_heads": 4, "causal": True}
    resp = web.post("/trace/html", data=json.dumps(body), content_type="application/json", buffered=True)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == "text/html; charset=utf-8"
    assert resp.headers["Content-Disposition"] == \
        'attachment; filename="attention-trace_the-cat-sat_d24_h4_seed0_causal.html"'
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.headers["Content-Security-Policy"] == API_CSP  # a download; the page carries its own in a <meta>
    doc = web.post("/trace", json=body, buffered=True).get_json()
    alt = web.post("/trace", json={**body, "scale": False}, buffered=True).get_json()
    assert export_filename(doc, body) == "attention-trace_the-cat-sat_d24_h4_seed0_causal.html"
    assert resp.data.decode("utf-8") == render_html(doc, body, comparison=alt)


@pytest.mark.parametrize(("body", "pointer"), [
    ({"sentence": "the cat sat", "num_heads": 5}, "/num_heads"),
    ({"sentence": "the cat sat", "stages": ["weights"]}, "/stages"),
    ({"sentence": "the cat sat", "nope": 1}, "/nope"),
])
def test_trace_html_refuses_what_trace_refuses_and_partial_traces(web, body, pointer):
    resp = web.post("/trace/html", json=body, buffered=True)
    assert resp.status_code == 422 and resp.mimetype == "application/problem+json"
    assert [e["pointer"] for e in resp.get_json()["errors"]] == [pointer]


def test_trace_html_takes_json_only(web):
    resp = web.post("/trace/html", data="the cat sat", content_type="text/plain", buffered=True)
    assert resp.status_code == 415
    assert web.get("/trace/html", buffered=True).status_code == 405
