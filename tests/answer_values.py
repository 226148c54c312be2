"""An answer as its structure plus its numbers, so that a golden file holds on any CPU.

BLAS kernels differ in the last bits between CPUs (and between OpenBLAS's
kernels on one CPU, ``OPENBLAS_CORETYPE``), so the bytes of an answer that
carries computed floats pin the machine that wrote it. This module splits an
answer in two:

* the **skeleton**: the answer with every float replaced by a mark. It holds
  everything no BLAS touches (status, headers, keys, strings, integers, token
  lists, the order of fields, the page around an embedded trace) and is pinned
  by its SHA-256;
* the **numbers**, in groups: one group per place in the document (the JSON
  path without list indices, e.g. ``stages/weights/values``, or an npz
  member's name). A group is compared at a tolerance relative to its own scale
  (``tolerance``): ``RTOL`` times the largest magnitude in the golden group.

A small group (at most ``SMALL`` numbers: /check's metrics, /explain's
arithmetic) is stored whole and compared number by number. A larger one
(a stage, a parameter matrix) is stored as a sketch: its count, its largest
magnitude and ``PROJECTIONS`` sums with fixed pseudo-random ±1 signs. If
every number is within the tolerance, each sum is within ``n`` times it, so a
sketch never fails on a CPU difference; a change of one number by more than
``n`` tolerances always shows, and a change spread over many numbers shows far
sooner. The golden file stays a few hundred KB instead of 1.2 M numbers.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import zipfile
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

#: tolerance relative to a group's scale. Measured over the whole corpus on one AVX-512 machine, answers
#: computed under OpenBLAS's Prescott, Nehalem, Sandybridge, Zen and its own (SkylakeX) kernels differ from
#: the Haswell kernel's by at most 2.3e-14 of their group's scale (an /explain exponent), and every stage by
#: at most 1.7e-15; an independent implementation agrees with the engine to about 5e-14
RTOL = 1e-12
#: plus this, absolute: a stage whose every value cancels to rounding level (the mean of a row that is centred
#: by construction, as a constructed head's input under LayerNorm) has a scale of ~1e-17, and its numbers
#: differ between kernels by that much (2.8e-17 measured, Prescott against Haswell); the values such a stage is
#: computed from are of order 1, so any real change moves it by far more than 1e-14
ATOL = 1e-14
#: numbers that measure a difference between two computations (/explain's ``max_abs_difference``, decoding's
#: ``weight_difference``, /check's ``max_abs_error`` and ``rel_error``): their values are rounding noise, up to
#: 0.4 of their own scale between kernels (measured), so they are compared at NOISY_RTOL of the larger of their
#: scale and 1
NOISY = re.compile(r"(difference|error)s?$")
NOISY_RTOL = 1e-9
#: a group this small is stored and compared number by number
SMALL = 32
#: ±1 sums in a large group's sketch
PROJECTIONS = 4
#: what stands for a float in a skeleton (a string no answer contains: JSON escapes control characters)
MARK = "\x00f"
#: booleans that report on this machine's arithmetic, not on the request: /explain's ``exact`` says whether
#: its plain recomputation equals the BLAS result bit for bit, which is true on some kernels and not on others
MACHINE_FLAGS = frozenset({"exact"})
MACHINE = "\x00m"
JSON_TYPES = ("application/json", "application/problem+json")
NPZ = "application/x-npz"
#: the offline page embeds its trace and request as JSON data blocks (viewer/offline_page.py)
EMBEDDED = re.compile(rb'(<script type="application/json" id="(trace-data|trace-json)">)(.*?)(</script>)', re.S)


@dataclass
class Canon:
    skeleton_sha256: str
    #: group name -> its numbers, in document order
    groups: dict[str, list[float]] = field(default_factory=dict)


def _walk(node: Any, path: str, groups: dict[str, list[float]]) -> Any:
    if type(node) is float:
        if not math.isfinite(node):  # NaN or ±Infinity in a request body: structure, not a number to compare
            return f"\x00{node!r}"
        groups.setdefault(path, []).append(node)
        return MARK
    if isinstance(node, dict):
        return {k: (MACHINE if k in MACHINE_FLAGS and isinstance(v, bool) else _walk(v, f"{path}/{k}", groups))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_walk(v, path, groups) for v in node]
    return node


def _json_skeleton(text: bytes | str, prefix: str, groups: dict[str, list[float]]) -> bytes:
    skeleton = _walk(json.loads(text), prefix, groups)
    return json.dumps(skeleton, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _npz_skeleton(body: bytes, groups: dict[str, list[float]]) -> bytes:
    """Members in order: a float array by name, dtype and shape; anything else by its bytes."""
    parts = []
    with zipfile.ZipFile(io.BytesIO(body)) as zf:
        for info in zf.infolist():
            data = zf.read(info)
            if info.filename.endswith(".npy"):
                arr = np.load(io.BytesIO(data), allow_pickle=False)
                if arr.dtype.kind == "f":
                    # -inf (a masked score) and NaN are structure, pinned with their places; the rest are numbers
                    flat = arr.ravel()
                    finite = np.isfinite(flat)
                    groups.setdefault(info.filename, []).extend(flat[finite].tolist())
                    odd = np.flatnonzero(~finite)
                    parts.append(f"{info.filename} {arr.dtype.str} {arr.shape} ".encode()
                                 + hashlib.sha256(odd.astype("<i8").tobytes() + flat[odd].astype("<f8").tobytes())
                                 .hexdigest().encode())
                    continue
            elif info.filename.endswith(".json"):
                parts.append(info.filename.encode() + b" " + _json_skeleton(data, info.filename, groups))
                continue
            parts.append(info.filename.encode() + b" " + hashlib.sha256(data).hexdigest().encode())
    return b"\n".join(parts)


def _html_skeleton(body: bytes, groups: dict[str, list[float]]) -> bytes:
    def one(m: re.Match[bytes]) -> bytes:
        return m.group(1) + _json_skeleton(m.group(3), m.group(2).decode(), groups) + m.group(4)

    return EMBEDDED.sub(one, body, count=2)


def canon(mimetype: str, body: bytes, header: bytes = b"") -> Canon:
    """``body`` split into its skeleton's digest (``header`` is digested with it) and its number groups."""
    groups: dict[str, list[float]] = {}
    if mimetype in JSON_TYPES:
        skeleton = _json_skeleton(body, "", groups)
    elif mimetype == NPZ:
        skeleton = _npz_skeleton(body, groups)
    elif mimetype == "text/html":
        skeleton = _html_skeleton(body, groups)
    else:
        skeleton = body
    return Canon(hashlib.sha256(header + b"\x00" + skeleton).hexdigest(), groups)


# ----------------------------------------------------------------- the numbers


@lru_cache(maxsize=256)
def _signs(n: int) -> np.ndarray:
    """[PROJECTIONS, n] fixed ±1 signs (a function of n alone, so the golden file needs no seeds)."""
    rng = np.random.default_rng(n)
    signs = rng.integers(0, 2, size=(PROJECTIONS, n)).astype(np.float64) * 2 - 1  # [P, n]
    signs.setflags(write=False)
    return signs


def _sketch(values: np.ndarray) -> list[float]:
    # numpy's pairwise sum, not a BLAS dot: the sketch itself must not depend on the CPU's kernel
    return [float(np.sum(s * values)) for s in _signs(values.size)]


def summarize(groups: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """What the golden file keeps of each group."""
    out: dict[str, dict[str, Any]] = {}
    for name, vals in groups.items():
        v = np.asarray(vals, dtype=np.float64)
        if v.size <= SMALL:
            out[name] = {"values": v.tolist()}
        else:
            out[name] = {"n": int(v.size), "scale": float(np.max(np.abs(v))), "sketch": _sketch(v)}
    return out


def tolerance(name: str, scale: float) -> float:
    if NOISY.search(name):
        return NOISY_RTOL * max(scale, 1.0)
    return RTOL * scale + ATOL


def compare(golden: dict[str, dict[str, Any]], groups: dict[str, list[float]]) -> list[str]:
    """The groups whose numbers are off by more than their tolerance (empty: all agree)."""
    problems = []
    for name in sorted(golden.keys() | groups.keys()):
        if name not in groups or name not in golden:
            problems.append(f"group {name!r} is {'missing' if name not in groups else 'new'}")
            continue
        want, got = golden[name], np.asarray(groups[name], dtype=np.float64)
        if "values" in want:
            ref = np.asarray(want["values"], dtype=np.float64)
            if ref.size != got.size:
                problems.append(f"group {name!r} has {got.size} numbers, not {ref.size}")
                continue
            tol = tolerance(name, float(np.max(np.abs(ref))) if ref.size else 0.0)
            off = np.abs(got - ref)
            if np.any(off > tol):
                i = int(np.argmax(off))
                problems.append(f"group {name!r} number {i}: {got[i]!r}, golden {ref[i]!r} (tolerance {tol:.3g})")
            continue
        if got.size != want["n"]:
            problems.append(f"group {name!r} has {got.size} numbers, not {want['n']}")
            continue
        tol = tolerance(name, want["scale"])
        scale = float(np.max(np.abs(got)))
        if abs(scale - want["scale"]) > tol:
            problems.append(f"group {name!r}: largest magnitude {scale!r}, golden {want['scale']!r}")
            continue
        for k, (s, ref_s) in enumerate(zip(_sketch(got), want["sketch"])):
            if abs(s - ref_s) > got.size * tol:
                problems.append(f"group {name!r} ({got.size} numbers): signed sum {k} is {s!r}, golden {ref_s!r}; "
                                f"the numbers moved by more than {tol:.3g} each")
                break
    return problems


def document_differences(golden: Any, current: Any) -> list[str]:
    """Two JSON-like documents compared as answers are: structure exactly, numbers within the tolerance.

    For documents that embed computed numbers (openapi.yaml's examples are real answers, computed when it is
    generated), so that a document written on one CPU still matches what another CPU computes."""
    a = canon("application/json", json.dumps(golden).encode())
    b = canon("application/json", json.dumps(current).encode())
    if a.skeleton_sha256 != b.skeleton_sha256:
        return ["the structure differs (keys, strings, integers or the count of numbers)"]
    return compare(summarize(a.groups), b.groups)
