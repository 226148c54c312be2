"""Section 6: the server from stock parts, against fixed floors, with nginx in front, from one run.

One run starts, side by side on 127.0.0.1 (each stopped by its PID), every
gunicorn with 2 workers, the response cache off
(``ATTENTION_TRACE_RESPONSE_CACHE_BYTES=0``), so that every request is computed,
and no worker recycling (``GUNICORN_MAX_REQUESTS=0``, see SERVER_ENV):

* the service: ``bench.wsgi:app`` (the production app plus
  ``/bench/static/<name>``, a prepared body on the same server) under the
  committed ``gunicorn.conf.py``: gunicorn's sync worker;
* the same service behind the shipped nginx (the Kubernetes sidecar's
  configuration, ``tools.server.Nginx``), its per-address limits lifted (the
  load comes from one address; max_conns stays);
* the plain floor: ``bench/floor_app.py``, a plain Flask app with none of the
  service, under ``gunicorn -k sync -w 2`` with gunicorn's defaults, answering
  a prepared body the size of an uncached S answer;
* the trace's own floor: ``bench/compute_floor_app.py``, a plain Flask app
  that validates each request with the service's model and answers
  ``render_trace``'s bytes, nothing else, twice: under the same server as the
  service (the committed ``gunicorn.conf.py``: the sync worker, its two
  listeners, its JSON access log), which the target holds the service
  against, so that the ratio is what the app's edge costs; and under
  ``gunicorn -k sync -w 2`` with gunicorn's defaults (one listener, no access
  log), which says what the committed server configuration costs;
* for the worker class: the service under ``-k gthread --threads 4`` (the
  committed config otherwise), behind an nginx of its own.

Under load, in interleaved rounds (A … G, then G … A), wrk drives each cell
for the same time with the same connections: S uncached ("the cat sat<N>", a
new N every request) on the service, the plain floor and the trace's own
floor; /trace S and /check S on the service; /trace S through nginx, for sync
and for gthread. Then, one connection at a time on the service, again in
interleaved rounds: L as JSON, L as ``application/x-npz``, L's answer as a
prepared body (``/bench/static/L``), and the 32 … 256-token series at d_model
64, with orjson's encoding of L's document timed in this process between
them. Server time is gunicorn's access-log ``duration_us``: the request
parsed to the answer written. Last, for each worker class, /health's worst
latency through nginx while 8 clients from 8 loopback addresses ask for the
largest answer and never read it (tools/attack.py's slow-read).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from tools import attack
from tools.server import Nginx

from .common import Table, cpu_clock, fmt_bytes, fmt_ratio, fmt_time
from .http_bench import LoadGenerator, Run, Server, _summ, round_ratios, rps_ratio
from .workloads import NARROW_D_MODEL, by_name, distinct_small, scaling_series

#: what every server of this section runs with. No worker recycling: the service answers every cell of the suite
#: and passed max_requests (20,000) twice a run, the floors never did, and each replacement (a new worker importing
#: the app, ~0.4 s of CPU, then cold) landed in one of the service's 1-s cells: rounds of S against the floor spread
#: 0.70-0.99 with it, 0.87-0.92 without. Its cost in service is that CPU once per max_requests (~20 us a request).
SERVER_ENV = {"WEB_CONCURRENCY": "2", "ATTENTION_TRACE_RESPONSE_CACHE_BYTES": "0", "GUNICORN_MAX_REQUESTS": "0"}
NPZ = "application/x-npz"
GTHREAD = ("-k", "gthread", "--threads", "4")

#: key: (what, target, higher is better)
TARGETS: dict[str, tuple[str, float, bool]] = {
    "S_uncached_vs_plain_floor": (
        "S uncached (a new sentence every request), req/s ÷ a plain Flask app under gunicorn sync "
        "answering a prepared body of the same size",
        0.4,
        True,
    ),
    "S_uncached_vs_compute_floor": (
        "S uncached, req/s ÷ the trace's own floor under the same server (gunicorn sync, the committed config)",
        0.9,
        True,
    ),
    "check_vs_trace_S": ("/check S (a wrong 5-stage submission), req/s ÷ /trace S", 0.45, True),
    "L_server_vs_encode": ("L: server time ÷ orjson's encoding of its arrays", 1.3, False),
    "L_less_static_vs_encode": (
        "L: time on one connection less the same server's for a prepared body of the same bytes, "
        "÷ orjson's encoding of its arrays",
        1.8,
        False,
    ),
    "L_npz_vs_json": ("L as application/x-npz ÷ as JSON, server time", 0.5, False),
    "per_byte_spread": (
        f"server time per byte, 32 … 256 tokens (d_model {NARROW_D_MODEL}), largest ÷ smallest",
        1.6,
        False,
    ),
    "nginx_vs_direct": ("/trace S req/s through nginx ÷ direct", 0.8, True),
}


class Behind:
    """A server measured through nginx: the client talks to nginx; CPU and request times are the server's."""

    def __init__(self, server: Server, proxy: Nginx) -> None:
        self.server, self.proxy, self.url = server, proxy, proxy.url

    def cpu_seconds(self) -> float:
        return self.server.cpu_seconds()

    def server_times(self, request_id: str) -> list[float]:
        return self.server.server_times(request_id)


def verdict(key: str, value: float | None) -> str:
    """ "met", "not met", or "not measured" for a ratio of TARGETS."""
    if value is None:
        return "not measured"
    _, limit, higher = TARGETS[key]
    return "met" if (value >= limit if higher else value <= limit) else "not met"


def limit_text(key: str) -> str:
    _, limit, higher = TARGETS[key]
    return ("≥ " if higher else "≤ ") + fmt_ratio(limit)


def _post(url: str, body: bytes, accept: str | None = None) -> tuple[int, str, bytes]:
    headers = {"Content-Type": "application/json", "X-Request-ID": "bench-check"}
    if accept:
        headers["Accept"] = accept
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read()


def _marginal(per_byte: dict[int, float], sizes: dict[str, int]) -> str:
    """The server time of each byte one size adds to the one before (32 → 64 tokens, …): flat when the time
    grows linearly with the answer, whatever each request's fixed cost, which weighs most at 32 tokens."""
    ns = sorted(per_byte)
    parts = []
    for a, b in zip(ns, ns[1:]):
        size_a, size_b = sizes[f"n{a}"], sizes[f"n{b}"]
        added = per_byte[b] * size_b - per_byte[a] * size_a
        parts.append(f"{a}→{b}: {fmt_time(added / (size_b - size_a) * 1e6)}/MB")
    return ", ".join(parts)


def _med(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _per_byte(seq: dict[str, list[Run]], series: list[Any], sizes: dict[str, int]) -> dict[int, float]:
    """Each size's median server time ÷ its answer's bytes, for the series run under keys ``"n<tokens>"``."""
    out: dict[int, float] = {}
    for w in series:
        t = _med([x for run_ in seq[f"n{w.n_tokens}"] for x in run_.server_s])
        if t is not None:
            out[w.n_tokens] = t / sizes[f"n{w.n_tokens}"]
    return out


def _spread(per_byte: dict[int, float], sizes: int) -> float | None:
    """The largest time per byte ÷ the smallest, once every one of ``sizes`` sizes was measured (else None)."""
    if not per_byte or len(per_byte) != sizes or min(per_byte.values()) <= 0:
        return None
    return max(per_byte.values()) / min(per_byte.values())


def run(
    gen: LoadGenerator,
    rounds: int,
    duration_s: float,
    conns: int,
    seq_rounds: int,
    results: dict[str, Any],
    attack_s: float = 6.0,
) -> list[Table]:
    """Section 6: the ratios, and the worker classes side by side, from one run."""
    from service import serialize
    from service.routes.trace import trace_document
    from service.settings import Settings

    from . import service_path
    from .guard import check_body

    settings = Settings()
    names = by_name()
    S, L, s_star = names["S"], names["L"], distinct_small()
    series = [w for w in scaling_series(d_model=NARROW_D_MODEL, start=32) if w.n_tokens <= 256]

    d = Path(tempfile.mkdtemp(prefix="attention-trace-server-"))
    servers: dict[str, Server] = {}
    proxies: dict[str, Nginx] = {}
    try:
        # request bodies, and the prepared bodies: the answer to the first uncached S ("sat0"), and L's
        files = {"S": S.body_bytes, "Sstar": s_star.body_bytes, "L": L.body_bytes, "check": check_body()}
        files.update({f"n{w.n_tokens}": w.body_bytes for w in series})
        for name, body in files.items():
            (d / f"{name}.req").write_bytes(body)
        first_star = s_star.body_bytes.replace(b"__N__", b"0")
        floor_body = service_path.render(first_star, settings)
        (d / "Sstar.json").write_bytes(floor_body)
        l_body = service_path.render(L.body_bytes, settings)
        (d / "L.json").write_bytes(l_body)
        req = d.joinpath

        servers["sync"] = Server(d, env=SERVER_ENV, label="the service (sync, the committed config)")
        servers["gthread"] = Server(d, env=SERVER_ENV, label="the service under gthread, 4 threads", args=GTHREAD)
        servers["floor"] = Server(
            d, label="plain Flask floor", args=["-k", "sync", "-w", "2"], app="bench.floor_app:app", plain=True
        )
        servers["compute"] = Server(
            d, env=SERVER_ENV, label="the trace's own floor (the committed config)", app="bench.compute_floor_app:app"
        )
        servers["compute_plain"] = Server(
            d,
            label="the trace's own floor (gunicorn's defaults)",
            args=["-k", "sync", "-w", "2"],
            app="bench.compute_floor_app:app",
            plain=True,
        )
        for key in ("sync", "gthread"):
            proxies[key] = Nginx(
                servers[key].port, servers[key].light_port, workers=2, log_name="bench-nginx", per_address_limits=False
            )
        service = servers["sync"]

        # ---- before any load: every server answers, with the same bytes
        want_s = service_path.render(S.body_bytes, settings)
        for url in (service.url, servers["gthread"].url, proxies["sync"].url, proxies["gthread"].url):
            status, _, got = _post(url + "/trace", S.body_bytes)
            if status != 200 or got != want_s:
                raise RuntimeError(
                    f"{url}/trace answered S {status} with {len(got):,} bytes, not the in-process "
                    f"render's {len(want_s):,}"
                )
        status, _, got = _post(servers["floor"].url + "/floor/Sstar", s_star.body_bytes)
        if status != 200 or got != floor_body:
            raise RuntimeError(
                f"the floor answered {status} with {len(got):,} bytes, not the prepared {len(floor_body):,}"
            )
        for key in ("compute", "compute_plain"):
            status, _, got = _post(servers[key].url + "/trace", first_star)
            if status != 200 or got != floor_body:
                raise RuntimeError(
                    f"{servers[key].label} answered {status} with {len(got):,} bytes, not /trace's {len(floor_body):,}"
                )
        status, _, got = _post(service.url + "/check", files["check"])
        if status != 200:
            raise RuntimeError(f"/check S answered {status}")
        sizes: dict[str, int] = {}
        for name in ["L", *(f"n{w.n_tokens}" for w in series)]:
            status, _, got = _post(service.url + "/trace", files[name])
            if status != 200:
                raise RuntimeError(f"/trace {name} answered {status}")
            sizes[name] = len(got)
        status, _, got = _post(service.url + "/bench/static/L", L.body_bytes)
        if status != 200 or len(got) != sizes["L"]:
            raise RuntimeError(f"/bench/static/L answered {status} with {len(got):,} bytes, not L's {sizes['L']:,}")
        status, ctype, got = _post(service.url + "/trace", L.body_bytes, accept=NPZ)
        if status != 200 or not ctype.startswith(NPZ):
            raise RuntimeError(f"/trace L with Accept: {NPZ} answered {status} as {ctype!r}")
        sizes["L npz"] = len(got)

        # ---- under load, interleaved
        cells: list[tuple[str, Any, str, Path]] = [
            ("S*", service, "/trace", req("Sstar.req")),
            ("floor", servers["floor"], "/floor/Sstar", req("Sstar.req")),
            ("compute", servers["compute"], "/trace", req("Sstar.req")),
            ("compute plain", servers["compute_plain"], "/trace", req("Sstar.req")),
            ("S", service, "/trace", req("S.req")),
            ("check", service, "/check", req("check.req")),
            ("S nginx", Behind(service, proxies["sync"]), "/trace", req("S.req")),
            ("S nginx gthread", Behind(servers["gthread"], proxies["gthread"]), "/trace", req("S.req")),
        ]
        load: dict[str, list[Run]] = {k: [] for k, *_ in cells}
        for r in range(rounds):
            for key, srv, path, req_file in cells if r % 2 == 0 else cells[::-1]:
                load[key].append(gen.run(srv, path, req_file, conns, duration_s, f"server-{key.replace(' ', '-')}"))

        # ---- one connection at a time on the service, with the encoding timed in between
        doc = trace_document(service_path.validate(L.body_bytes, settings))
        encode_wall: list[float] = []
        encode_cpu: list[float] = []

        def encode_for(seconds: float) -> None:
            serialize.dumps(doc)  # warm
            start = time.perf_counter()
            while True:
                w0, c0 = time.perf_counter(), time.thread_time()
                serialize.dumps(doc)
                encode_wall.append(time.perf_counter() - w0)
                encode_cpu.append(time.thread_time() - c0)
                if len(encode_wall) >= 3 and time.perf_counter() - start >= seconds:
                    break

        Item = tuple[str, str, str, str | None]  # key, path, request body's name, Accept
        seq_items: list[Item] = [
            ("L", "/trace", "L", None),
            ("L npz", "/trace", "L", NPZ),
            ("L static", "/bench/static/L", "L", None),
        ]
        seq_items += [(f"n{w.n_tokens}", "/trace", f"n{w.n_tokens}", None) for w in series]
        seq: dict[str, list[Run]] = {k: [] for k, *_ in seq_items}
        for r in range(seq_rounds):
            order: list[Item | None] = [*seq_items, None]  # None: the encoding
            for item in order if r % 2 == 0 else order[::-1]:
                if item is None:
                    encode_for(duration_s)
                    continue
                key, path, name, accept = item
                seq[key].append(
                    gen.run(
                        service,
                        path,
                        req(f"{name}.req"),
                        1,
                        duration_s,
                        f"server-seq-{key.replace(' ', '-')}",
                        accept=accept,
                    )
                )

        # ---- slow readers of the largest answers through nginx: /health's worst latency, per worker class
        slow = {
            key: attack.run_attack("slow-read", "127.0.0.1", proxies[key].port, 8, attack_s, settle=1.0, addresses=8)
            for key in ("sync", "gthread")
        }
        replaced = {key: srv.log_text().count("Autorestarting worker") for key, srv in servers.items()}
    finally:
        for proxy in proxies.values():
            proxy.stop()
            shutil.rmtree(proxy.dir, ignore_errors=True)
        for srv in servers.values():
            srv.stop()
        shutil.rmtree(d, ignore_errors=True)

    # ---- figures
    summ = {k: _summ(v) for k, v in load.items()}
    l_srv = _med([t for run_ in seq["L"] for t in run_.server_s])
    npz_srv = _med([t for run_ in seq["L npz"] for t in run_.server_s])
    l_wall = _med([run_.p50_s for run_ in seq["L"] if run_.requests])
    static_wall = _med([run_.p50_s for run_ in seq["L static"] if run_.requests])
    enc_wall, enc_cpu = _med(encode_wall), _med(encode_cpu)
    enc = enc_cpu if cpu_clock() else enc_wall
    per_byte = _per_byte(seq, series, sizes)
    ratios = {
        "S_uncached_vs_plain_floor": rps_ratio(load["S*"], load["floor"]),
        "S_uncached_vs_compute_floor": rps_ratio(load["S*"], load["compute"]),
        "check_vs_trace_S": rps_ratio(load["check"], load["S"]),
        "L_server_vs_encode": l_srv / enc if l_srv and enc else None,
        "L_less_static_vs_encode": (l_wall - static_wall) / enc if l_wall and static_wall and enc else None,
        "L_npz_vs_json": npz_srv / l_srv if npz_srv and l_srv else None,
        "per_byte_spread": _spread(per_byte, len(series)),
        "nginx_vs_direct": rps_ratio(load["S nginx"], load["S"]),
    }
    # No target: what the committed server configuration costs the trace's own floor, and the service against
    # the floor under gunicorn's defaults (the app's edge and the configuration together).
    config_cost = {
        "S_uncached_vs_compute_floor_defaults": rps_ratio(load["S*"], load["compute plain"]),
        "compute_floor_config_vs_defaults": rps_ratio(load["compute"], load["compute plain"]),
    }
    out: dict[str, Any] = {
        "rounds": rounds,
        "duration_s": duration_s,
        "connections": conns,
        "seq_rounds": seq_rounds,
        "sizes": sizes,
        "load": summ,
        "ratios": ratios,
        "config_cost": config_cost,
        "round_ratios": {
            "S_uncached_vs_plain_floor": round_ratios(load["S*"], load["floor"]),
            "S_uncached_vs_compute_floor": round_ratios(load["S*"], load["compute"]),
            "S_uncached_vs_compute_floor_defaults": round_ratios(load["S*"], load["compute plain"]),
            "compute_floor_config_vs_defaults": round_ratios(load["compute"], load["compute plain"]),
            "check_vs_trace_S": round_ratios(load["check"], load["S"]),
            "nginx_vs_direct": round_ratios(load["S nginx"], load["S"]),
        },
        "L": {
            "server_s": l_srv,
            "npz_server_s": npz_srv,
            "wall_p50_s": l_wall,
            "static_wall_p50_s": static_wall,
            "encode_wall_s": enc_wall,
            "encode_cpu_s": enc_cpu,
            "encode_clock": "cpu" if cpu_clock() else "wall",
        },
        "per_byte_s": {str(n): v for n, v in per_byte.items()},
        "slow_readers": slow,
        "workers_replaced": replaced,
    }
    results.update(out)

    def rounds_of(key: str) -> str:
        rs = out["round_ratios"].get(key)
        return f"; rounds {min(rs):.2f}–{max(rs):.2f}" if rs else ""

    how = {
        "S_uncached_vs_plain_floor": f"{summ['S*']['rps']:,.0f} vs {summ['floor']['rps']:,.0f} req/s; "
        f"{fmt_bytes(len(floor_body))} answers" + rounds_of("S_uncached_vs_plain_floor"),
        "S_uncached_vs_compute_floor": f"{summ['S*']['rps']:,.0f} vs {summ['compute']['rps']:,.0f} req/s"
        + rounds_of("S_uncached_vs_compute_floor"),
        "check_vs_trace_S": f"{summ['check']['rps']:,.0f} vs {summ['S']['rps']:,.0f} req/s"
        + rounds_of("check_vs_trace_S"),
        "L_server_vs_encode": f"{fmt_time(l_srv)} vs {fmt_time(enc)}; the encoding {fmt_time(enc_cpu)} of CPU, "
        f"{fmt_time(enc_wall)} wall",
        "L_less_static_vs_encode": f"({fmt_time(l_wall)} − {fmt_time(static_wall)}) vs {fmt_time(enc)}",
        "L_npz_vs_json": f"{fmt_time(npz_srv)} vs {fmt_time(l_srv)}; {fmt_bytes(sizes['L npz'])} vs "
        f"{fmt_bytes(sizes['L'])}",
        "per_byte_spread": ", ".join(f"{n}: {fmt_time(v * 1e6)}/MB" for n, v in per_byte.items())
        + (f"; each added byte: {m}" if (m := _marginal(per_byte, sizes)) else ""),
        "nginx_vs_direct": f"{summ['S nginx']['rps']:,.0f} vs {summ['S']['rps']:,.0f} req/s"
        + rounds_of("nginx_vs_direct"),
    }
    t = Table(
        "6. The server from stock parts (gunicorn sync, nginx in front) against fixed floors, this run",
        ["ratio", "measured", "from", "target", "met?"],
    )
    for key, (what, _, _) in TARGETS.items():
        t.add(what, fmt_ratio(ratios[key]), how[key], limit_text(key), verdict(key, ratios[key]))
    errors = sum(s["errors"] for s in summ.values()) + sum(r.errors for v in seq.values() for r in v)
    t.notes.append(
        f"load generator: {gen.name}, closed loop, {conns} connections, {rounds} interleaved round(s) of "
        f"{duration_s:g} s per cell; req/s ratios are the median of each round's ratio. S uncached is "
        '"the cat sat<N>" with a new N every request; the plain floor is bench/floor_app.py under '
        "`gunicorn -k sync -w 2` with gunicorn's defaults; the trace's own floor is bench/compute_floor_app.py "
        "under the committed gunicorn.conf.py, as the service; nginx is the shipped sidecar configuration "
        "without its per-address limits"
    )
    cpu = {
        label: summ[k]["cpu_per_request_s"]
        for k, label in (("S*", "the service"), ("compute", "the floor"), ("compute plain", "the floor, defaults"))
    }
    t.notes.append(
        "the committed server configuration (two listeners, the JSON access log) against gunicorn's defaults, "
        "the trace's own floor under each: "
        f"{fmt_ratio(config_cost['compute_floor_config_vs_defaults'])} "
        f"({summ['compute']['rps']:,.0f} vs {summ['compute plain']['rps']:,.0f} req/s"
        + rounds_of("compute_floor_config_vs_defaults")
        + "); the service against the floor under gunicorn's defaults: "
        f"{fmt_ratio(config_cost['S_uncached_vs_compute_floor_defaults'])}"
        + rounds_of("S_uncached_vs_compute_floor_defaults")
        + "; worker CPU a request: "
        + ", ".join(f"{k} {fmt_time(v)}" for k, v in cpu.items() if v is not None)
    )
    t.notes.append(
        f"L and the series: one connection, {seq_rounds} interleaved round(s) of {duration_s:g} s per item; "
        "server time = the median of gunicorn's access-log duration_us (the request parsed to the answer "
        "written); L less a prepared body = wrk's median latency for /trace L less that for "
        "/bench/static/L (the same server answering L's bytes, prepared); the encoding = "
        f"service.serialize.dumps of L's document in this process, {len(encode_wall)} times between the "
        f"HTTP runs, median of this thread's {'CPU time' if cpu_clock() else 'wall-clock time'}"
    )
    if errors:
        t.notes.append(f"{errors} requests failed")

    t2 = Table(
        "6b. The worker class: the committed config under sync and under gthread (4 threads), each behind "
        "the shipped nginx",
        [
            "worker class",
            "/trace S req/s through nginx",
            "p99",
            "worker CPU / request",
            "/health worst while 8 slow readers of the largest answer (8 addresses)",
            "/health p50",
            "probe /trace worst",
            "workers replaced",
        ],
    )
    for key, cell in (("sync", "S nginx"), ("gthread", "S nginx gthread")):
        s, a = summ[cell], slow[key]
        t2.add(
            key,
            f"{s['rps']:,.0f}",
            fmt_time(s["p99_s"]),
            fmt_time(s["cpu_per_request_s"]),
            f"{a['health_max_s']} s",
            f"{a['health_p50_s']} s",
            f"{a['trace_max_s']} s",
            replaced[key],
        )
    t2.notes.append(
        f"slow readers: tools/attack.py slow-read, 8 connections for {attack_s:g} s, each asking for the "
        "largest /trace the limits allow and never reading it; the probe asks /health and a small /trace "
        "every 200 ms from 127.0.0.1"
    )
    return [t, t2]
