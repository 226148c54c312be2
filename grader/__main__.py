"""Command line of the grader: ``attention-trace-grade`` (or ``python -m grader``).

    attention-trace-grade setup-sandbox [--runtime DIR] [--force]
        Build the student runtime (stdlib + numpy, readable by any uid) and prove it: start a
        sandboxed process as it will run in production (dropped uid, namespaces, limits), import
        numpy in it and compute. Prints what the sandbox could and could not do here. Exit 1 if
        the sandbox does not work.

    attention-trace-grade grade COURSE.toml SUBMISSION_DIR [--json OUT] [--seed NAME=SEED ...]
        Grade one submission; print the result (JSON with --json).

    attention-trace-grade selftest [COURSE.toml]
        Load the course file (default: the shipped course.toml) and grade the shipped correct student
        with it: full marks expected.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

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
            or out.arrays["result"].tolist() != [0.0, 0.5, 1.0]:
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
    result = core.grade(args.submission, course, seeds=_seeds(args.seed), log=lambda s: print(s, file=sys.stderr))
    if args.json:
        Path(args.json).write_text(json.dumps(dataclasses.asdict(result), indent=2, default=str) + "\n")
    print(result.message)
    for t in result.tests:
        print(f"\n[{'PASS' if t.passed else 'FAIL'}] {t.name} ({t.points:g}/{t.max_points:g}, {t.visibility})\n"
              f"{t.message}")
    if result.printed:
        print(f"\nYour code printed:\n{result.printed}")
    return 0 if result.gradable else 1


def selftest(args: argparse.Namespace) -> int:
    course = config.load(args.course or HERE / "course.toml")
    sub = Path(tempfile.mkdtemp(prefix="attention-selftest-"))
    try:
        shutil.copy(HERE / "students" / ("single_function" if course.form == "single" else "") / "correct.py",
                    sub / course.file)
        result = core.grade(sub, course)
    finally:
        shutil.rmtree(sub, ignore_errors=True)
    print(result.message)
    for t in result.tests:
        print(f"  [{'PASS' if t.passed else 'FAIL'}] {t.name}: {t.points:g}/{t.max_points:g} ({t.visibility})")
    ok = result.gradable and result.score == result.max_score
    print(f"\nselftest: {'OK' if ok else 'FAILED'}: the correct student scored {result.score:g}/"
          f"{result.max_score:g} in {result.extra.get('seconds')} s"
          + ("" if result.gradable else f" (not gradable: {result.internal_error})"))
    return 0 if ok else 1


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
    p.set_defaults(fn=grade)
    p = sub.add_parser("selftest", help="grade the shipped correct student with a course file")
    p.add_argument("course", nargs="?")
    p.set_defaults(fn=selftest)
    args = ap.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
