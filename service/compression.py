"""Response compression, offered only where it pays for its time.

Measured (docs/performance.md): trace JSON compresses by about half whatever
the codec, because float digits are close to random. brotli at quality 1
costs ~6 ns a byte, gzip at level 1 ~9.5 ns, higher levels 3–8× more for a
few points. So: brotli quality 1 by default, gzip level 1 only if the
operator enables it, never a higher level on the fly, and only for JSON
bodies of at least ``compress_min_bytes`` (16 KiB: a smaller body fits the
first round trips of a new connection anyway). Operators whose clients sit on
a fast network, or behind a compressing proxy, set ``compression`` to off.
Output is deterministic (gzip's mtime is fixed), so equal requests still get
equal bytes.

**Compression never more than doubles a request's CPU.** brotli at quality 1
costs ~6.2 ns a byte of trace JSON, which is more than producing the JSON did
for the largest traces (~105 ms of CPU for 40 MB, then 254 ms to compress
it: 270 ms → 643 ms of CPU for the request, measured). So a body is compressed only if its
estimated compression CPU (``COST_NS_PER_BYTE``, measured, with a margin) is
at most what the request itself is estimated to cost: its work units
(service/budget.py: numbers computed, weights generated, a fixed part) at
``NS_PER_UNIT``. The estimate comes from the request alone, so the same
request is always answered the same way, cached or not. Answers without an
estimate (/check, batches) use the CPU time the request has actually used.
Otherwise the body goes out as it is (``Vary: Accept-Encoding`` either way).
/trace answers are kept compressed in the response cache too.
"""

from __future__ import annotations

import gzip
import time

import brotli
from flask import Response, current_app, g, request

from .settings import Settings

_ENCODERS = {
    "br": lambda body: brotli.compress(body, quality=1),
    "gzip": lambda body: gzip.compress(body, compresslevel=1, mtime=0),
}


#: CPU a byte of trace JSON costs to compress (measured 6.2 ns for br quality 1
#: and 9.0 ns for gzip level 1, docs/performance.md; with a margin)
COST_NS_PER_BYTE = {"br": 7.0, "gzip": 10.0}
#: CPU a unit of work costs (service/budget.py; measured ~42 ns a trace number)
NS_PER_UNIT = 42.0


#: the environ key under which the service's WSGI middleware (service.AnswerHeaders) puts the thread's CPU time
#: when the request reached the app
CPU_START = "attention_trace.cpu_start"


def estimate_s(units: int) -> float:
    """The CPU seconds a request of this many work units is expected to cost."""
    return units * NS_PER_UNIT * 1e-9


def affordable(encoding: str, size: int) -> bool:
    """Compressing `size` bytes costs no more CPU than the request itself (so at most doubles it)."""
    budget = g.get("cpu_estimate")
    if budget is None:
        start = request.environ.get(CPU_START)
        if start is None:
            return True
        budget = time.thread_time() - start
    return size * COST_NS_PER_BYTE[encoding] * 1e-9 <= budget


def may_compress(settings: Settings) -> bool:
    """Whether this request's answer can be compressed at all: an encoding is configured and the client sent an
    Accept-Encoding header (without one, werkzeug's parse of the missing header says every coding is at q=0).
    Read without parsing anything: most API clients send none."""
    return bool(settings.compression and request.environ.get("HTTP_ACCEPT_ENCODING"))


def choose_encoding(settings: Settings) -> str | None:
    """The first configured encoding this request's client accepts (q > 0), or None (see may_compress)."""
    if not may_compress(settings):
        return None
    quality = request.accept_encodings.quality
    for name in settings.compression:
        if quality(name) > 0:
            return name
    return None


def add_vary(resp: Response, name: str) -> None:
    """Add ``name`` to the response's Vary header, as werkzeug's ``resp.vary.add(name)`` does, without parsing
    the header into a set and writing the set back (6 µs of an S answer's ~300 µs, measured in process)."""
    # getlist, not get: werkzeug's get and `in` raise and catch an exception for a missing name (~3 µs)
    vary = ", ".join(resp.headers.getlist("Vary"))
    if not vary:
        resp.headers["Vary"] = name
    elif name.lower() not in (v.strip().lower() for v in vary.split(",")):
        resp.headers["Vary"] = f"{vary}, {name}"


def maybe_compress(resp: Response, settings: Settings) -> Response:
    """Compress a large, complete JSON response if the client accepts a configured encoding."""
    if (
        not settings.compression
        or resp.direct_passthrough
        or resp.is_streamed
        or resp.headers.getlist("Content-Encoding")
        or not (resp.mimetype or "").endswith("json")
        or resp.status_code < 200
        or resp.status_code in (204, 304)
    ):
        return resp
    size = resp.calculate_content_length()  # the body's length, without joining it into a copy
    if size is None or size < settings.compress_min_bytes:
        return resp
    add_vary(resp, "Accept-Encoding")  # the answer depends on it, for every cache on the way
    encoding = choose_encoding(settings)
    if encoding is None or not affordable(encoding, size):
        return resp
    packed = _ENCODERS[encoding](resp.get_data())
    resp.set_data(packed)
    resp.headers["Content-Encoding"] = encoding
    key = g.get("response_cache_key")
    cache = current_app.extensions.get("attention_trace.responses")
    if key is not None and cache is not None and resp.status_code == 200:
        cache.put(encoded_key(encoding, key), packed)
    return resp


def encoded_key(encoding: str, key: bytes) -> bytes:
    """The response cache's key for an encoded answer, or another variant of it (the npz answer, by its media
    type); identity JSON answers are keyed by the body alone, which is JSON and cannot start with NUL."""
    return b"\x00" + encoding.encode() + b"\x00" + key
