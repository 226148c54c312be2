"""Command line of the grader: ``attention-trace-grade`` (or ``python -m grader``).

    attention-trace-grade setup-sandbox [--runtime DIR] [--force]
        Build the student runtime (stdlib + numpy, readable by any uid) and prove it: start a
        sandboxed process as it will run in production (dropped uid, namespaces, limits), import
        numpy in it and compute. Prints what the sandbox could and could not do here. Exit 1 if
        the sandbox does not work.

    attention-trace-grade grade COURSE.toml SUBMISSION_DIR [--json OUT] [--seed NAME=SEED ...] [--student ID]
        Grade one submission; print the result (JSON with --json) and how long it took.

    attention-trace-grade batch COURSE.toml DIR --out results.csv|results.json [--jobs N]
        Grade every submission in DIR (each a directory holding the course's file, or a .py file; its
        name is the student's id) into one table, one row per submission: score, each test's points, the
        named mistakes, the seeds, the integrity log's kinds and the time it took. Then how long the
        batch took, and what that makes 300 submissions take with these jobs on this machine.

    attention-trace-grade selftest [COURSE.toml] [--solution FILE] [--draws K]
        Load the course file (default: the shipped course.toml) and grade the shipped correct student
        with it (a block course's: students/block_<preset>/correct.py, GPT-2's students/block/correct.py),
        or FILE: full marks expected. With --draws K, grade it K times, each with seeds drawn afresh (or,
        with [seeds] derive = "student", for K students): a correct solution (a float32 one too) must
        earn full marks on every draw, or the course's tolerances fail it on some seeds. Each draw that
        does not is printed with the `grade --seed NAME=SEED ...` options that replay it.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import config, core, runtime, sandbox

HERE = Path(__file__).resolve().parent

PROBE = '''
import numpy as np

def probe():
    return np.linalg.solve(np.eye(3) * 2.0, np.arange(3.0))
'''


def setup_sandbox(args: argparse.Namespace) -> int:
    start = time.monotonic()
    rt = runtime.build(Path(args.runtime) if args.runtime else None, force=args.force)
    print(f"runtime: {rt.root} ({rt.python}), built or checked in {time.monotonic() - start:.1f} s")
    sub = Path(tempfile.mkdtemp(prefix="attention-probe-"))
    try:
        (sub / "attention.py").write_text(PROBE)
        call = sandbox.Call("probe", "probe", {}, [])
        lim = sandbox.Limits(call_seconds=30, total_seconds=60)
        result = sandbox.run_calls([call], runtime=rt, submission=sub, filename="attention.py", limits=lim,
                                   hide=[str(HERE.parent)], deadline=time.monotonic() + 60)
    finally:
        shutil.rmtree(sub, ignore_errors=True)
    out = result.outcomes.get("probe")
    for k, v in result.notes.items():
        print(f"  {k}: {v}")
    if result.start.status != "ready" or out is None or out.status != "ok" \
            or out.arrays is None or out.arrays["result"].tolist() != [0.0, 0.5, 1.0]:
        print(f"sandbox: FAILED: start {result.start}, call {out}, output {result.output!r}", file=sys.stderr)
        return 1
    print(f"sandbox: works ({result.seconds:.2f} s for one sandboxed process)")
    return 0


def _seeds(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items or []:
        name, _, value = item.partition("=")
        out[name] = int(value)
    return out


def grade(args: argparse.Namespace) -> int:
    course = config.load(args.course)
    result = core.grade(args.submission, course, seeds=_seeds(args.seed), log=lambda s: print(s, file=sys.stderr),
                        student=args.student)
    if args.json:
        Path(args.json).write_text(json.dumps(dataclasses.asdict(result), indent=2, default=str) + "\n")
    print(result.message)
    for t in result.tests:
        print(f"\n[{'PASS' if t.passed else 'FAIL'}] {t.name} ({t.points:g}/{t.max_points:g}, {t.visibility})\n"
              f"{t.message}")
    if result.printed:
        print(f"\nYour code printed:\n{result.printed}")
    print(f"\ngraded in {result.extra.get('seconds')} s", file=sys.stderr)
    return 0 if result.gradable else 1


# ------------------------------------------------------------------ batch


def submissions_in(folder: Path, file: str) -> list[tuple[str, Path]]:
    """(student id, path) of each submission in ``folder``: a directory, or a .py file (graded as ``file``)."""
    out = []
    for p in sorted(folder.iterdir()):
        if p.name.startswith("."):
            continue
        if p.is_dir() or p.suffix == ".py":
            out.append((p.stem if p.is_file() else p.name, p))
    return out


def batch_row(student: str, result: core.GradeResult, seconds: float) -> dict[str, Any]:
    """One submission's row of the batch table (staff only: seeds and the integrity log included)."""
    named = result.extra.get("named", {})
    integrity = result.extra.get("integrity", {})
    return {
        "student": student,
        "gradable": result.gradable,
        "score": result.score if result.gradable else None,
        "max_score": result.max_score,
        "seconds": round(seconds, 3),
        "tests": {t.name: t.points for t in result.tests},
        "named": {test: list(bugs) for test, bugs in named.items()},
        "format_error": result.format_errors[0] if result.format_errors else "",
        "not_gradable": result.internal_error or "",
        "integrity": {kind: entry["count"] for kind, entry in integrity.items()},
        "integrity_examples": {kind: entry["examples"][:3] for kind, entry in integrity.items()},
        "seeds": result.extra.get("seeds", {}),
    }


def write_table(rows: list[dict[str, Any]], out: Path, course: config.Course, summary: dict[str, Any]) -> None:
    if out.suffix == ".json":
        out.write_text(json.dumps({"summary": summary, "submissions": rows}, indent=2, ensure_ascii=False) + "\n",
                       encoding="utf-8")
        return
    tests = [t.name for t in course.tests]
    header = ["student", "gradable", "score", "max_score", "seconds", *tests, "named_mistakes", "format_error",
              "not_gradable", "integrity", "seeds"]
    with open(out, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        for r in rows:
            w.writerow([r["student"], r["gradable"], "" if r["score"] is None else f"{r['score']:g}",
                        f"{r['max_score']:g}", r["seconds"], *[f"{r['tests'].get(t, 0):g}" for t in tests],
                        "; ".join(f"{t}: {', '.join(b)}" for t, b in r["named"].items()), r["format_error"],
                        r["not_gradable"], "; ".join(f"{k} {n}" for k, n in r["integrity"].items()),
                        json.dumps(r["seeds"], sort_keys=True)])


def batch(args: argparse.Namespace) -> int:
    course = config.load(args.course)
    folder, out = Path(args.folder), Path(args.out)
    if out.suffix not in (".csv", ".json"):
        print("batch: --out must end in .csv or .json", file=sys.stderr)
        return 2
    subs = submissions_in(folder, course.file)
    if not subs:
        print(f"batch: no submissions in {folder}", file=sys.stderr)
        return 2
    rt = runtime.build(Path(course.runtime) if course.runtime else None)
    lock = threading.Lock()
    done: list[int] = [0]

    def one(student: str, path: Path) -> dict[str, Any]:
        tmp = None
        if path.is_file():
            tmp = Path(tempfile.mkdtemp(prefix="attention-batch-"))
            shutil.copyfile(path, tmp / course.file)
            path = tmp
        log: list[str] = []
        start = time.monotonic()
        try:
            result = core.grade(path, course, student=student, runtime=rt, log=log.append)
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        seconds = time.monotonic() - start
        row = batch_row(student, result, seconds)
        with lock:
            done[0] += 1
            score = f"{result.score:g}/{result.max_score:g}" if result.gradable else "not gradable"
            print(f"[{done[0]}/{len(subs)}] {student}: {score} in {seconds:.2f} s", file=sys.stderr)
        return row

    start = time.monotonic()
    with ThreadPoolExecutor(max(1, args.jobs)) as ex:
        rows = list(ex.map(lambda item: one(*item), subs))
    wall = time.monotonic() - start
    each = [r["seconds"] for r in rows]
    summary = {"submissions": len(rows), "jobs": args.jobs, "wall_seconds": round(wall, 2),
               "seconds_per_submission": {"mean": round(statistics.mean(each), 3),
                                          "median": round(statistics.median(each), 3), "max": round(max(each), 3)},
               "throughput_per_minute": round(60 * len(rows) / wall, 1) if wall else None,
               "minutes_for_300": round(300 * wall / len(rows) / 60, 1)}
    write_table(rows, out, course, summary)
    print(f"batch: {len(rows)} submissions in {wall:.1f} s with {args.jobs} job(s) "
          f"({wall / len(rows):.2f} s each; one submission alone took {summary['seconds_per_submission']['median']} s "
          f"(median), {summary['seconds_per_submission']['max']} s at most); at this rate 300 submissions take "
          f"{summary['minutes_for_300']} min on this machine. Table: {out}", file=sys.stderr)
    return 0 if all(r["gradable"] for r in rows) else 1


def shipped_solution(course: config.Course) -> Path:
    """The shipped correct student of a course file: the single-function one, the block preset's, or the
    attention course's."""
    if course.form == "single":
        return HERE / "students" / "single_function" / "correct.py"
    if course.block is not None:
        folder = "block" if course.block.preset == "gpt2" else f"block_{course.block.preset.removesuffix('2017')}"
        return HERE / "students" / folder / "correct.py"
    return HERE / "students" / "correct.py"


def selftest(args: argparse.Namespace) -> int:
    course = config.load(args.course or HERE / "course.toml")
    draws = getattr(args, "draws", 1)
    if draws < 1:
        print("selftest: --draws must be at least 1", file=sys.stderr)
        return 2
    if draws > 1 and all(c.seed is not None for c in course.configurations.values()):
        print("selftest: every configuration's seed is fixed in the course file, so every draw grades alike",
              file=sys.stderr)
    rt = runtime.build(Path(course.runtime) if course.runtime else None)  # checked once, as batch does
    sub = Path(tempfile.mkdtemp(prefix="attention-selftest-"))
    results = []
    try:
        shutil.copy(Path(args.solution) if getattr(args, "solution", None) else shipped_solution(course),
                    sub / course.file)
        for i in range(draws):  # each grade draws its own seeds (or derives them from its own student id)
            result = core.grade(sub, course, student="selftest" if draws == 1 else f"selftest-{i + 1}",
                                runtime=rt)
            results.append(result)
            if draws > 1 and not _full_marks(result):
                replay = " ".join(f"--seed {n}={v}" for n, v in result.extra.get("seeds", {}).items())
                print(f"draw {i + 1}: {_shortfall(result)}; replay with `grade COURSE SUBMISSION {replay}`", flush=True)
    finally:
        shutil.rmtree(sub, ignore_errors=True)
    if draws == 1:
        result = results[0]
        print(result.message)
        for t in result.tests:
            print(f"  [{'PASS' if t.passed else 'FAIL'}] {t.name}: {t.points:g}/{t.max_points:g} ({t.visibility})")
        print(f"\nselftest: {'OK' if _full_marks(result) else 'FAILED'}: the correct student scored {result.score:g}/"
              f"{result.max_score:g} in {result.extra.get('seconds')} s"
              + ("" if result.gradable else f" (not gradable: {result.internal_error})"))
        return 0 if _full_marks(result) else 1
    full = sum(map(_full_marks, results))
    seconds = statistics.median(r.extra.get("seconds", 0.0) for r in results)
    print(f"\nselftest: {'OK' if full == draws else 'FAILED'}: the correct student scored full marks "
          f"({results[0].max_score:g}) on {full} of {draws} draws of seeds ({seconds:.2f} s a grade, median)")
    return 0 if full == draws else 1


def _full_marks(result: core.GradeResult) -> bool:
    return result.gradable and result.score == result.max_score


def _shortfall(result: core.GradeResult) -> str:
    if not result.gradable:
        return f"not gradable ({result.internal_error})"
    failed = [t.name for t in result.tests if not t.passed]
    return f"{result.score:g}/{result.max_score:g}, failed {', '.join(failed)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="attention-trace-grade", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("setup-sandbox", help="build the student runtime and check the sandbox")
    p.add_argument("--runtime", help=f"where (default {runtime.default_location()})")
    p.add_argument("--force", action="store_true", help="rebuild even when it is current")
    p.set_defaults(fn=setup_sandbox)
    p = sub.add_parser("grade", help="grade one submission")
    p.add_argument("course")
    p.add_argument("submission")
    p.add_argument("--json")
    p.add_argument("--seed", action="append", help="NAME=SEED: fix a configuration's seed (a regrade)")
    p.add_argument("--student", help="who submitted (the key of derived seeds: [seeds] derive = \"student\")")
    p.set_defaults(fn=grade)
    p = sub.add_parser("batch", help="grade a directory of submissions into one table")
    p.add_argument("course")
    p.add_argument("folder", metavar="DIR")
    p.add_argument("--out", required=True, help="results.csv or results.json")
    p.add_argument("--jobs", type=int, default=2, help="submissions graded at once (default 2: one per core of a "
                                                          "2-core machine, the sandboxed processes mostly wait)")
    p.set_defaults(fn=batch)
    p = sub.add_parser("selftest", help="grade the shipped correct student with a course file")
    p.add_argument("course", nargs="?")
    p.add_argument("--solution", help="the correct submission to grade (default: the shipped one for the course)")
    p.add_argument("--draws", type=int, default=1, metavar="K",
                   help="grade it K times with seeds drawn afresh: full marks expected on every draw (default 1)")
    p.set_defaults(fn=selftest)
    args = ap.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
