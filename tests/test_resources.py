"""Resource bounds: the largest request the default limits allow completes in a
documented time and memory; a request beyond the limits is rejected before any
large array exists; responses, including problem documents, have a bounded,
documented size. docs/reliability.md has the measured figures
(scripts/measure-limits) and these bounds."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tracemalloc

import orjson
import pytest

from conftest import ROOT
from service.settings import Settings
from tools import measure_limits

DEFAULTS = Settings()
#: documented bounds for the largest allowed /trace (measured: ~0.2 s and ~135 MiB
#: worker peak RSS; in-process ~0.3 s, ~180 MiB). The margins absorb a slow CI machine.
LARGEST_WALL_S = 10.0
LARGEST_PEAK_RSS_MIB = 512
#: a number is at most 25 JSON bytes ("-1.2345678901234567e-300,"); token texts are
#: echoed twice (tokens and the tokens stage), at most 2 × 256 × 1024 × 4 bytes
RESPONSE_BOUND = 25 * DEFAULTS.max_trace_values + 4 * 1024 * 1024
#: a problem document (400/404/405/413/415/422) is small, whatever the body
PROBLEM_BOUND = 64 * 1024
#: rejecting a request beyond the limits: wall time and Python-heap peak (plus
#: 10 bytes per body byte for the parsed JSON itself)
REJECT_WALL_S = 1.0  # measured: ~1 ms for the trace-size rejections; the margin is for a loaded CI machine
REJECT_PEAK_BYTES = 2 * 1024 * 1024


# The peak is VmHWM, not getrusage's ru_maxrss: on Linux ru_maxrss survives
# execve, so a child forked from a large pytest process (after the memory-heavy
# tests) would start at pytest's size, and this test would fail or pass by test
# order. VmHWM belongs to the new address space.
_CHILD = r"""
import json, os, sys, time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
def hwm_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
from service import create_app
body = sys.stdin.buffer.read()
client = create_app().test_client()
client.get("/health")
idle = hwm_kib()
start = time.perf_counter()
resp = client.post("/trace", data=body, content_type="application/json")
data = resp.get_data()
wall = time.perf_counter() - start
print(json.dumps({"status": resp.status_code, "wall_s": wall, "bytes": len(data),
                  "idle_kib": idle, "peak_kib": hwm_kib()}))
"""


@pytest.mark.integration  # starts another process
@pytest.mark.parametrize("which", ["most-numbers", "d512-with-parameters"])
def test_largest_allowed_request_completes_within_documented_time_and_memory(which):
    if which == "most-numbers":
        req = measure_limits.largest_trace()
    else:
        req = {"tokens": [f"t{i}" for i in range(256)], "d_model": 512, "num_heads": 1, "causal": True,
               "include_parameters": True}
    # A fresh process, so that ru_maxrss is this request's peak.
    out = subprocess.run([sys.executable, "-c", _CHILD], input=orjson.dumps(req), capture_output=True, cwd=ROOT,
                         timeout=120, check=True)
    m = json.loads(out.stdout)
    assert m["status"] == 200
    assert m["wall_s"] < LARGEST_WALL_S, m
    assert m["peak_kib"] / 1024 < LARGEST_PEAK_RSS_MIB, m
    assert m["bytes"] <= RESPONSE_BOUND, m
    assert m["bytes"] > 10 * 2**20  # it really is a large one


def _rejected_cheaply(client, body: dict | bytes, path: str = "/trace", max_wall: float | None = None) -> dict:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    tracemalloc.start()
    try:
        # CPU time of this thread (the test client runs the app in it): the work itself, not the machine's load
        start = time.thread_time()
        resp = client.post(path, data=raw, content_type="application/json")
        wall = time.thread_time() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert resp.status_code == 422, resp.get_data()[:300]
    # numpy reports its buffers to tracemalloc: a large array would show here.
    assert peak < REJECT_PEAK_BYTES + 10 * len(raw), f"peak {peak} bytes while rejecting"
    if max_wall is None:
        max_wall = REJECT_WALL_S + len(raw) / 1e6  # + parsing, ~1 s per MB at worst
    assert wall < max_wall, f"{wall:.3f}s to reject"
    return resp.get_json()


def test_trace_far_beyond_the_limits_is_rejected_in_milliseconds_without_allocating(app_factory):
    # Lift the per-field limits, so only the trace-size bound stands between this
    # request and a [256, 10^8] float64 array (200 GB) per stage.
    client = app_factory(max_d_model=10**9, max_heads=10**6).test_client()
    doc = _rejected_cheaply(client, {"tokens": [f"t{i}" for i in range(256)], "d_model": 10**8, "num_heads": 1})
    assert any(e["type"] == "trace_too_large" for e in doc["errors"])
    doc = _rejected_cheaply(client, {"tokens": [f"t{i}" for i in range(256)], "d_model": 4096, "num_heads": 4096,
                                     "causal": True})
    assert any(e["type"] == "trace_too_large" for e in doc["errors"])


def test_beyond_default_limits_is_rejected_cheaply(client):
    toks = [f"t{i}" for i in range(256)]
    for body, err in [
        ({"tokens": toks, "d_model": 512, "num_heads": 64}, "trace_too_large"),
        ({"tokens": toks, "d_model": 10**12}, "d_model_too_large"),
        ({"tokens": [f"t{i}" for i in range(100_000)]}, "too_many_tokens"),
        ({"sentence": "a " * 32_000}, "too_many_tokens"),  # the tokenizer stops at limit + 1
        ({"sentence": "a" * 999_999}, "sentence_too_long"),  # checked before tokenising
    ]:
        doc = _rejected_cheaply(client, body)
        assert any(e["type"] == err for e in doc["errors"]), (err, doc["errors"])


def test_batch_beyond_the_limits_is_rejected_cheaply(client):
    item = {"tokens": [f"t{i}" for i in range(256)], "d_model": 512, "num_heads": 2}  # under the limit alone
    raw = orjson.dumps({"items": [item] * DEFAULTS.max_batch_items})
    _rejected_cheaply(client, raw, path="/trace/batch", max_wall=2.0)


@pytest.mark.parametrize(("name", "body"), [
    ("5k-unknown-fields", b"{" + b",".join(b'"k%d":0' % i for i in range(5_000)) + b"}"),
    ("5k-invalid-stage-ids", b'{"sentence":"a","stages":[' + b",".join([b"1"] * 5_000) + b"]}"),
    ("5k-empty-tokens", b'{"tokens":[' + b",".join([b'""'] * 5_000) + b"]}"),
    ("5k-non-string-tokens", b'{"tokens":[' + b",".join([b"1"] * 5_000) + b"]}"),
    ("huge-unknown-field-name", b'{"sentence":"a","' + b"k" * 1_000_000 + b'":1}'),
])
def test_problem_documents_have_a_bounded_size(client, name, body):
    """One error entry per offending item makes a 4 MB body answer hundreds of
    MB (measured: 1.5 M invalid stage ids, 3 MB, answer 348 MiB after 17 s at
    3.3 GiB RSS). The errors list must be capped and echoed names truncated."""
    resp = client.post("/trace", data=body, content_type="application/json")
    assert resp.status_code == 422
    size = len(resp.get_data())
    assert size <= PROBLEM_BOUND, f"{name}: a {len(body)}-byte body got a {size}-byte problem document"


def test_documented_bounds_hold_for_small_and_odd_responses(client):
    for path in ("/health", "/version", "/nope"):
        assert len(client.get(path).get_data()) < PROBLEM_BOUND
    assert len(client.get("/openapi.yaml").get_data()) < 1024 * 1024
    resp = client.post("/trace", data=b"x" * 100_000, content_type="application/json")
    assert resp.status_code == 400 and len(resp.get_data()) < PROBLEM_BOUND
