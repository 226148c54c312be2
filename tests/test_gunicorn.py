"""Integration: real gunicorn (2 workers, committed config) on a free loopback port."""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

import pytest
import requests

from conftest import Gunicorn

pytestmark = pytest.mark.integration

CAT = {"sentence": "the cat sat", "d_model": 24, "num_heads": 4}


def test_health_and_trace_over_http(gunicorn_server, spec_checker):
    r = requests.get(gunicorn_server.url + "/health", timeout=5)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = requests.post(gunicorn_server.url + "/trace", json=CAT, timeout=10)
    assert r.status_code == 200
    spec_checker.check("/trace", "post", r.status_code, r.headers["Content-Type"], r.content)
    assert r.json()["config"]["d_k"] == 6


def test_same_request_byte_identical_across_calls_and_workers(gunicorn_server):
    # Concurrent clients keep both workers busy, so both answer the same
    # request; the access log names the worker (pid) behind each request id.
    def call(i: int) -> bytes:
        r = requests.post(gunicorn_server.url + "/trace", json=CAT, timeout=10,
                          headers={"Connection": "close", "X-Request-ID": f"identical-{i}"})
        assert r.status_code == 200
        return r.content

    bodies: set[bytes] = set()
    pids: set[str] = set()
    with cf.ThreadPoolExecutor(max_workers=4) as pool:
        for batch in range(10):  # bounded: stops as soon as both workers have answered
            bodies.update(pool.map(call, range(batch * 40, batch * 40 + 40)))
            entries = gunicorn_server.wait_for_log(lambda e: e["request_id"].startswith("identical-"),
                                                   count=(batch + 1) * 40, within=5)
            pids = {e["pid"] for e in entries}
            if len(pids) == 2:
                break
    assert len(bodies) == 1
    assert len(pids) == 2, f"only worker(s) {pids} answered"


def test_concurrent_burst_gets_no_errors(gunicorn_server):
    reqs = [CAT, {"sentence": "a b c d e f g h", "d_model": 64, "num_heads": 8, "causal": True},
            {"tokens": ["x"] * 32, "d_model": 32}, {"sentence": "bad", "num_heads": 5}]
    expected = {i: requests.post(gunicorn_server.url + "/trace", json=b, timeout=10).content for i, b in enumerate(reqs)}

    def call(i: int) -> tuple[int, int, bytes]:
        r = requests.post(gunicorn_server.url + "/trace", json=reqs[i % 4], timeout=20)
        return i % 4, r.status_code, r.content

    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(call, range(120)))
    assert all(status == (422 if i == 3 else 200) for i, status, _ in results)
    assert all(body == expected[i] for i, _, body in results)


def test_access_log_is_json_with_request_id_and_no_body(gunicorn_server):
    r = requests.post(gunicorn_server.url + "/trace", json={"sentence": "secret-sentence-xyz"}, timeout=10,
                      headers={"X-Request-ID": "log-check-1"})
    assert r.headers["X-Request-ID"] == "log-check-1"
    assert r.headers["Server"] == "attention-trace"  # no server name or version banner
    # The worker writes the line after the response: wait for it (with a deadline), never sleep.
    mine = gunicorn_server.wait_for_log(lambda e: e["request_id"] == "log-check-1")
    assert mine and mine[0]["path"] == "/trace" and mine[0]["status"] == 200
    assert "secret-sentence-xyz" not in gunicorn_server.log_text()


def test_sigterm_stops_cleanly_within_a_few_seconds():
    server = Gunicorn(workers=2)
    assert requests.get(server.url + "/health", timeout=5).ok
    took = server.stop()
    assert server.proc.returncode == 0
    assert took < 8, f"gunicorn took {took:.1f}s to stop"


def test_workers_start_with_the_malloc_tunables(gunicorn_server):
    """The fixture starts gunicorn as production does (service.worker.server_env): each worker's environment,
    as the kernel gave it at exec (inherited by the fork), holds the tunables glibc read."""
    from service.worker import MALLOC_TUNABLES

    master = gunicorn_server.proc.pid
    pids = [int(p) for p in Path(f"/proc/{master}/task/{master}/children").read_text().split()]
    assert pids
    for pid in pids:
        env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if kv)
        assert MALLOC_TUNABLES in env["GLIBC_TUNABLES"].split(":")


def test_the_master_warns_when_started_without_the_malloc_tunables():
    from service.worker import MALLOC_TUNABLES, malloc_note, server_env

    note = malloc_note({})
    assert note is not None and MALLOC_TUNABLES in note and "GLIBC_TUNABLES" in note
    assert malloc_note({"GLIBC_TUNABLES": MALLOC_TUNABLES}) is None
    assert malloc_note({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None  # the operator's choice
    assert malloc_note({"GUNICORN_MALLOC_TUNING": "0"}) is None  # glibc's defaults asked for
    assert server_env({})["GLIBC_TUNABLES"] == MALLOC_TUNABLES
    assert server_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})["GLIBC_TUNABLES"] == \
        f"glibc.malloc.arena_max=2:{MALLOC_TUNABLES}"
    assert server_env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"


_FAULTS_PROBE = """
import resource, sys
import numpy as np
from service.worker import MMAP_THRESHOLD, _tune_malloc
if sys.argv[1] == "tuned":
    _tune_malloc()
else:  # the mmap threshold fixed alone, as the tuning once did
    import ctypes
    ctypes.CDLL("libc.so.6").mallopt(-3, MMAP_THRESHOLD)

def answer():  # an answer of 600 kB made and freed, as a 32-token trace's JSON is
    body = np.ones(600_000 // 8).tobytes()
    del body

for _ in range(5):
    answer()
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(100):
    answer()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / 100)
"""


def test_a_worker_keeps_the_heap_it_frees_between_answers():
    """A worker's malloc tuning (service.worker._tune_malloc) keeps freed memory at the top of its heap up to
    TRIM_THRESHOLD: an answer below the mmap threshold, freed after it is sent, is not given back to the
    system only for the next answer to fault it in again (~150 pages of 4 KiB each time; run without the
    huge-page tunable, so that each page is a fault the probe counts)."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "GUNICORN_MALLOC_TUNING")}

    def faults(mode: str) -> float:
        out = subprocess.run([sys.executable, "-c", _FAULTS_PROBE, mode], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=60, check=True)
        return float(out.stdout)

    assert faults("tuned") < 5
    # fixing only the mmap threshold (as _tune_malloc once did) fixed the trim threshold at 128 KiB: the same
    # loop then faulted every page of every answer in again
    assert faults("mmap-only") > 100


def test_the_master_logs_that_warning_at_start():
    """gunicorn.conf.py's on_starting hook logs malloc_note (the config loaded in a process of its own,
    as gunicorn's master loads it; it patches gunicorn when loaded)."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    probe = ("import runpy\n"
             "c = runpy.run_path('gunicorn.conf.py')\n"
             "class Log:\n    warning = staticmethod(lambda m: print('WARNING', m))\n"
             "class Server:\n    log = Log\n"
             "c['on_starting'](Server())\n")
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "GUNICORN_MALLOC_TUNING")}
    without = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=60, check=True).stdout
    assert without.count("WARNING") == 1 and "glibc.malloc.hugetlb=1" in without
    with_it = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**env, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
                             capture_output=True, text=True, timeout=60, check=True).stdout
    assert "WARNING" not in with_it
