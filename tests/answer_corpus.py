"""A fixed corpus of ~1,400 requests whose answers must not change unless on purpose, checked two ways (the
corpus, the golden files, and ``main`` for scripts/answer-digests; tests/test_answer_digests.py runs it in
pytest). Test data, so it lives under tests/: it names known bugs, which code outside engine/bugs.py may not.

The corpus (``build_corpus``) is built in code: /trace over sentences, sizes,
seeds and every variant (RoPE, grouped-query attention, sliding windows,
cross-attention, explicit x and weights, decoding, every injected bug, npz and
compressed answers), /check with correct, perturbed and bug-made submissions
under every tolerance option, both batch endpoints, /explain, /export,
/trace/html, the GET endpoints (the viewer's files too), the tokenizer's edge
cases, and ~100 invalid requests. Each request goes to
``create_app(Settings(response_cache_bytes=0))``'s test client; it runs in a
few seconds.

**On any CPU: structure exactly, numbers at a tolerance.** BLAS gives other
last bits on another CPU, so an answer is split (tests/answer_values.py) into
its skeleton (status, headers, every key, string, integer and token: pinned by
SHA-256) and its number groups (compared at 1e-12 of each group's scale).
tests/golden/answers/answers.json holds one line per request, numbers.json the
groups.

**On this machine: bytes against a baseline commit.** The same code on the same
machine gives the same bytes, so the baseline commit named in
tests/golden/answers/baseline.json is extracted with ``git archive`` and answers
the corpus here too; every answer must be byte-identical to its answer, except
the requests that file lists as changed on purpose. Which requests an intended
change touches can depend on the CPU (a number at a threshold), so once such a
change is committed, run ``--write`` again on the next commit: the baseline
then moves past it and its list is empty.

    .venv/bin/python scripts/answer-digests              # compare with the golden files
    .venv/bin/python scripts/answer-digests --write      # rewrite them; HEAD becomes the byte baseline
    .venv/bin/python scripts/answer-digests --against REV  # bytes of this tree against REV's, on this machine

The service is imported from ``--root`` (default: the working directory when it
holds the service and engine packages, else this script's repository), so the
same script can answer for another checkout.

Normalisations, each because the raw bytes are not a function of the request:

* ``application/x-npz`` answers are read member by member (a zip carries dates).
* Compressed answers (``Content-Encoding: br`` or ``gzip``) are read after
  decompression (the encoding is recorded): compressed bytes may change with
  the compression library's version while the answer does not.
* Accept-Encoding is sent only to endpoints that bound compression by the
  request's own cost estimate (/trace, /explain, /export, /trace/html). /check
  and the batch endpoints compress only if the CPU time the request has used so
  far covers it (service/compression.py, ``affordable``), so whether their
  answer is compressed depends on timing.
* GET /version is read without its ``libraries`` (the interpreter's and
  packages' versions: a fact about the machine).

Requests whose body is derived from another answer (the /check submissions are
a /trace answer's stages) get their id from a stable label, not from their
body, and their body is compared as an answer is (skeleton and numbers).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import random
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import answer_values as av

SCRIPT_ROOT = Path(__file__).resolve().parent.parent
GOLDEN = SCRIPT_ROOT / "tests" / "golden" / "answers" / "answers.json"  # a folder of its own: tests/golden/*.json are the engine's
NUMBERS_FILE = "numbers.json"
BASELINE = GOLDEN.parent / "baseline.json"
SUMMARY_CHARS = 200
JSON = "application/json"
NPZ = "application/x-npz"


# ----------------------------------------------------------------- requests


@dataclass(frozen=True)
class Req:
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    #: derived requests (a body built from another answer): the stable name their id comes from
    label: str | None = None

    @property
    def request_sha256(self) -> str:
        h = hashlib.sha256()
        for part in (self.method, self.path, *(f"{k}: {v}" for k, v in sorted(self.headers))):
            h.update(part.encode("utf-8") + b"\x00")
        h.update(self.body)
        return h.hexdigest()

    @property
    def id(self) -> str:
        if self.label is not None:
            return hashlib.sha256(b"derived\x00" + self.label.encode("utf-8")).hexdigest()[:16]
        return self.request_sha256[:16]

    @property
    def summary(self) -> str:
        heads = " ".join(f"[{k}: {v}]" for k, v in self.headers if k != "Content-Type" or v != JSON)
        text = f"{self.method} {self.path}"
        if self.label is not None:
            text += f" <{self.label}>"
        if heads:
            text += " " + heads
        if self.body:
            text += " " + self.body[:SUMMARY_CHARS + 50].decode("utf-8", "replace")
        return text if len(text) <= SUMMARY_CHARS else text[:SUMMARY_CHARS - 1] + "…"


def dump(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=True).encode("utf-8")


def post(path: str, body: Any, *, headers: Iterable[tuple[str, str]] = (), content_type: str | None = JSON,
         label: str | None = None) -> Req:
    raw = body if isinstance(body, bytes) else dump(body)
    hs = (("Content-Type", content_type),) if content_type is not None else ()
    return Req("POST", path, hs + tuple(headers), raw, label)


def get(path: str, *, headers: Iterable[tuple[str, str]] = ()) -> Req:
    return Req("GET", path, tuple(headers), b"")


# ----------------------------------------------------------------- the corpus

SENTENCES = {
    1: "Hello",
    2: "naïve café",
    3: "the cat sat",
    5: "Café, naïve café!",
    8: "the cat sat on the mat again.",
    16: "I think, therefore I am; the cat sat on the mat — naïve?",
}
SIZES = ((24, 1), (24, 4), (16, 2), (64, 4), (32, 8))
#: what the tokenizer must split by its rules (docs/engine.md): ASCII punctuation, digits, whitespace of every kind,
#: combining marks, joiners, scripts without spaces, emoji sequences
TOKENIZER_SENTENCES = (
    "don't stop", "U.S.A. 3.14 -2 1e5 50% $100", "a_b_c snake_case CamelCase123abc", "x--y...z!!!?",
    "tab\there\nnewline\rreturn", "vertical\x0bfeed\x0c", "  leading and trailing  ", "(parens) [brackets] {braces}",
    "email@example.com http://x.y/z?q=1#f", "~`^|\\/<>&*+=", "\"quoted\" 'single'", "ABC abc 0123456789",
    "e\u0301 cafe\u0301 n\u0303", "👩\u200d💻 🇫🇷 👍🏽", "東京都に行く", "नमस्ते दुनिया", "สวัสดีครับ", "مرحبا بالعالم",
    "Ελληνικά ΑΒΓ", "zero\u200bwidth", "non\u00a0breaking", "line\u2028sep", "bom\ufeffinside", "ﬁ ligature",
    "１２３ ＡＢＣ", "½ ² Ⅻ", "a\u0300\u0301\u0302", "Straße STRASSE", "İstanbul ı", "x" * 300,
)
BASE = {"sentence": "the cat sat", "d_model": 24, "num_heads": 4}
CAUSAL = {**BASE, "causal": True}


def explicit_input(n: int, d_model: int, salt: int = 0) -> list[list[float]]:
    """Deterministic small x, exact in binary and decimal: multiples of 1/8."""
    return [[((i * 7 + j * 3 + salt) % 11 - 5) / 8 for j in range(d_model)] for i in range(n)]


def explicit_weights(heads: int, d_k: int, d_model: int, salt: int) -> list[list[list[float]]]:
    return [[[((h * 5 + r * 3 + c * 2 + salt) % 9 - 4) / 16 for c in range(d_model)] for r in range(d_k)]
            for h in range(heads)]


def explicit_parameters(d_model: int = 4, num_heads: int = 2, kv_heads: int | None = None) -> dict[str, Any]:
    d_k = d_model // num_heads
    kv = kv_heads or num_heads
    w_o = [[((r * 3 + c + 1) % 7 - 3) / 8 for c in range(num_heads * d_k)] for r in range(d_model)]
    return {"W_Q": explicit_weights(num_heads, d_k, d_model, 1), "W_K": explicit_weights(kv, d_k, d_model, 2),
            "W_V": explicit_weights(kv, d_k, d_model, 3), "W_O": w_o}


def trace_corpus(bug_names: tuple[str, ...], pe_choices: tuple[str, ...], pairings: tuple[str, ...],
                 stage_ids: tuple[str, ...]) -> list[Req]:
    out: list[Req] = []
    add = out.append

    # The grid: every sentence length, size, seed, scale and causal.
    for n, sentence in SENTENCES.items():
        for d_model, heads in SIZES:
            for seed in (0, 7):
                for scale in (True, False):
                    for causal in (True, False):
                        add(post("/trace", {"sentence": sentence, "d_model": d_model, "num_heads": heads,
                                            "seed": seed, "scale": scale, "causal": causal}))
    # Defaults only, and the fields given at their defaults (another body, the same answer).
    add(post("/trace", {"sentence": "the cat sat"}))
    add(post("/trace", {"sentence": "the cat sat", "d_model": 24, "num_heads": 1, "seed": 0, "scale": True,
                        "causal": False, "positional_encoding": "sinusoidal", "include_parameters": False,
                        "parameters_layout": "per_head", "precision": None, "stages": None, "decode": False,
                        "inject_bug": None, "num_kv_heads": None, "window": None}))
    add(post("/trace", {"sentence": "  the   cat\tsat\n"}))
    add(post("/trace", {"sentence": "the the the the the"}))
    add(post("/trace", {"sentence": "Wait... don't stop-believing 3.14 ¿Qué? 東京 😀"}))
    for seed in (1, 2, 12345, 2**31 - 1):
        add(post("/trace", {**BASE, "seed": seed}))

    # Positional encodings, RoPE pairings and bases.
    for pe in pe_choices:
        for d_model, heads in ((24, 1), (24, 4), (16, 2), (32, 8)):
            for causal in (False, True):
                add(post("/trace", {"sentence": SENTENCES[5], "d_model": d_model, "num_heads": heads,
                                    "causal": causal, "positional_encoding": pe}))
    for pairing in pairings:
        for rope_base in (10000.0, 500000.0, 2.5):
            for d_model, heads in ((24, 4), (16, 2)):
                add(post("/trace", {"sentence": SENTENCES[8], "d_model": d_model, "num_heads": heads,
                                    "causal": True, "positional_encoding": "rope", "rope_pairing": pairing,
                                    "rope_base": rope_base}))
        add(post("/trace", {**BASE, "positional_encoding": "rope", "rope_pairing": pairing,
                            "stages": ["q", "q_rotated", "k_rotated", "weights"]}))
    add(post("/trace", {**BASE, "rope_pairing": "interleaved", "rope_base": 20000}))  # ignored without rope

    # Grouped-query attention (and multi-query), with RoPE, causal and decoding.
    for kv in (1, 2, 4, 8):
        add(post("/trace", {"sentence": SENTENCES[5], "d_model": 32, "num_heads": 8, "num_kv_heads": kv}))
        add(post("/trace", {"sentence": SENTENCES[8], "d_model": 64, "num_heads": 8, "num_kv_heads": kv,
                            "causal": True, "positional_encoding": "rope"}))
    add(post("/trace", {**CAUSAL, "num_kv_heads": 2, "decode": True}))
    add(post("/trace", {**BASE, "num_kv_heads": 2, "include_parameters": True}))

    # Sliding windows.
    for window in (1, 2, 3, 100):
        add(post("/trace", {"sentence": SENTENCES[8], "d_model": 16, "num_heads": 2, "causal": True,
                            "window": window}))
    add(post("/trace", {"sentence": SENTENCES[8], "d_model": 32, "num_heads": 8, "causal": True, "window": 2,
                        "num_kv_heads": 2, "positional_encoding": "rope", "decode": True}))

    # Cross-attention.
    for ctx in ({"context_sentence": "le chat"}, {"context_sentence": "Le chat s'est assis sur le tapis."},
                {"context_tokens": ["le", "chat", "assis"]}, {"context_tokens": ["un"]}):
        add(post("/trace", {**BASE, **ctx}))
        add(post("/trace", {"sentence": SENTENCES[1], "d_model": 16, "num_heads": 2, "positional_encoding": "none",
                            **ctx}))
    add(post("/trace", {"tokens": ["a", "b"], "d_model": 32, "num_heads": 8, "num_kv_heads": 2,
                        "context_sentence": "x y z"}))
    add(post("/trace", {**BASE, "context_sentence": "le chat", "stages": ["context_tokens", "k", "weights"]}))

    # Pre-split tokens.
    for toks in (["the", "cat", "sat"], ["the cat", "sat"], ["naïve", "café", "naïve"], ["x"], [" ", "\t", "."]):
        add(post("/trace", {"tokens": toks, "d_model": 16, "num_heads": 2}))

    # Parameters in both layouts, stages, precision, decoding.
    for d_model, heads in SIZES:
        add(post("/trace", {"sentence": "the cat sat", "d_model": d_model, "num_heads": heads,
                            "include_parameters": True}))
        add(post("/trace", {"sentence": "the cat sat", "d_model": d_model, "num_heads": heads,
                            "include_parameters": True, "parameters_layout": "torch"}))
    for stages in (["weights"], ["q", "k", "v"], ["tokens", "output"], ["masked_scores", "weights"], ["concat"],
                   list(stage_ids[:4]), ["output", "tokens"], ["weights", "weights"]):
        add(post("/trace", {**CAUSAL, "stages": stages}))
    add(post("/trace", {**BASE, "stages": ["weights"], "include_parameters": True}))
    for precision in (0, 3, 6, 17):
        add(post("/trace", {**CAUSAL, "precision": precision}))
        add(post("/trace", {**CAUSAL, "precision": precision, "stages": ["weights"], "include_parameters": True}))
    add(post("/trace", {**CAUSAL, "precision": 3, "decode": True}))
    for d_model, heads in ((24, 1), (24, 4), (32, 8)):
        add(post("/trace", {"sentence": SENTENCES[5], "d_model": d_model, "num_heads": heads, "causal": True,
                            "decode": True}))
    add(post("/trace", {**CAUSAL, "positional_encoding": "rope", "decode": True, "stages": ["weights"]}))

    # Every bug on configurations where it applies and where it is refused (422).
    bug_configs = (
        CAUSAL,
        {**BASE, "causal": False},
        {"sentence": SENTENCES[5], "d_model": 24, "num_heads": 1, "scale": False},
        {"sentence": SENTENCES[1], "d_model": 16, "num_heads": 2, "causal": True},
        {**CAUSAL, "positional_encoding": "rope"},
        {**CAUSAL, "positional_encoding": "none"},
        {"sentence": SENTENCES[5], "d_model": 32, "num_heads": 8, "num_kv_heads": 2, "causal": True},
        {**BASE, "context_sentence": "le chat"},
        {"sentence": SENTENCES[8], "d_model": 16, "num_heads": 2, "causal": True, "window": 1},
        {"tokens": ["a", "b", "c"], "d_model": 4, "num_heads": 2, "input": explicit_input(3, 4)},
    )
    for config in bug_configs:
        for bug in bug_names:
            add(post("/trace", {**config, "inject_bug": bug}))
    add(post("/trace", {**CAUSAL, "inject_bug": bug_names[0], "stages": ["weights"], "precision": 4}))
    add(post("/trace", {**CAUSAL, "inject_bug": bug_names[0], "decode": True}))

    # Explicit input and parameters (d_model 4, 2 heads).
    toks = ["one", "two", "three"]
    params = explicit_parameters()
    add(post("/trace", {"tokens": toks, "d_model": 4, "num_heads": 2, "input": explicit_input(3, 4)}))
    add(post("/trace", {"tokens": toks, "d_model": 4, "num_heads": 2, "parameters": params}))
    add(post("/trace", {"tokens": toks, "d_model": 4, "num_heads": 2, "parameters": params,
                        "input": explicit_input(3, 4, 5), "causal": True}))
    add(post("/trace", {"tokens": toks, "d_model": 4, "num_heads": 2, "parameters": params,
                        "include_parameters": True, "parameters_layout": "torch"}))
    add(post("/trace", {"sentence": "a b", "d_model": 4, "num_heads": 2, "num_kv_heads": 1,
                        "parameters": explicit_parameters(4, 2, 1), "include_parameters": True}))
    add(post("/trace", {"sentence": "a b", "d_model": 4, "num_heads": 2, "positional_encoding": "rope",
                        "parameters": params, "causal": True, "decode": True}))
    add(post("/trace", {"sentence": "a b c", "d_model": 4, "num_heads": 2, "input": explicit_input(3, 4),
                        "context_tokens": ["x", "y"], "context_input": explicit_input(2, 4, 3),
                        "parameters": params}))
    add(post("/trace", {"tokens": toks, "d_model": 4, "num_heads": 1,
                        "input": [[1e300, -1e300, 1e300, 1], [0, 0, 0, 0], [1, 2, 3, 4]]}))  # overflow
    add(post("/trace", {"tokens": toks, "d_model": 4, "num_heads": 2, "input": explicit_input(2, 4)}))  # rows
    add(post("/trace", {"tokens": toks, "d_model": 4, "num_heads": 2, "input": explicit_input(3, 5)}))  # cols
    add(post("/trace", {"tokens": toks, "d_model": 4, "num_heads": 2, "input": [[1, 2], [3, 4, 5, 6], [7]]}))
    bad = explicit_parameters()
    bad["W_Q"] = [[list(col) for col in zip(*w)] for w in bad["W_Q"]]  # transposed: [head, d_model, d_k]
    add(post("/trace", {"tokens": toks, "d_model": 4, "num_heads": 2, "parameters": bad}))
    sq = {"W_Q": explicit_weights(1, 4, 4, 1), "W_K": explicit_weights(1, 4, 4, 2),
          "W_V": explicit_weights(1, 4, 4, 3), "W_O": [[(r * 4 + c) / 16 for c in range(4)] for r in range(4)]}
    add(post("/trace", {"tokens": toks, "d_model": 4, "num_heads": 1, "parameters": sq}))
    sq_t = {k: ([[list(col) for col in zip(*w)] for w in v] if k != "W_O" else [list(c) for c in zip(*v)])
            for k, v in sq.items()}
    add(post("/trace", {"tokens": toks, "d_model": 4, "num_heads": 1, "parameters": sq_t}))  # square: runs
    add(post("/trace", {"tokens": toks, "d_model": 4, "num_heads": 2, "num_kv_heads": 1, "parameters": params}))
    add(post("/trace", {"tokens": toks, "d_model": 4, "num_heads": 2,
                        "parameters": {k: v for k, v in params.items() if k != "W_O"}}))

    # Extreme explicit numbers (the largest allowed), with and without scaling, and a bug on them.
    huge = [[1e6 if (i + j) % 2 else -1e6 for j in range(4)] for i in range(3)]
    big_params = {k: [[[1e6 * x for x in row] for row in w] for w in v] if k != "W_O" else
                  [[1e6 * x for x in row] for row in v] for k, v in params.items()}
    for extra in ({}, {"scale": False}, {"causal": True}, {"inject_bug": "log_softmax"},
                  {"inject_bug": "no_scale", "causal": True}, {"precision": 2}, {"decode": True, "causal": True}):
        add(post("/trace", {"tokens": toks, "d_model": 4, "num_heads": 2, "input": huge, "parameters": big_params,
                            **extra}))
    add(post("/trace", {"tokens": toks, "d_model": 4, "num_heads": 2, "input": [[1e-300] * 4] * 3}))
    add(post("/trace", {"tokens": toks, "d_model": 4, "num_heads": 2, "input": [[0.0] * 4] * 3,
                        "parameters": {k: [[[0.0 for _ in r] for r in w] for w in v] if k != "W_O" else v
                                       for k, v in params.items()}}))

    # The tokenizer: ASCII and Unicode edge cases (only the tokens stage, so each answer is small).
    for text in TOKENIZER_SENTENCES:
        add(post("/trace", {"sentence": text, "d_model": 4, "num_heads": 1, "stages": ["tokens"]}))
    lines = "\n".join(t for t in TOKENIZER_SENTENCES[:12] if "\x0b" not in t)  # \v is refused: a control char
    add(post("/trace", {"sentence": lines, "d_model": 8, "num_heads": 2, "stages": ["tokens", "input"]}))

    # Content negotiation: npz, and compression (only /trace's own estimate decides it; see the docstring).
    big = {"sentence": SENTENCES[16], "d_model": 64, "num_heads": 4}
    for body in (BASE, CAUSAL, big, {**CAUSAL, "decode": True}, {**CAUSAL, "precision": 3},
                 {**BASE, "include_parameters": True, "parameters_layout": "torch"},
                 {**BASE, "context_sentence": "le chat"}, {**CAUSAL, "stages": ["masked_scores"]},
                 {**BASE, "d_model": 5}):
        add(post("/trace", body, headers=[("Accept", NPZ)]))
    for accept in (f"{NPZ};q=0.5, {JSON}", f"{JSON};q=0.5, {NPZ}", "*/*", "text/html", f"{NPZ}, */*;q=0.1",
                   "application/*", "APPLICATION/X-NPZ", f"{NPZ};q=0", f"*/*;q=0.1, {NPZ}", f"{JSON}, {NPZ}",
                   f"{NPZ}, {JSON}", "application/*, application/json;q=0.5", "application/json;q=0, */*",
                   "*/*;q=0", "", "text/plain, */*;q=0.2", "application/x-NPZ;q=0.9, application/json;q=0.8",
                   "image/png"):
        add(post("/trace", BASE, headers=[("Accept", accept)]))
        if "npz" in accept.lower() or "*" in accept:
            add(post("/trace/batch", {"items": [BASE]}, headers=[("Accept", accept)]))
    # Compression pays (is affordable) for answers whose trace costs enough, such as BASE (its weights) and wide
    # layers; a long sentence at d_model 64 makes more JSON than its estimate allows, so it goes uncompressed.
    wide = {"sentence": SENTENCES[8], "d_model": 256, "num_heads": 8, "causal": True}
    for enc in ("br", "gzip", "zstd", "br;q=0", "gzip, deflate, br", "*", "identity", "br, gzip;q=0.5",
                "gzip, zstd", "BR", "br;q=0.001"):
        add(post("/trace", BASE, headers=[("Accept-Encoding", enc)]))
        add(post("/trace", wide, headers=[("Accept-Encoding", enc)]))
    add(post("/trace", big, headers=[("Accept-Encoding", "br")]))
    add(post("/trace", {**big, "causal": True, "num_heads": 8}, headers=[("Accept-Encoding", "gzip, br")]))
    add(post("/trace", {"sentence": "a b", "d_model": 16, "num_heads": 2}, headers=[("Accept-Encoding", "br")]))
    add(post("/trace", {"sentence": SENTENCES[16], "d_model": 512, "num_heads": 8},
             headers=[("Accept-Encoding", "br")]))
    add(post("/trace", {**big, "d_model": 7}, headers=[("Accept-Encoding", "br")]))  # a 422 is never compressed
    add(post("/trace", big, headers=[("Accept", NPZ), ("Accept-Encoding", "br")]))
    return out


def invalid_corpus(stage_ids: tuple[str, ...]) -> list[Req]:
    out: list[Req] = []
    add = out.append
    for raw in (b"", b"{", b"{'sentence': 'x'}", b"[]", b"null", b"42", b'"the cat sat"', b"\xff\xfe",
                b'{"sentence": "the cat sat",}', b'\xef\xbb\xbf{"sentence": "x"}', b'{"sentence": "x"} {}',
                b'{"sentence": "x", "sentence": "y"}', b"[" * 5000 + b"]" * 5000):
        add(post("/trace", raw))
    for body in (
        {"sentence": "the cat sat", "d_model": "24"},
        {"sentence": "the cat sat", "d_model": 24.0},
        {"sentence": "the cat sat", "d_model": 0},
        {"sentence": "the cat sat", "d_model": 10, "num_heads": 4},
        {"sentence": "the cat sat", "d_model": 513},
        {"sentence": "the cat sat", "d_model": 64, "num_heads": 65},
        {"sentence": "the cat sat", "num_heads": 0},
        {"sentence": "the cat sat", "seed": -1},
        {"sentence": "the cat sat", "seed": 2**64},
        {"sentence": "the cat sat", "scale": "yes"},
        {"sentence": "the cat sat", "causal": 1},
        {"sentence": "the cat sat", "stages": ["weights", "attention"]},
        {"sentence": "the cat sat", "stages": []},
        {"sentence": "the cat sat", "stages": "weights"},
        {"sentence": "the cat sat", "stages": ["masked_scores"]},
        {"sentence": "the cat sat", "stages": ["q_rotated"]},
        {"sentence": "the cat sat", "stages": ["context_input"]},
        {"sentence": "the cat sat", "stages": list(stage_ids) * 2},
        {"sentence": "the cat sat", "precision": -1},
        {"sentence": "the cat sat", "precision": 18},
        {"sentence": "the cat sat", "unknown_field": 1},
        {"sentence": "the cat sat", "tokens": ["the"]},
        {"d_model": 24},
        {"sentence": ""},
        {"sentence": "   "},
        {"sentence": "bell\x07"},
        {"sentence": "x" * 65537},
        {"sentence": " ".join(["w"] * 257)},
        {"tokens": ["w"] * 257},
        {"tokens": []},
        {"tokens": ["ok", ""]},
        {"tokens": ["ok", 3]},
        {"tokens": ["a" * 1025]},
        {"sentence": " ".join(["w"] * 256), "d_model": 512, "num_heads": 64},
        {"sentence": "the cat sat", "positional_encoding": "learned"},
        {"sentence": "the cat sat", "positional_encoding": "rope", "d_model": 9, "num_heads": 3},
        {"sentence": "the cat sat", "positional_encoding": "rope", "rope_base": 1},
        {"sentence": "the cat sat", "positional_encoding": "rope", "rope_pairing": "adjacent"},
        {"sentence": "the cat sat", "d_model": 24, "num_heads": 4, "num_kv_heads": 3},
        {"sentence": "the cat sat", "d_model": 24, "num_heads": 4, "num_kv_heads": 8},
        {"sentence": "the cat sat", "d_model": 24, "num_heads": 4, "num_kv_heads": 0},
        {"sentence": "the cat sat", "window": 2},
        {"sentence": "the cat sat", "causal": True, "window": 0},
        {"sentence": "the cat sat", "causal": True, "context_sentence": "le chat"},
        {"sentence": "the cat sat", "positional_encoding": "rope", "context_sentence": "le chat"},
        {"sentence": "the cat sat", "context_sentence": "le chat", "context_tokens": ["le"]},
        {"sentence": "the cat sat", "context_input": [[0.0] * 24]},
        {"sentence": "the cat sat", "decode": True},
        {"sentence": "the cat sat", "decode": True, "causal": True, "context_sentence": "le"},
        {"sentence": "the cat sat", "inject_bug": "off_by_one"},
        {"sentence": "the cat sat", "parameters_layout": "torch"},
        {"sentence": "the cat sat", "d_model": 24, "num_heads": 4, "num_kv_heads": 2, "include_parameters": True,
         "parameters_layout": "torch"},
        {"sentence": "the cat sat", "parameters_layout": "jax", "include_parameters": True},
        {"tokens": ["a"], "d_model": 2, "num_heads": 1, "input": [[1e309, 0]]},
    ):
        add(post("/trace", body))
    for ch in ("\x00", "\x01", "\x08", "\x0e", "\x1b", "\x1c", "\x1f", "\x7f", "\x80", "\x85", "\x9f"):
        add(post("/trace", {"sentence": f"the c{ch}at"}))
        add(post("/trace", {"tokens": ["ok", f"b{ch}"]}))
    add(post("/trace", {"sentence": "ok \x7f then \x01"}))
    add(post("/trace", {"sentence": "the cat", "context_sentence": "le\x85chat"}))
    add(post("/trace", b'{"tokens": ["ok", "\\udc00x"]}'))
    add(post("/trace", b'{"sentence": "pair \\ud83d\\ude00 ok"}'))
    add(post("/trace", b'{"tokens": ["a"], "d_model": 2, "num_heads": 1, "input": [[NaN, 0]]}'))
    add(post("/trace", b'{"sentence": "lone \\ud800 surrogate"}'))
    add(post("/trace", b'{"sentence": "' + b"x" * (4 * 1024 * 1024) + b'"}'))  # 413: above max_body_bytes
    # Content types and encodings.
    add(post("/trace", BASE, content_type="text/plain"))
    add(post("/trace", BASE, content_type=None))
    add(post("/trace", BASE, content_type="application/x-www-form-urlencoded"))
    add(post("/trace", BASE, content_type="application/merge-patch+json"))
    add(post("/trace", BASE, content_type="application/json; charset=utf-8"))
    add(post("/trace", BASE, headers=[("Content-Encoding", "gzip")]))
    add(post("/check", {"sentence": "the cat sat", "submission": {"weights": [[[1.0]]]}}, content_type="text/json"))
    # Batches.
    add(post("/trace/batch", {"items": []}))
    add(post("/trace/batch", {"items": [BASE] * 33}))
    add(post("/trace/batch", {"items": BASE}))
    add(post("/trace/batch", {"items": [BASE, "the cat sat"]}))
    add(post("/trace/batch", [BASE]))
    add(post("/trace/batch", {"items": [{"sentence": " ".join(["w"] * 256), "d_model": 512, "num_heads": 8,
                                         "seed": s} for s in range(3)]}))  # each item too large
    add(post("/trace/batch", {"items": [{"sentence": " ".join(["w"] * 256), "d_model": 256, "num_heads": 4,
                                         "seed": s} for s in range(2)]}))  # together too large
    add(post("/check/batch", {"items": [], "extra": 1}))
    # Other methods and paths.
    add(get("/trace"))
    add(Req("PUT", "/check", (("Content-Type", JSON),), dump(BASE)))
    add(Req("DELETE", "/health", (), b""))
    add(get("/nope"))
    add(get("/static/nope.js"))
    add(get("/static/../service/api.py"))
    add(post("/trace/", BASE))
    return out


def check_bodies(config: dict[str, Any], stages: dict[str, Any], tag: str) -> list[Req]:
    """Submissions of a correct trace's stages: all, partial, perturbed, malformed, under every tolerance."""
    out: list[Req] = []
    values = {sid: st["values"] for sid, st in stages.items()}
    numeric = {sid: v for sid, v in values.items() if sid not in ("tokens", "context_tokens")}

    def add(name: str, submission: dict[str, Any], **extra: Any) -> None:
        out.append(post("/check", {**config, **extra, "submission": submission}, label=f"check:{tag}:{name}"))

    add("all", values)
    add("numeric", numeric)
    for subset in (("weights",), ("q", "k", "v"), ("output",), ("scores", "weights"), ("tokens",),
                   ("masked_scores",), ("q_rotated", "k_rotated"), ("context_input", "weights")):
        if all(s in values for s in subset):
            add("+".join(subset), {s: values[s] for s in subset})
    w = values["weights"]
    add("metric-allclose", {"weights": w}, metric="allclose")
    add("rtol-atol", {"weights": w}, rtol=1e-3, atol=1e-6)
    add("stage_rtol", {"weights": w}, stage_rtol=1e-2)
    add("rtol-0", {"weights": w}, rtol=0, atol=0, stage_rtol=0)
    add("rel_error", {"weights": w}, metric="rel_error")
    add("rel_error-threshold", {"weights": w}, metric="rel_error", threshold=1e-6)

    scaled = scale_values(w, 1.001)
    for name, extra in (("default", {}), ("rtol-1e-2", {"rtol": 1e-2}), ("atol-0.01", {"atol": 1e-2}),
                        ("stage_rtol-1e-2", {"stage_rtol": 1e-2}), ("rel_error", {"metric": "rel_error"}),
                        ("rel_error-1e-2", {"metric": "rel_error", "threshold": 1e-2})):
        add(f"perturbed-{name}", {"weights": scaled, "output": values["output"]}, **extra)
    add("doubled-output", {"output": scale_values(values["output"], 2.0)})
    add("transposed-weights", {"weights": [[list(col) for col in zip(*head)] for head in w]})
    add("reversed-rows", {"weights": [list(reversed(head)) for head in w]})
    add("uniform-weights", {"weights": [[[1 / len(row)] * len(row) for row in head] for head in w]})
    add("missing-row", {"weights": [head[:-1] for head in w]})
    add("extra-axis", {"weights": [w]})
    add("ragged", {"weights": [[row[:1] if i == 0 else row for i, row in enumerate(head)] for head in w]})
    add("strings", {"weights": [[["NaN" if j == 0 else x for j, x in enumerate(row)] for row in head]
                                for head in w]})
    add("infinity-strings", {"output": [["Infinity", "-Infinity"] + row[2:] for row in values["output"]]})
    add("bad-string", {"output": [["0.5"] + row[1:] for row in values["output"]]})
    add("bool", {"output": [[True] + row[1:] for row in values["output"]]})
    add("tokens-wrong", {"tokens": list(reversed(values["tokens"]))})
    add("tokens-numbers", {"tokens": [1] * len(values["tokens"])})
    add("unknown-stage", {"attention": w})
    add("conflict-rel_error-rtol", {"weights": w}, metric="rel_error", rtol=1e-3)
    add("conflict-threshold", {"weights": w}, threshold=1e-3)
    add("rtol-too-big", {"weights": w}, rtol=2)
    add("metric-unknown", {"weights": w}, metric="max_abs")
    add("empty", {})
    if "masked_scores" in values:
        ms = values["masked_scores"]
        for name, fill in (("inf", "-Infinity"), ("-1e9", -1e9), ("zero", 0.0), ("-5e8", -5e8),
                           ("-999999999", -999999999.0), ("-1e300", -1e300), ("nan", "NaN")):
            add(f"masked-{name}", {"masked_scores": [[[fill if x is None else x for x in row] for row in head]
                                                     for head in ms]})
    # Non-finite literals are not JSON; Python's json writes them, and /check reads them.
    marked = [["\x00first"] + row[1:] if i == 0 else row for i, row in enumerate(values["output"])]
    raw = dump({**config, "submission": {"output": marked}})
    for literal in ("NaN", "Infinity", "-Infinity"):
        out.append(post("/check", raw.replace(dump("\x00first"), literal.encode()),
                        label=f"check:{tag}:literal-{literal}"))
    return out


def scale_values(v: Any, factor: float) -> Any:
    if isinstance(v, list):
        return [scale_values(x, factor) for x in v]
    return None if v is None else v * factor


def check_corpus(client: Any, bug_names: tuple[str, ...]) -> list[Req]:
    """/check requests, their submissions taken from this tree's /trace answers (derived: labelled ids)."""
    out: list[Req] = []
    configs = {
        "base": CAUSAL,
        "one-head": {"sentence": SENTENCES[5], "d_model": 24, "num_heads": 1},
        "unscaled": {"sentence": SENTENCES[2], "d_model": 16, "num_heads": 2, "scale": False, "seed": 7},
        "rope": {"sentence": SENTENCES[5], "d_model": 16, "num_heads": 2, "causal": True,
                 "positional_encoding": "rope", "rope_pairing": "interleaved"},
        "gqa": {"sentence": SENTENCES[3], "d_model": 32, "num_heads": 8, "num_kv_heads": 2, "causal": True},
        "window": {"sentence": SENTENCES[8], "d_model": 16, "num_heads": 2, "causal": True, "window": 2},
        "cross": {**BASE, "context_tokens": ["le", "chat", "assis"]},
        "explicit": {"tokens": ["one", "two", "three"], "d_model": 4, "num_heads": 2, "causal": True,
                     "input": explicit_input(3, 4), "parameters": explicit_parameters()},
    }
    for tag, config in configs.items():
        stages = trace_stages(client, config)
        out += check_bodies(config, stages, tag)
    # Wrong submissions, each made by a known bug: the bug's trace, checked without inject_bug.
    bug_configs = {"base": CAUSAL, "noncausal": {**BASE, "seed": 7},
                   "gqa": configs["gqa"], "rope": configs["rope"]}
    for tag, config in bug_configs.items():
        for bug in bug_names:
            stages = trace_stages(client, {**config, "inject_bug": bug}, missing_ok=True)
            if stages is None:
                continue  # refused for this configuration (that 422 is in the trace corpus)
            values = {sid: st["values"] for sid, st in stages.items()}
            out.append(post("/check", {**config, "submission": values}, label=f"check-bug:{tag}:{bug}:all"))
            out.append(post("/check", {**config, "submission": {"output": values["output"]}},
                            label=f"check-bug:{tag}:{bug}:output"))
            if tag == "base":
                out.append(post("/check", {**config, "metric": "rel_error", "submission": values},
                                label=f"check-bug:{tag}:{bug}:rel_error"))
    # Too many JSON values (counted before parsing: 413).
    out.append(post("/check", b'{"sentence": "a", "submission": {"output": [' + b"0," * 1_000_000 + b"0]}}"))
    return out


def trace_stages(client: Any, config: dict[str, Any], missing_ok: bool = False) -> dict[str, Any] | None:
    resp = client.post("/trace", data=dump(config), headers={"Content-Type": JSON})
    if resp.status_code != 200:
        if missing_ok:
            return None
        raise RuntimeError(f"/trace {config} answered {resp.status_code}: {resp.get_data(as_text=True)[:500]}")
    return json.loads(resp.get_data())["stages"]


def batch_corpus(client: Any) -> list[Req]:
    out: list[Req] = []
    items = [BASE, {**BASE, "d_model": 5}, {**CAUSAL, "positional_encoding": "rope", "stages": ["weights"]},
             {**BASE, "bogus": 1}, {"sentence": SENTENCES[5], "d_model": 16, "num_heads": 2, "inject_bug": "no_scale"},
             {**BASE, "context_sentence": "le chat", "include_parameters": True}]
    out.append(post("/trace/batch", {"items": items}))
    out.append(post("/trace/batch", {"items": items}, headers=[("Accept", NPZ)]))
    out.append(post("/trace/batch", {"items": [BASE]}))
    out.append(post("/trace/batch", {"items": [{**CAUSAL, "decode": True}, {**CAUSAL, "seed": 7, "precision": 2}]}))
    out.append(post("/trace/batch", {"items": [{**BASE, "inject_bug": "average_heads", "num_heads": 1}] * 2}))
    out.append(post("/trace/batch", {"items": [{**CAUSAL, "stages": ["masked_scores"]}]}, headers=[("Accept", NPZ)]))
    w = trace_stages(client, CAUSAL)
    assert w is not None
    weights = w["weights"]["values"]
    check_items = [
        {**CAUSAL, "submission": {"weights": weights}},
        {**CAUSAL, "submission": {"weights": scale_values(weights, 1.01)}},
        {**CAUSAL, "submission": {"weights": weights}, "metric": "rel_error", "threshold": 1e-9},
        {**CAUSAL, "submission": {"weights": weights[:1]}},
        {**CAUSAL, "submission": {}},
        {**CAUSAL},
        {**CAUSAL, "d_model": 25, "submission": {"weights": weights}},
    ]
    out.append(post("/check/batch", {"items": check_items}, label="check-batch:mixed"))
    out.append(post("/check/batch", {"items": check_items[:1]}, label="check-batch:one"))
    out.append(post("/check/batch", {"items": check_items[4:]}, label="check-batch:invalid"))
    return out


def explain_corpus() -> list[Req]:
    out: list[Req] = []
    add = out.append
    for head, query, key in ((0, 0, 0), (0, 1, 2), (3, 2, 0), (1, 2, 2)):
        add(post("/explain", {**BASE, "head": head, "query": query, "key": key}))
        add(post("/explain", {**CAUSAL, "head": head, "query": query, "key": key}))
    for body in (
        {"sentence": SENTENCES[1], "head": 0, "query": 0, "key": 0},
        {"sentence": SENTENCES[5], "d_model": 24, "num_heads": 1, "scale": False, "head": 0, "query": 4, "key": 1},
        {**CAUSAL, "positional_encoding": "rope", "head": 2, "query": 2, "key": 1},
        {**CAUSAL, "positional_encoding": "rope", "rope_pairing": "interleaved", "head": 2, "query": 2, "key": 1},
        {"sentence": SENTENCES[5], "d_model": 32, "num_heads": 8, "num_kv_heads": 2, "head": 5, "query": 3, "key": 1},
        {"sentence": SENTENCES[8], "d_model": 16, "num_heads": 2, "causal": True, "window": 2, "head": 1,
         "query": 6, "key": 3},
        {**BASE, "context_sentence": "le chat", "head": 1, "query": 2, "key": 1},
        {**CAUSAL, "decode": True, "head": 1, "query": 2, "key": 1},
        {**CAUSAL, "decode": True, "head": 1, "query": 0, "key": 2},
        {**CAUSAL, "precision": 3, "head": 0, "query": 2, "key": 1},
        {"tokens": ["one", "two", "three"], "d_model": 4, "num_heads": 2, "input": explicit_input(3, 4),
         "parameters": explicit_parameters(), "head": 1, "query": 1, "key": 2},
        {**BASE, "stages": ["weights"], "head": 0, "query": 0, "key": 0},
        {**BASE, "include_parameters": True, "head": 0, "query": 0, "key": 0},
        # refused
        {**BASE, "head": 4, "query": 0, "key": 0},
        {**BASE, "head": 0, "query": 3, "key": 0},
        {**BASE, "head": 0, "query": 0, "key": -1},
        {**BASE, "context_sentence": "le chat", "head": 0, "query": 0, "key": 2},
        {**CAUSAL, "inject_bug": "no_scale", "head": 0, "query": 0, "key": 0},
        {**BASE, "query": 0, "key": 0},
        {**BASE, "head": "0", "query": 0, "key": 0},
    ):
        add(post("/explain", body))
    add(post("/explain", {**BASE, "d_model": 64, "sentence": SENTENCES[16], "head": 1, "query": 15, "key": 3},
             headers=[("Accept-Encoding", "br")]))
    add(post("/explain", b"{"))
    return out


def export_corpus(formats: tuple[str, ...]) -> list[Req]:
    out: list[Req] = []
    add = out.append
    for fmt in formats:
        for body in (BASE, CAUSAL, {"sentence": SENTENCES[5], "d_model": 16, "num_heads": 2, "seed": 7},
                     {"sentence": SENTENCES[8], "d_model": 32, "num_heads": 8, "num_kv_heads": 2, "causal": True,
                      "window": 3},
                     {**CAUSAL, "positional_encoding": "rope"}, {**CAUSAL, "precision": 3},
                     {**CAUSAL, "inject_bug": "mask_after_softmax"}, {**BASE, "context_sentence": "le chat"},
                     {**BASE, "context_tokens": ["x"], "num_heads": 1},
                     {**BASE, "stages": ["weights"]}, {**BASE, "include_parameters": True},
                     {**BASE, "parameters_layout": "per_head"}, {**CAUSAL, "decode": True},
                     {"sentence": SENTENCES[1], "head": 0}):
            add(post("/export", {**body, "format": fmt}))
        add(post("/export", {"sentence": SENTENCES[16], "d_model": 64, "num_heads": 8, "causal": True,
                             "format": fmt}, headers=[("Accept-Encoding", "br")]))
    for body in ({**BASE, "format": "bertviz "}, {**BASE, "format": "BERTVIZ"}, BASE, {**BASE, "format": None}):
        add(post("/export", body))
    return out


def html_corpus() -> list[Req]:
    # The page has no per-request nonce or time: its CSP names the inline script and style by hash.
    return [post("/trace/html", body) for body in (
        BASE, CAUSAL, {**CAUSAL, "positional_encoding": "rope", "decode": True, "num_kv_heads": 2},
        {**BASE, "context_sentence": "le chat"}, {"tokens": ["<script>", "</script>", "&amp;"], "d_model": 8,
                                                   "num_heads": 2},
        {**BASE, "scale": False, "inject_bug": "average_heads"}, {**BASE, "stages": ["weights"]},
        {**BASE, "d_model": 5})] + [post("/trace/html", CAUSAL, headers=[("Accept-Encoding", "br")])]


def get_corpus() -> list[Req]:
    scripts = [get(f"/static/{name}.js") for name in ("format", "trace", "url-state", "svg", "cell", "api", "render",
                                                       "explain", "block", "heads")]
    return [get("/health"), get("/version"), get("/openapi.yaml"), get("/"), get("/static/app.js"), *scripts,
            get("/static/style.css"), get("/static/favicon.svg"), get("/health", headers=[("Accept", NPZ)]),
            get("/version", headers=[("Origin", "https://example.org")])]


#: stacks of blocks, one per preset and the hand-set choices, as small as the presets allow
STACKS = {
    "gpt2": {"sentence": SENTENCES[5], "d_model": 16, "num_heads": 2, "block": "gpt2", "num_layers": 2},
    "vaswani2017": {"sentence": SENTENCES[5], "d_model": 16, "num_heads": 2, "block": "vaswani2017",
                    "num_layers": 2, "norm_weights": "seeded"},
    "llama": {"sentence": SENTENCES[8], "d_model": 32, "num_heads": 4, "num_kv_heads": 2, "block": "llama",
              "num_layers": 3, "d_ff": 48, "norm_weights": "seeded"},
    "custom": {"sentence": SENTENCES[3], "d_model": 8, "num_heads": 2, "num_layers": 3, "norm": "rms_norm",
               "norm_position": "post", "ffn": "gelu", "norm_eps": 0.1, "causal": True, "seed": 7},
    "one": {"sentence": SENTENCES[2], "d_model": 8, "num_heads": 1, "ffn": "relu"},
}

#: constructed heads: each kind alone, mixed with seeded heads, under RoPE, and induction in a stack
CONSTRUCTED = {
    "previous": {"sentence": "the cat sat on the mat", "d_model": 32, "num_heads": 1, "causal": True,
                 "head_weights": ["previous_token"]},
    "mixed": {"sentence": "the cat sat on the mat the cat", "d_model": 96, "num_heads": 3, "causal": True,
              "head_weights": ["previous_token", "same_token", "first_token"], "sharpness": 4},
    "seeded-beside": {"sentence": "a b c a b", "d_model": 64, "num_heads": 2, "causal": True,
                      "head_weights": ["first_token", "seeded"]},
    "rope": {"sentence": "one two three four", "d_model": 32, "num_heads": 1, "causal": True,
             "positional_encoding": "rope", "head_weights": ["previous_token"]},
    "induction": {"sentence": "red blue green red", "d_model": 64, "num_heads": 1, "causal": True,
                  "head_weights": ["induction"], "num_layers": 2, "block": "vaswani2017"},
}


def stack_corpus(client: Any) -> list[Req]:
    """Stacks of blocks and constructed heads on every endpoint that takes a trace's request."""
    out: list[Req] = []
    add = out.append
    for body in (*STACKS.values(), *CONSTRUCTED.values()):
        add(post("/trace", body))
        add(post("/trace", {**body, "include_parameters": True, "precision": 6}))
        add(post("/trace", body, headers=[("Accept", NPZ)]))
    gpt2, llama, custom = STACKS["gpt2"], STACKS["llama"], STACKS["custom"]
    add(post("/trace", {**gpt2, "stages": ["norm1_mean", "ffn_activation", "residual_stream", "final_norm"]}))
    add(post("/trace", {**gpt2, "num_layers": 1}))
    add(post("/trace", {"sentence": SENTENCES[5], "d_model": 16, "num_heads": 2, "num_layers": 1}))
    add(post("/trace/batch", {"items": [BASE, gpt2, CONSTRUCTED["previous"]]}))
    add(post("/trace/html", gpt2))
    add(post("/trace/html", CONSTRUCTED["mixed"]))
    for fmt in ("bertviz", "transformer-explainer"):
        add(post("/export", {**gpt2, "format": fmt}))
        add(post("/export", {**CONSTRUCTED["induction"], "format": fmt}))
    for cell in ({"cell": "norm1", "layer": 1, "token": 2, "feature": 5},
                 {"cell": "norm2", "layer": 0, "token": 0, "feature": 0},
                 {"cell": "final_norm", "token": 1, "feature": 3},
                 {"cell": "ffn", "layer": 1, "token": 2, "unit": 7},
                 {"head": 1, "query": 3, "key": 0, "layer": 1}):
        add(post("/explain", {**gpt2, **cell}))
    add(post("/explain", {**llama, "cell": "ffn", "layer": 2, "token": 1, "unit": 40}))
    add(post("/explain", {**llama, "cell": "norm1", "layer": 0, "token": 0, "feature": 31}))
    add(post("/explain", {**CONSTRUCTED["previous"], "head": 0, "query": 2, "key": 1}))
    for tag, config in (("gpt2", gpt2), ("custom", custom), ("previous", CONSTRUCTED["previous"]),
                        ("induction", CONSTRUCTED["induction"])):
        stages = trace_stages(client, config)
        values = {sid: st["values"] for sid, st in stages.items()}
        add(post("/check", {**config, "submission": values}, label=f"check-stack:{tag}:all"))
        add(post("/check", {**config, "submission": {"weights": scale_values(values["weights"], 1.001),
                                                    "output": values["output"]}},
                 label=f"check-stack:{tag}:perturbed"))
    # refused: each with its field named
    for body in ({**gpt2, "num_layers": 0}, {**gpt2, "block": "bert"}, {**gpt2, "d_ff": 0},
                 {**gpt2, "norm_position": "middle"}, {**BASE, "num_layers": 2},
                 {**gpt2, "cell": "norm1", "layer": 2, "token": 0, "feature": 0},
                 {**CONSTRUCTED["previous"], "d_model": 8, "num_heads": 1},
                 {**CONSTRUCTED["induction"], "num_layers": 1}, {**CONSTRUCTED["previous"], "head_weights": ["x"]},
                 {**CONSTRUCTED["previous"], "head_weights": ["previous_token", "seeded"]},
                 {**CONSTRUCTED["previous"], "sharpness": 0}):
        add(post("/explain" if "cell" in body else "/trace", body))
    return out


def build_corpus(client: Any) -> list[Req]:
    """Every request, in order, without duplicates (``client`` answers the /trace calls that /check needs)."""
    import engine
    from engine.export import EXPORT_FORMATS
    from engine.layer import ALL_STAGE_IDS, POSITIONAL_ENCODING_CHOICES, ROPE_PAIRINGS

    bugs = tuple(engine.BUG_NAMES)
    stage_ids = tuple(ALL_STAGE_IDS)
    corpus = (trace_corpus(bugs, tuple(POSITIONAL_ENCODING_CHOICES), tuple(ROPE_PAIRINGS), stage_ids)
              + invalid_corpus(stage_ids) + check_corpus(client, bugs) + batch_corpus(client) + explain_corpus()
              + export_corpus(tuple(EXPORT_FORMATS)) + html_corpus() + get_corpus() + stack_corpus(client))
    # Some variety no list above was written for: a fixed seed, so the corpus is the same every run.
    rng = random.Random(20261201)
    words = ["the", "cat", "sat", "on", "mat", "naïve", "café", ",", ".", "!", "über", "x", "—", "?"]
    for _ in range(60):
        d_model, heads = rng.choice(SIZES)
        body: dict[str, Any] = {"sentence": " ".join(rng.choice(words) for _ in range(rng.randint(1, 12))),
                                "d_model": d_model, "num_heads": heads, "seed": rng.randint(0, 1000),
                                "scale": rng.random() < 0.7, "causal": rng.random() < 0.5,
                                "positional_encoding": rng.choice(POSITIONAL_ENCODING_CHOICES)}
        if rng.random() < 0.3:
            body["precision"] = rng.randint(0, 8)
        if rng.random() < 0.2 and body["causal"]:
            body["decode"] = True
        if rng.random() < 0.2:
            body["inject_bug"] = rng.choice(bugs)
        corpus.append(post("/trace", body))
    seen: dict[str, Req] = {}
    for req in corpus:
        seen.setdefault(req.id, req)
    return list(seen.values())


# ----------------------------------------------------------------- answers


def answer_body(resp: Any) -> tuple[bytes, str]:
    """The answer's body as the golden files see it, and what that is.

    Compressed answers are read decompressed (the encoding is kept in the
    record): compressed bytes may change with the compression library's version
    while the answer does not. GET /version is read without its ``libraries``
    (the interpreter's and packages' versions: a fact about the machine, not an
    answer the code computes)."""
    body = resp.get_data()
    encoding = resp.headers.get("Content-Encoding")
    digest_of = "body"
    if encoding == "br":
        import brotli

        body, digest_of = brotli.decompress(body), "decompressed body"
    elif encoding == "gzip":
        body, digest_of = gzip.decompress(body), "decompressed body"
    elif encoding is not None:
        raise RuntimeError(f"unexpected Content-Encoding {encoding!r}")
    if resp.status_code == 200 and resp.mimetype == JSON and resp.request.path == "/version":
        doc = json.loads(body)
        doc.pop("libraries", None)
        body, digest_of = json.dumps(doc, sort_keys=True).encode(), "body without libraries"
    return body, digest_of


def npz_members_digest(body: bytes) -> str:
    """The members' names and contents, in order: the archive without its timestamps."""
    h = hashlib.sha256()
    with zipfile.ZipFile(io.BytesIO(body)) as zf:
        for info in zf.infolist():
            data = zf.read(info)
            for part in (info.filename.encode("utf-8"), data):
                h.update(len(part).to_bytes(8, "big") + part)
    return h.hexdigest()


def byte_digest(resp: Any) -> dict[str, Any]:
    """The answer's exact bytes (after ``answer_body``): what the baseline check compares on one machine."""
    body, digest_of = answer_body(resp)
    if resp.mimetype == NPZ and resp.status_code == 200:
        sha, digest_of = npz_members_digest(body), f"npz members of the {digest_of}"
    else:
        sha = hashlib.sha256(body).hexdigest()
    return {"status": resp.status_code, "content_type": resp.headers.get("Content-Type"),
            "content_encoding": resp.headers.get("Content-Encoding"), "body_sha256": sha, "digest_of": digest_of}


@dataclass
class Answer:
    """One request's answer, portable (skeleton and number groups) and exact (bytes)."""
    record: dict[str, Any]  # what answers.json keeps
    groups: dict[str, list[float]]  # the answer's numbers, by group
    request_groups: dict[str, list[float]]  # a derived request's numbers (its body came from another answer)
    bytes: dict[str, Any]  # byte_digest


def answer_of(req: Req, resp: Any) -> Answer:
    body, _ = answer_body(resp)
    head = f"{resp.status_code} {resp.headers.get('Content-Type')} {resp.headers.get('Content-Encoding')}"
    canon = av.canon(resp.mimetype, body, head.encode())
    # A derived request's body holds another answer's numbers, so it is compared as an answer is;
    # every other request is pinned by its id (the SHA-256 of its bytes).
    request = av.canon(JSON if req.label is not None else "", req.body,
                       f"{req.method} {req.path} {sorted(req.headers)}".encode())
    record = {"request": req.summary, "status": resp.status_code, "request_skeleton_sha256": request.skeleton_sha256,
              "skeleton_sha256": canon.skeleton_sha256}
    return Answer(record, canon.groups, request.groups, byte_digest(resp))


def make_client() -> Any:
    from service import create_app
    from service.settings import Settings

    return create_app(Settings(response_cache_bytes=0)).test_client()


def answers(client: Any, corpus: list[Req]) -> dict[str, Answer]:
    out: dict[str, Answer] = {}
    for req in corpus:
        resp = client.open(req.path, method=req.method, headers=list(req.headers), data=req.body)
        try:
            out[req.id] = answer_of(req, resp)
        finally:
            resp.close()
    return out


def compute() -> dict[str, Answer]:
    """This tree's answers to the whole corpus (the service must be importable)."""
    client = make_client()
    return answers(client, build_corpus(client))


# ----------------------------------------------------------------- the golden files
#
# answers.json: one line per request (its summary, status and skeleton digests, and the names of its number
# groups with a reference into numbers.json); numbers.json: one line per distinct group summary. Answers that
# carry the same trace (JSON, npz, the offline page, a batch) share their entries there.


def _ref(summary: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest()[:16]


def golden_of(current: dict[str, Answer]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    records: dict[str, dict[str, Any]] = {}
    table: dict[str, dict[str, Any]] = {}
    for key, ans in current.items():
        rec = dict(ans.record)
        for field_name, groups in (("numbers", ans.groups), ("request_numbers", ans.request_groups)):
            refs = {}
            for name, summary in av.summarize(groups).items():
                ref = _ref(summary)
                table[ref] = summary
                refs[name] = ref
            if refs:
                rec[field_name] = refs
        records[key] = rec
    return records, table


def _lines(entries: dict[str, Any]) -> str:
    return ",\n".join(f"    {json.dumps(k)}: {json.dumps(entries[k], ensure_ascii=False, sort_keys=True)}"
                      for k in sorted(entries))


def render(records: dict[str, dict[str, Any]]) -> str:
    """answers.json: sorted by id, one request a line (a diff names the requests whose answer changed)."""
    return ("{\n"
            '  "comment": "The corpus of tests/answer_corpus.py: each answer\'s structure and number groups '
            '(rewrite with scripts/answer-digests --write).",\n'
            f'  "count": {len(records)},\n'
            '  "answers": {\n' + _lines(records) + "\n  }\n}\n")


def render_numbers(table: dict[str, dict[str, Any]]) -> str:
    return ("{\n"
            '  "comment": "Number groups that answers.json refers to: small ones whole, large ones as sketches '
            '(tests/answer_values.py).",\n'
            '  "groups": {\n' + _lines(table) + "\n  }\n}\n")


def load(path: Path = GOLDEN) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    records = json.loads(path.read_text(encoding="utf-8"))["answers"]
    table = json.loads((path.parent / NUMBERS_FILE).read_text(encoding="utf-8"))["groups"]
    return records, table


def mismatches(golden: tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]],
               current: dict[str, Answer]) -> list[str]:
    """One entry per differing, missing or extra id (empty: every answer agrees)."""
    records, table = golden
    out = []
    for key in sorted(records.keys() | current.keys()):
        old, new = records.get(key), current.get(key)
        if new is None:
            out.append(f"{key} missing (in the golden file, not in the corpus): {old['request']}")  # type: ignore
            continue
        if old is None:
            out.append(f"{key} extra (in the corpus, not in the golden file): {new.record['request']}")
            continue
        problems = [f"{f}: {old.get(f)} -> {new.record.get(f)}" for f in RECORD_FIELDS
                    if old.get(f) != new.record.get(f)]
        for field_name, groups in (("numbers", new.groups), ("request_numbers", new.request_groups)):
            want = {name: table[ref] for name, ref in old.get(field_name, {}).items()}
            problems += [f"{field_name}: {p}" for p in av.compare(want, groups)]
        if problems:
            out.append(f"{key} {new.record['request']}\n    " + "\n    ".join(problems))
    return out


RECORD_FIELDS = ("status", "request_skeleton_sha256", "skeleton_sha256")


# ----------------------------------------------------------------- bytes against a baseline commit
#
# On one machine the same code gives the same bytes, so the exact bytes are compared where that holds: the
# baseline commit's tree (tests/golden/answers/baseline.json) answers the corpus on this machine, and so does
# this tree; the ids whose bytes differ must be the ones the baseline file lists as changed on purpose.


def git(*args: str, cwd: Path = SCRIPT_ROOT) -> str:
    import subprocess

    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def tree_bytes(rev: str, workdir: Path) -> dict[str, dict[str, Any]]:
    """Byte digests of the corpus answered by commit ``rev``'s tree, extracted into ``workdir``, on this machine."""
    import subprocess
    import tarfile

    archive = workdir / "tree.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "archive", "--format=tar", rev], cwd=SCRIPT_ROOT, check=True, stdout=f)
    root = workdir / "tree"
    root.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    out = workdir / "bytes.json"
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--root", str(root), "--bytes-out", str(out)],
                   check=True, capture_output=True, text=True)
    return json.loads(out.read_text(encoding="utf-8"))


def byte_changes(base: dict[str, dict[str, Any]], current: dict[str, dict[str, Any]]) -> list[str]:
    """Ids whose exact answer differs (or that only one side answers)."""
    return sorted(k for k in base.keys() | current.keys() if base.get(k) != current.get(k))


def use_root(root: Path) -> None:
    """Import the service and engine from ``root`` (first on sys.path)."""
    root = root.resolve()
    sys.path.insert(0, str(root))
    import engine
    import service

    for mod in (service, engine):
        if not Path(mod.__file__).resolve().is_relative_to(root):  # type: ignore[arg-type]
            raise SystemExit(f"answer-digests: {mod.__name__} was imported from {mod.__file__}, not from {root}")


def default_root() -> Path:
    cwd = Path.cwd()
    if (cwd / "service" / "__init__.py").is_file() and (cwd / "engine" / "__init__.py").is_file():
        return cwd
    return SCRIPT_ROOT


def write_golden(current: dict[str, Answer], golden: Path = GOLDEN) -> None:
    records, table = golden_of(current)
    golden.parent.mkdir(parents=True, exist_ok=True)
    golden.write_text(render(records), encoding="utf-8")
    (golden.parent / NUMBERS_FILE).write_text(render_numbers(table), encoding="utf-8")


def write_baseline(current: dict[str, Answer]) -> dict[str, Any]:
    """Name HEAD as the baseline, and list the ids whose bytes this working tree changes against it."""
    import tempfile

    head = git("rev-parse", "HEAD")
    with tempfile.TemporaryDirectory() as tmp:
        base = tree_bytes(head, Path(tmp))
    changed = byte_changes(base, {k: a.bytes for k, a in current.items()})
    doc = {"comment": "The commit whose answers, computed on the machine at hand, the corpus is compared with byte "
                      "for byte; 'changed' lists the requests whose bytes changed on purpose since "
                      "(scripts/answer-digests --write rewrites it).",
           "commit": head, "changed": {k: current[k].record["request"] if k in current else "(no longer asked)"
                                       for k in changed}}
    BASELINE.write_text(json.dumps(doc, ensure_ascii=False, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", action="store_true",
                   help=f"rewrite the golden files ({GOLDEN.parent}) and name HEAD as the byte baseline")
    p.add_argument("--golden", type=Path, default=GOLDEN, help="the golden file (default: %(default)s)")
    p.add_argument("--bytes-out", type=Path, help="write this tree's exact byte digests to FILE and stop")
    p.add_argument("--against", metavar="REV",
                   help="compare this tree's exact bytes with commit REV's, both answered on this machine")
    p.add_argument("--root", type=Path, default=None,
                   help="the repository whose service answers (default: the working directory if it holds the "
                        "service and engine packages, else this script's repository)")
    args = p.parse_args(argv)
    root = args.root or default_root()
    use_root(root)
    start = time.perf_counter()
    current = compute()
    elapsed = time.perf_counter() - start
    print(f"answer-digests: {len(current)} requests answered by {root.resolve()} in {elapsed:.1f} s",
          file=sys.stderr)
    if args.bytes_out:
        args.bytes_out.write_text(json.dumps({k: a.bytes for k, a in current.items()}, sort_keys=True),
                                  encoding="utf-8")
        return 0
    if args.against:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            base = tree_bytes(args.against, Path(tmp))
        changed = byte_changes(base, {k: a.bytes for k, a in current.items()})
        for key in changed:
            print(f"{key} {current[key].record['request'] if key in current else '(only in ' + args.against + ')'}")
        print(f"answer-digests: {len(changed)} of {len(current)} answers differ in their bytes from {args.against}'s",
              file=sys.stderr)
        return 1 if changed else 0
    if args.write:
        write_golden(current, args.golden)
        doc = write_baseline(current)
        print(f"answer-digests: wrote {args.golden.parent}; baseline {doc['commit'][:12]}, "
              f"{len(doc['changed'])} answers changed since", file=sys.stderr)
        if doc["changed"]:
            print("answer-digests: which answers a change touches can depend on the CPU: after committing it, "
                  "run --write again so that the baseline moves past it", file=sys.stderr)
        return 0
    if not args.golden.is_file():
        print(f"answer-digests: {args.golden} does not exist; create it with --write", file=sys.stderr)
        return 1
    problems = mismatches(load(args.golden), current)
    for line in problems:
        print(line)
    if problems:
        print(f"answer-digests: {len(problems)} of {len(current)} answers differ from {args.golden}",
              file=sys.stderr)
        return 1
    print(f"answer-digests: all {len(current)} answers agree with {args.golden}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
