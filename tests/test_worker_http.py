"""The worker's HTTP framing, over real gunicorn with raw sockets.

service/worker.py reads requests on its event loop and leaves every framing
decision to gunicorn's own parser and readers (the request head to
gunicorn.http.message.Request, a chunked body to gunicorn.http.body.ChunkedReader
fed as bytes arrive). Each test here is a defect an operator's probe found in
the worker's earlier, hand-written framing, and failed before its fix.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import orjson
import pytest
import requests

from conftest import Gunicorn
from test_hostile import CAT_BYTES, JSON, PROBLEM, parse_raw, request_bytes

pytestmark = pytest.mark.integration

MAX_BODY = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def one_worker():
    s = Gunicorn(workers=1, env={"GUNICORN_HEADER_TIMEOUT": "3", "GUNICORN_BODY_TIMEOUT": "3"})
    try:
        yield s
    finally:
        s.stop()


def worker_pids(server: Gunicorn) -> list[int]:
    master = server.proc.pid
    return [int(p) for p in Path(f"/proc/{master}/task/{master}/children").read_text().split()]


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def read_answer(s: socket.socket, within: float) -> bytes:
    """Everything the server sends until it closes, or what came within `within` seconds."""
    s.settimeout(0.2)
    data = b""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def health_within(server: Gunicorn, limit: float) -> float:
    start = time.monotonic()
    r = requests.get(server.url + "/health", timeout=limit, headers={"Connection": "close"})
    assert r.status_code == 200
    return time.monotonic() - start


def chunked_head(path: str = "/trace", method: str = "POST") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {JSON}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()


# ------------------------------------------------------------------ negative chunk size


def test_a_negative_chunk_size_is_400_at_once_and_freezes_nothing(one_worker):
    """`-6` as a chunk size (int(x, 16) accepts it) moved the worker's scan back and span its
    event loop until the arbiter killed it, 30 s later. Three such requests 0.3 s apart were a 33.6 s
    outage. Now gunicorn's reader refuses the size: 400 at once, and /health never waits."""
    for size in (b"-6", b"-0", b" -6", b"+6", b"0x6", b"6_0"):
        with socket.create_connection(("127.0.0.1", one_worker.port), timeout=5) as s:
            start = time.monotonic()
            s.sendall(chunked_head() + size + b"\r\n")
            data = read_answer(s, 2.0)
            took = time.monotonic() - start
        assert data, f"{size!r}: no answer within 2 s"
        raw = parse_raw(data, took)
        assert raw.status == 400 and raw.mime == PROBLEM, (size, raw.status, raw.body[:200])
        assert took < 1.0, (size, took)
        assert health_within(one_worker, 1.0) < 1.0
    assert "WORKER TIMEOUT" not in one_worker.log_text()


def test_three_negative_chunk_sizes_in_a_row_cause_no_outage(one_worker):
    socks = []
    try:
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", one_worker.port), timeout=5)
            s.sendall(chunked_head() + b"-6\r\n")
            socks.append(s)
            time.sleep(0.3)
        worst = max(health_within(one_worker, 2.0) for _ in range(5))
        assert worst < 1.0, worst
        for s in socks:
            raw = parse_raw(read_answer(s, 2.0), 0.0)
            assert raw.status == 400
    finally:
        for s in socks:
            s.close()


# ------------------------------------------------------------------ a declared chunk counts at once


def _stream_after(head: bytes, *, port: int, pid: int, seconds: float) -> tuple[bytes, int, int]:
    """Send `head`, then data as fast as the server takes it for up to `seconds` or until it answers;
    return (the answer, bytes of data sent, the worker's largest RSS growth meanwhile)."""
    base = rss(pid)
    peak = [base]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], rss(pid))
            except (OSError, AssertionError):
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    sent = 0
    answer = b""
    block = b"a" * 65536
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(head)
            s.setblocking(False)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                try:
                    got = s.recv(65536)
                    if not got:
                        break
                    answer += got
                    if b"\r\n\r\n" in answer:
                        break
                except BlockingIOError:
                    pass
                except ConnectionResetError:
                    break
                try:
                    sent += s.send(block)
                except BlockingIOError:
                    time.sleep(0.001)
                except (BrokenPipeError, ConnectionResetError):
                    break
            s.setblocking(True)
            answer += read_answer(s, 2.0)
    finally:
        stop.set()
        watcher.join()
    return answer, sent, peak[0] - base


def test_a_declared_chunk_over_the_limit_is_413_before_its_data(one_worker):
    """A chunk size of fffffffffff followed by a stream of data grew one worker from 56 to
    1,076 MiB in 14 s: the chunk counted only once it had fully arrived. Now the declared size counts
    against the body limit as soon as its line is read: 413 at once, and memory stays flat."""
    pid = worker_pids(one_worker)[0]
    answer, sent, grew = _stream_after(chunked_head() + b"fffffffffff\r\n", port=one_worker.port, pid=pid,
                                       seconds=4.0)
    assert answer, f"no answer after {sent} bytes of data"
    raw = parse_raw(answer, 0.0)
    assert raw.status == 413 and raw.mime == PROBLEM, (raw.status, raw.body[:200])
    assert raw.body and b"payload-too-large" in raw.body
    assert grew < 32 * 1024 * 1024, f"the worker grew by {grew >> 20} MiB while {sent >> 20} MiB were sent"
    assert health_within(one_worker, 1.0) < 1.0


def test_chunks_count_against_the_limit_as_they_are_declared(one_worker):
    """A body within the limit chunk by chunk, over it in all: refused when the declaring line arrives,
    before that chunk's data."""
    pid = worker_pids(one_worker)[0]
    first = b"%x\r\n" % (MAX_BODY - 10) + b"b" * (MAX_BODY - 10) + b"\r\n"
    answer, sent, grew = _stream_after(chunked_head() + first + b"b\r\n", port=one_worker.port, pid=pid,
                                       seconds=4.0)
    raw = parse_raw(answer, 0.0)
    assert raw.status == 413, (raw.status, raw.body[:200])
    assert grew < 48 * 1024 * 1024, grew
    # exactly at the limit is read whole: the app parses it (and refuses the unknown field "x")
    body = b'{"sentence":"a","x":"' + b"b" * (MAX_BODY - 23) + b'"}'
    assert len(body) == MAX_BODY
    with socket.create_connection(("127.0.0.1", one_worker.port), timeout=10) as s:
        s.sendall(request_bytes("POST", "/trace", body, chunked=True, chunk_size=MAX_BODY))
        raw = parse_raw(read_answer(s, 10.0), 0.0)
    assert raw.status == 422 and b"extra_forbidden" in raw.body, (raw.status, raw.body[:200])


def test_a_chunked_check_body_has_the_check_limit(one_worker):
    """/check takes 16 MiB: a declared chunk of 8 MiB is read there, refused on /trace."""
    for path, status in (("/trace", 413), ("/check", 400)):
        with socket.create_connection(("127.0.0.1", one_worker.port), timeout=10) as s:
            s.sendall(chunked_head(path) + b"800000\r\n" + b"x" * 0x800000 + b"\r\n0\r\n\r\n")
            raw = parse_raw(read_answer(s, 10.0), 0.0)
        assert raw.status == status, (path, raw.status, raw.body[:200])


# ------------------------------------------------------------------ smaller framing defects


def test_a_broken_chunked_body_on_a_get_is_400_without_a_trace(one_worker):
    """`GET /health` with a chunked body whose chunk is not followed by CRLF got a 500, a
    stack trace in the error log and two access-log lines. Now: 400, no trace, one line."""
    marker = f"broken-chunk-{time.monotonic_ns()}"
    data = (f"GET /health HTTP/1.1\r\nHost: x\r\nX-Request-ID: {marker}\r\nUser-Agent: {marker}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", one_worker.port), timeout=5) as s:
        s.sendall(data)
        raw = parse_raw(read_answer(s, 3.0), 0.0)
    assert raw.status == 400 and raw.mime == PROBLEM, (raw.status, raw.body[:200])
    lines = one_worker.wait_for_log(lambda e: e["user_agent"] == marker, count=2, within=2.0)
    assert len(lines) == 1 and lines[0]["status"] == 400, lines
    assert "Traceback" not in one_worker.log_text()


@pytest.mark.parametrize("head", [
    b"GET /health HTTP/1.1\nHost: x\n\n",
    b"GET /health HTTP/1.1\r\nHost: x\n\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: b\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: b\n",
])
def test_a_bare_lf_head_is_400_at_once(one_worker, head):
    """A head with bare-LF line endings waited 10 s (header_timeout), then got 408. gunicorn's
    parser refuses it: 400 at once, as its stock workers answer."""
    with socket.create_connection(("127.0.0.1", one_worker.port), timeout=5) as s:
        start = time.monotonic()
        s.sendall(head)
        data = read_answer(s, 2.0)
        took = time.monotonic() - start
    assert data, f"{head!r}: no answer within 2 s"
    raw = parse_raw(data, took)
    assert raw.status == 400 and raw.mime == PROBLEM, (head, raw.status)
    assert took < 1.0


def test_a_chunked_body_split_anywhere_is_answered_the_same(one_worker):
    """The same chunked request, sent a few bytes at a time (cut inside sizes, CRLFs, extensions and
    trailers), gets the Content-Length answer."""
    reference = requests.post(one_worker.url + "/trace", data=CAT_BYTES, headers={"Content-Type": JSON},
                              timeout=10).content
    body = (b"5;name=value\r\n" + CAT_BYTES[:5] + b"\r\n" + b"%x\r\n" % (len(CAT_BYTES) - 5) + CAT_BYTES[5:]
            + b"\r\n0\r\nX-Trailer: yes\r\n\r\n")
    data = chunked_head().replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") + body
    for step in (1, 3, 7):
        with socket.create_connection(("127.0.0.1", one_worker.port), timeout=10) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for i in range(0, len(data), step):
                s.sendall(data[i:i + step])
                time.sleep(0.001)
            raw = parse_raw(read_answer(s, 5.0), 0.0)
        assert raw.status == 200 and raw.body == reference, (step, raw.status, raw.body[:200])


# ------------------------------------------------------------------ bodies arriving are bounded


def test_request_bodies_arriving_are_bounded_by_max_buffered():
    """60 connections declaring 16 MiB to /check and sending it pushed the workers to 563 and
    629 MiB: only answers counted against max_buffered. Now a body over 64 KiB reserves its size before
    it is read: with max_buffered at 8 MiB, twelve 6 MiB bodies are read one or two at a time (TCP holds
    the others back), the worker's memory stays near 8 MiB over its idle size, every client is answered,
    and /health stays fast meanwhile."""
    server = Gunicorn(workers=1, env={"GUNICORN_MAX_BUFFERED": str(8 * 1024 * 1024)})
    try:
        pid = worker_pids(server)[0]
        base = rss(pid)
        size = 6 * 1024 * 1024
        body = b"[" + b"1," * (size // 2 - 1) + b"1]"
        head = (f"POST /check HTTP/1.1\r\nHost: x\r\nContent-Type: {JSON}\r\nConnection: close\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        answers: list[int] = []
        peak = [base]
        stop = threading.Event()

        def upload() -> None:
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
                s.sendall(head + body)
                answers.append(parse_raw(read_answer(s, 30.0), 0.0).status)

        def watch() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], rss(pid))
                time.sleep(0.01)

        watcher = threading.Thread(target=watch)
        watcher.start()
        clients = [threading.Thread(target=upload) for _ in range(12)]
        for t in clients:
            t.start()
        worst = 0.0
        while any(t.is_alive() for t in clients):
            worst = max(worst, health_within(server, 2.0))
            time.sleep(0.05)
        for t in clients:
            t.join(60)
        stop.set()
        watcher.join()
    finally:
        server.stop()
    grew = peak[0] - base
    print(f"answers {sorted(answers)}, grew {grew >> 20} MiB, /health worst {worst:.3f} s")
    assert len(answers) == 12 and all(400 <= s < 500 for s in answers), answers  # the app read each body
    assert grew < 40 * 1024 * 1024, f"the worker grew by {grew >> 20} MiB for 72 MiB of bodies"
    assert worst < 1.0, worst


# ------------------------------------------------------------------ clients that hung up


def test_a_request_whose_client_hung_up_is_not_computed(one_worker):
    """20 clients sending the largest trace and closing at once left 85 of 92 legitimate
    /trace requests answered 503 (the queue was full of work nobody would read); the 7 answered waited
    12.2 s. Now a queued request whose client has closed its end leaves the queue uncomputed (logged
    499, as nginx does), and the lane checks the socket again before it computes."""
    from tools import measure_limits

    largest = measure_limits.largest_trace()
    stop = threading.Event()
    sent = [0]

    def hang_up(n: int) -> None:
        i = 0
        while not stop.is_set():
            body = orjson.dumps({**largest, "seed": 1000 * n + i})
            try:
                with socket.create_connection(("127.0.0.1", one_worker.port), timeout=5) as s:
                    s.sendall(request_bytes("POST", "/trace", body, headers={"X-Request-ID": f"gone-{n}-{i}"}))
                sent[0] += 1
            except OSError:
                pass
            i += 1
            time.sleep(0.05)

    attackers = [threading.Thread(target=hang_up, args=(n,)) for n in range(20)]
    for t in attackers:
        t.start()
    statuses, took = [], []
    try:
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            start = time.monotonic()
            r = requests.post(one_worker.url + "/trace", data=CAT_BYTES, headers={"Content-Type": JSON},
                              timeout=30)
            took.append(time.monotonic() - start)
            statuses.append(r.status_code)
    finally:
        stop.set()
        for t in attackers:
            t.join(30)
    gone = one_worker.wait_for_log(lambda e: e["request_id"].startswith("gone-"), count=sent[0], within=5)
    computed = [e for e in gone if e["status"] == 200]
    dropped = [e for e in gone if e["status"] == 499]
    took.sort()
    print(f"{len(statuses)} legitimate requests, p50 {took[len(took) // 2]:.3f} s, max {took[-1]:.3f} s; "
          f"{sent[0]} hung up: {len(computed)} computed, {len(dropped)} dropped (499)")
    assert statuses and all(s == 200 for s in statuses), statuses
    assert took[len(took) // 2] < 0.5
    assert len(computed) <= max(3, sent[0] // 10), (len(computed), sent[0])
    assert len(dropped) >= sent[0] // 2


# ------------------------------------------------------------------ recycling loses nothing


class KeptAlive:
    """A careful HTTP/1.1 client on one kept-alive connection (raw socket): it reconnects when an answer
    said "close" or when the server closed the idle connection before the next request went out (as
    urllib3 checks), and it counts as lost every request sent and never answered."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None
        self.file = None
        self.answered = self.lost = self.reconnects = 0

    def _usable(self) -> bool:
        if self.sock is None:
            return False
        import select

        readable, _, _ = select.select([self.sock], [], [], 0)
        return not readable  # readable while idle: the server closed it (or sent something unasked)

    def _connect(self) -> None:
        self.close()
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=20)
        self.file = self.sock.makefile("rb")
        self.reconnects += 1

    def close(self) -> None:
        if self.sock is not None:
            self.file.close()
            self.sock.close()
        self.sock = self.file = None

    def _response(self) -> tuple[int, bool, bytes] | None:
        """(status, "close" said, body), or None when the connection ended first."""
        try:
            line = self.file.readline()
            if not line:
                return None
            status = int(line.split()[1])
            headers = {}
            while (h := self.file.readline()) not in (b"\r\n", b""):
                name, _, value = h.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            body = self.file.read(int(headers.get("content-length", "0")))
            return status, headers.get("connection", "").lower() == "close", body
        except (OSError, ValueError, IndexError):
            return None

    def exchange(self, requests_: list[bytes]) -> list[int]:
        """Send the requests at once (pipelined when several); the statuses of those answered."""
        if not self._usable():
            self._connect()
        try:
            self.sock.sendall(b"".join(requests_))
        except OSError:
            self.lost += len(requests_)
            self.close()
            return []
        statuses = []
        for _ in requests_:
            got = self._response()
            if got is None:
                break
            statuses.append(got[0])
            if got[1]:
                break
        self.answered += len(statuses)
        self.lost += len(requests_) - len(statuses)
        if len(statuses) < len(requests_) or got is None or got[1]:
            self.close()
        return statuses


def keepalive_request(i: int) -> bytes:
    return request_bytes("POST", "/trace", CAT_BYTES, headers={"X-Request-ID": f"ka-{i}"}).replace(
        b"Connection: close\r\n", b"")


def test_a_recycled_worker_loses_no_request_on_kept_alive_or_pipelined_connections():
    """With 10 kept-alive clients and a pipelining one, 6 requests failed at a recycle
    (max_requests), with no kill involved: the stopping worker closed idle kept-alive connections at
    once (racing the clients' next requests) and dropped requests pipelined behind the last answer. Now
    it answers every request already sent, pipelined ones included (the last answer says "close"), and
    closes a kept-alive connection only after 1 s of quiet, with a FIN."""
    server = Gunicorn(workers=2, env={"GUNICORN_MAX_REQUESTS": "150"})
    clients = [KeptAlive(server.port) for _ in range(8)]
    pipeliners = [KeptAlive(server.port) for _ in range(2)]
    stop = threading.Event()
    bad: list[int] = []

    def run(client: KeptAlive, depth: int) -> None:
        i = 0
        while not stop.is_set():
            statuses = client.exchange([keepalive_request(i + k) for k in range(depth)])
            bad.extend(s for s in statuses if s != 200)
            i += depth

    threads = [threading.Thread(target=run, args=(c, 1)) for c in clients] + \
              [threading.Thread(target=run, args=(c, 4)) for c in pipeliners]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while server.log_text().count("Autorestarting worker") < 8 and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(30)
        recycled = server.log_text().count("Autorestarting worker")
    finally:
        stop.set()
        for c in clients + pipeliners:
            c.close()
        server.stop()
    answered = sum(c.answered for c in clients + pipeliners)
    lost = sum(c.lost for c in clients + pipeliners)
    print(f"{recycled} recycles, {answered} answered, {lost} lost, "
          f"{sum(c.reconnects for c in clients + pipeliners)} connections")
    assert recycled >= 8
    assert lost == 0 and not bad, (lost, bad[:5])


def test_the_load_test_recycles_workers_under_kept_alive_and_pipelined_load():
    """scripts/loadtest with kept-alive and pipelining clients (it used to send only Connection: close,
    so it could not see losses at a recycle) and workers recycled every 150 requests: nothing lost."""
    from tools import loadtest

    rep = loadtest.run(duration=6, threads=2, keepalive=3, pipeline=1, workers=2, max_requests=150, timeout=20,
                       seed=9)
    loadtest.print_report(rep)
    assert rep["workers_recycled"] >= 2, rep["workers_recycled"]
    assert rep["connection_errors"] == 0 and rep["timeouts"] == 0 and rep["status_5xx"] == 0
    assert rep["not_identical"] == 0 and rep["passed"], rep["problems"]
