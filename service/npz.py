"""A JSON answer as a NumPy ``.npz`` archive: exact float64 arrays, no text round trip.

``Accept: application/x-npz`` on /trace and /trace/batch. The archive (an
uncompressed zip, what ``np.savez`` writes, readable by ``np.load`` and by
a zip reader plus a small .npy reader such as npyjs in JavaScript) holds:

- ``metadata.json``: the JSON answer itself, in which every numeric array is
  replaced by ``{"npz": KEY}``; KEY is the JSON Pointer of the array it
  replaces, without the leading slash (``stages/q/values``,
  ``stats/entropy``, ``results/0/result/stages/weights/values``);
- one ``KEY.npy`` member per array, float64 in the JSON's shape and axes.
  Where the JSON has null (a masked entry of ``masked_scores``) the array
  holds NaN, and the stage gains ``"mask": {"npz": ".../mask"}``, a boolean
  array that is true exactly there.

Every number is the float64 the engine computed; the JSON answer prints the
same number as the shortest decimal that reads back to it, so the two are
equal bit for bit (tests/test_npz.py). The Python client reads it back with
``Client.trace(..., arrays=True)`` (attention_trace/client.py, ``load_npz``).
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

import numpy as np
import orjson

MEDIA_TYPE = "application/x-npz"
METADATA = "metadata.json"


def _escape(token: str) -> str:
    """One JSON Pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


def split(doc: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """The document with each ndarray replaced by ``{"npz": key}``, and the arrays by key."""
    arrays: dict[str, np.ndarray] = {}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, np.ndarray):
            arrays[path] = node
            return {"npz": path}
        if isinstance(node, dict):
            return {k: walk(v, f"{path}/{_escape(k)}" if path else _escape(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{path}/{i}" if path else str(i)) for i, v in enumerate(node)]
        return node

    return walk(doc, ""), arrays


def dumps(doc: Any) -> bytes:
    """The ``.npz`` bytes of a document whose arrays are numpy arrays (see the module's docstring)."""
    meta, arrays = split(doc)
    buf = io.BytesIO()
    # What np.savez writes (stored, not deflated: float64 noise barely compresses, and the
    # client asked for speed), built here so that the metadata member is plain JSON.
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        # Every member dated 1980-01-01 (zip's epoch, what members opened by name get), so the same request
        # gets the same bytes; writestr would stamp the metadata with the current time.
        info = zipfile.ZipInfo(METADATA)
        info.external_attr = 0o600 << 16  # -rw-------, as writestr gives a file
        zf.writestr(info, orjson.dumps(meta))
        for key, a in arrays.items():
            with zf.open(key + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()

