"""/check's own body limits: a whole submission at the largest configuration
graders use is accepted (in-process and over real gunicorn), while every
/check request's cost stays bounded before the work is done: the body is
bounded in bytes (max_check_body_bytes) and in JSON values
(max_check_json_values, counted before parsing), so the worst body the limits
allow parses within a documented memory. docs/checking.md has the figures
(scripts/measure-check); /trace keeps its own, smaller limit."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tracemalloc

import orjson
import pytest
import requests

from attention_trace.client import LocalClient, encode_json, encode_npz_check
from conftest import ROOT
from service.settings import Settings

DEFAULTS = Settings()
LARGEST = {"tokens": [f"w{i}" for i in range(64)], "d_model": 512, "num_heads": 8, "causal": True, "seed": 1}
#: the largest trace the default limits allow with every stage (2 492 160 numbers): 47 MiB of JSON, ~19 MiB of npz
LARGEST_TRACE = {"tokens": [f"w{i}" for i in range(240)], "d_model": 512, "num_heads": 8, "seed": 1}
#: documented bounds (docs/checking.md; measured: the largest submission ~0.2 s and +38 MiB over an idle
#: process, the worst hostile body the limits allow ~0.5 s and +133 MiB). Margins absorb a loaded CI machine.
LARGEST_WALL_S = 10.0
PEAK_OVER_IDLE_MIB = 256


def largest_body() -> bytes:
    t = LocalClient().trace(LARGEST)
    return encode_json({**LARGEST, "submission": {sid: st.values for sid, st in t.stages.items()}})


def largest_npz_body(wrong: str | None = None) -> bytes:
    """Every stage of LARGEST_TRACE as an npz /check body (what Client.check sends for it); ``wrong``: that
    stage 1 % off, so that the diagnosis tries every known bug."""
    t = LocalClient().trace(LARGEST_TRACE, arrays=True)
    sub = {sid: st.values * 1.01 if sid == wrong else st.values for sid, st in t.stages.items()}
    return encode_npz_check({**LARGEST_TRACE, "submission": sub})


def test_limits_are_settings_reported_by_version(app_factory, monkeypatch):
    doc = app_factory(max_check_body_bytes=12345, max_check_json_values=678).test_client().get("/version").get_json()
    assert doc["limits"]["max_check_body_bytes"] == 12345 and doc["limits"]["max_check_json_values"] == 678
    assert doc["limits"]["max_body_bytes"] == DEFAULTS.max_body_bytes
    s = Settings.from_env({"ATTENTION_TRACE_MAX_CHECK_BODY_BYTES": "9999",
                           "ATTENTION_TRACE_MAX_CHECK_JSON_VALUES": "4242"})
    assert (s.max_check_body_bytes, s.max_check_json_values) == (9999, 4242)
    with pytest.raises(ValueError, match="MAX_CHECK_BODY_BYTES"):
        Settings.from_env({"ATTENTION_TRACE_MAX_CHECK_BODY_BYTES": "lots"})
    assert DEFAULTS.max_check_body_bytes == 24 * 2**20 and DEFAULTS.max_check_json_values == 1_000_000


def test_check_has_its_own_body_limit_and_trace_keeps_its_own(app_factory):
    client = app_factory(max_body_bytes=1000, max_check_body_bytes=5000).test_client()
    pad = {"tokens": ["a"], "d_model": 4}
    check = orjson.dumps(pad | {"submission": {"weights": [[[1.0]]]}, "tokens": ["abcdefgh"] * 150})
    assert 1000 < len(check) < 5000
    assert client.post("/check", data=check, content_type="application/json").status_code == 200
    batch = orjson.dumps({"items": [json.loads(check)]})
    assert client.post("/check/batch", data=batch, content_type="application/json").status_code == 200
    trace = orjson.dumps(pad | {"tokens": ["abcdefgh"] * 150})
    resp = client.post("/trace", data=trace, content_type="application/json")
    assert resp.status_code == 413 and resp.get_json()["detail"] == \
        "The request body is larger than the limit of 1000 bytes."
    for path in ("/check", "/check/batch"):
        resp = client.post(path, data=b'{"x":"' + b"a" * 5000 + b'"}', content_type="application/json")
        assert resp.status_code == 413, path
        doc = resp.get_json()
        assert doc["type"].endswith("payload-too-large")
        assert doc["detail"] == f"The request body is larger than the limit of 5000 bytes for {path}."


def _rejected_before_parsing(client, raw: bytes) -> dict:
    tracemalloc.start()
    try:
        # CPU time of this thread (the test client runs the app in it): the work itself, not the machine's load
        start = time.thread_time()
        resp = client.post("/check", data=raw, content_type="application/json")
        wall = time.thread_time() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert resp.status_code == 413, resp.get_data()[:300]
    # The body itself is held (and copied by the test client); nothing is parsed.
    assert peak < 4 * len(raw) + 2 * 2**20, f"peak {peak} bytes while rejecting a {len(raw)}-byte body"
    assert wall < 1.0, f"{wall:.3f}s to reject"
    return resp.get_json()


@pytest.mark.parametrize("unit", [b"0", b"[]", b"{}", b"[[0]]"])
def test_more_json_values_than_the_limit_are_413_before_parsing(app_factory, unit):
    limit = 50_000
    client = app_factory(max_check_json_values=limit).test_client()
    head, tail = b'{"sentence":"a","submission":{"weights":[', b"]}}"
    per_unit = unit.count(b"[") + unit.count(b"{") + 1
    over = head + b",".join([unit] * (limit // per_unit + 1)) + tail
    doc = _rejected_before_parsing(client, over)
    assert doc["detail"].startswith(f"The request body holds more than {limit} JSON values")
    under = head + b",".join([unit] * (limit // per_unit - 10)) + tail
    assert client.post("/check", data=under, content_type="application/json").status_code in (200, 422)


def test_the_largest_submission_is_far_inside_the_value_limit():
    raw = largest_body()
    values = raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1
    assert DEFAULTS.max_body_bytes < len(raw) < DEFAULTS.max_check_body_bytes / 2
    assert values < DEFAULTS.max_check_json_values / 2


_CHILD = r"""
import json, os, sys, time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
from service import create_app

def vm(key):  # this process's own (ru_maxrss would count the parent's before exec)
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])

body = sys.stdin.buffer.read()
client = create_app().test_client()
client.get("/health")
idle = vm("VmRSS")
start = time.perf_counter()
resp = client.post("/check", data=body, content_type=sys.argv[1])
data = resp.get_data()
wall = time.perf_counter() - start
doc = json.loads(data)
print(json.dumps({"status": resp.status_code, "wall_s": wall, "over_idle_mib": (vm("VmHWM") - idle) / 1024,
                  "passed": doc.get("passed")}))
"""


def _measure(body: bytes, content_type: str = "application/json") -> dict:
    """A fresh process, so that its peak is this request's."""
    out = subprocess.run([sys.executable, "-c", _CHILD, content_type], input=body, capture_output=True, cwd=ROOT,
                         timeout=120, check=True)
    return json.loads(out.stdout)


def _hostile(unit: bytes) -> bytes:
    """As many units in one submitted stage as max_check_json_values allows (scripts/measure-check)."""
    head, tail = b'{"sentence":"a","submission":{"weights":[', b"]}}"
    per_unit = unit.count(b"[") + unit.count(b"{") + 1
    return head + b",".join([unit] * ((DEFAULTS.max_check_json_values - 10) // per_unit)) + tail


@pytest.mark.integration  # starts another process
@pytest.mark.parametrize("which", ["largest-submission", "hostile-nested-rows", "hostile-strings",
                                   "largest-trace-npz", "largest-trace-npz-wrong-weights"])
def test_every_check_within_the_limits_has_a_bounded_cost(which):
    """The largest legitimate submissions (JSON, and every stage of the largest trace as npz), and the
    bodies that cost the most memory per byte of all those the limits let through (measured by
    scripts/measure-check), stay within the documented bound."""
    body = {"largest-submission": largest_body, "hostile-nested-rows": lambda: _hostile(b"[[0]]"),
            "hostile-strings": lambda: _hostile(b'"-Infinity"'), "largest-trace-npz": largest_npz_body,
            "largest-trace-npz-wrong-weights": lambda: largest_npz_body(wrong="weights")}[which]()
    assert len(body) <= DEFAULTS.max_check_body_bytes
    m = _measure(body, "application/x-npz" if "npz" in which else "application/json")
    assert m["status"] == 200, m
    assert m["wall_s"] < LARGEST_WALL_S, m
    assert m["over_idle_mib"] < PEAK_OVER_IDLE_MIB, m
    if which in ("largest-submission", "largest-trace-npz"):
        assert m["passed"] is True


@pytest.mark.integration  # starts another process
def test_largest_submission_over_real_gunicorn(gunicorn_server):
    raw = largest_body()
    resp = requests.post(gunicorn_server.url + "/check", data=raw, headers={"Content-Type": "application/json"},
                         timeout=60)
    assert resp.status_code == 200, resp.text[:300]
    assert resp.json()["passed"] is True
    over = requests.post(gunicorn_server.url + "/check", data=b" " * (DEFAULTS.max_check_body_bytes + 1),
                         headers={"Content-Type": "application/json"}, timeout=60)
    assert over.status_code == 413
    trace = requests.post(gunicorn_server.url + "/trace", data=raw, headers={"Content-Type": "application/json"},
                          timeout=60)
    assert trace.status_code == 413  # /trace's limit stays 4 MiB


@pytest.mark.integration  # starts another process
def test_the_largest_trace_is_checkable_over_real_gunicorn(gunicorn_server):
    """Every stage at d_model 512, 240 tokens, 8 heads: a 413 as JSON (47 MiB), checked as npz (19 MiB),
    which the client chooses by itself."""
    from attention_trace.client import Client

    body = largest_npz_body()
    assert len(body) < DEFAULTS.max_check_body_bytes < 47 * 2**20
    resp = requests.post(gunicorn_server.url + "/check", data=body, headers={"Content-Type": "application/x-npz"},
                         timeout=60)
    assert resp.status_code == 200, resp.text[:300]
    assert resp.json()["passed"] is True and len(resp.content) < 64 * 1024
    t = LocalClient().trace(LARGEST_TRACE, arrays=True)
    with Client(gunicorn_server.url, timeout=(3.05, 60)) as client:
        r = client.check(LARGEST_TRACE, submission={sid: st.values for sid, st in t.stages.items()})
    assert r.passed and len(r.stages) == 13
