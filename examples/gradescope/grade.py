#!/usr/bin/env python3
"""Gradescope autograder for the multi-head self-attention assignment: a thin adapter on the
grader (the installed ``grader`` package), which runs the student's code sandboxed, compares it with
the engine's reference, diagnoses it and awards the points of the course file.

This file only finds Gradescope's paths and writes Gradescope's results.json:
https://gradescope-autograders.readthedocs.io/en/latest/specs/ (per-test ``score``, ``max_score``,
``status``, ``name``, ``output``, ``visibility``; top-level ``score``, ``output``,
``stdout_visibility``, ``extra_data``; every text as plain ``text``).

Environment (all optional; run_autograder sets the first three):
  AUTOGRADER_ROOT           default /autograder
  AUTOGRADER_SUBMISSION     default $AUTOGRADER_ROOT/submission
  AUTOGRADER_RESULTS        default $AUTOGRADER_ROOT/results/results.json
  ATTENTION_GRADER_COURSE   the course file (default: course.toml next to this file in the zip;
                            the grader package's course.toml otherwise)
  ATTENTION_TRACE_URL       overrides the course file's [service] url ("local" or a URL)
  ATTENTION_GRADER_SEEDS    name=seed,... : regrade with the seeds a previous run logged
  ATTENTION_GRADER_STUDENT  who submitted, for a course whose seeds are derived per student ([seeds] derive =
                            "student"); default: the user ids in $AUTOGRADER_ROOT/submission_metadata.json
  ATTENTION_GRADER_SECRET   that course's secret (or its [seeds] secret_file)

Exit status 0 when results.json holds a grade. When the submission could not be graded through no
fault of the student's (the service failed, the sandbox failed, the course file is wrong), NO
results.json is written and the exit status is 1: Gradescope then shows "The autograder failed to
execute correctly" and records no score (rather than a 0), and the reason is in the log (stdout, for
the staff); rerun the autograder on the submission once it is fixed.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import grader
from grader import config, core

HERE = Path(__file__).resolve().parent

MAX_OUTPUT = 200_000  # characters of one output field (Gradescope shows them in a <pre>)


def paths() -> tuple[Path, Path, Path]:
    root = Path(os.environ.get("AUTOGRADER_ROOT") or "/autograder")
    sub = Path(os.environ.get("AUTOGRADER_SUBMISSION") or root / "submission")
    results = Path(os.environ.get("AUTOGRADER_RESULTS") or root / "results" / "results.json")
    return root, sub, results


def student_id(root: Path) -> str | None:
    """Who submitted: ATTENTION_GRADER_STUDENT, else Gradescope's user ids (a group's, sorted and joined) from
    submission_metadata.json; None when neither says."""
    if os.environ.get("ATTENTION_GRADER_STUDENT"):
        return os.environ["ATTENTION_GRADER_STUDENT"]
    try:
        meta = json.loads((root / "submission_metadata.json").read_text(encoding="utf-8"))
        ids = sorted(str(u["id"]) for u in meta.get("users", []) if isinstance(u, dict) and u.get("id") is not None)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return "+".join(ids) or None


def _cut(text: str) -> str:
    return text if len(text) <= MAX_OUTPUT else text[:MAX_OUTPUT] + "\n[... cut]"


def results_json(result: core.GradeResult, course: config.Course) -> dict[str, Any]:
    """Gradescope's results.json for a graded submission."""
    output = result.message
    if result.printed:
        output += f"\n\nYour code printed (during the visible tests):\n{result.printed}"
    tests = [{
        "name": t.name,
        "number": str(i + 1),
        "score": t.points,
        "max_score": t.max_points,
        "status": "passed" if t.passed else "failed",
        "output": _cut(t.message),
        "output_format": "text",
        "name_format": "text",
        "visibility": t.visibility,
    } for i, t in enumerate(result.tests)]
    return {
        "score": result.score,
        "execution_time": result.extra.get("seconds", 0.0),
        "output": _cut(output),
        "output_format": "text",
        "test_output_format": "text",
        "test_name_format": "text",
        "visibility": course.gradescope.get("visibility", "visible"),
        "stdout_visibility": course.gradescope.get("stdout_visibility", "hidden"),
        "tests": tests,
        "extra_data": {"max_score": result.max_score, "format_errors": result.format_errors, **result.extra},
    }


def write_atomically(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)


def grade_submission(sub: Path, course: config.Course, results_path: Path, hide: tuple[str, ...] = (),
                     log: Any = print, **kwargs: Any) -> tuple[int, dict[str, Any] | None]:
    """Grade one submission and write results.json; (exit status, the document or None if not graded)."""
    start = time.monotonic()
    results_path.unlink(missing_ok=True)  # a stale file must never stand for this run
    result = core.grade(sub, course, hide=hide + (str(results_path.parent),), log=log, **kwargs)
    if not result.gradable:
        log(f"grader: NOT GRADED ({result.internal_error}); no results.json is written, so Gradescope records "
            "no score. Rerun the autograder once the cause is fixed.")
        return 1, None
    doc = results_json(result, course)
    doc["execution_time"] = round(time.monotonic() - start, 3)
    write_atomically(results_path, doc)
    log(f"grader: results in {results_path}")
    return 0, doc


def main() -> int:
    root, sub, results_path = paths()
    results_path.unlink(missing_ok=True)
    default = HERE / "course.toml" if (HERE / "course.toml").is_file() else grader.COURSE
    course_path = Path(os.environ.get("ATTENTION_GRADER_COURSE") or default)
    try:
        course = config.load(course_path)
        return grade_submission(sub, course, results_path, hide=(str(root),), student=student_id(root))[0]
    except config.ConfigError as e:
        print(f"grader: the course file is wrong: {e}")
        return 1
    except Exception:  # noqa: BLE001 - a bug in the grader: no grade, the traceback for the staff
        traceback.print_exc(file=sys.stdout)
        return 1


if __name__ == "__main__":
    sys.exit(main())
