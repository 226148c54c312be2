"""attention-trace benchmark suite: ``python -m bench.run [--quick]``.

Prints markdown tables: engine time (with torch's multi-head attention as a
reference), a stack of blocks against transformers, serialization and request
options, compression, and the server: the whole stack under gunicorn's sync
worker against fixed floors, with nginx in front, and the worker classes side
by side; then the targets as ratios from this run. Also writes them, with the
raw figures as JSON, to artifacts/. ``--server`` runs the server section alone.

Run it with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset in that command
alone (see bench/README.md); the header says which BLAS kernel ran.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
SECTIONS = ("engine", "block", "serialize", "compress", "server")


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
                    help="comma-separated sections to run, the others skipped (e.g. --only server)")
    ap.add_argument("--server", action="store_true",
                    help="the server section alone (= --only server): the whole stack against fixed floors, nginx "
                         "in front, and the worker classes side by side")
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
        skip = skipped_sections(args.skip, args.only, args.server)
    except ValueError as e:
        ap.error(str(e))
    use_cpu_clock(args.clock == "cpu")

    # One BLAS thread in this process too, as every gunicorn worker has; threadpoolctl holds it for the run.
    import numpy  # noqa: F401 (loads the BLAS that threadpoolctl then finds)
    from threadpoolctl import threadpool_limits

    blas_default = blas_summary()
    limiter = threadpool_limits(1, user_api="blas")  # noqa: F841  (kept for the whole run)
    held = sorted({i.get("num_threads") for i in blas_info()})  # type: ignore[type-var]  # each pool has a count

    from . import engine_bench, http_bench, serialize_bench, server_bench, torch_compare

    http_bench.Server.keep_logs = args.keep_logs
    from .workloads import by_name, workloads

    q = args.quick
    repeats = 5 if q else 15
    budget = 1.5 if q else 6.0
    dur = 1.0  # seconds per HTTP run; repetition comes from the rounds
    server_rounds = 3 if q else 10  # section 6: rounds of the load cells, then of the one-connection items
    server_seq_rounds = 2 if q else 5
    conns = 2 * cpus()

    wl = workloads()
    names = by_name()
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
    header.add("mode", f"{results['mode']}: {repeats} repeats per in-process figure; HTTP (section 6) "
                       f"{server_rounds} round(s) of {dur:g} s per cell under load, {server_seq_rounds} on one "
                       f"connection; in-process clock: {clock_name()}")
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
    if "compress" not in skip:  # the bodies compression compresses
        for w in wl:
            responses[w.name] = service_path.render(w.body_bytes, s)
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

    # ---------------------------------------------------------------- 6. the server
    if "server" not in skip:
        results["server"] = {}
        for t in server_bench.run(http_bench.LoadGenerator(force_python=args.python_client), server_rounds, dur,
                                  conns, server_seq_rounds, results["server"]):
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


def skipped_sections(skip: str, only: str = "", server: bool = False) -> set[str]:
    """The sections not to run, from --skip, --only (both comma-separated) and --server (= --only server)."""
    skipped = {x.strip() for x in skip.split(",") if x.strip()}
    chosen = {x.strip() for x in only.split(",") if x.strip()} | ({"server"} if server else set())
    unknown = (skipped | chosen) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown section(s): {', '.join(sorted(unknown))}; sections: {', '.join(SECTIONS)}")
    if chosen:
        skipped |= set(SECTIONS) - chosen
    return skipped


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
    t = Table("Targets (ratios from this run)", ["target", "measured", "limit", "met?"])

    def row(name: str, value: float | None, limit: float, lower_is_better: bool = True, how: str = "") -> None:
        if value is None:
            t.add(name, "not measured", fmt_ratio(limit), "–")
            return
        ok = value <= limit if lower_is_better else value >= limit
        t.add(name, fmt_ratio(value) + (f" ({how})" if how else ""),
              ("≤ " if lower_is_better else "≥ ") + fmt_ratio(limit), "yes" if ok else "NO")

    eng = r.get("engine", {})
    for name in ("M", "L"):
        e = eng.get(name, {})
        if "core_torch_s" in e:
            row(f"{name}: attention core vs torch MHA (float64, 1 thread)", e["core_numpy_s"] / e["core_torch_s"], 1.0,
                how=f"{e['core_numpy_s'] * 1e3:.3f} vs {e['core_torch_s'] * 1e3:.3f} ms")
    b = r.get("block", {})
    if b:
        row("GPT-2-small stack (768, 12 heads, 12 layers, 64 tokens): engine trace vs torch float64 + hooks",
            b.get("ratio"), 1.5, how=b.get("ratio") and f"{b['engine_s'] * 1e3:.0f} vs {b['torch_s'] * 1e3:.0f} ms")
    srv = r.get("server")
    if srv:
        from .server_bench import TARGETS

        for key, (what, limit, higher) in TARGETS.items():
            row(f"server: {what}", srv["ratios"].get(key), limit, lower_is_better=not higher)
    return t


if __name__ == "__main__":
    sys.exit(main())
