"""Connections spread over gunicorn's workers (service/worker.py: least connections first, keepalive_requests).

Kept-alive clients (wrk, a proxy's upstream pool) used to land all on one worker
when they connected in a burst, or while the other worker was booting or being
recycled: half the machine idled. Real gunicorn, two workers, on loopback.
"""

from __future__ import annotations

import http.client
import socket
import time

import pytest

from conftest import Gunicorn

pytestmark = pytest.mark.integration  # starts another process


@pytest.fixture(scope="module")
def server():
    s = Gunicorn(workers=2, env={"GUNICORN_KEEPALIVE_REQUESTS": "3", "GUNICORN_MAX_REQUESTS": "0"})
    try:
        yield s
    finally:
        s.stop()


def _pid_of(server: Gunicorn, request_id: str) -> str:
    (entry,) = server.wait_for_log(lambda e: e.get("request_id") == request_id, within=10.0)[:1] or [None]
    assert entry is not None, f"no access-log line for {request_id}"
    return entry["pid"]


def _both_workers_ready(server: Gunicorn, deadline_s: float = 60.0) -> set[str]:
    """Fresh connections until two distinct worker pids have answered (both have loaded the app)."""
    pids: set[str] = set()
    deadline = time.monotonic() + deadline_s
    i = 0
    while len(pids) < 2 and time.monotonic() < deadline:
        i += 1
        c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        c.request("GET", "/health", headers={"X-Request-ID": f"ready-{i}", "Connection": "close"})
        c.getresponse().read()
        c.close()
        pids.add(_pid_of(server, f"ready-{i}"))
    assert len(pids) == 2, "the second worker never answered"
    return pids


def test_a_burst_of_kept_alive_connections_spreads_over_the_workers(server):
    workers = _both_workers_ready(server)
    # Eight connections at once, before any request: the first worker awake used to take them all. Now a
    # worker holding k connections looks for another only every k·0.5 ms (at most 2 ms), so taking all eight
    # alone needs the other worker unscheduled for 11 ms (with four, 3 ms: a loaded 2-core machine did that).
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(8)]
    conns = []
    try:
        for s in socks:
            c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            c.sock = s
            conns.append(c)
        served = []
        for i, c in enumerate(conns):
            c.request("GET", "/health", headers={"X-Request-ID": f"burst-{i}"})
            r = c.getresponse()
            r.read()
            assert r.status == 200 and r.getheader("Connection", "").lower() != "close"
            served.append(_pid_of(server, f"burst-{i}"))
    finally:
        for c in conns:
            c.close()
    assert set(served) == workers, f"8 connections served by {served}: every worker should hold some"


def _read_response(sock: socket.socket, buf: bytes) -> tuple[bytes, bytes]:
    """One response's head (the body is read and dropped) and what followed it."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, "the server closed before answering"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed in the middle of a body"
        rest += chunk
    return head, rest[length:]


def test_a_connection_is_closed_after_keepalive_requests(server):
    """GUNICORN_KEEPALIVE_REQUESTS=3: the third answer says Connection: close, and the server closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        buf = b""
        for i in range(3):
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            head, buf = _read_response(sock, buf)
            assert head.startswith(b"HTTP/1.1 200")
            closing = b"\r\nconnection: close" in head.lower()
            assert closing == (i == 2), f"request {i + 1}: {head!r}"
        assert buf == b"" and sock.recv(1) == b""  # the server closed its end
