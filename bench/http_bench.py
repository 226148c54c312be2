"""The HTTP measurement kit: real gunicorn, a load generator, and rounds of runs (section 6, the guard).

``Server`` is tools/server.py's gunicorn on a free loopback port, serving
``bench.wsgi:app`` under the committed ``gunicorn.conf.py`` (or a plain app
under gunicorn's defaults), with what the suite reads from it: gunicorn's own
request times and the workers' CPU.

Load generator: wrk (Debian package ``wrk``) with ``bench/post.lua``. It is C
and epoll: on a 2-core machine the client shares the cores with the server,
and wrk spends a few µs of CPU per request where a Python client spends
~100 µs under the GIL: as much as a whole small trace, which would hide the
very overhead S measures. It keeps ``-c`` connections busy (closed loop,
bounded by ``-d``), reconnects whenever the server closes a connection (the
sync worker closes each after its answer), and reports latency percentiles.
Where wrk is missing, a Python client (threads, ``http.client``, a new
connection per request) stands in, and the table says so.

Server time is gunicorn's own: the access log's ``duration_us`` (request
parsed → response written) of the requests tagged with that run's
X-Request-ID.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import shutil
import statistics
import subprocess
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from tools.server import Gunicorn


_TICKS = os.sysconf("SC_CLK_TCK")
LUA = Path(__file__).resolve().parent / "post.lua"


class Server(Gunicorn):
    """tools.server's gunicorn serving ``bench.wsgi:app`` on 127.0.0.1 (the committed gunicorn.conf.py),
    with what the benchmark reads from it: gunicorn's own request times, the workers' CPU.

    ``args`` go on gunicorn's command line after the config, where they override it (``-k sync`` runs
    the same config and app under another worker class). ``plain=True`` starts gunicorn with none of the
    project's configuration: its defaults, the bind address and ``args`` only, run from ``static_dir`` so
    that gunicorn does not find gunicorn.conf.py in its working directory (``app`` then names a module
    importable from the repository root, e.g. ``bench.floor_app:app``). The worker count is the config's
    (or ``env``'s WEB_CONCURRENCY, or ``args``'), not waited for: ready when /health answers.
    """

    #: keep each server's log in artifacts/ after a clean stop (bench.run --keep-logs)
    keep_logs = False

    def __init__(self, static_dir: Path, env: dict[str, str] | None = None, label: str = "",
                 args: list[str] | tuple[str, ...] = (), app: str = "bench.wsgi:app", plain: bool = False) -> None:
        self.label = label
        super().__init__(workers=None, env={"BENCH_STATIC_DIR": str(static_dir), **(env or {})}, app=app,
                         args=args, config=None if plain else "gunicorn.conf.py", cwd=static_dir if plain else None,
                         log_name="bench-gunicorn")

    def get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=60) as r:
            return r.read()

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "X-Request-ID": "bench-check"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()

    def server_times(self, request_id: str) -> list[float]:
        """gunicorn's duration (s) of each request logged with this X-Request-ID."""
        self._log.flush()
        out = []
        with self.log.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("{") and f'"request_id":"{request_id}"' in line:
                    try:
                        out.append(json.loads(line)["duration_us"] / 1e6)
                    except (ValueError, KeyError):
                        pass
        return out

    def cpu_seconds(self) -> float:
        """User + system CPU time used so far by the workers (not the client, not the master's own),
        replaced ones included: gunicorn replaces a worker every ~20,000 requests (max_requests), and
        the kernel adds a reaped worker's time to the master's cutime/cstime. Counting only the live
        workers lost a replaced one's time, so a run with a replacement came out negative."""
        master = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total = int(master[13]) + int(master[14])  # cutime, cstime: the reaped workers', in clock ticks
        for pid in self.worker_pids(live=False):  # an exited worker not yet reaped: its time is still its own
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime in clock ticks
        return total / _TICKS


@dataclass
class Run:
    requests: int
    duration_s: float
    p50_s: float
    p99_s: float
    errors: int
    server_s: list[float] = field(default_factory=list)
    cpu_s: float = 0.0  # the workers' CPU seconds during the run

    @property
    def cpu_per_request_s(self) -> float | None:
        return self.cpu_s / self.requests if self.requests else None

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0

    @property
    def server_median_s(self) -> float | None:
        return statistics.median(self.server_s) if self.server_s else None


class LoadGenerator:
    """wrk when installed, else a Python client; both closed-loop and bounded by duration."""

    def __init__(self, force_python: bool = False) -> None:
        self.wrk = None if force_python else shutil.which("wrk")

    @property
    def name(self) -> str:
        return "wrk (bench/post.lua), 1 thread" if self.wrk else "Python client (threads, http.client)"

    def run(self, server: Server, path: str, body_file: Path, conns: int, duration_s: float, tag: str,
            accept: str | None = None) -> Run:
        cpu0 = server.cpu_seconds()
        if self.wrk:
            r = self._wrk(server.url + path, body_file, conns, duration_s, tag, accept)
        else:
            r = self._python(server.url + path, body_file.read_bytes(), conns, duration_s, tag, accept)
        time.sleep(0.05)  # let the access log reach the file, and the last response finish
        r.cpu_s = server.cpu_seconds() - cpu0
        r.server_s = server.server_times(tag)
        return r

    _runs = 0

    def _next_n0(self) -> int:
        LoadGenerator._runs += 1
        return LoadGenerator._runs * 10_000_000  # __N__ never repeats across the runs of a suite

    def _wrk(self, url: str, body_file: Path, conns: int, duration_s: float, tag: str,
             accept: str | None = None) -> Run:
        env = {**os.environ, "BENCH_BODY_FILE": str(body_file), "BENCH_REQUEST_ID": tag,
               "BENCH_N0": str(self._next_n0()), "BENCH_ACCEPT": accept or ""}
        secs = max(1, math.ceil(duration_s))
        cmd = [cast(str, self.wrk), "-t1", f"-c{conns}", f"-d{secs}s", "--timeout", "60s", "-s", str(LUA), url]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=secs + 120, check=False)
        line = next((x for x in p.stdout.splitlines() if x.startswith("BENCH_RESULT ")), None)
        if line is None:
            raise RuntimeError(f"wrk failed ({p.returncode}): {p.stdout[-500:]} {p.stderr[-500:]}")
        d = json.loads(line.split(" ", 1)[1])
        # connect/read errors count sockets the server closed, which gunicorn sync does after every
        # response; only status (non-2xx/3xx), write and timeout errors are failures.
        return Run(d["requests"], d["duration_us"] / 1e6, d["p50_us"] / 1e6, d["p99_us"] / 1e6,
                   d["status"] + d["write"] + d["timeout"])

    def _python(self, url: str, body: bytes, conns: int, duration_s: float, tag: str,
                accept: str | None = None) -> Run:
        host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
        path = "/" + url.split("//", 1)[1].split("/", 1)[1]
        lat: list[float] = []
        errors = [0]
        lock = threading.Lock()
        counter = iter(range(self._next_n0() + 1, 1 << 62))
        deadline = time.perf_counter() + duration_s
        headers = {"Content-Type": "application/json", "X-Request-ID": tag, "Connection": "close"}
        if accept:
            headers["Accept"] = accept

        def worker() -> None:
            mine = []
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                try:
                    c = http.client.HTTPConnection(host, int(port), timeout=60)
                    data = body.replace(b"__N__", str(next(counter)).encode()) if b"__N__" in body else body
                    c.request("POST", path, data, headers)
                    resp = c.getresponse()
                    resp.read()
                    c.close()
                    ok = resp.status == 200
                except OSError:
                    ok = False
                mine.append(time.perf_counter() - t0)
                if not ok:
                    with lock:
                        errors[0] += 1
            with lock:
                lat.extend(mine)

        start = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(conns)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.perf_counter() - start
        lat.sort()
        pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]) if lat else (lambda q: 0.0)
        return Run(len(lat), took, pct(0.50), pct(0.99), errors[0])


# ------------------------------------------------------------------ set-up


@dataclass
class Fixture:
    """Request bodies and pre-encoded responses on disk, shared by the server and the client."""

    dir: Path
    responses: dict[str, bytes]

    def request_file(self, name: str) -> Path:
        return self.dir / f"{name}.req"


# ------------------------------------------------------------------ rounds


def _med(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _summ(runs: list[Run]) -> dict[str, Any]:
    server = [t for r in runs for t in r.server_s]
    reqs = sum(r.requests for r in runs)
    return {
        "rps": _med([r.rps for r in runs]),
        "p50_s": _med([r.p50_s for r in runs]),
        "p99_s": _med([r.p99_s for r in runs]),
        "server_s": statistics.median(server) if server else None,
        "cpu_per_request_s": (sum(r.cpu_s for r in runs) / reqs) if reqs else None,
        "requests": reqs,
        "errors": sum(r.errors for r in runs),
    }


def paired_rounds(gen: LoadGenerator, server: Server, fixture: Fixture, name: str, paths: dict[str, str],
                  rounds: int, dur: float, conns: int, tag: str) -> dict[str, list[Run]]:
    """Run each path once per round, alternating which goes first; one list of runs per path."""
    runs: dict[str, list[Run]] = {k: [] for k in paths}
    for r in range(rounds):
        order = list(paths.items()) if r % 2 == 0 else list(reversed(paths.items()))
        for kind, path in order:
            runs[kind].append(gen.run(server, path, fixture.request_file(name), conns, dur, f"{tag}-{kind}"))
    return runs


def round_ratios(a: list[Run], b: list[Run]) -> list[float]:
    """Each round's back-to-back req/s ratio a / b (rounds where b answered nothing left out)."""
    return [x.rps / y.rps for x, y in zip(a, b, strict=True) if y.rps]


def rps_ratio(a: list[Run], b: list[Run]) -> float | None:
    """The median over rounds of each round's back-to-back req/s ratio a / b."""
    return _med(round_ratios(a, b))


def check_rounds(server: Server, gen: LoadGenerator, fixture: Fixture, rounds: int, duration_s: float, conns: int,
                 tag: str) -> dict[str, list[Run]]:
    """/trace S (request file S.req) and /check S (check.req) in interleaved rounds, alternating which goes first."""
    runs: dict[str, list[Run]] = {"trace": [], "check": []}
    for r in range(rounds):
        order = [("trace", "S", "/trace"), ("check", "check", "/check")]
        for kind, name, path in order if r % 2 == 0 else list(reversed(order)):
            runs[kind].append(gen.run(server, path, fixture.request_file(name), conns, duration_s, f"{tag}-{kind}"))
    return runs
