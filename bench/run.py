"""attention-trace benchmark suite: ``python -m bench.run [--quick]``.

Prints markdown tables: engine time (with torch's multi-head attention as a
reference), serialization and request options, compression, HTTP throughput
and latency under real gunicorn against the framework's floor, BLAS threads,
token scaling, where the time goes, the project's worker against gunicorn's
stock workers with the whole stack against a plain Flask floor, and the
targets as ratios from this run. Also writes them, with the raw figures as
JSON, to artifacts/. ``--workers`` runs the worker comparison alone.

Run it with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset in that command
alone (see bench/README.md); the header says which BLAS kernel ran.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from .common import (
    Table,
    blas_info,
    blas_summary,
    clock_name,
    cpu_model,
    cpus,
    fmt_ratio,
    loadavg,
    print_table,
    use_cpu_clock,
)

ROOT = Path(__file__).resolve().parent.parent
#: the sections, in the order they run (--skip and --only take these names)
SECTIONS = ("engine", "block", "serialize", "compress", "http", "profile", "workers")


def _v(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="about a minute: fewer repeats and shorter HTTP runs")
    ap.add_argument("--skip", default="",
                    help="comma-separated sections to skip: " + ",".join(SECTIONS))
    ap.add_argument("--only", default="",
                    help="comma-separated sections to run, the others skipped (e.g. --only workers)")
    ap.add_argument("--workers", action="store_true",
                    help="the worker comparison alone (= --only workers): the project's worker against gunicorn's "
                         "sync, gthread and gevent, and the four whole-stack ratios against a plain Flask floor")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="in-process timings on this thread's CPU time (default: other processes on a shared "
                         "machine do not inflate it) or on the wall clock")
    ap.add_argument("--python-client", action="store_true",
                    help="use the Python load generator even if wrk is installed")
    ap.add_argument("--keep-logs", action="store_true",
                    help="keep the gunicorn logs in artifacts/ (deleted after a clean stop by default)")
    ap.add_argument("--out", default=str(ROOT / "artifacts"),
                    help="where bench.md and bench.json go (default artifacts/)")
    args = ap.parse_args(argv)
    try:
        skip = skipped_sections(args.skip, args.only, args.workers)
    except ValueError as e:
        ap.error(str(e))
    use_cpu_clock(args.clock == "cpu")

    # One BLAS thread in this process too, as every gunicorn worker has; threadpoolctl holds it for the run.
    import numpy  # noqa: F401 (loads the BLAS that threadpoolctl then finds)
    from threadpoolctl import threadpool_limits

    blas_default = blas_summary()
    limiter = threadpool_limits(1, user_api="blas")  # noqa: F841  (kept for the whole run)
    held = sorted({i.get("num_threads") for i in blas_info()})  # type: ignore[type-var]  # each pool has a count

    from . import engine_bench, guard, http_bench, profile_bench, serialize_bench, torch_compare, worker_bench

    http_bench.Server.keep_logs = args.keep_logs
    from .workloads import NARROW_D_MODEL, by_name, distinct_small, scaling_series, workloads

    q = args.quick
    repeats = 5 if q else 15
    budget = 1.5 if q else 6.0
    rounds = 1 if q else 5
    dur = 1.0  # seconds per HTTP run (XL: twice); repetition comes from the rounds
    worker_rounds = 3 if q else 10  # section 6: rounds of the six load cells, then of the one-connection items
    worker_seq_rounds = 2 if q else 5
    conns = 2 * cpus()

    wl = workloads()
    names = by_name()
    series = scaling_series()
    narrow = scaling_series(d_model=NARROW_D_MODEL, start=32)
    results: dict[str, Any] = {"mode": "quick" if q else "full"}
    tables: list[Table] = []
    started = time.perf_counter()

    def show(t: Table) -> None:
        tables.append(t)
        print_table(t)

    header = Table("Machine and run", ["item", "value"])
    header.add("CPU", f"{cpu_model()} ({cpus()} CPUs available), {platform.machine()}")
    header.add("numpy BLAS (threadpoolctl)", blas_default + f"; held to {'/'.join(map(str, held))} thread(s) in "
                                                            "this process")
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if os.environ.get(var):
            header.add(f"WARNING: {var}", f"{os.environ[var]!r} is set: it slows current numpy; run with "
                                            f"`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE …`")
    header.add("code", _git_describe())
    header.add("Python / numpy / orjson / gunicorn",
               f"{platform.python_version()} / {_v('numpy')} / {_v('orjson')} / {_v('gunicorn')}")
    header.add("torch (reference only)", torch_compare.version())
    header.add("mode", f"{results['mode']}: {repeats} repeats per in-process figure, HTTP {rounds} round(s) of "
                       f"{dur:g} s per cell (section 6: {worker_rounds} under load, {worker_seq_rounds} on one "
                       f"connection); in-process clock: {clock_name()}")
    if skip:
        header.add("sections skipped", ", ".join(s for s in SECTIONS if s in skip))
    busy = os.getloadavg()[0] > 0.5 * cpus()
    header.add("load average at start", loadavg() + ("  (BUSY: other processes share these cores; wall-clock "
                                                      "figures are perturbed, CPU-time figures much less)"
                                                      if busy else ""))
    header.add("workloads", "; ".join(f"{w.name}: {w.shape}{' (' + w.note + ')' if w.note else ''}" for w in wl))
    show(header)

    # ---------------------------------------------------------------- 1. engine
    if "engine" not in skip:
        results["engine"] = {}
        show(engine_bench.run(wl, repeats, budget, results["engine"]))

    # ---------------------------------------------------------------- 1b. a stack of blocks vs torch
    if "block" not in skip:  # 1b: the stack of blocks (bench/block_bench.py; --skip block leaves it out)
        from . import block_bench

        results["block"] = {}
        show(block_bench.run(max(3, repeats // 3), budget * 4, results["block"]))

    # ---------------------------------------------------------------- 2. serialization
    responses: dict[str, bytes] = {}
    from service.settings import Settings

    from . import service_path

    s = Settings()
    s_star = distinct_small()
    if {"compress", "http"} - skip:  # the bodies the static floor answers and compression compresses
        for w in wl + series + narrow:
            responses[w.name] = service_path.render(w.body_bytes, s)
        responses[s_star.name] = service_path.render(s_star.body_bytes.replace(b"__N__", b"0"), s)
    if "serialize" not in skip:
        results["serialize"] = {}
        show(serialize_bench.run_serialization(wl, repeats, budget, results["serialize"],
                                               skip_stdlib={"XL"} if q else set()))
        results["options"] = {}
        show(serialize_bench.run_options(names["L"], repeats, budget, results["options"]))
    if "compress" not in skip:
        results["compression"] = {}
        render_s = {k: v["render_s"] for k, v in results.get("serialize", {}).items()}
        bodies = {w.name: responses[w.name] for w in wl if not (q and w.name == "XL")}
        t = serialize_bench.run_compression(bodies, render_s, max(3, repeats // 2), budget, results["compression"])
        if q:
            t.notes.append("--quick: XL skipped (it compresses like L, per byte)")
        show(t)

    # ---------------------------------------------------------------- 3./4. HTTP
    seq: dict[str, Any] = {}
    if "http" not in skip:
        gen = http_bench.LoadGenerator(force_python=args.python_client)
        http_wl = wl[:1] + [s_star] + wl[1:]
        fixture = http_bench.make_fixture(http_wl + series + narrow, responses)
        (fixture.dir / "check.req").write_bytes(guard.check_body())
        try:
            run_http(show, args, results, gen, fixture, http_wl, wl, series + narrow, names, seq, rounds, dur, conns)
        finally:
            shutil.rmtree(fixture.dir, ignore_errors=True)  # request bodies and pre-encoded responses
        results["scaling"] = {}
        show(http_bench.scaling_table(series, seq, results["scaling"]))
        results["scaling_narrow"] = {}
        show(http_bench.scaling_table(narrow, seq, results["scaling_narrow"]))

    # ---------------------------------------------------------------- 5. profile
    if "profile" not in skip:
        results["profile"] = {}
        show(profile_bench.measure(wl, seq, repeats, budget, results["profile"]))
        show(profile_bench.cprofile_top([names["S"], names["L"]], {"S": 300 if q else 2000, "L": 3 if q else 10},
                                        top=8))

    # ---------------------------------------------------------------- 6. worker classes, whole stack
    if "workers" not in skip:
        results["workers"] = {}
        for t in worker_bench.run(http_bench.LoadGenerator(force_python=args.python_client), worker_rounds, dur,
                                  conns, worker_seq_rounds, results["workers"]):
            show(t)

    # ---------------------------------------------------------------- targets
    show(targets(results))
    took = time.perf_counter() - started
    print(f"load average at end: {loadavg()}; suite took {took:.0f} s", flush=True)
    results["took_s"] = took
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text("\n".join(t.render() for t in tables)
                                  + f"\nload average at end: {loadavg()}; suite took {took:.0f} s\n",
                                  encoding="utf-8")
    (out / "bench.json").write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")
    print(f"tables: {out / 'bench.md'}; figures: {out / 'bench.json'}", flush=True)
    return 0


def skipped_sections(skip: str, only: str = "", workers: bool = False) -> set[str]:
    """The sections not to run, from --skip, --only (both comma-separated) and --workers (= --only workers)."""
    skipped = {x.strip() for x in skip.split(",") if x.strip()}
    chosen = {x.strip() for x in only.split(",") if x.strip()} | ({"workers"} if workers else set())
    unknown = (skipped | chosen) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown section(s): {', '.join(sorted(unknown))}; sections: {', '.join(SECTIONS)}")
    if chosen:
        skipped |= set(SECTIONS) - chosen
    return skipped


def run_http(show: Any, args: Any, results: dict[str, Any], gen: Any, fixture: Any, http_wl: list[Any],
             wl: list[Any], series: list[Any], names: dict[str, Any], seq: dict[str, Any], rounds: int,
             dur: float, conns: int) -> None:
    """Sections 3, 3b and 3c: one server for the load and one-connection runs, two for BLAS threads."""
    from . import http_bench

    q = args.quick
    # The response cache off: this measures the work (a grader's /check and every new sentence miss it).
    server = http_bench.Server(fixture.dir, env={"ATTENTION_TRACE_RESPONSE_CACHE_BYTES": "0"})
    try:
        notes = http_bench.check_server(server, fixture, http_wl)
        notes += http_bench.check_server(server, fixture, series, static=False)
        infos = server.workers_blas()
        results["workers_blas"] = infos
        results["load"] = {}
        t = http_bench.run_load(server, gen, fixture, http_wl, rounds, dur, conns, results["load"])
        t.notes.append("S* = S with a new third word in every request (\"the cat sat1\", \"sat2\", …): "
                       "nothing to reuse between requests but the weights; its floor is the response for \"sat0\"")
        t.notes += notes
        t.notes.append("workers' BLAS: " + "; ".join(
            f"pid {i['pid']}: " + ", ".join(f"{b['internal_api']} {b['architecture']} {b['num_threads']} thread(s)"
                                           for b in i["blas"]) for i in infos))
        show(t)
        results["check"] = {}
        show(http_bench.run_check(server, gen, fixture, rounds, dur, conns, results["check"]))
        http_bench.run_sequential(server, gen, fixture, wl + series, dur, 8 if q else 20, seq,
                                  floor={w.name for w in wl})
        results["sequential"] = seq
        enc = {k: v["orjson_s"] for k, v in results.get("serialize", {}).items()}
        show(http_bench.sequential_table(wl, seq, enc))
    finally:
        server.stop()
    results["blas_threads"] = {}
    show(http_bench.run_blas_threads(fixture, gen, [names["M"], names["L"]], rounds, dur, conns,
                                     results["blas_threads"]))


def _git_describe() -> str:
    import subprocess

    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "engine", "service"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return f"git {sha}" + (" + uncommitted changes in engine/ or service/" if dirty else "")


def targets(r: dict[str, Any]) -> Table:
    from .workloads import NARROW_D_MODEL

    t = Table("Targets (ratios from this run)", ["target", "measured", "limit", "met?"])

    def row(name: str, value: float | None, limit: float, lower_is_better: bool = True, how: str = "") -> None:
        if value is None:
            t.add(name, "not measured", fmt_ratio(limit), "–")
            return
        ok = value <= limit if lower_is_better else value >= limit
        t.add(name, fmt_ratio(value) + (f" ({how})" if how else ""),
              ("≤ " if lower_is_better else "≥ ") + fmt_ratio(limit), "yes" if ok else "NO")

    if not any(k in r for k in ("engine", "serialize", "load", "sequential", "scaling_narrow")):
        _whole_stack_targets(r, row, t)  # only section 6 ran
        return t
    load = r.get("load", {})
    s = load.get("S*")
    row("S* (uncached: a new sentence every request): req/s vs the static-body floor", s and s["rps_ratio"], 0.75,
        lower_is_better=False, how=s and f"{s['trace']['rps']:.0f} vs {s['floor']['rps']:.0f} req/s")
    s = load.get("S")
    if s:
        t.add("(S repeated, for reference)", fmt_ratio(s["rps_ratio"]) + f" ({s['trace']['rps']:.0f} vs "
              f"{s['floor']['rps']:.0f} req/s)", "", "")
    c = r.get("check", {})
    row("/check S (wrong 5-stage submission) vs /trace S, req/s", c.get("ratio"), 0.5, lower_is_better=False,
        how=c and f"{c['check']['rps']:.0f} vs {c['trace']['rps']:.0f} req/s")
    seq, ser = r.get("sequential", {}), r.get("serialize", {})
    srv = seq.get("L", {}).get("trace", {}).get("server_s")
    if srv and "L" in ser:
        row("L: server time per request vs orjson encode alone", srv / ser["L"]["orjson_s"], 1.2,
            how=f"{srv * 1e3:.1f} ms vs {ser['L']['orjson_s'] * 1e3:.1f} ms")
    else:
        row("L: server time per request vs orjson encode alone", None, 1.2)
    if "L" in ser and ser["L"].get("render_npz_s"):
        row("L as application/x-npz vs as JSON (whole render in process)",
            ser["L"]["render_npz_s"] / ser["L"]["render_s"], 0.5,
            how=f"{ser['L']['render_npz_s'] * 1e3:.1f} ms vs {ser['L']['render_s'] * 1e3:.1f} ms")
    cpu = seq.get("L", {}).get("trace", {}).get("cpu_per_request_s")
    if cpu and "L" in ser:
        t.add("(L, for reference: worker CPU per request vs encode)", fmt_ratio(cpu / ser["L"]["orjson_s"])
              + f" ({cpu * 1e3:.1f} ms vs {ser['L']['orjson_s'] * 1e3:.1f} ms)", "", "")
    eng = r.get("engine", {})
    for name in ("M", "L"):
        e = eng.get(name, {})
        if "core_torch_s" in e:
            row(f"{name}: attention core vs torch MHA (float64, 1 thread)", e["core_numpy_s"] / e["core_torch_s"], 1.0,
                how=f"{e['core_numpy_s'] * 1e3:.3f} vs {e['core_torch_s'] * 1e3:.3f} ms")
        else:
            row(f"{name}: attention core vs torch MHA (float64, 1 thread)", None, 1.0)
    b = r.get("block", {})
    row("GPT-2-small stack (768, 12 heads, 12 layers, 64 tokens): engine trace vs torch float64 + hooks",
        b.get("ratio"), 1.5, how=b.get("ratio") and f"{b['engine_s'] * 1e3:.0f} vs {b['torch_s'] * 1e3:.0f} ms")
    sc = r.get("scaling_narrow", {})
    row(f"scaling: server time per byte, max / min over 32…256 tokens at d_model {NARROW_D_MODEL}",
        sc.get("per_byte_spread"), 1.5)
    sc = r.get("scaling", {})
    row("(scaling at d_model 512, 8…256 tokens: the first round's series)", sc.get("per_byte_spread"), 1.5)
    _whole_stack_targets(r, row, t)
    return t


def _whole_stack_targets(r: dict[str, Any], row: Any, t: Table) -> None:
    """Section 6's four ratios (against floors started in the same run), and the worker classes for reference."""
    w = r.get("workers")
    if not w:
        return
    from .worker_bench import TARGETS

    for key, (what, limit, higher) in TARGETS.items():
        row(f"whole stack: {what}", w["ratios"].get(key), limit, lower_is_better=not higher)
    if w.get("per_byte_e2e_spread"):
        t.add("(time per byte, 32 … 256 tokens, end to end: wrk's median latency, the whole answer received; "
              "for reference)", fmt_ratio(w["per_byte_e2e_spread"]), "", "")
    proj, sync = w["classes"].get("project"), w["classes"].get("sync")
    if proj and sync and sync.get("rps_vs_project"):
        t.add("(/trace S req/s, sync ÷ the project's worker, same app and config, median of rounds: for reference)",
              fmt_ratio(sync["rps_vs_project"]) + f" ({sync['rps']:,.0f} vs {proj['rps']:,.0f} req/s)", "", "")


if __name__ == "__main__":
    sys.exit(main())
