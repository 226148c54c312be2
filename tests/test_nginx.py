"""Slow and hostile clients through the shipped nginx, in front of real gunicorn (the committed config).

nginx runs the Kubernetes sidecar's configuration (deploy/nginx.conf for one
backend: tools/sidecar_nginx_conf.py) on loopback, Debian's binary, with
only its paths changed (tools/server.py ``Nginx``). Each attack runs from 8
loopback addresses while tools/attack.py's probe asks /health and a small
/trace every 200 ms from 127.0.0.1. /health must answer within 1 s, or, on a
machine so loaded that the longest request the workers served meanwhile took
longer, within 1.5 times that request's own time: a free sync worker takes a
waiting probe (on LIGHT_PORT) before the next POST, so a probe waits for at
most the request a worker is computing (docs/reliability.md has the figures).
"""

from __future__ import annotations

import concurrent.futures as cf
import http.client
import json
import time

import orjson
import pytest

from conftest import Gunicorn, Nginx
from tools import attack, measure_limits

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CAT = b'{"sentence":"the cat sat","d_model":24,"num_heads":4}'
ADDRESSES = 8


@pytest.fixture(scope="module")
def stack():
    app = Gunicorn(workers=2, log_name="nginx-app")
    proxy = None
    try:
        proxy = Nginx(app.port, app.light_port, workers=2)
        yield app, proxy
    finally:
        if proxy is not None:
            proxy.stop()
        app.stop()


def _post(port: int, path: str, body: bytes, timeout: float = 120) -> tuple[int, bytes, float]:
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read(), time.monotonic() - start
    finally:
        conn.close()


def _served(app: Gunicorn, before: int, count: int = 0, within: float = 120.0) -> list[dict]:
    """The app's access-log entries after the first ``before``, once every request nginx passed on has been
    answered (hung-up ones too: nginx waits for them): polled until at least ``count`` of them are /trace
    answers over 30 MB and no new entry came for 1 s, or ``within`` seconds have passed."""
    deadline = time.monotonic() + within
    seen, still_since = -1, time.monotonic()
    while True:
        entries = app.log_entries()[before:]
        if len(entries) != seen:
            seen, still_since = len(entries), time.monotonic()
        big = sum(e["path"] == "/trace" and e["bytes"] > 30_000_000 for e in entries)
        if (big >= count and time.monotonic() - still_since >= 1.0) or time.monotonic() > deadline:
            return entries
        time.sleep(0.1)


def test_the_largest_answer_passes_through_nginx_whole(stack):
    _, proxy = stack
    status, body, _ = _post(proxy.port, "/trace", orjson.dumps({**measure_limits.largest_trace(), "seed": 1}))
    assert status == 200 and len(body) > 30_000_000
    assert orjson.loads(body)["config"]["d_model"] == measure_limits.largest_trace()["d_model"]


@pytest.mark.parametrize(
    ("kind", "connections"), [("idle", 64), ("slowloris", 32), ("slow-body", 16), ("slow-read", 8), ("hangup", 20)]
)
def test_health_answers_through_nginx_while_clients_attack(stack, kind, connections):
    app, proxy = stack
    before = len(app.log_entries())
    r = attack.run_attack(kind, "127.0.0.1", proxy.port, connections, 6.0, settle=1.0, addresses=ADDRESSES)
    print(json.dumps(r))  # shown on failure
    # Every request the attack made nginx pass on is answered, hung-up ones too (nginx waits for them).
    entries = _served(app, before, count=connections if kind == "slow-read" else 0)
    longest = max([e["duration_us"] / 1e6 for e in entries if e["path"] == "/trace"], default=0.0)
    assert r["health_failed"] == 0, r
    assert r["health_max_s"] is not None and r["health_max_s"] < max(1.0, 1.5 * longest), (r, longest)
    if kind in ("idle", "slowloris", "slow-body"):  # held by nginx alone: the app never sees them
        assert r["failed"] == 0, r
        assert not [e for e in entries if e["path"] == "/trace" and e["status"] != 200]
    if kind == "slow-read":
        # Nobody read their answers, yet the workers wrote every one of them whole (to nginx) and moved on.
        big = [e for e in entries if e["path"] == "/trace" and e["bytes"] > 30_000_000]
        assert len(big) >= connections and all(e["status"] == 200 for e in big), big
    if kind == "hangup":
        assert r["attacker"]["sent_and_closed"] >= connections
    assert "WORKER TIMEOUT" not in app.log_text()


def test_recycling_loses_no_request():
    """Workers replaced every ~100 requests (max_requests plus jitter) under concurrent POSTs through nginx:
    every one of 1,200 answered 200, byte for byte the same. The per-address limits are lifted (the load comes
    from one address); max_conns stays."""
    app = Gunicorn(workers=2, env={"GUNICORN_MAX_REQUESTS": "100"}, log_name="nginx-recycle")
    proxy = None
    try:
        proxy = Nginx(app.port, app.light_port, workers=2, per_address_limits=False)
        want = _post(proxy.port, "/trace", CAT)[1]

        def one(i: int) -> tuple[int, bytes]:
            status, body, _ = _post(
                proxy.port,
                "/trace" if i % 4 else "/trace/batch",
                CAT if i % 4 else b'{"items":[' + CAT + b"]}",
                timeout=60,
            )
            return (status, body) if i % 4 else (status, b"batch")

        with cf.ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(one, range(1200)))
        replaced = app.log_text().count("Autorestarting worker")
    finally:
        if proxy is not None:
            proxy.stop()
        app.stop()
    statuses = {}
    for status, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    assert statuses == {200: 1200}, statuses
    assert all(body in (want, b"batch") for _, body in results)
    assert replaced >= 8, replaced


def test_with_the_app_gone_nginx_answers_503_problem_json_with_retry_after():
    app = Gunicorn(workers=1, log_name="nginx-gone")
    proxy = None
    try:
        proxy = Nginx(app.port, app.light_port, workers=1)
        app.stop()
        for method, path, body in (("GET", "/health", None), ("POST", "/trace", CAT)):
            conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            doc = json.loads(resp.read())
            conn.close()
            assert resp.status == 503 and resp.getheader("Content-Type") == "application/problem+json", path
            assert resp.getheader("Retry-After") == "1" and doc["status"] == 503
            assert doc["type"] == "urn:attention-trace:problem:unavailable"
    finally:
        if proxy is not None:
            proxy.stop()
        app.stop()
