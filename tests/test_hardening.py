"""Slow clients, bounded costs and the smaller findings, each with a test.

In process (the Flask app) and over real gunicorn with the committed config
(service/worker.py's BufferedWorker). docs/reliability.md has the figures.
"""

from __future__ import annotations

import socket
import threading
import time

import orjson
import pytest
import requests

from conftest import Gunicorn
from service import create_app
from service.settings import Settings
from test_hostile import CAT_BYTES, JSON, PROBLEM, parse_raw, raw_http, request_bytes


@pytest.fixture(scope="module")
def plain():
    """A client that does not check answers against openapi.yaml (some statuses here are server-level)."""
    return create_app().test_client()


@pytest.fixture(scope="module")
def server():
    s = Gunicorn(workers=1, env={"GUNICORN_HEADER_TIMEOUT": "1.5", "GUNICORN_BODY_TIMEOUT": "1.5",
                                 "GUNICORN_SEND_TIMEOUT": "2", "GUNICORN_WORKER_CONNECTIONS": "16"})
    try:
        yield s
    finally:
        s.stop()


# ------------------------------------------------------------------ small findings, in process


def test_no_redirect_is_built_from_the_host_header(plain):
    for path in ("/static//x", "//health", "/static//app.js", "/static/../static/app.js"):
        # PATH_INFO as a server passes it (the test client would read "//health" as a host)
        resp = plain.get("/", environ_overrides={"PATH_INFO": path}, headers={"Host": "evil.example"})
        resp.close()
        assert not 300 <= resp.status_code < 400, (path, resp.status_code)
        assert "Location" not in resp.headers
        assert "evil.example" not in resp.get_data(as_text=True)


def test_cors_allows_only_get_and_post_and_the_api_headers(plain):
    pre = plain.open("/trace", method="OPTIONS", headers={
        "Origin": "https://class.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, x-request-id, x-evil, authorization"})
    methods = {m.strip() for m in pre.headers["Access-Control-Allow-Methods"].split(",")}
    assert methods == {"GET", "POST"}
    allowed = {h.strip().lower() for h in pre.headers["Access-Control-Allow-Headers"].split(",")}
    assert allowed <= {"content-type", "x-request-id"} and "content-type" in allowed
    for bad in ("DELETE", "PUT", "PATCH"):
        resp = plain.open("/trace", method="OPTIONS", headers={"Origin": "https://class.example",
                                                               "Access-Control-Request-Method": bad})
        assert "Access-Control-Allow-Methods" not in resp.headers, bad


def test_cors_with_an_origin_list_varies_on_origin():
    client = create_app(Settings(cors_origins=("https://class.example",))).test_client()
    for origin in ("https://class.example", "https://evil.example", None):
        resp = client.get("/health", headers={"Origin": origin} if origin else {})
        assert "Origin" in resp.headers.get("Vary", ""), (origin, resp.headers)
        # only ever the configured origin, never the caller's
        assert resp.headers.get("Access-Control-Allow-Origin") in ("https://class.example", None)
    # with any origin, the answer is a literal "*": nothing varies
    any_origin = create_app().test_client().get("/health", headers={"Origin": "https://x.example"})
    assert any_origin.headers["Access-Control-Allow-Origin"] == "*"


def test_api_answers_are_not_stored_by_caches(plain):
    answers = [plain.get("/health"), plain.get("/version"), plain.get("/nope"),
               plain.post("/trace", data=CAT_BYTES, content_type=JSON),
               plain.post("/trace", data=b"{", content_type=JSON),
               plain.post("/trace/batch", data=b'{"items":[{"sentence":"a"}]}', content_type=JSON)]
    for resp in answers:
        assert resp.headers["Cache-Control"] == "no-store", (resp.request.path, resp.status_code)
    viewer = plain.get("/")
    viewer.close()
    assert viewer.headers["Cache-Control"] == "no-cache"  # the viewer revalidates instead


@pytest.mark.parametrize("coding", ["gzip", "br", "deflate", "x-unknown", "gzip, identity"])
def test_unknown_content_coding_is_415(plain, coding):
    resp = plain.post("/trace", data=CAT_BYTES, content_type=JSON, headers={"Content-Encoding": coding})
    assert resp.status_code == 415 and resp.mimetype == PROBLEM
    assert resp.headers["Accept-Encoding"] == "identity"
    ok = plain.post("/trace", data=CAT_BYTES, content_type=JSON, headers={"Content-Encoding": "identity"})
    assert ok.status_code == 200


def test_http11_without_host_is_400(plain):
    resp = plain.get("/health", environ_overrides={"HTTP_HOST": ""})
    assert resp.status_code == 400 and resp.mimetype == PROBLEM
    resp = plain.get("/health", environ_overrides={"HTTP_HOST": "", "SERVER_PROTOCOL": "HTTP/1.0"})
    assert resp.status_code == 200  # HTTP/1.0 has no Host requirement


def test_batch_budget_counts_weight_generation(plain):
    """32 one-token items with distinct seeds at d_model 512 are 1.5 KB and cost
    ~1.5 s of CPU (a weight set each); the budget refuses them before any work."""
    items = [{"tokens": ["a"], "d_model": 512, "seed": 100 + i} for i in range(32)]
    start = time.thread_time()  # the work itself (the test client runs the app in this thread), not the load
    resp = plain.post("/trace/batch", data=orjson.dumps({"items": items}), content_type=JSON)
    assert time.thread_time() - start < 0.5
    assert resp.status_code == 422
    assert resp.get_json()["errors"][0]["type"] == "batch_too_costly"
    # the same items sharing one seed are one weight set: fine
    shared = [{"tokens": ["a"], "d_model": 512, "seed": 7} for _ in range(32)]
    assert plain.post("/trace/batch", data=orjson.dumps({"items": shared}), content_type=JSON).status_code == 200
    # and every single /trace is within the budget by construction
    limits = Settings()
    assert limits.max_request_cost == limits.max_trace_values + 4 * limits.max_d_model ** 2


def test_trace_html_is_inside_the_request_cost_budget(plain):
    """/trace/html was outside the budget. A 313-byte request made a 40 MB page
    for 0.62-0.94 s of CPU and +275 MiB (the JSON was widened into a str of 2-4 bytes a character and
    encoded back). Now the page's cost (service/budget.py page_cost: its traces plus a unit a number for
    the page) is counted before any work: over the budget, a 422 in milliseconds; within it, the page
    costs no more CPU than the budget allows. App-level: it holds under any worker class."""
    from service import budget, compression

    costly_page = {"sentence": "!" * 256, "d_model": 512, "num_heads": 4, "causal": True}
    start = time.thread_time()
    resp = plain.post("/trace/html", data=orjson.dumps(costly_page), content_type=JSON)
    assert time.thread_time() - start < 0.05
    assert resp.status_code == 422 and resp.mimetype == PROBLEM
    assert resp.get_json()["errors"][0]["type"] == "page_too_costly"
    assert "POST /trace" in resp.get_json()["detail"]
    # the largest trace of the benchmarks (L: 19.5 MB of JSON) fits, with its comparison left out
    large = {"tokens": [f"w{i}" for i in range(128)], "d_model": 512, "num_heads": 8}
    limits = Settings()
    for seed in (31, 32):
        start = time.thread_time()
        resp = plain.post("/trace/html", data=orjson.dumps({**large, "seed": seed}), content_type=JSON)
        cpu = time.thread_time() - start
        assert resp.status_code == 200 and len(resp.get_data()) > 19_000_000
        assert b'"comparison":null' in resp.get_data()[:2_000_000]
    from service.edge import parse_body
    from service.routes.trace import TraceRequest

    with create_app().app_context():
        units = budget.page_cost([parse_body(TraceRequest, orjson.dumps(large))])
    assert units <= limits.max_request_cost
    assert cpu <= 2 * compression.estimate_s(units), (cpu, compression.estimate_s(units))


def test_weight_cache_is_bounded_by_bytes():
    from engine.params import generate_parameters

    create_app(Settings(weight_cache_bytes=24 * 1024 * 1024))
    try:
        for seed in range(5):
            generate_parameters(9000 + seed, 512, 8, None)  # 8 MiB each
        info = generate_parameters.cache_info()
        assert info.bytes <= 24 * 1024 * 1024 and info.currsize == 3
        for seed in range(200):
            generate_parameters(9100 + seed, 16, 2, None)  # 8 KiB each: many fit
        assert generate_parameters.cache_info().bytes <= 24 * 1024 * 1024
    finally:
        create_app()  # back to the default bound


# ------------------------------------------------------------------ over gunicorn (BufferedWorker)


def _health_latency(srv: Gunicorn) -> float:
    start = time.monotonic()
    r = requests.get(srv.url + "/health", timeout=10, headers={"Connection": "close"})
    assert r.status_code == 200
    return time.monotonic() - start


@pytest.mark.integration
def test_idle_and_slowloris_clients_never_hold_the_only_worker(server):
    """Two idle connections or two slowloris clients stopped all traffic for
    31 s. Here ONE worker keeps answering within a second while ten of each are open,
    and cuts them off after header_timeout (1.5 s here) with 408s that the access log
    records with the client's address."""
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(10)]
    loris = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(10)]
    for s in loris:
        s.sendall(b"POST /trace HTTP/1.1\r\nHost: x\r\n")
    try:
        worst = 0.0
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            for s in loris:
                try:
                    s.sendall(b"X-a: b\r\n")
                except OSError:
                    pass
            worst = max(worst, _health_latency(server))
            time.sleep(0.1)
        assert worst < 1.0, worst
        for s in loris:  # each got a 408 problem+json, then the close
            s.settimeout(5)
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            raw = parse_raw(data, 0.0)
            assert raw.status == 408 and raw.mime == PROBLEM
    finally:
        for s in idle + loris:
            s.close()
    logged = server.wait_for_log(lambda e: e["status"] == 408, count=20)
    assert len(logged) >= 20 and all(e["remote"] == "127.0.0.1" for e in logged)
    assert "WORKER TIMEOUT" not in server.log_text()


@pytest.mark.integration
def test_a_full_worker_drops_its_slowest_sender_to_make_room(server):
    """worker_connections is 16 here: 40 idle connections cannot lock a client out."""
    idle = []
    try:
        for _ in range(40):
            idle.append(socket.create_connection(("127.0.0.1", server.port)))
        time.sleep(0.6)  # old enough to be dropped (service/worker.py SHED_AGE)
        assert _health_latency(server) < 1.0
    finally:
        for s in idle:
            s.close()


@pytest.mark.integration
def test_a_client_that_never_reads_is_cut_off_and_logged(server):
    """Two clients not reading a 19.5 MB trace stopped traffic for 32 s."""
    body = orjson.dumps({"tokens": [f"w{i}" for i in range(128)], "d_model": 512, "num_heads": 8, "seed": 5})
    readers = []
    for _ in range(2):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", server.port))
        s.sendall(request_bytes("POST", "/trace", body))
        readers.append(s)
    try:
        worst = 0.0
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            worst = max(worst, _health_latency(server))
            time.sleep(0.1)
        assert worst < 1.0, worst
    finally:
        for s in readers:
            s.close()
    deadline = time.monotonic() + 10
    while "cut off" not in server.log_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "client 127.0.0.1 cut off" in server.log_text()


@pytest.mark.integration
def test_expect_100_continue_comes_only_after_the_size_check(server):
    head = (f"POST /trace HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: {JSON}\r\n"
            f"Expect: 100-continue\r\nContent-Length: {5 * 1024 * 1024}\r\n\r\n").encode()
    raw = raw_http(server.port, head, timeout=5)
    assert raw.interim == [] and raw.status == 413 and raw.mime == PROBLEM  # no "100 Continue" first
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(request_bytes("POST", "/trace", CAT_BYTES, headers={"Expect": "100-continue"})
                  [:-len(CAT_BYTES)])
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(CAT_BYTES)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert parse_raw(data, 0.0).status == 200


@pytest.mark.integration
def test_server_level_rejections_reach_the_json_access_log(server):
    marker = f"ua-{time.monotonic_ns()}"
    cases = [
        (400, f"get /health HTTP/1.1\r\nHost: x\r\nUser-Agent: {marker}\r\nConnection: close\r\n\r\n".encode()),
        (414, request_bytes("GET", "/" + "a" * 9000)),
        (431, request_bytes("GET", "/health", headers={"X-Long": "a" * 9000, "User-Agent": marker})),
        (400, f"GET /health HTTP/1.1\r\nUser-Agent: {marker}\r\nConnection: close\r\n\r\n".encode()),  # no Host
        (415, request_bytes("POST", "/trace", CAT_BYTES, headers={"Content-Encoding": "gzip"})),
    ]
    ids = []
    for status, data in cases:
        raw = raw_http(server.port, data)
        assert raw.status == status, (status, raw.status, raw.body[:200])
        assert raw.mime == PROBLEM
        ids.append(raw.headers["x-request-id"])
    logged = {e["request_id"]: e for e in server.wait_for_log(lambda e: e["request_id"] in ids, count=len(ids))}
    for (status, _), rid in zip(cases, ids):
        assert rid in logged, (status, rid)
        assert logged[rid]["status"] == status and logged[rid]["remote"] == "127.0.0.1"


@pytest.mark.integration
def test_a_slow_body_is_cut_off_with_408_and_logged(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(request_bytes("POST", "/trace", b"x" * 4000)[:-4000])
        start = time.monotonic()
        data = b""
        try:
            while time.monotonic() - start < 8:
                s.sendall(b" ")
                time.sleep(0.3)
        except OSError:
            pass
        s.settimeout(5)
        try:
            while chunk := s.recv(65536):
                data += chunk
        except OSError:
            pass
    assert time.monotonic() - start < 6
    assert parse_raw(data, 0.0).status == 408
    assert server.wait_for_log(lambda e: e["status"] == 408 and e["path"] == "/trace")


@pytest.mark.integration
def test_health_stays_fast_while_the_only_worker_computes(server):
    """GETs have their own thread: /health does not wait behind the largest traces."""
    from tools import measure_limits

    largest = orjson.dumps({**measure_limits.largest_trace(), "seed": 77})
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            try:
                requests.post(server.url + "/trace", data=largest, headers={"Content-Type": JSON}, timeout=30)
            except requests.RequestException:
                pass

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.5)
        worst = max(_health_latency(server) for _ in range(15))
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert worst < 1.0, worst
