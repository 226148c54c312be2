"""Section 6: the project's worker against gunicorn's stock workers, and the whole stack against fixed floors.

One run starts, side by side on 127.0.0.1 (each stopped by its PID):

* the same app (``bench.wsgi:app``), virtualenv and committed ``gunicorn.conf.py``
  under each worker class: the project's (``service.worker.BufferedWorker``, the
  config as committed), and gunicorn's ``sync``, ``gthread`` with 4 threads and
  ``gevent`` (when installed: bench/requirements.txt pins it), chosen by ``-k``
  (and ``--threads``) on gunicorn's command line, which overrides the config
  file and nothing else. Every server has 2 workers (``WEB_CONCURRENCY=2``) and
  the response cache off (``ATTENTION_TRACE_RESPONSE_CACHE_BYTES=0``), so every
  request is computed;
* the floor: ``bench/floor_app.py``, a plain Flask app with none of the
  service, under ``gunicorn -k sync -w 2`` with gunicorn's defaults, answering
  a prepared body the size of an uncached S answer. Nothing the service or its
  worker does changes this floor;
* for reference, the trace's own floor: ``bench/compute_floor_app.py`` under the
  same server, a plain Flask app that validates each request with the service's
  model and answers ``render_trace``'s bytes (/trace's), nothing else. Against
  the plain floor it is the most the S uncached ratio can reach under Flask
  with this engine; the project's server against it is what the service's app
  and worker add;
* for reference too, the same app under the project's own server (the committed
  config, 2 workers, the response cache off): the trace's own time per byte,
  measured as the service's is, through the same worker and access log;
* and for reference, the service under the project's server with its response
  cache on, answering S (the same body every time) from that cache: no
  validation, engine, document or encoding, only the service's edge and
  server. Against the plain floor it is what they alone leave of the budget.

Then, in interleaved rounds (A, B, … H in one round, H … A in the next, and so
on), wrk drives each for the same time with the same connections: /trace S on
each worker class (the side-by-side table), S uncached (a new sentence every
request) on the project's server next to the floor and the trace's own floor,
and S from the service's response cache.

After that, one connection at a time on the project's server, again in
interleaved rounds: L as JSON, L as ``application/x-npz``, and the 32 … 256
token series at d_model 64 (and the same series on the trace's own floor under
the project's server), with orjson's encoding of L's document timed in this
process between them. Server time is gunicorn's access-log
``duration_us`` (wall clock). The encoding is timed on the suite's clock: this
thread's CPU time by default, as in section 2, which other processes on a
shared machine do not inflate while they do inflate the server's wall-clock
time, so a busy machine can only make ratio 2 look worse (``--clock wall``
times it on the wall clock; both are reported).

The four whole-stack ratios, each with its target:

1. S uncached, req/s ÷ the floor's req/s (the median of each round's
   back-to-back ratio): at least 0.5×;
2. L's server time ÷ orjson's encoding of its arrays: at most 1.3×;
3. server time per response byte over 32 … 256 tokens, the largest ÷ the
   smallest: at most 1.5×;
4. L as npz ÷ L as JSON, server time: at most 0.5×.
"""

from __future__ import annotations

import importlib.util
import shutil
import statistics
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import Table, cpu_clock, fmt_bytes, fmt_ratio, fmt_time
from .http_bench import LoadGenerator, Run, Server, _summ, round_ratios, rps_ratio
from .workloads import NARROW_D_MODEL, by_name, distinct_small, scaling_series

#: what every server of this section runs with, the project's and the stock ones alike
SERVER_ENV = {"WEB_CONCURRENCY": "2", "ATTENTION_TRACE_RESPONSE_CACHE_BYTES": "0"}
NPZ = "application/x-npz"

#: key: (what, target, higher is better)
TARGETS: dict[str, tuple[str, float, bool]] = {
    "S_uncached_vs_plain_floor": (
        "S uncached (a new sentence every request), req/s ÷ a plain Flask app under gunicorn sync "
        "answering a prepared body of the same size", 0.5, True),
    "L_server_vs_encode": ("L: server time ÷ orjson's encoding of its arrays", 1.3, False),
    "per_byte_spread": (f"server time per byte, 32 … 256 tokens (d_model {NARROW_D_MODEL}), largest ÷ smallest",
                        1.5, False),
    "L_npz_vs_json": ("L as application/x-npz ÷ as JSON, server time", 0.5, False),
}


@dataclass(frozen=True)
class WorkerClass:
    key: str
    label: str
    args: tuple[str, ...]


def worker_classes() -> tuple[list[WorkerClass], list[str]]:
    """The classes to compare, and a note for each one skipped."""
    classes = [
        WorkerClass("project", "the project's: service.worker.BufferedWorker", ()),
        WorkerClass("sync", "sync", ("-k", "sync")),
        WorkerClass("gthread", "gthread, 4 threads", ("-k", "gthread", "--threads", "4")),
    ]
    notes = []
    if importlib.util.find_spec("gevent") is not None:
        classes.append(WorkerClass("gevent", "gevent", ("-k", "gevent")))
    else:
        notes.append("gevent: not installed in this venv (bench/requirements.txt pins it; `make bench` installs "
                     "it), so it was skipped")
    return classes, notes


def verdict(key: str, value: float | None) -> str:
    """"met", "not met", or "not measured" for a ratio of TARGETS."""
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


def _per_byte(seq: dict[str, list[Run]], series: list[Any], sizes: dict[str, int], prefix: str) -> dict[int, float]:
    """Each size's median server time ÷ its answer's bytes, for the series run under keys ``prefix + "n<tokens>"``."""
    out: dict[int, float] = {}
    for w in series:
        t = _med([x for run_ in seq[f"{prefix}n{w.n_tokens}"] for x in run_.server_s])
        if t is not None:
            out[w.n_tokens] = t / sizes[f"n{w.n_tokens}"]
    return out


def _spread(per_byte: dict[int, float], sizes: int) -> float | None:
    """The largest time per byte ÷ the smallest, once every one of ``sizes`` sizes was measured (else None)."""
    if not per_byte or len(per_byte) != sizes or min(per_byte.values()) <= 0:
        return None
    return max(per_byte.values()) / min(per_byte.values())


def run(gen: LoadGenerator, rounds: int, duration_s: float, conns: int, seq_rounds: int,
        results: dict[str, Any]) -> list[Table]:
    """Section 6: the side-by-side worker table and the whole-stack ratios, from one run."""
    from service import serialize
    from service.routes.trace import trace_document
    from service.settings import Settings

    from . import service_path

    settings = Settings()
    names = by_name()
    S, L, s_star = names["S"], names["L"], distinct_small()
    series = scaling_series(d_model=NARROW_D_MODEL, start=32)
    series = [w for w in series if w.n_tokens <= 256]
    classes, notes = worker_classes()

    d = Path(tempfile.mkdtemp(prefix="attention-trace-workers-"))
    servers: dict[str, Server] = {}
    try:
        # request bodies, and the floor's prepared body: the answer to the first uncached S ("sat0")
        files = {"S": S.body_bytes, "Sstar": s_star.body_bytes, "L": L.body_bytes}
        files.update({f"n{w.n_tokens}": w.body_bytes for w in series})
        for name, body in files.items():
            (d / f"{name}.req").write_bytes(body)
        first_star = s_star.body_bytes.replace(b"__N__", b"0")
        floor_body = service_path.render(first_star, settings)
        (d / "Sstar.json").write_bytes(floor_body)
        req = d.joinpath

        for c in classes:
            servers[c.key] = Server(d, env=SERVER_ENV, label=c.label, args=list(c.args))
        servers["floor"] = Server(d, label="plain Flask floor", args=["-k", "sync", "-w", "2"],
                                  app="bench.floor_app:app", plain=True)
        servers["compute"] = Server(d, label="the trace's own floor", args=["-k", "sync", "-w", "2"],
                                    app="bench.compute_floor_app:app", plain=True)
        servers["bare"] = Server(d, env=SERVER_ENV, label="the trace's own floor, under the project's server",
                                 app="bench.compute_floor_app:app")
        # the committed config with the response cache at its default size: S from the cache, no trace work
        servers["cached"] = Server(d, env={"WEB_CONCURRENCY": SERVER_ENV["WEB_CONCURRENCY"]},
                                   label="the service answering from its response cache")
        project = servers["project"]

        # ---- before any load: every server answers, with the same bytes
        want_s = service_path.render(S.body_bytes, settings)
        for c in classes:
            status, _, got = _post(servers[c.key].url + "/trace", S.body_bytes)
            if status != 200:
                raise RuntimeError(f"/trace S answered {status} under {c.label}")
            if got != want_s:
                notes.append(f"{c.label}: /trace S bytes differ from the in-process render "
                             f"({len(got):,} vs {len(want_s):,})")
        for _ in range(2):  # the first answer fills the cache, the second comes from it
            status, _, got = _post(servers["cached"].url + "/trace", S.body_bytes)
            if status != 200 or got != want_s:
                raise RuntimeError(f"the service with its response cache answered /trace S {status} with "
                                   f"{len(got):,} bytes, not the in-process render's {len(want_s):,}")
        status, _, got = _post(servers["floor"].url + "/floor/Sstar", s_star.body_bytes)
        if status != 200 or got != floor_body:
            raise RuntimeError(f"the floor answered {status} with {len(got):,} bytes, not the prepared "
                               f"{len(floor_body):,}")
        status, _, got = _post(servers["compute"].url + "/trace", first_star)
        if status != 200 or got != floor_body:
            raise RuntimeError(f"the trace's own floor answered {status} with {len(got):,} bytes, not /trace's "
                               f"{len(floor_body):,}")
        sizes: dict[str, int] = {}
        for name in ["L", *(f"n{w.n_tokens}" for w in series)]:
            status, _, got = _post(project.url + "/trace", files[name])
            if status != 200:
                raise RuntimeError(f"/trace {name} answered {status}")
            sizes[name] = len(got)
            if name != "L":  # the series on the trace's own floor: the same answers, or its times mean nothing
                status, _, bare = _post(servers["bare"].url + "/trace", files[name])
                if status != 200 or bare != got:
                    raise RuntimeError(f"the trace's own floor under the project's server answered /trace {name} "
                                       f"{status} with {len(bare):,} bytes, not the service's {len(got):,}")
        status, ctype, got = _post(project.url + "/trace", L.body_bytes, accept=NPZ)
        if status != 200 or not ctype.startswith(NPZ):
            raise RuntimeError(f"/trace L with Accept: {NPZ} answered {status} as {ctype!r}")
        sizes["L npz"] = len(got)

        # ---- under load: /trace S on each class, and S uncached against the floor, interleaved
        cells: list[tuple[str, Server, str, Path]] = [(c.key, servers[c.key], "/trace", req("S.req"))
                                                      for c in classes]
        cells += [("S*", project, "/trace", req("Sstar.req")),
                  ("floor", servers["floor"], "/floor/Sstar", req("Sstar.req")),
                  ("compute", servers["compute"], "/trace", req("Sstar.req")),
                  ("cached", servers["cached"], "/trace", req("S.req"))]
        load: dict[str, list[Run]] = {k: [] for k, *_ in cells}
        for r in range(rounds):
            for key, srv, path, body_file in (cells if r % 2 == 0 else cells[::-1]):
                load[key].append(gen.run(srv, path, body_file, conns, duration_s, f"workers-{key}"))

        # ---- one connection at a time on the project's server, with the encoding timed in between
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

        Item = tuple[str, Server, str, str | None]  # key, server, request body's name, Accept
        seq_items: list[Item] = [("L", project, "L", None), ("L npz", project, "L", NPZ)]
        seq_items += [(f"n{w.n_tokens}", project, f"n{w.n_tokens}", None) for w in series]
        seq_items += [(f"bare n{w.n_tokens}", servers["bare"], f"n{w.n_tokens}", None) for w in series]
        seq: dict[str, list[Run]] = {k: [] for k, *_ in seq_items}
        for r in range(seq_rounds):
            order: list[Item | None] = [*seq_items, None]  # None: the encoding
            for item in (order if r % 2 == 0 else order[::-1]):
                if item is None:
                    encode_for(duration_s)
                    continue
                key, srv, name, accept = item
                seq[key].append(gen.run(srv, "/trace", req(f"{name}.req"), 1, duration_s,
                                        f"workers-seq-{key.replace(' ', '-')}", accept=accept))
        # workers replaced for max_requests during the run: each replacement is a new worker's boot (its CPU is
        # in the figures) and, while it boots, one worker fewer answering
        replaced = {key: srv.log_text().count("Autorestarting worker") for key, srv in servers.items()}
    finally:
        for srv in servers.values():
            srv.stop()
        shutil.rmtree(d, ignore_errors=True)

    # ---- figures
    summ = {k: _summ(v) for k, v in load.items()}
    out: dict[str, Any] = {"rounds": rounds, "duration_s": duration_s, "connections": conns,
                           "seq_rounds": seq_rounds, "sizes": sizes, "notes": notes, "classes": {}}
    table = Table(
        "6. Worker classes side by side: /trace S, same app, venv and gunicorn.conf.py, "
        f"{SERVER_ENV['WEB_CONCURRENCY']} workers each, response cache off; {conns} connections, {rounds} "
        f"interleaved round(s) of {duration_s:g} s",
        ["worker class", "/trace S req/s", "req/s vs the project's (range over rounds)", "worker CPU / request",
         "p50", "p99", "requests", "errors", "workers replaced"])
    for c in classes:
        s = summ[c.key]
        vs = rps_ratio(load[c.key], load["project"])
        per_round = round_ratios(load[c.key], load["project"])
        out["classes"][c.key] = {"label": c.label, "args": list(c.args), **s, "rps_vs_project": vs,
                                 "round_rps": [r.rps for r in load[c.key]], "round_vs_project": per_round,
                                 "workers_replaced": replaced[c.key]}
        spread = f" ({min(per_round):.2f}–{max(per_round):.2f})" if c.key != "project" and per_round else ""
        table.add(c.label, f"{s['rps']:,.0f}", fmt_ratio(vs) + spread, fmt_time(s["cpu_per_request_s"]),
                  fmt_time(s["p50_s"]), fmt_time(s["p99_s"]), f"{s['requests']:,}", s["errors"], replaced[c.key])
    table.notes.append(f"load generator: {gen.name}, closed loop. Each stock class is the committed config with "
                       "`-k` (and `--threads 4`) on gunicorn's command line; the project's is the config as committed")
    table.notes.append("req/s, p50 and p99: medians over rounds; req/s vs the project's: the median of each round's "
                       "ratio; worker CPU / request: the workers' user+system CPU (/proc, replaced workers included) "
                       "over the requests answered. Only the project's worker applies its malloc tuning "
                       "(service/worker.py); the others run on glibc's defaults")
    table.notes.append("workers replaced: for max_requests (the committed config's 20,000 plus jitter, every class), "
                       "over the whole run; the project's server also answered the S uncached and one-connection "
                       "runs. Each replacement's boot (~0.3 s of CPU, the app's imports) is in the CPU figures, and "
                       "while it boots one worker fewer answers")
    table.notes += notes

    l_json = [t for run_ in seq["L"] for t in run_.server_s]
    l_npz = [t for run_ in seq["L npz"] for t in run_.server_s]
    l_srv, npz_srv = _med(l_json), _med(l_npz)
    enc_wall, enc_cpu = _med(encode_wall), _med(encode_cpu)
    enc = enc_cpu if cpu_clock() else enc_wall
    l_cpu = _summ(seq["L"])["cpu_per_request_s"]
    per_byte = _per_byte(seq, series, sizes, "")
    bare_per_byte = _per_byte(seq, series, sizes, "bare ")
    # the same, end to end: wrk's median latency on one connection (request sent → whole answer received)
    per_byte_e2e: dict[int, float] = {}
    for w in series:
        p50 = _med([run_.p50_s for run_ in seq[f"n{w.n_tokens}"] if run_.requests])
        if p50:
            per_byte_e2e[w.n_tokens] = p50 / sizes[f"n{w.n_tokens}"]
    ratios = {
        "S_uncached_vs_plain_floor": rps_ratio(load["S*"], load["floor"]),
        "L_server_vs_encode": l_srv / enc if l_srv and enc else None,
        "per_byte_spread": _spread(per_byte, len(series)),
        "L_npz_vs_json": npz_srv / l_srv if npz_srv and l_srv else None,
    }
    # for reference, not a target: the trace's own floor (bench/compute_floor_app.py) against the plain floor
    # (the most the S uncached ratio can reach under Flask with this engine), and the project's server against it
    compute_vs_floor = rps_ratio(load["compute"], load["floor"])
    project_vs_compute = rps_ratio(load["S*"], load["compute"])
    # and what the service's edge and server alone leave of the budget: S from the response cache, no trace work
    cached_vs_floor = rps_ratio(load["cached"], load["floor"])
    out.update({
        "S*": summ["S*"], "floor": summ["floor"], "compute_floor": summ["compute"], "cached": summ["cached"],
        "ratios": ratios, "cached_vs_plain_floor": cached_vs_floor,
        "round_cached_vs_plain_floor": round_ratios(load["cached"], load["floor"]),
        "compute_floor_vs_plain_floor": compute_vs_floor, "S_uncached_vs_compute_floor": project_vs_compute,
        "round_compute_floor_vs_plain_floor": round_ratios(load["compute"], load["floor"]),
        "round_S_uncached_vs_plain_floor": round_ratios(load["S*"], load["floor"]),
        "L": {"server_s": l_srv, "npz_server_s": npz_srv, "encode_wall_s": enc_wall, "encode_cpu_s": enc_cpu,
              "encode_clock": "cpu" if cpu_clock() else "wall",
              "cpu_per_request_s": l_cpu, "requests": len(l_json), "npz_requests": len(l_npz),
              "encodes": len(encode_wall)},
        "per_byte_s": {str(n): v for n, v in per_byte.items()},
        "per_byte_e2e_s": {str(n): v for n, v in per_byte_e2e.items()},
        "per_byte_e2e_spread": _spread(per_byte_e2e, len(series)),
        "compute_floor_per_byte_s": {str(n): v for n, v in bare_per_byte.items()},
        "compute_floor_per_byte_spread": _spread(bare_per_byte, len(series)),
    })
    results.update(out)

    how = {
        "S_uncached_vs_plain_floor":
            f"{summ['S*']['rps']:,.0f} vs {summ['floor']['rps']:,.0f} req/s; {fmt_bytes(len(floor_body))} answers"
            + (f"; rounds {min(r1):.2f}–{max(r1):.2f}" if (r1 := out["round_S_uncached_vs_plain_floor"]) else ""),
        "L_server_vs_encode":
            f"{fmt_time(l_srv)} vs {fmt_time(enc)}; the encoding {fmt_time(enc_cpu)} of CPU, {fmt_time(enc_wall)} "
            f"wall; worker CPU / request {fmt_time(l_cpu)}",
        "per_byte_spread":
            ", ".join(f"{n}: {fmt_time(v * 1e6)}/MB" for n, v in per_byte.items())
            + (f"; each added byte (from one size to the next): {marginal}" if (marginal := _marginal(per_byte, sizes))
               else "")
            + (f"; end to end (wrk's median latency): {e2e}" if (e2e := ", ".join(
                f"{n}: {fmt_time(v * 1e6)}/MB" for n, v in per_byte_e2e.items())) else ""),
        "L_npz_vs_json":
            f"{fmt_time(npz_srv)} vs {fmt_time(l_srv)}; {fmt_bytes(sizes['L npz'])} vs {fmt_bytes(sizes['L'])}",
    }
    t2 = Table("6b. The whole stack against fixed floors (this run; the plain-Flask floor started fresh in it)",
               ["ratio", "measured", "from", "target", "met?"])
    for key, (what, _, _) in TARGETS.items():
        t2.add(what, fmt_ratio(ratios[key]), how[key], limit_text(key), verdict(key, ratios[key]))
    r0 = out["round_compute_floor_vs_plain_floor"]
    t2.add("(for reference) S uncached from the trace's own floor, req/s ÷ the plain floor: the most ratio 1 can "
           "reach under Flask with this engine", fmt_ratio(compute_vs_floor),
           f"{summ['compute']['rps']:,.0f} vs {summ['floor']['rps']:,.0f} req/s"
           + (f"; rounds {min(r0):.2f}–{max(r0):.2f}" if r0 else ""), "", "")
    t2.add("(for reference) S uncached, the project's server ÷ the trace's own floor: what the service's app and "
           "worker cost on top of the trace", fmt_ratio(project_vs_compute),
           f"{summ['S*']['rps']:,.0f} vs {summ['compute']['rps']:,.0f} req/s", "", "")
    rc = out["round_cached_vs_plain_floor"]
    t2.add("(for reference) S from the service's response cache, req/s ÷ the plain floor: the service's edge and "
           "server with no trace work (no validation, engine, document or encoding)", fmt_ratio(cached_vs_floor),
           f"{summ['cached']['rps']:,.0f} vs {summ['floor']['rps']:,.0f} req/s"
           + (f"; rounds {min(rc):.2f}–{max(rc):.2f}" if rc else ""), "", "")
    t2.add("(for reference) worker CPU per request under the same load (ratio 1's cells, and the two above)",
           "", "; ".join(f"{what} {fmt_time(summ[key]['cpu_per_request_s'])}" for key, what in (
               ("floor", "the plain floor"), ("cached", "the service from its cache"),
               ("compute", "the trace's own floor"), ("S*", "the service, S uncached"))), "", "")
    t2.add("(for reference) time per byte, 32 … 256 tokens, largest ÷ smallest, of the trace's own floor under the "
           "project's server: what ratio 3 is with none of the service's app",
           fmt_ratio(out["compute_floor_per_byte_spread"]),
           ", ".join(f"{n}: {fmt_time(v * 1e6)}/MB" for n, v in bare_per_byte.items())
           + (f"; each added byte: {m}" if (m := _marginal(bare_per_byte, sizes)) else ""), "", "")
    s_err = summ["S*"]["errors"] + summ["floor"]["errors"] + summ["compute"]["errors"] + summ["cached"]["errors"] \
        + sum(r.errors for v in seq.values() for r in v)
    t2.notes.append(f"1: {conns} connections, the {rounds} rounds above; S uncached is \"the cat sat<N>\" with a new "
                    "N every request on the project's server (its answers differ by a few bytes); the floor is "
                    "bench/floor_app.py under `gunicorn -k sync -w 2` with gunicorn's defaults, answering the first "
                    "of them as prepared bytes; the trace's own floor is bench/compute_floor_app.py under the same "
                    "server: it validates each request with the service's model and answers render_trace's bytes "
                    "(/trace's), with none of the service's app or worker; the service from its cache is the "
                    "committed config with the response cache at its default size, answering S (the same body "
                    "every request, a cache hit after the first) in the same rounds")
    t2.notes.append(f"2–4: one connection, {seq_rounds} interleaved round(s) of {duration_s:g} s per item on the "
                    "project's server; server time = the median of gunicorn's access-log duration_us (from the "
                    "request head parsed to the answer rendered into the worker's memory, before its event loop "
                    "sends it); the encoding = service.serialize.dumps of L's "
                    f"document in this process, {len(encode_wall)} times between the HTTP runs, median of this "
                    f"thread's {'CPU time' if cpu_clock() else 'wall-clock time'}; "
                    f"{len(l_json)} L and {len(l_npz)} L npz requests. The trace's own floor's series runs in the "
                    "same rounds on bench/compute_floor_app.py under the project's server (the committed config, "
                    "2 workers, the response cache off), timed the same way; its answers are the service's, "
                    "byte for byte")
    if s_err:
        t2.notes.append(f"{s_err} requests failed")
    return [table, t2]
