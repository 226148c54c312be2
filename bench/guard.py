"""CI's guard against performance regressions: ``python -m bench.guard`` (``make bench-guard``).

A short run (about a minute) that measures each figure as a ratio against a
floor measured in the same run, on the same machine, interleaved with it, so
that a slow or busy CI machine moves both sides together:

* ``trace_S_vs_floor`` (higher is better): uncached /trace S* ("the cat sat<N>",
  a new word in every request, response cache off) req/s under real gunicorn
  (the committed config), against the same server answering a prepared body
  of the same size from a static route (bench/wsgi.py);
* ``check_vs_trace_S`` (higher is better): /check S with a wrong 5-stage
  submission (every known bug tried) against /trace S, req/s, same server;
* ``L_render_vs_encode`` (lower is better): L's whole in-process render
  (validate, trace, document, encode) against orjson encoding that document alone;
* ``L_npz_vs_json`` (lower is better): L rendered as ``application/x-npz``
  against L rendered as JSON;
* ``scaling_spread`` (lower is better): in-process render time per response byte,
  the largest over the smallest, for n = 32 … 256 tokens at d_model 64 (the sizes
  in interleaved rounds, each its fastest round).

Each is compared with bench/guard-baseline.json (the same ratios measured on
the development machine; HTTP ones per load generator). The run fails only
when a ratio is more than ``--factor`` (2) times worse than its baseline: a
real regression, never noise or a slower machine. The figures go to
``artifacts/bench-guard.json`` and ``.md`` either way. ``--write-baseline``
records this run as the new baseline (commit it with the change that moved it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import orjson

ROOT = Path(__file__).resolve().parent.parent
BASELINE = Path(__file__).with_name("guard-baseline.json")

#: each guarded ratio, and whether a larger value is better
RATIOS: dict[str, bool] = {
    "trace_S_vs_floor": True,
    "check_vs_trace_S": True,
    "L_render_vs_encode": False,
    "L_npz_vs_json": False,
    "scaling_spread": False,
}
HTTP_RATIOS = ("trace_S_vs_floor", "check_vs_trace_S")


def _cpu_timer(fn: Any, repeats: int, number: int = 1) -> float:
    """The median of ``repeats`` measurements of ``fn``'s thread CPU time per call (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        for _ in range(number):
            fn()
        times.append((time.thread_time() - t0) / number)
    return statistics.median(times)


def check_body() -> bytes:
    """/check S with a wrong 5-stage submission: the numbers of a known bug, so diagnosis tries every bug."""
    from attention_trace.client import LocalClient
    from engine import BUG_NAMES

    base = {"sentence": "the cat sat", "d_model": 24, "num_heads": 4, "causal": True}
    stages = ["q", "scores", "scaled_scores", "weights", "output"]
    wrong = LocalClient().trace({**base, "inject_bug": BUG_NAMES[0], "stages": stages})
    return orjson.dumps({**base, "submission": {sid: wrong.stages[sid].values for sid in stages}})


def in_process(repeats: int) -> dict[str, float]:
    """The in-process ratios: L's render against its encoding, npz against JSON, and the scaling spread."""
    from service import serialize
    from service.settings import Settings

    from . import service_path
    from .workloads import by_name, sentence_of

    s = Settings()
    L = by_name()["L"]
    req = service_path.validate(L.body_bytes, s)
    from service.routes.trace import trace_document

    doc = trace_document(req)
    encode = _cpu_timer(lambda: serialize.dumps(doc), repeats)
    render = _cpu_timer(lambda: service_path.render(L.body_bytes, s), repeats)
    render_npz = _cpu_timer(lambda: service_path.render_npz(L.body_bytes, s), repeats)
    # The four sizes are timed in interleaved rounds and each keeps its fastest round: other work on the
    # machine only adds to a measurement, and one slow stretch used to land on one size alone (a spread of
    # 3.2 on a loaded machine whose other rounds gave 1.4).
    raws = {n: orjson.dumps({"sentence": sentence_of(n), "d_model": 64, "num_heads": 4}) for n in (32, 64, 128, 256)}
    sizes = {n: len(service_path.render(raw, s)) for n, raw in raws.items()}  # also the warm-up
    fastest = dict.fromkeys(raws, math.inf)
    for _ in range(repeats):
        for n, raw in raws.items():
            t0 = time.thread_time()
            service_path.render(raw, s)
            fastest[n] = min(fastest[n], time.thread_time() - t0)
    per_byte = {n: fastest[n] / sizes[n] for n in raws}
    return {
        "L_render_vs_encode": render / encode,
        "L_npz_vs_json": render_npz / render,
        "scaling_spread": max(per_byte.values()) / min(per_byte.values()),
        "_L_render_s": render, "_L_encode_s": encode, "_L_npz_s": render_npz,
        **{f"_per_byte_s_n{n}": v for n, v in per_byte.items()},
    }


def over_http(rounds: int, duration_s: float, conns: int, force_python: bool) -> tuple[str, dict[str, float]]:
    """The HTTP ratios, under real gunicorn with the response cache off (every request is work)."""
    from service.settings import Settings

    from . import service_path
    from .http_bench import Fixture, LoadGenerator, Server, check_rounds, paired_rounds, rps_ratio
    from .workloads import by_name, distinct_small

    gen = LoadGenerator(force_python=force_python)
    s_star, S = distinct_small(), by_name()["S"]
    d = Path(tempfile.mkdtemp(prefix="attention-trace-guard-"))
    try:
        (d / "Sstar.req").write_bytes(s_star.body_bytes)
        (d / "S.req").write_bytes(S.body_bytes)
        (d / "check.req").write_bytes(check_body())
        (d / "Sstar.json").write_bytes(service_path.render(s_star.body_bytes.replace(b"__N__", b"0"), Settings()))
        fixture = Fixture(d, {})
        server = Server(d, env={"ATTENTION_TRACE_RESPONSE_CACHE_BYTES": "0"}, label="guard")
        try:
            status, _ = server.post("/check", (d / "check.req").read_bytes())
            if status != 200:
                raise RuntimeError(f"/check answered {status}")
            star = paired_rounds(gen, server, fixture, "Sstar", {"trace": "/trace", "floor": "/bench/static/Sstar"},
                                 rounds, duration_s, conns, "guard-star")
            runs = check_rounds(server, gen, fixture, rounds, duration_s, conns, "guard")
        finally:
            server.stop()
    finally:
        shutil.rmtree(d, ignore_errors=True)

    errors = sum(r.errors for v in (*star.values(), *runs.values()) for r in v)
    if errors:
        raise RuntimeError(f"{errors} requests failed during the guard's HTTP runs")
    if any(r.rps == 0 for v in (*star.values(), *runs.values()) for r in v):
        raise RuntimeError("an HTTP run of the guard answered no request")
    return gen.name, {
        # every run answered (checked above), so each ratio is a number
        "trace_S_vs_floor": cast(float, rps_ratio(star["trace"], star["floor"])),
        "check_vs_trace_S": cast(float, rps_ratio(runs["check"], runs["trace"])),
        "_trace_Sstar_rps": statistics.median(r.rps for r in star["trace"]),
        "_floor_rps": statistics.median(r.rps for r in star["floor"]),
        "_trace_S_rps": statistics.median(r.rps for r in runs["trace"]),
        "_check_S_rps": statistics.median(r.rps for r in runs["check"]),
    }


def generator_key(name: str) -> str:
    return "wrk" if name.startswith("wrk") else "python"


def judge(figures: dict[str, float], baseline: dict[str, float], factor: float) -> list[dict[str, Any]]:
    rows = []
    for key, higher_better in RATIOS.items():
        if key not in figures:
            continue
        now, base = figures[key], baseline.get(key)
        if base is None:
            rows.append({"ratio": key, "now": now, "baseline": None, "limit": None, "ok": True})
            continue
        limit = base / factor if higher_better else base * factor
        ok = now >= limit if higher_better else now <= limit
        rows.append({"ratio": key, "now": now, "baseline": base, "limit": limit, "ok": ok,
                     "higher_is_better": higher_better})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.guard", description=__doc__.splitlines()[0])
    ap.add_argument("--factor", type=float, default=2.0, help="fail when a ratio is this many times worse (2)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved HTTP rounds per pair (3)")
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per HTTP run (2)")
    ap.add_argument("--repeats", type=int, default=5, help="in-process measurements per figure (5)")
    ap.add_argument("--python-client", action="store_true", help="the Python load generator even if wrk is there")
    ap.add_argument("--write-baseline", action="store_true", help="record this run as bench/guard-baseline.json")
    ap.add_argument("--out", default=str(ROOT / "artifacts"), help="where bench-guard.json and .md go")
    args = ap.parse_args(argv)

    # One BLAS thread here, as in every gunicorn worker (gunicorn.conf.py).
    try:
        from threadpoolctl import threadpool_limits

        limiter = threadpool_limits(1, user_api="blas")  # noqa: F841 (held for the run)
    except ImportError:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    started = time.perf_counter()
    figures = in_process(args.repeats)
    gen, http = over_http(args.rounds, args.duration, 2 * (os.cpu_count() or 1), args.python_client)
    figures.update(http)
    gkey = generator_key(gen)

    base_doc = json.loads(BASELINE.read_text(encoding="utf-8")) if BASELINE.exists() else {}
    baseline = {**base_doc.get("in_process", {}), **base_doc.get("http", {}).get(gkey, {})}
    rows = judge(figures, baseline, args.factor)
    took = time.perf_counter() - started

    lines = [f"### Performance guard ({gen}; {took:.0f} s; fails when a ratio is {args.factor:g}× worse "
             "than bench/guard-baseline.json)", "",
             "| ratio | this run | baseline | limit | ok |", "|---|---|---|---|---|"]
    for r in rows:
        fmt = (lambda v: "–" if v is None else f"{v:.3f}")  # noqa: E731 (a one-line formatter)
        sign = "≥" if r.get("higher_is_better") else "≤"
        lines.append(f"| {r['ratio']} | {r['now']:.3f} | {fmt(r['baseline'])} | "
                     f"{'–' if r['limit'] is None else sign + ' ' + fmt(r['limit'])} | {'yes' if r['ok'] else 'NO'} |")
    lines += ["", "raw figures: " + ", ".join(f"{k[1:]} {v:.6g}" for k, v in figures.items() if k.startswith("_"))]
    text = "\n".join(lines)
    print(text, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench-guard.md").write_text(text + "\n", encoding="utf-8")
    (out / "bench-guard.json").write_text(json.dumps({"generator": gen, "figures": figures, "rows": rows,
                                                      "took_s": took}, indent=1), encoding="utf-8")
    if args.write_baseline:
        base_doc.setdefault("http", {})[gkey] = {k: figures[k] for k in HTTP_RATIOS}
        base_doc["in_process"] = {k: v for k, v in figures.items() if k in RATIOS and k not in HTTP_RATIOS}
        base_doc["note"] = ("ratios measured by `python -m bench.guard --write-baseline` on the development "
                            "machine (2-core AMD EPYC); see docs/performance.md")
        BASELINE.write_text(json.dumps(base_doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {BASELINE}")
    failed = [r["ratio"] for r in rows if not r["ok"]]
    if failed:
        print(f"performance regression: {', '.join(failed)} more than {args.factor:g}× worse than the baseline",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
