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
"""

from __future__ import annotations

import gzip

import brotli
from flask import Response, request

from .settings import Settings

_ENCODERS = {
    "br": lambda body: brotli.compress(body, quality=1),
    "gzip": lambda body: gzip.compress(body, compresslevel=1, mtime=0),
}


def choose_encoding(settings: Settings, accept_encoding_quality) -> str | None:
    """The first configured encoding the client accepts (q > 0), or None."""
    for name in settings.compression:
        if accept_encoding_quality(name) > 0:
            return name
    return None


def maybe_compress(resp: Response, settings: Settings) -> Response:
    """Compress a large, complete JSON response if the client accepts a configured encoding."""
    if (
        not settings.compression
        or resp.direct_passthrough
        or resp.is_streamed
        or "Content-Encoding" in resp.headers
        or not (resp.mimetype or "").endswith("json")
        or resp.status_code < 200
        or resp.status_code in (204, 304)
    ):
        return resp
    body = resp.get_data()
    if len(body) < settings.compress_min_bytes:
        return resp
    resp.vary.add("Accept-Encoding")  # the answer depends on it, for every cache on the way
    encoding = choose_encoding(settings, request.accept_encodings.quality)
    if encoding is None:
        return resp
    resp.set_data(_ENCODERS[encoding](body))
    resp.headers["Content-Encoding"] = encoding
    return resp
