"""Section 5: where the time goes, per workload.

Two views:

* a decomposition without a profiler, in CPU time (which other processes on
  a shared machine do not inflate): the gunicorn workers' CPU per request
  (from /proc, section 3b's one-connection runs) for the trace and for its
  static floor of the same bytes, and each part of the handler's work timed on
  its own in process with this thread's CPU clock, interleaved (validation;
  engine.trace and, inside it, the attention core and the parameters digest;
  building the document; orjson);
* cProfile's top functions by own time for S and L (cProfile's per-call cost
  inflates the many small Python calls of the framework at S; the
  decomposition above has no such bias).
"""

from __future__ import annotations

import cProfile
import pstats
from typing import Any

import numpy as np

import engine
from engine.params import parameters_digest
from engine.layer import attend
from service import create_app, serialize
from service.settings import Settings

from . import common, service_path
from .common import Table, fmt_time, interleaved
from .engine_bench import config_of
from .workloads import Workload

PARTS = [
    ("HTTP floor: the same bytes from a static route (gunicorn, Flask, hooks, socket, log)", "floor"),
    ("  of which Flask, werkzeug, hooks, CORS (static route in process)", "flask_floor"),
    ("  of which gunicorn, socket, access log (the rest of the floor)", "gunicorn_floor"),
    ("request validation (pydantic, tokenizer count)", "validate"),
    ("engine: attention core (projections → output)", "core"),
    ("engine: parameters digest (SHA-256 of the weights)", "digest"),
    ("engine: the rest (tokens, embeddings, PE, checks, stats)", "engine_rest"),
    ("document: finiteness checks, copies", "document"),
    ("orjson encode", "encode"),
    ("not accounted for (trace − floor − parts above)", "rest"),
]


def digest_as_traced(t: Any, cfg: Any) -> Any:
    """The digest as engine.trace gets it: from a cache of generated weights' digests if the engine has one."""
    import engine.params

    cached = getattr(engine.params, "generated_parameters_digest", None)
    if cached is not None and t.parameters_source == "generated":
        return lambda: cached(cfg.seed, cfg.d_model, cfg.num_heads)
    return lambda: parameters_digest(t.parameters)


def measure(workloads: list[Workload], seq: dict[str, Any], repeats: int, budget_s: float,
            results: dict[str, Any]) -> Table:
    s = Settings()
    app = create_app(s)
    static: dict[str, bytes] = {}

    def bench_static(name: str) -> Any:
        from flask import request

        request.get_data(cache=False)
        return app.response_class(static[name], mimetype="application/json")

    app.add_url_rule("/bench/static/<name>", view_func=bench_static, methods=["POST"])  # as bench/wsgi.py
    cols = ["part"]
    for w in workloads:
        cols += [w.name, "%"]
    table = Table("5. Where the time goes: CPU time of one request (one connection at a time), by part", cols)
    parts: dict[str, dict[str, float]] = {}
    for w in workloads:
        raw = w.body_bytes
        cfg = config_of(w)
        sentence = w.body["sentence"]
        wsgi = service_path.WsgiCaller(app, "/trace", raw)
        status, body = wsgi()
        if not status.startswith("200"):
            raise RuntimeError(f"in-process /trace answered {status} for {w.name}")
        static[w.name] = body
        wsgi_static = service_path.WsgiCaller(app, f"/bench/static/{w.name}", raw)
        t = engine.trace(cfg, sentence=sentence)
        x = np.asarray(t.stages["input"].values)
        doc = serialize.trace_document(t, include_parameters=w.include_parameters)
        fns = [
            wsgi_static,
            wsgi,
            lambda: service_path.validate(raw, s),
            lambda: engine.trace(cfg, sentence=sentence),
            lambda: attend(x, vars(t.parameters), cfg),
            digest_as_traced(t, cfg),
            lambda: serialize.trace_document(t, include_parameters=w.include_parameters),
            lambda: serialize.dumps(doc),
        ]
        reps = repeats if w.n_tokens < 128 else max(3, repeats // 3)
        was_cpu = common.clock_name().startswith("thread")
        common.use_cpu_clock(True)
        try:
            t_static, t_wsgi, t_val, t_trace, t_core, t_digest, t_doc, t_enc = interleaved(fns, reps,
                                                                                           budget_s=budget_s)
        finally:
            common.use_cpu_clock(was_cpu)
        sq = seq.get(w.name, {})
        server = sq.get("trace", {}).get("cpu_per_request_s")
        floor = sq.get("floor", {}).get("cpu_per_request_s")
        p = {
            "floor": floor if floor is not None else float("nan"),
            "flask_floor": t_static,
            "gunicorn_floor": (floor - t_static) if floor is not None else float("nan"),
            "validate": t_val,
            "core": t_core,
            "digest": t_digest,
            "engine_rest": t_trace - t_core - t_digest,
            "document": t_doc,
            "encode": t_enc,
            "wsgi": t_wsgi,
            "client_p50": sq.get("trace", {}).get("p50_s") or float("nan"),
            "server_wall": sq.get("trace", {}).get("server_s") or float("nan"),
        }
        handler = t_val + t_trace + t_doc + t_enc
        p["rest"] = (server - floor - handler) if server is not None and floor is not None else float("nan")
        p["total"] = server if server is not None else t_wsgi
        parts[w.name] = p
    for label, key in PARTS:
        row: list[str] = [label]
        for w in workloads:
            v, tot = parts[w.name][key], parts[w.name]["total"]
            row += [fmt_time(v) if v == v else "–", f"{100 * v / tot:.0f}%" if v == v else "–"]
        table.add(*row)
    for label, key in (("= worker CPU per request, trace (/proc)", "total"),
                       ("for reference: whole Flask app in process (WSGI call, CPU)", "wsgi"),
                       ("for reference: server time, wall (access log median)", "server_wall"),
                       ("for reference: client p50, wall", "client_p50")):
        row = [label]
        for w in workloads:
            v, tot = parts[w.name][key], parts[w.name]["total"]
            row += [fmt_time(v) if v == v else "–", f"{100 * v / tot:.0f}%" if v == v else "–"]
        table.add(*row)
    table.notes.append("trace and floor: the gunicorn workers' user+system CPU time per request (/proc, 10 ms "
                       "ticks summed over section 3b's runs), which includes the kernel's socket copy and the "
                       "access log; the parts: this process's thread CPU time, interleaved medians. \"Not "
                       "accounted for\" holds what only the server does (reading the request body, allocating "
                       "in a long-lived worker) and the noise of both; a negative value is within noise of zero")
    results.update(parts)
    return table


def _short(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    if filename == "~":
        return name
    for marker in ("/site-packages/", "/work/main/", "/lib/python3"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            break
    return f"{filename}:{line}({name})"


def cprofile_top(workloads: list[Workload], calls: dict[str, int], top: int = 10) -> Table:
    app = create_app(Settings())
    table = Table("5b. cProfile, whole Flask app in process: top functions by own time",
                  ["workload", "function", "own time / request", "share of profiled time", "calls / request"])
    for w in workloads:
        wsgi = service_path.WsgiCaller(app, "/trace", w.body_bytes)
        wsgi()
        n = calls.get(w.name, 10)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            wsgi()
        prof.disable()
        st = pstats.Stats(prof)
        total = st.total_tt  # type: ignore[attr-defined]  # pstats' own attributes
        # the ignore below: pstats' own attributes
        rows = sorted(st.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]  # type: ignore[attr-defined]
        for func, (_cc, nc, tt, _ct, _callers) in rows:
            table.add(w.name, _short(func), fmt_time(tt / n), f"{100 * tt / total:.0f}%", f"{nc / n:g}")
    table.notes.append("cProfile adds a cost to every Python call: at S it inflates the framework's many small "
                       "calls; section 5 above is the unbiased split")
    return table
