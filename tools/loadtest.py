"""Load test: real gunicorn on loopback, N client threads for a bounded time.

    scripts/loadtest [--duration 60] [--threads 8] [--keepalive 4] [--pipeline 1] [--workers 2]
                     [--max-requests N] [--kill-worker] [--json out.json]
    python -m tools.loadtest ...    # the same, from the repository root

Starts gunicorn with the committed gunicorn.conf.py on a free 127.0.0.1 port,
computes the reference answer of every request in the mix in-process (a fresh
create_app(), no gunicorn involved), then lets the threads send a seeded mix
of valid and invalid requests until the time is up. Every answer must be
byte-identical to its reference (status and body) and echo its X-Request-ID.

The clients: --threads send one request a connection (Connection: close);
--keepalive keep one connection open for many requests, as a browser, a
proxy's upstream pool or wrk do; --pipeline send 4 requests at a time on a
kept-alive connection before reading the answers (HTTP/1.1 pipelining). A
kept-alive client reconnects when an answer says "close", or when it finds
its idle connection closed by the server before it sends (as urllib3 does);
a request it sent that is never answered is a connection error. With
--max-requests, the workers are recycled that often (GUNICORN_MAX_REQUESTS):
a recycled worker must answer everything already sent to it and lose nothing.

With --kill-worker, one worker is SIGKILLed by its PID at --kill-at (fraction
of the run); the master must replace it, and only requests in flight at the
moment of the kill may fail: every connection the killed worker held (being
read, queued, computed or written; at most one per client thread). Those are
counted, not hidden. Behind the recipes' nginx they are retried on another
replica instead (scripts/deploy-check).

Prints a report (requests sent, errors, throughput, p50/p99 latency, the kill
outcome) and exits 0 only if: no 5xx, no timeouts, no connection errors other
than the in-flight ones at the kill, every answer identical to its reference,
and (with --kill-worker) the worker was replaced. Only 127.0.0.1 is used;
everything started is stopped by PID.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

from tools.server import ROOT, Gunicorn, shown

JSON = "application/json"
#: requests a pipelining client sends at a time
PIPELINE_DEPTH = 4


# ------------------------------------------------------------------ the server


class _Remote:
    """A server already running at a loopback URL (nothing to start or stop)."""

    def __init__(self, url: str) -> None:
        from urllib.parse import urlsplit

        u = urlsplit(url)
        if u.hostname not in ("127.0.0.1", "localhost"):
            raise SystemExit(f"loadtest: --url must be on 127.0.0.1, not {u.hostname}")
        self.port = u.port or 80
        self.proc = None

    def stop(self) -> None:
        pass


# ------------------------------------------------------------------ the mix


@dataclass(frozen=True)
class Req:
    name: str
    method: str
    path: str
    body: bytes | None
    content_type: str | None
    valid: bool
    weight: int


def _json(doc: object) -> bytes:
    return json.dumps(doc, ensure_ascii=False).encode()


MIX: list[Req] = [
    Req("trace-cat", "POST", "/trace", _json({"sentence": "the cat sat", "d_model": 24, "num_heads": 4}), JSON, True, 8),
    Req("trace-causal-64", "POST", "/trace",
        _json({"sentence": "the quick brown fox jumps over the lazy dog " * 3, "d_model": 64, "num_heads": 8,
               "causal": True}), JSON, True, 4),
    Req("trace-tokens-weights", "POST", "/trace",
        _json({"tokens": [f"x{i}" for i in range(32)], "d_model": 32, "num_heads": 4, "stages": ["weights"]}),
        JSON, True, 4),
    Req("trace-parameters", "POST", "/trace",
        _json({"sentence": "the cat sat", "d_model": 48, "num_heads": 6, "include_parameters": True, "seed": 7}),
        JSON, True, 3),
    Req("trace-unicode", "POST", "/trace",
        _json({"sentence": "Café 👩‍💻 你好, שלום! cafe\u0301", "d_model": 16, "num_heads": 2, "scale": False}),
        JSON, True, 3),
    Req("trace-128-tokens", "POST", "/trace",
        _json({"tokens": [f"w{i}" for i in range(128)], "d_model": 128, "num_heads": 8, "seed": 3}), JSON, True, 1),
    Req("health", "GET", "/health", None, None, True, 3),
    Req("version", "GET", "/version", None, None, True, 1),
    Req("422-head-division", "POST", "/trace", _json({"sentence": "the cat sat", "num_heads": 5}), JSON, False, 2),
    Req("422-unknown-field", "POST", "/trace", _json({"sentence": "a", "dmodel": 24}), JSON, False, 2),
    Req("422-whitespace", "POST", "/trace", _json({"sentence": " \t "}), JSON, False, 1),
    Req("400-malformed", "POST", "/trace", b'{"sentence": "the cat', JSON, False, 2),
    Req("400-lone-surrogate", "POST", "/trace", b'{"sentence": "a \\ud800"}', JSON, False, 1),
    Req("415-text-plain", "POST", "/trace", b'{"sentence": "a"}', "text/plain", False, 1),
    Req("404-nope", "GET", "/nope", None, None, False, 1),
    Req("405-get-trace", "GET", "/trace", None, None, False, 1),
]


def agrees(want: tuple[int, bytes], got: tuple[int, bytes]) -> bool:
    """Same status and bytes, or, for JSON, the same structure with the numbers within 1e-12 of their scale."""
    if want == got:
        return True
    if want[0] != got[0]:
        return False
    if str(ROOT / "tests") not in sys.path:  # once, not once per request compared
        sys.path.insert(0, str(ROOT / "tests"))
    from answer_values import document_differences  # type: ignore[import-not-found]  # tests/, on sys.path above

    try:
        return not document_differences(json.loads(want[1]), json.loads(got[1]))
    except ValueError:  # not JSON: bytes only
        return False


def references(mix: list[Req]) -> dict[str, tuple[int, bytes]]:
    """Each request's (status, body), computed in-process on a fresh app."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from service import create_app

    client = create_app().test_client()
    out = {}
    for r in mix:
        kw: dict[str, Any] = {"data": r.body} if r.body is not None else {}
        if r.content_type:
            kw["content_type"] = r.content_type
        resp = client.open(r.path, method=r.method, **kw)
        if r.valid != (resp.status_code < 400):
            raise SystemExit(f"mix entry {r.name} answered {resp.status_code} in-process")
        out[r.name] = (resp.status_code, resp.get_data())
    return out


# ------------------------------------------------------------------ running


@dataclass
class Result:
    name: str
    valid: bool
    start: float
    end: float
    status: int | None = None
    error: str | None = None  # "timeout" or "connection: <ExceptionName>"
    identical: bool | None = None
    id_echoed: bool | None = None


def send(port: int, r: Req, request_id: str, timeout: float) -> tuple[int, bytes, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"X-Request-ID": request_id, "Connection": "close"}
        if r.content_type:
            headers["Content-Type"] = r.content_type
        conn.request(r.method, r.path, body=r.body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(), resp.getheader("X-Request-ID", "")
    finally:
        conn.close()


class KeptAlive:
    """One kept-alive HTTP/1.1 connection (a raw socket, so that requests can be pipelined)."""

    def __init__(self, port: int, timeout: float) -> None:
        self.port = port
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.file: BinaryIO | None = None
        self.connections = 0

    def _usable(self) -> bool:
        import select

        if self.sock is None:
            return False
        readable, _, _ = select.select([self.sock], [], [], 0)
        return not readable  # readable while idle: the server has closed it

    def close(self) -> None:
        if self.sock is not None:
            cast(BinaryIO, self.file).close()  # opened with the socket
            self.sock.close()
        self.sock = self.file = None

    @staticmethod
    def request_bytes(r: Req, request_id: str) -> bytes:
        lines = [f"{r.method} {r.path} HTTP/1.1", "Host: 127.0.0.1", f"X-Request-ID: {request_id}"]
        if r.content_type:
            lines.append(f"Content-Type: {r.content_type}")
        if r.body is not None:
            lines.append(f"Content-Length: {len(r.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + (r.body or b"")

    def _response(self) -> tuple[int, bytes, str, bool]:
        file = cast(BinaryIO, self.file)  # connected by exchange()
        line = file.readline()
        if not line:
            raise ConnectionError("no answer on a kept-alive connection")
        status = int(line.split()[1])
        headers: dict[str, str] = {}
        while (h := file.readline()) not in (b"\r\n", b""):
            name, _, value = h.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while (size := int(file.readline().split(b";")[0], 16)):
                body += file.read(size)
                file.readline()
            while file.readline() not in (b"\r\n", b""):
                pass
        else:
            body = file.read(int(headers.get("content-length", "0")))
        return status, body, headers.get("x-request-id", ""), headers.get("connection", "").lower() == "close"

    def exchange(self, batch: list[tuple[Req, str]]) -> list[tuple[int, bytes, str] | Exception]:
        """Send the batch at once (pipelined when more than one) and read the answers in order."""
        out: list[tuple[int, bytes, str] | Exception] = []
        if not self._usable():
            self.close()
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout)
            self.file = self.sock.makefile("rb")
            self.connections += 1
        try:
            cast(socket.socket, self.sock).sendall(b"".join(self.request_bytes(r, rid) for r, rid in batch))
            for _ in batch:
                status, body, echoed, close = self._response()
                out.append((status, body, echoed))
                if close:
                    break
        except (OSError, ValueError, IndexError) as e:
            out.append(e if isinstance(e, OSError) else ConnectionError(f"bad answer: {e}"))
        if len(out) < len(batch) or isinstance(out[-1], Exception) or close:
            self.close()
        while len(out) < len(batch):  # sent, never answered (after a "close", or the connection ended)
            out.append(ConnectionError("no answer on a kept-alive connection"))
        return out


def kept_alive_loop(port: int, mix: list[Req], refs: dict[str, tuple[int, bytes]], seed: int, deadline: float,
                    timeout: float, out: list[Result], depth: int = 1) -> None:
    """A kept-alive client: `depth` requests at a time (pipelined when more than 1)."""
    rng = random.Random(seed)
    weights = [r.weight for r in mix]
    conn = KeptAlive(port, timeout)
    seq = 0
    try:
        while time.monotonic() < deadline:
            batch = []
            for _ in range(depth):
                seq += 1
                batch.append((rng.choices(mix, weights)[0], f"lt-{seed}-{seq}"))
            start = time.monotonic()
            got = conn.exchange(batch)
            end = time.monotonic()
            for (r, rid), answer in zip(batch, got):
                res = Result(r.name, r.valid, start, end)
                if isinstance(answer, TimeoutError):
                    res.error = "timeout"
                elif isinstance(answer, Exception):
                    res.error = f"connection: {type(answer).__name__}"
                else:
                    status, body, echoed = answer
                    res.status = status
                    res.identical = (status, body) == refs[r.name]
                    res.id_echoed = echoed == rid
                out.append(res)
    finally:
        conn.close()


def client_loop(port: int, mix: list[Req], refs: dict[str, tuple[int, bytes]], seed: int, deadline: float,
                timeout: float, out: list[Result], interval: float = 0.0) -> None:
    rng = random.Random(seed)
    weights = [r.weight for r in mix]
    seq = 0
    next_at = time.monotonic()
    while time.monotonic() < deadline:
        if interval:  # a paced client (under a proxy's per-address rate limit)
            time.sleep(max(0.0, next_at - time.monotonic()))
            # no catching up after a slow answer (a retry on another replica takes seconds): a burst of the
            # requests not sent meanwhile would break the very rate limit the pacing keeps to
            next_at = max(next_at + interval, time.monotonic())
        r = rng.choices(mix, weights)[0]
        seq += 1
        rid = f"lt-{seed}-{seq}"
        res = Result(r.name, r.valid, time.monotonic(), 0.0)
        try:
            status, body, echoed = send(port, r, rid, timeout)
            res.status = status
            res.identical = (status, body) == refs[r.name]
            res.id_echoed = echoed == rid
        except TimeoutError:
            res.error = "timeout"
        except (OSError, http.client.HTTPException) as e:
            res.error = f"connection: {type(e).__name__}"
        res.end = time.monotonic()
        out.append(res)


@dataclass
class KillOutcome:
    killed_pid: int | None = None
    at_s: float | None = None
    replacement_pid: int | None = None
    replaced_after_s: float | None = None
    workers_before: list[int] = field(default_factory=list)
    workers_after: list[int] = field(default_factory=list)
    failed_in_flight: int = 0


def killer(server: Gunicorn, at: float, t0: float, outcome: KillOutcome, stop: threading.Event) -> None:
    if stop.wait(max(0.0, t0 + at - time.monotonic())):
        return
    before = server.worker_pids()
    outcome.workers_before = before
    victim = before[0]
    outcome.killed_pid = victim
    outcome.at_s = time.monotonic() - t0
    os.kill(victim, signal.SIGKILL)  # by PID: one worker, nothing else
    while not stop.is_set():
        now = server.worker_pids()
        new = [p for p in now if p not in before]
        if new and len(now) == len(before) and victim not in now:
            outcome.replacement_pid = new[0]
            outcome.replaced_after_s = time.monotonic() - t0 - outcome.at_s
            outcome.workers_after = now
            return
        time.sleep(0.05)


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def run(duration: float = 30.0, threads: int = 8, workers: int = 2, kill_worker: bool = False, kill_at: float = 0.5,
        timeout: float = 30.0, seed: int = 1, env: dict[str, str] | None = None, url: str | None = None,
        rate: float | None = None, keepalive: int = 0, pipeline: int = 0, max_requests: int | None = None) -> dict:
    """Run the load test and return the report as a dict (see main() for the printout).

    With `url` (loopback only), the load goes to a server running already (the
    deploy recipes: scripts/deploy-check), and nothing is started or killed here."""
    refs = references(MIX)
    if max_requests is not None:
        env = {**(env or {}), "GUNICORN_MAX_REQUESTS": str(max_requests)}
    # a _Remote (a port and stop() only) when url is given: every other use is under `url is None`
    server: Any = Gunicorn(workers=workers, env=env, log_name="loadtest") if url is None else _Remote(url)
    if url is not None:
        # A server running already may be another machine's build: /version names its Python, and its
        # OpenBLAS may run another kernel than this process (numbers then differ in the last bits). Its
        # references are its own first answers, each checked against this process's: the same structure,
        # the numbers within 1e-12 of their scale (docs/engine.md, "Versions and reproducibility").
        local = refs
        refs = {}
        for r in MIX:
            if rate:  # within the rate asked for: a proxy's per-address limits count these too
                time.sleep(1.0 / rate)
            status, body, _ = send(server.port, r, f"lt-ref-{r.name}", timeout)
            refs[r.name] = (status, body)
            if r.name != "version" and not agrees(local[r.name], (status, body)):
                raise SystemExit(f"the server's answer to {r.name} disagrees with this process's")
    results: list[list[Result]] = [[] for _ in range(threads + keepalive + pipeline)]
    outcome = KillOutcome()
    stop = threading.Event()
    try:
        t0 = time.monotonic()
        deadline = t0 + duration
        clients = [threading.Thread(target=client_loop, args=(server.port, MIX, refs, seed * 1000 + i, deadline,
                                                               timeout, results[i], threads / rate if rate else 0.0),
                                    daemon=True)
                   for i in range(threads)]
        clients += [threading.Thread(target=kept_alive_loop,
                                     args=(server.port, MIX, refs, seed * 1000 + threads + i, deadline, timeout,
                                           results[threads + i], 1 if i < keepalive else PIPELINE_DEPTH),
                                     daemon=True)
                    for i in range(keepalive + pipeline)]
        kt = threading.Thread(target=killer, args=(server, duration * kill_at, t0, outcome, stop), daemon=True)
        for c in clients:
            c.start()
        if kill_worker:
            kt.start()
        for c in clients:
            c.join(duration + timeout + 10)
        elapsed = time.monotonic() - t0
        if kill_worker:
            kt.join(10)
        stop.set()
        # A worker recycled by max_requests (or killed) just before the end may still be booting: the master
        # must be back to its count within a deadline, not at this very instant.
        workers_at_end = server.worker_pids() if url is None else []
        settle = time.monotonic() + 15
        while url is None and len(workers_at_end) != workers and time.monotonic() < settle:
            time.sleep(0.1)
            workers_at_end = server.worker_pids()
        log = server.log_text() if url is None else ""
    finally:
        stop.set()
        server.stop()

    flat = [r for rs in results for r in rs]
    kill_t = t0 + outcome.at_s if outcome.at_s is not None else None
    errors = [r for r in flat if r.error]
    in_flight = [r for r in errors if kill_t is not None and (r.error or "").startswith("connection")
                 and r.start <= kill_t + 0.05 and r.end >= kill_t]
    outcome.failed_in_flight = len(in_flight)
    other_errors = [r for r in errors if r not in in_flight]
    answered = [r for r in flat if r.status is not None]
    lat = sorted((r.end - r.start) * 1000 for r in answered)
    lat_valid = sorted((r.end - r.start) * 1000 for r in answered if r.valid)
    by_name: dict[str, dict[str, int]] = {}
    for res in flat:
        d = by_name.setdefault(res.name, {"sent": 0, "answered": 0, "identical": 0})
        d["sent"] += 1
        d["answered"] += res.status is not None
        d["identical"] += bool(res.identical)
    report = {
        "command": {"duration_s": duration, "threads": threads, "keepalive": keepalive, "pipeline": pipeline,
                    "workers": workers, "max_requests": max_requests, "kill_worker": kill_worker,
                    "kill_at": kill_at, "timeout_s": timeout, "seed": seed},
        "elapsed_s": round(elapsed, 3),
        "requests_sent": len(flat),
        "answered": len(answered),
        "valid_sent": sum(r.valid for r in flat),
        "invalid_sent": sum(not r.valid for r in flat),
        "status_5xx": sum(1 for r in answered if (r.status or 0) >= 500),
        "timeouts": sum(1 for r in errors if r.error == "timeout"),
        "connection_errors": sum(1 for r in errors if (r.error or "").startswith("connection")),
        "connection_errors_in_flight_at_kill": len(in_flight),
        "unexplained_errors": len(other_errors),
        "error_kinds": sorted({r.error or "" for r in errors}),
        "not_identical": sum(1 for r in answered if not r.identical),
        "not_identical_valid": sum(1 for r in answered if r.valid and not r.identical),
        "not_identical_examples": sorted({(r.name, r.status) for r in answered if not r.identical})[:10],
        "request_id_not_echoed": sum(1 for r in answered if not r.id_echoed),
        "throughput_rps": round(len(answered) / elapsed, 1),
        "latency_ms": {"p50": round(percentile(lat, 50), 2), "p90": round(percentile(lat, 90), 2),
                       "p99": round(percentile(lat, 99), 2), "max": round(lat[-1], 2) if lat else None},
        "latency_valid_ms": {"p50": round(percentile(lat_valid, 50), 2), "p99": round(percentile(lat_valid, 99), 2)},
        "by_request": by_name,
        "kill": asdict(outcome) if kill_worker else None,
        "workers_at_end": len(workers_at_end),
        "log_5xx_lines": sum(1 for line in log.splitlines() if line.startswith("{") and '"status":5' in line),
        "log_sigkill_seen": "was sent SIGKILL" in log,
        "workers_recycled": log.count("Autorestarting worker"),
    }
    problems = []
    if report["status_5xx"]:
        problems.append(f"{report['status_5xx']} responses were 5xx")
    if report["timeouts"]:
        problems.append(f"{report['timeouts']} requests timed out")
    if other_errors:
        problems.append(f"{len(other_errors)} connection errors not explained by the kill: {report['error_kinds']}")
    if report["not_identical"]:
        problems.append(f"{report['not_identical']} answers differ from their reference")
    if report["request_id_not_echoed"]:
        problems.append(f"{report['request_id_not_echoed']} answers did not echo X-Request-ID")
    if kill_worker:
        if outcome.replacement_pid is None:
            problems.append("the killed worker was not replaced")
        most = threads + keepalive + pipeline * PIPELINE_DEPTH
        if len(in_flight) > most:
            problems.append(f"{len(in_flight)} requests failed at the kill; the clients have at most {most} in flight")
    if url is None and report["workers_at_end"] != workers:
        problems.append(f"{report['workers_at_end']} workers at the end, expected {workers}")
    if not answered:
        problems.append("no request was answered")
    report["problems"] = problems
    report["passed"] = not problems
    # under the repository (artifacts/) or wherever ATTENTION_TRACE_ARTIFACTS points (the test suite's temp dir)
    report["log"] = None if url is not None else shown(server.log)
    report["target"] = url or "gunicorn started here"
    return report


def print_report(rep: dict) -> None:
    c = rep["command"]
    print(f"attention-trace load test: {c['threads']} client threads, {c.get('keepalive', 0)} kept-alive, "
          f"{c.get('pipeline', 0)} pipelining {PIPELINE_DEPTH} at a time, {c['workers']} gunicorn workers, "
          f"{c['duration_s']:g} s{', SIGKILL one worker at ' + format(c['kill_at'], '.0%') if c['kill_worker'] else ''}"
          + (f", workers recycled every {c['max_requests']} requests" if c.get("max_requests") else ""))
    print(f"  requests sent        {rep['requests_sent']} ({rep['valid_sent']} valid, {rep['invalid_sent']} invalid)"
          f" in {rep['elapsed_s']} s")
    print(f"  answered             {rep['answered']}")
    print(f"  throughput           {rep['throughput_rps']} requests/s")
    lat = rep["latency_ms"]
    print(f"  latency (all)        p50 {lat['p50']} ms, p90 {lat['p90']} ms, p99 {lat['p99']} ms, max {lat['max']} ms")
    lv = rep["latency_valid_ms"]
    print(f"  latency (valid)      p50 {lv['p50']} ms, p99 {lv['p99']} ms")
    print(f"  5xx                  {rep['status_5xx']}")
    print(f"  timeouts             {rep['timeouts']}")
    print(f"  connection errors    {rep['connection_errors']} "
          f"({rep['connection_errors_in_flight_at_kill']} in flight on the killed worker)")
    print(f"  not byte-identical   {rep['not_identical']} ({rep['not_identical_valid']} of them valid requests)"
          + (f": {rep['not_identical_examples']}" if rep["not_identical"] else ""))
    print(f"  X-Request-ID missing {rep['request_id_not_echoed']}")
    if rep["kill"]:
        k = rep["kill"]
        print(f"  worker kill          SIGKILL pid {k['killed_pid']} at {k['at_s']:.2f} s; "
              f"replaced by pid {k['replacement_pid']} after "
              f"{'%.2f s' % k['replaced_after_s'] if k['replaced_after_s'] is not None else 'NEVER'}; "
              f"{k['failed_in_flight']} request(s) in flight on it failed")
    print(f"  workers at the end   {rep['workers_at_end']}"
          + (f" ({rep['workers_recycled']} recycled by max_requests)" if rep.get("workers_recycled") else ""))
    print("  per request          " + ", ".join(f"{n} {d['sent']}" for n, d in sorted(rep["by_request"].items())))
    print(f"  gunicorn log         {rep['log']}")
    print("PASS" if rep["passed"] else "FAIL: " + "; ".join(rep["problems"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of load (default 30)")
    ap.add_argument("--threads", type=int, default=8, help="client threads, one request a connection (default 8)")
    ap.add_argument("--keepalive", type=int, default=4, help="kept-alive client threads (default 4)")
    ap.add_argument("--pipeline", type=int, default=1,
                    help=f"client threads pipelining {PIPELINE_DEPTH} requests at a time (default 1)")
    ap.add_argument("--max-requests", type=int, help="recycle each worker after this many requests "
                    "(GUNICORN_MAX_REQUESTS; default: the committed config's)")
    ap.add_argument("--workers", type=int, default=2, help="gunicorn workers (default 2)")
    ap.add_argument("--kill-worker", action="store_true", help="SIGKILL one worker by PID mid-run")
    ap.add_argument("--kill-at", type=float, default=0.5, help="when to kill, as a fraction of the run (default 0.5)")
    ap.add_argument("--timeout", type=float, default=30.0, help="per-request client timeout in seconds (default 30)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the request mix (default 1)")
    ap.add_argument("--json", type=Path, help="also write the report as JSON here")
    ap.add_argument("--url", help="load a server running already at this 127.0.0.1 URL (no gunicorn started)")
    ap.add_argument("--rate", type=float, help="requests per second in all (paced; default: as fast as answered)")
    args = ap.parse_args(argv)
    if not (0 < args.duration <= 3600 and 0 <= args.threads <= 64 and 1 <= args.workers <= 16
            and 0 <= args.keepalive <= 64 and 0 <= args.pipeline <= 64
            and 0 < args.threads + args.keepalive + args.pipeline):
        ap.error("duration must be in (0, 3600], threads, keepalive and pipeline in [0, 64] (not all 0), "
                 "workers in [1, 16]")
    rep = run(duration=args.duration, threads=args.threads, workers=args.workers, kill_worker=args.kill_worker,
              kill_at=args.kill_at, timeout=args.timeout, seed=args.seed, url=args.url, rate=args.rate,
              keepalive=args.keepalive, pipeline=args.pipeline, max_requests=args.max_requests)
    print_report(rep)
    if args.json:
        args.json.write_text(json.dumps(rep, indent=2) + "\n")
    return 0 if rep["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
