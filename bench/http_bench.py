"""Sections 3 and 4: HTTP throughput and latency under real gunicorn, BLAS threads, and token scaling.

The server is real gunicorn with the committed ``gunicorn.conf.py`` on a free
loopback port, serving ``bench.wsgi:app``: the service's production app plus
``/bench/static/<name>``, which answers the pre-encoded bytes of the same
workload's response. Trace and static floor run on the same server, config
and Flask app, interleaved round by round, so their ratio is the cost of the
work above the framework's floor.

Load generator: wrk (Debian package ``wrk``) with ``bench/post.lua``. It is C
and epoll: on a 2-core machine the client shares the cores with the server,
and wrk spends a few µs of CPU per request where a Python client spends
~100 µs under the GIL: as much as a whole small trace, which would hide the
very overhead S measures. It keeps ``-c`` connections busy (closed loop,
bounded by ``-d``), reconnects whenever the server closes a connection
(after GUNICORN_KEEPALIVE_REQUESTS), and reports latency percentiles. Where
wrk is missing, a Python client (threads, ``http.client``, a new connection
per request) stands in, and the table says so.

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
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from tools.server import Gunicorn

from .common import Table, cpus, fmt_bytes, fmt_ratio, fmt_time
from .workloads import Workload

_TICKS = os.sysconf("SC_CLK_TCK")
LUA = Path(__file__).resolve().parent / "post.lua"


class Server(Gunicorn):
    """tools.server's gunicorn serving ``bench.wsgi:app`` on 127.0.0.1 (the committed gunicorn.conf.py),
    with what the benchmark reads from it: /bench/blas, gunicorn's own request times, the workers' CPU.

    ``args`` go on gunicorn's command line after the config, where they override it (``-k sync`` runs
    the same config and app under a stock worker class). ``plain=True`` starts gunicorn with none of the
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

    def workers_blas(self, tries: int = 12) -> list[dict[str, Any]]:
        """Ask /bench/blas on new connections until every worker has answered (or give up)."""
        seen: dict[int, dict[str, Any]] = {}
        for _ in range(tries):
            doc = json.loads(self.get("/bench/blas"))
            seen[doc["pid"]] = doc
        return list(seen.values())

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


def make_fixture(workloads: list[Workload], responses: dict[str, bytes]) -> Fixture:
    d = Path(tempfile.mkdtemp(prefix="attention-trace-bench-"))
    for w in workloads:
        (d / f"{w.name}.req").write_bytes(w.body_bytes)
        if w.name in responses:
            (d / f"{w.name}.json").write_bytes(responses[w.name])
    return Fixture(d, responses)


def check_server(server: Server, fixture: Fixture, workloads: list[Workload], static: bool = True) -> list[str]:
    """One request each before any load: 200, and the bytes the bench process rendered."""
    notes = []
    for w in workloads:
        body = fixture.request_file(w.name).read_bytes()
        varies = b"__N__" in body
        body = body.replace(b"__N__", b"0")
        status, got = server.post("/trace", body)
        want = None if varies else fixture.responses.get(w.name)
        if status != 200:
            raise RuntimeError(f"/trace answered {status} for {w.name}")
        if want is not None and got != want:
            notes.append(f"{w.name}: the server's /trace bytes differ from the bench process's render "
                         f"({len(got):,} vs {len(want):,} bytes)")
        if static:
            status, s = server.post(f"/bench/static/{w.name}", body)
            if status != 200 or abs(len(s) - len(got)) > (32 if varies else 0):
                raise RuntimeError(f"/bench/static/{w.name} answered {status}, {len(s):,} bytes, "
                                   f"not the trace's {len(got):,}")
    return notes


# ------------------------------------------------------------------ section 3


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


def duration_for(w: Workload, base: float) -> float:
    return base * (2 if w.n_tokens >= 200 else 1)  # XL answers a few requests a second: give it more time


def paired_rounds(gen: LoadGenerator, server: Server, fixture: Fixture, name: str, paths: dict[str, str],
                  rounds: int, dur: float, conns: int, tag: str) -> dict[str, list[Run]]:
    """Run each path once per round, alternating which goes first; one list of runs per path."""
    runs: dict[str, list[Run]] = {k: [] for k in paths}
    for r in range(rounds):
        order = list(paths.items()) if r % 2 == 0 else list(reversed(paths.items()))
        for kind, path in order:
            runs[kind].append(gen.run(server, path, fixture.request_file(name), conns, dur, f"{tag}-{kind}"))
    return runs


def run_load(server: Server, gen: LoadGenerator, fixture: Fixture, workloads: list[Workload], rounds: int,
             duration_s: float, conns: int, results: dict[str, Any]) -> Table:
    table = Table(
        f"3. HTTP under load: gunicorn, committed config ({cpus()} service.worker workers), {conns} connections, "
        "closed loop; "
        f"trace and its static-body floor interleaved, {rounds} round(s) each",
        ["workload", "response", "trace req/s", "floor req/s", "trace / floor", "trace p50", "trace p99",
         "floor p50", "floor p99", "worker CPU / request (trace)", "(floor)", "requests (trace/floor)"],
    )
    for w in workloads:
        runs = paired_rounds(gen, server, fixture, w.name, {"trace": "/trace", "floor": f"/bench/static/{w.name}"},
                             rounds, duration_for(w, duration_s), conns, f"load-{w.name}")
        t, f = _summ(runs["trace"]), _summ(runs["floor"])
        # the ratio of each round's pair (measured back to back), then the median over rounds
        pairs = round_ratios(runs["trace"], runs["floor"])
        ratio = rps_ratio(runs["trace"], runs["floor"])
        results[w.name] = {"trace": t, "floor": f, "rps_ratio": ratio, "round_ratios": pairs}
        errors = t["errors"] + f["errors"]
        table.add(w.name, fmt_bytes(len(fixture.responses[w.name])), f"{t['rps']:.1f}", f"{f['rps']:.1f}",
                  fmt_ratio(ratio), fmt_time(t["p50_s"]), fmt_time(t["p99_s"]), fmt_time(f["p50_s"]),
                  fmt_time(f["p99_s"]), fmt_time(t["cpu_per_request_s"]), fmt_time(f["cpu_per_request_s"]),
                  f"{t['requests']}/{f['requests']}" + (f" ({errors} errors)" if errors else ""))
    table.notes.append(f"load generator: {gen.name}. Floor = /bench/static/<workload> on the same server and app, "
                       "answering that workload's pre-encoded response bytes (same size, checked)")
    table.notes.append("trace / floor = median over rounds of each round's back-to-back req/s ratio; req/s, p50 "
                       "and p99 = medians over rounds; worker CPU / request = the workers' user+system CPU time "
                       "(/proc) over the requests answered")
    return table


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


def run_check(server: Server, gen: LoadGenerator, fixture: Fixture, rounds: int, duration_s: float, conns: int,
              results: dict[str, Any]) -> Table:
    """/check S with a wrong 5-stage submission (bench/guard.py's check_body) against /trace S, interleaved."""
    table = Table(f"3a. /check against /trace at S under load ({conns} connections, {rounds} round(s))",
                  ["request", "req/s", "p50", "p99", "worker CPU / request", "vs /trace S"])
    runs = check_rounds(server, gen, fixture, rounds, duration_s, conns, "check")
    t, c = _summ(runs["trace"]), _summ(runs["check"])
    ratio = rps_ratio(runs["check"], runs["trace"])
    results.update({"trace": t, "check": c, "ratio": ratio})
    for label, d, rel in (("/trace S", t, 1.0), ("/check S, wrong 5-stage submission", c, ratio)):
        table.add(label, f"{d['rps']:.1f}", fmt_time(d["p50_s"]), fmt_time(d["p99_s"]),
                  fmt_time(d["cpu_per_request_s"]), fmt_ratio(rel))
    table.notes.append("the submission is the first known bug's (engine.BUG_NAMES[0]) q, scores, scaled_scores, "
                       "weights and output of the "
                       "causal S trace: /check recomputes the reference, compares, and tries every applicable bug")
    return table


def run_sequential(server: Server, gen: LoadGenerator, fixture: Fixture, workloads: list[Workload],
                   duration_s: float, min_requests: int, results: dict[str, Any], floor: set[str]) -> None:
    """One connection at a time: latency without queueing, server time without contention between workers.

    Each workload runs (with its floor, for those in ``floor``, interleaved) in rounds until every path has
    at least ``min_requests`` requests or 4 rounds have run.
    """
    for w in workloads:
        paths = {"trace": "/trace"}
        if w.name in floor:
            paths["floor"] = f"/bench/static/{w.name}"
        runs: dict[str, list[Run]] = {k: [] for k in paths}
        for _ in range(4):
            got = paired_rounds(gen, server, fixture, w.name, paths, 1, duration_s, 1, f"seq-{w.name}")
            for k, v in got.items():
                runs[k] += v
            if all(sum(r.requests for r in v) >= min_requests for v in runs.values()):
                break
        results[w.name] = {k: _summ(v) for k, v in runs.items()}
        results[w.name]["bytes"] = len(fixture.responses[w.name])


def fit_exponent(xs: Sequence[float], ys: Sequence[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def sequential_table(workloads: list[Workload], seq: dict[str, Any], encode_s: dict[str, float]) -> Table:
    table = Table("3b. One connection at a time (no queueing): server time against the floor and the encoder",
                  ["workload", "response", "client p50", "client p99", "server time (trace)",
                   "server time (floor)", "worker CPU / request", "orjson encode alone", "server time / encode",
                   "requests"])
    for w in workloads:
        t, f = seq[w.name]["trace"], seq[w.name].get("floor", {})
        enc = encode_s.get(w.name)
        table.add(w.name, fmt_bytes(seq[w.name]["bytes"]), fmt_time(t["p50_s"]), fmt_time(t["p99_s"]),
                  fmt_time(t["server_s"]), fmt_time(f.get("server_s")), fmt_time(t["cpu_per_request_s"]),
                  fmt_time(enc), fmt_ratio(t["server_s"] / enc) if enc and t["server_s"] else "–",
                  t["requests"])
    table.notes.append("server time = median of the access log's duration_us: from the request head parsed to "
                       "the answer rendered into the worker's memory (its event loop then sends it as the client "
                       "reads; the floor, the same bytes with no work, shows what is left)")
    table.notes.append("orjson encode alone = section 2's median of service.serialize.dumps on the same document, "
                       "in this process")
    return table


def scaling_table(series: list[Workload], seq: dict[str, Any], results: dict[str, Any]) -> Table:
    w0 = series[0]
    table = Table(
        f"4. Scaling: token count doubling at d_model {w0.d_model}, {w0.num_heads} heads "
        "(one connection; server time = gunicorn's median)",
        ["tokens", "numbers", "response bytes", "server time", "client p50", "worker CPU / request",
         "server time per MB", "per byte / best", "local exponent: time", "local exponent: bytes"],
    )
    ns, times, sizes = [], [], []
    for w in series:
        s = seq[w.name]
        ns.append(w.n_tokens)
        times.append(s["trace"]["server_s"] or s["trace"]["p50_s"])
        sizes.append(s["bytes"])
    per_byte = [t / b for t, b in zip(times, sizes, strict=True)]
    best = min(per_byte)
    for i, w in enumerate(series):
        le_t = le_b = "–"
        if i:
            le_t = f"{math.log(times[i] / times[i - 1], 2):.2f}"
            le_b = f"{math.log(sizes[i] / sizes[i - 1], 2):.2f}"
        t = seq[w.name]["trace"]
        table.add(w.n_tokens, f"{w.numbers:,}", f"{sizes[i]:,}", fmt_time(times[i]), fmt_time(t["p50_s"]),
                  fmt_time(t["cpu_per_request_s"]), fmt_time(per_byte[i] * 1e6), fmt_ratio(per_byte[i] / best),
                  le_t, le_b)
    e_t, e_b = fit_exponent(ns, times), fit_exponent(ns, sizes)
    e_tb = fit_exponent(sizes, times)
    spread = max(per_byte) / best
    results.update({"tokens": ns, "server_s": times, "bytes": sizes, "exponent_time": e_t, "exponent_bytes": e_b,
                    "exponent_time_vs_bytes": e_tb, "per_byte_spread": spread})
    table.notes.append(f"fitted over the series (least squares on logs): time ∝ n^{e_t:.2f}, bytes ∝ n^{e_b:.2f}, "
                       f"time ∝ bytes^{e_tb:.2f}; server time per byte, max / min: {spread:.2f}×")
    table.notes.append("expected: compute O(n·d² + h·n²), bytes O(n·d + h·n²): at d_model 512 and 4 heads the n·d "
                       "terms (9·d per token) outweigh the n² terms (3·h per pair) up to n ≈ 380, so the exponents "
                       "of n sit between 1 and 2 and time should follow bytes (exponent of bytes ≈ 1)")
    return table


def run_blas_threads(fixture: Fixture, gen: LoadGenerator, workloads: list[Workload], rounds: int,
                     duration_s: float, conns: int, results: dict[str, Any]) -> Table:
    """BLAS pinned to 1 thread per worker (the committed default) against 2, same load, interleaved."""
    threads_env = {v: "2" for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    one = Server(fixture.dir, label="1 BLAS thread")
    two = Server(fixture.dir, env=threads_env, label="2 BLAS threads")
    table = Table(
        f"3c. BLAS threads per worker under load ({cpus()} workers, {conns} connections; {rounds} interleaved rounds)",
        ["workload", "BLAS threads (as the workers report)", "req/s", "req/s vs 1 thread", "p50", "p99",
         "p99 vs 1 thread", "worker CPU / request"],
    )
    try:
        seen = {}
        for srv in (one, two):
            infos = srv.workers_blas()
            seen[srv.label] = sorted({b["num_threads"] for i in infos for b in i["blas"]})
        for w in workloads:
            runs: dict[str, list[Run]] = {one.label: [], two.label: []}
            for r in range(rounds):
                for srv in ((one, two) if r % 2 == 0 else (two, one)):
                    runs[srv.label].append(gen.run(srv, "/trace", fixture.request_file(w.name), conns,
                                                   duration_for(w, duration_s), f"blas-{w.name}"))
            base = _summ(runs[one.label])
            results[w.name] = {}
            for srv in (one, two):
                s = _summ(runs[srv.label])
                results[w.name][srv.label] = s
                table.add(w.name, f"{srv.label} ({'/'.join(map(str, seen[srv.label]))})", f"{s['rps']:.1f}",
                          fmt_ratio(s["rps"] / base["rps"]) if base["rps"] else "–",
                          fmt_time(s["p50_s"]), fmt_time(s["p99_s"]),
                          fmt_ratio(s["p99_s"] / base["p99_s"]) if base["p99_s"] else "–",
                          fmt_time(s["cpu_per_request_s"]))
    finally:
        one.stop()
        two.stop()
    table.notes.append("two servers up at once, loaded in turn (the idle one sleeps); the 2-thread server gets "
                       "OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=MKL_NUM_THREADS=2, which gunicorn.conf.py's "
                       "setdefault keeps")
    return table
