"""One trace as one offline HTML file: the viewer's own page, with its script and style inlined and the trace embedded.

``render_html(trace_document, request_body)`` returns a single HTML document
that draws the trace exactly as the viewer at ``GET /`` does (it *is* the
viewer: ``service/static/index.html``, ``style.css`` and the scripts
index.html loads, ``format.js`` … ``app.js``), but read-only and without the
service:

- the trace is embedded as ``<script type="application/json">`` data (the
  service's exact JSON bytes, so "Download trace JSON" still saves them), with
  the request and, when given, the scale-flipped comparison trace;
- the style sheet and the scripts are inlined (each script file verbatim in
  its own ``<script>``, in the order index.html loads them, after the data), the
  icon is a ``data:`` URI, and nothing refers to another file: no request ever
  leaves the page;
- its own Content-Security-Policy, in a ``<meta>``, allows exactly those inline
  scripts and the style by their SHA-256 hashes (no ``'unsafe-inline'``),
  ``data:`` images, and nothing else (``default-src 'none'``: no fetch, font or
  frame).

With ``view`` (an address fragment, e.g. ``"text=150&theme=dark"``), the page
also embeds the view to open on, as ``<script type="application/json"
id="view-state">`` data (never run, so the CSP is unchanged): the page reads it
when its own address has no fragment, as the viewer's "Download HTML" writes it
(api.js, withView).

The scripts see the embedded trace and draw it: the inputs show the
configuration, disabled; the query token, head and decoding step can still be
picked, the maps read and downloaded as SVG; what needs the service (another
trace, explaining a cell, this export) is hidden.

Used by ``POST /trace/html`` (service/routes/trace.py) and ``attention-trace trace
SENTENCE --html FILE`` (attention_trace/cli.py), which write the same bytes for
the same request. The files are the service's (``service/static/``, beside this
package when installed); this module imports no project package.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

#: the viewer's files, which the service also serves (service/static/, in the checkout and in the wheel alike)
STATIC_DIR = Path(__file__).resolve().parent.parent / "service" / "static"

#: how index.html loads each of the viewer's scripts, in order (classic scripts, deferred)
SCRIPT_TAG = re.compile(r'<script src="static/([a-z0-9-]+\.js)" defer></script>\n')

#: the stages the page reads for any trace (a variant's own stages are read when present)
DRAWN_STAGES = ("input", "token_embedding", "q", "k", "v", "scores", "scaled_scores", "weights", "context", "concat",
                "output")


def comparison_request(request_body: Mapping[str, Any]) -> dict[str, Any]:
    """The saturation comparison the viewer asks for: the same request with ``scale`` flipped, without decoding."""
    alt = {k: v for k, v in request_body.items() if k != "decode"}
    alt["scale"] = not request_body.get("scale", True)
    return alt


def export_filename(trace_document: Mapping[str, Any], request_body: Mapping[str, Any], ext: str = "html") -> str:
    """``attention-trace_<sentence>_d<d_model>_h<heads>_seed<seed>[_unscaled][_causal][variants][_<block>_L<layers>].<ext>``,
    as the viewer names its downloads (trace.js, exportName)."""
    cfg = trace_document["config"]
    text = request_body.get("sentence")
    if not isinstance(text, str):
        text = " ".join(t["text"] for t in trace_document["tokens"])
    slug = re.sub(r"[^a-z0-9]+", "-", text.strip().lower()).strip("-")[:40] or "trace"
    variant = "".join([
        "_rope" if cfg.get("positional_encoding") == "rope" else "",
        f"_kv{cfg['num_kv_heads']}" if "num_kv_heads" in cfg else "",
        f"_w{cfg['window']}" if "window" in cfg else "",
        "_cross" if trace_document.get("context_tokens") is not None else "",
        "_decode" if cfg.get("decode") else "",
        # a stack: its preset (or "block" for one set field by field) and its layers
        f"_{cfg.get('block') or 'block'}_L{cfg['num_layers']}" if "num_layers" in cfg else "",
    ])
    return (f"attention-trace_{slug}_d{cfg['d_model']}_h{cfg['num_heads']}_seed{cfg['seed']}"
            f"{'' if cfg['scale'] else '_unscaled'}{'_causal' if cfg['causal'] else ''}{variant}.{ext}")


def _json_for_script(data: bytes) -> bytes:
    """JSON text safe inside <script>: every "<" escaped as \\u003c, so no "</script>" or "<!--" can occur.
    (The service's JSON writer never escapes "<" itself, so the page (api.js) can undo exactly these.) As
    bytes: the page's text around it has non-ASCII characters, and a 40 MB ASCII JSON put into such a str is
    widened to 2 or 4 bytes a character, then encoded back (3x the CPU of the whole page, +275 MiB)."""
    return data.replace(b"<", b"\\u003c")


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


def _replace_once(page: str, old: str, new: str) -> str:
    if page.count(old) != 1:
        raise RuntimeError(f"service/static/index.html changed: expected {old!r} exactly once")
    return page.replace(old, new)


def viewer_scripts(page: str | None = None) -> list[str]:
    """The viewer's script files, in the order index.html (or ``page``, its text) loads them."""
    if page is None:
        page = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    names = SCRIPT_TAG.findall(page)
    if not names or names[-1] != "app.js" or len(set(names)) != len(names):
        raise RuntimeError(f"service/static/index.html changed: expected its scripts, app.js last, found {names}")
    return names


def csp_for(scripts: Sequence[str], style: str) -> str:
    """The saved page's policy: its inline scripts and its one style, each by hash; data: images; nothing else."""
    if isinstance(scripts, str):
        scripts = [scripts]
    sources = " ".join(f"'{_sha256(script)}'" for script in scripts)
    return (f"default-src 'none'; script-src {sources}; style-src '{_sha256(style)}'; img-src data:; "
            "base-uri 'none'; form-action 'none'")


def render_html(trace_document: Mapping[str, Any], request_body: Mapping[str, Any], *,
                comparison: Mapping[str, Any] | None = None, view: str | None = None) -> str:
    """The viewer's page for this trace, in one self-contained file (see the module's docstring)."""
    return render_html_bytes(trace_document, request_body, comparison=comparison, view=view).decode("utf-8")


def _dumps(doc: Any) -> bytes:
    """JSON bytes as the service writes its answers (orjson, numpy arrays as lists)."""
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def render_html_bytes(trace_document: Mapping[str, Any], request_body: Mapping[str, Any], *,
                      comparison: Mapping[str, Any] | None = None,
                      dumps: Callable[[Any], bytes] = _dumps, view: str | None = None) -> bytes:
    """render_html's page, UTF-8 encoded (what POST /trace/html answers), made without a str of the trace.

    ``trace_document``: a /trace answer (as parsed JSON, or the service's document with numpy arrays), with every
    stage (a request with ``stages`` cannot be drawn); ``request_body``: the /trace request that made it;
    ``comparison``: the answer to ``comparison_request(request_body)``, for the "why divide by √d_k" section.
    ``dumps``: the JSON writer (the service passes its own, which writes the same bytes a piece at a time).
    ``view``: the address fragment the page opens on when its address has none (None: the page's defaults).
    """
    missing = [s for s in DRAWN_STAGES if s not in trace_document.get("stages", {})]
    if missing:
        raise ValueError(f"the page draws every stage; this trace lacks {', '.join(missing)} (drop `stages`)")
    trace_json = _json_for_script(dumps(trace_document))
    meta_json = _json_for_script(dumps({"request": dict(request_body), "comparison": comparison}))
    view_data = b"" if view is None else (b'<script type="application/json" id="view-state">'
                                          + _json_for_script(orjson.dumps({"fragment": view.removeprefix("#")}))
                                          + b"</script>\n")

    page = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    style = (STATIC_DIR / "style.css").read_text(encoding="utf-8")
    names = viewer_scripts(page)
    scripts = [(STATIC_DIR / name).read_text(encoding="utf-8") for name in names]
    for name, text, end in (("style.css", style, "</style"), *((n, s, "</script") for n, s in zip(names, scripts))):
        if end in text.lower() or "<!--" in text:
            raise RuntimeError(f"{name} cannot be inlined: it contains {end!r} or '<!--'")
    icon = base64.b64encode((STATIC_DIR / "favicon.svg").read_bytes()).decode("ascii")

    cfg = trace_document["config"]
    words = " ".join(t["text"] for t in trace_document["tokens"])
    title = (f"“{words[:80]}{'…' if len(words) > 80 else ''}” · d_model {cfg['d_model']} · "
             f"{cfg['num_heads']} head{'s' if cfg['num_heads'] != 1 else ''} · attention-trace")

    page = _replace_once(page, '<meta charset="utf-8">',
                         '<meta charset="utf-8">\n<meta http-equiv="Content-Security-Policy" content="'
                         + csp_for(scripts, style) + '">')
    page = re.sub(r"<title>[^<]*</title>", lambda _: f"<title>{html.escape(title)}</title>", page, count=1)
    page = _replace_once(page, '<link rel="icon" href="static/favicon.svg" type="image/svg+xml">',
                         f'<link rel="icon" href="data:image/svg+xml;base64,{icon}" type="image/svg+xml">')
    page = _replace_once(page, '<link rel="stylesheet" href="static/style.css">', "<style>" + style + "</style>")
    for name in names:
        page = _replace_once(page, f'<script src="static/{name}" defer></script>\n', "")
    if "<script" in page:
        raise RuntimeError("service/static/index.html changed: a script it loads is not one the page can inline")
    # Links to the service's other pages lead nowhere from a file: plain text (their paragraphs are hidden anyway).
    page = re.sub(r'(<a\b[^>]*?)\s+href="(?!#)[^"]*"', r"\1", page)
    if page.count("</body>") != 1:
        raise RuntimeError("service/static/index.html changed: expected '</body>' exactly once")
    head, tail = page.split("</body>")
    inlined = "".join("<script>" + script + "</script>\n" for script in scripts)
    return b"".join([head.encode("utf-8"), view_data, b'<script type="application/json" id="trace-data">', meta_json,
                     b'</script>\n<script type="application/json" id="trace-json">', trace_json,
                     ("</script>\n" + inlined + "</body>" + tail).encode("utf-8")])
