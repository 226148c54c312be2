"""Timing, machine facts and table printing shared by the benchmark sections.

Every figure the suite prints is a median over repeated runs; every ratio is
taken between two figures measured in the same run, and where it matters the
two sides are *interleaved* (A, B, A, B, …) so that drift in the machine's
load (other processes on a shared 2-core box) hits both sides alike.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: In-process timings use this thread's CPU time by default (bench.run
#: ``--clock cpu``): preemption by other processes on a shared machine does not
#: inflate it, and every timed call here runs on the calling thread (numpy's
#: BLAS and torch are held to one thread). ``--clock wall`` uses perf_counter.
_CLOCK: Callable[[], float] = time.perf_counter


def use_cpu_clock(on: bool) -> None:
    global _CLOCK
    _CLOCK = time.thread_time if on else time.perf_counter


def cpu_clock() -> bool:
    """Whether in-process timings use the thread's CPU time (the default) rather than the wall clock."""
    return _CLOCK is time.thread_time


def clock_name() -> str:
    return "thread CPU time" if _CLOCK is time.thread_time else "wall clock (perf_counter)"


def timed(fn: Callable[[], Any]) -> float:
    t0 = _CLOCK()
    fn()
    return _CLOCK() - t0


def median_time(fn: Callable[[], Any], repeats: int, warmup: int = 1, budget_s: float | None = None) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs (fewer if ``budget_s`` runs out, at least 3)."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    for i in range(repeats):
        times.append(timed(fn))
        if budget_s is not None and i >= 2 and time.perf_counter() - start > budget_s:
            break
    return statistics.median(times)


def interleaved(fns: Sequence[Callable[[], Any]], repeats: int, warmup: int = 1,
                budget_s: float | None = None, before: Callable[[], Any] | None = None) -> list[float]:
    """Median seconds of each function, run in turn A, B, C, A, B, C, …

    ``before`` (untimed) runs before every timed call, e.g. to clear a cache.
    """
    for _ in range(warmup):
        for fn in fns:
            if before:
                before()
            fn()
    times: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    for i in range(repeats):
        for j, fn in enumerate(fns):
            if before:
                before()
            times[j].append(timed(fn))
        if budget_s is not None and i >= 2 and time.perf_counter() - start > budget_s:
            break
    return [statistics.median(t) for t in times]


# ------------------------------------------------------------------ formatting


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms" if seconds < 0.1 else f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "–"
    for unit, size in (("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}" if n / size < 100 else f"{n / size:.0f} {unit}"
    return f"{n:.0f} B"


def fmt_ratio(r: float | None) -> str:
    return "–" if r is None else (f"{r:.2f}×" if r < 100 else f"{r:.0f}×")


def fmt_rate(bytes_per_s: float | None) -> str:
    if bytes_per_s is None:
        return "–"
    bits = bytes_per_s * 8
    if bits >= 1e9:
        return f"{bits / 1e9:.1f} Gbit/s"
    return f"{bits / 1e6:.0f} Mbit/s"


@dataclass
class Table:
    """A markdown pipe table, printed as it is (so docs/performance.md can quote it)."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def render(self) -> str:
        widths = [len(c) for c in self.columns]
        for row in self.rows:
            for i, cell in enumerate(row):
                widths[i] = max(widths[i], len(cell))

        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)) + " |"

        out = [f"### {self.title}", "", line(self.columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        out += [line(r) for r in self.rows]
        if self.notes:
            out.append("")
            out += [f"- {n}" for n in self.notes]
        return "\n".join(out) + "\n"


def print_table(t: Table) -> None:
    print(t.render(), flush=True)


# ------------------------------------------------------------------ machine


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def blas_info() -> list[dict[str, Any]]:
    """numpy's BLAS as threadpoolctl sees it (library, version, kernel, threads)."""
    try:
        import numpy  # noqa: F401  (load the BLAS before asking)
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [i for i in threadpool_info() if i.get("user_api") == "blas"]


def blas_summary(infos: list[dict[str, Any]] | None = None) -> str:
    infos = blas_info() if infos is None else infos
    if not infos:
        return "unknown (threadpoolctl not installed)"
    return "; ".join(
        f"{i.get('internal_api')} {i.get('version')} kernel {i.get('architecture')} "
        f"({i.get('num_threads')} threads by default)"
        for i in infos
    )


def loadavg() -> str:
    try:
        one, five, fifteen = os.getloadavg()
        return f"{one:.2f} {five:.2f} {fifteen:.2f}"
    except OSError:
        return "unknown"


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
