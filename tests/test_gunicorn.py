"""Integration: real gunicorn (2 workers, committed config) on a free loopback port."""

from __future__ import annotations

import concurrent.futures as cf
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


def test_a_probe_on_the_light_port_skips_the_queue_of_posts():
    """gunicorn.conf.py binds LIGHT_PORT first: a free sync worker takes a connection waiting there before the
    next one on PORT. With one worker and six large traces queued on PORT, /health on LIGHT_PORT waits for the
    trace being computed at most; /health on PORT waits behind the queue."""
    import http.client
    import threading
    import time

    server = Gunicorn(workers=1)
    body = b'{"tokens": [' + b",".join(b'"w%d"' % i for i in range(128)) + b'], "d_model": 512, "num_heads": 8}'

    def post() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        conn.request("POST", "/trace", body=body, headers={"Content-Type": "application/json"})
        conn.getresponse().read()
        conn.close()

    def health(port: int) -> float:
        start = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("GET", "/health")
        assert conn.getresponse().status == 200
        conn.close()
        return time.monotonic() - start

    try:
        post()  # warm: the weights are cached, every trace below costs the same
        started = time.monotonic()
        post()
        one = time.monotonic() - started
        threads = [threading.Thread(target=post) for _ in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while _accept_queue(server.port) < 4 and time.monotonic() < deadline:  # the rest wait for the worker
            time.sleep(0.01)
        assert _accept_queue(server.port) >= 4
        light = health(server.light_port)
        work = health(server.port)
        for t in threads:
            t.join(120)
    finally:
        server.stop()
    assert light < 2 * one, (light, one)
    assert work > 2 * light, (work, light, one)


def _accept_queue(port: int) -> int:
    """Connections waiting in the kernel's accept queue of the listening socket on 127.0.0.1:port
    (/proc/net/tcp: a listening socket's rx_queue is its backlog)."""
    from pathlib import Path

    want = f"0100007F:{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == want and fields[3] == "0A":  # LISTEN
            return int(fields[4].split(":")[1], 16)
    return 0
