#!/usr/bin/env python3
"""PrairieLearn external grader for the multi-head self-attention assignment: a thin adapter on the
grader (the installed ``grader`` package: sandbox, reference, check, points, messages).

It reads the student's files from ``/grade/student`` and writes PrairieLearn's
``/grade/results/results.json`` (docs/externalGrading.md in PrairieLearn):

* gradable: ``{"gradable": true, "score": 0..1, "message", "output", "tests": [{"name",
  "description", "points", "max_points", "message", "output"}]}``;
* a submission that cannot be run (no file, a syntax error, an exception while importing):
  ``{"gradable": false, "format_errors": [...]}``: no points lost, no attempt used;
* not gradable through no fault of the student's (the service or the sandbox failed, the course
  file is wrong): ``{"gradable": false, ...}`` with the reason, so no grade is recorded.

PrairieLearn shows every test as soon as it is graded, so a test the course file marks
``after_due_date``, ``after_published`` or ``hidden`` gets the message without numbers (pass/fail
and the named mistake). The file is at most ``MAX_BYTES`` (PrairieLearn's 1 MB limit), enforced:
outputs are shortened until it fits.

Environment (optional):
  PL_GRADE_ROOT            default /grade
  ATTENTION_GRADER_COURSE  default /grade/tests/course.toml if it exists, else
                           /grade/serverFilesCourse/attention_grader/course.toml, else the course.toml
                           shipped with the grader
  ATTENTION_TRACE_URL      overrides the course file's [service] url
  ATTENTION_GRADER_SEEDS   name=seed,... : regrade with the seeds a previous run logged
  ATTENTION_GRADER_STUDENT who submitted, for a course whose seeds are derived per student ([seeds] derive =
                           "student"); default: the variant's seed in /grade/data/data.json (PrairieLearn keeps
                           it for a regrade of that variant)
  ATTENTION_GRADER_SECRET  that course's secret (or its [seeds] secret_file, e.g. in serverFilesCourse)

Besides what pl-external-grader-results shows (message, output, tests), results.json holds ``extra_data`` for
the staff, as Gradescope's does: every configuration's seed (``ATTENTION_GRADER_SEEDS`` regrades with them),
the engine's version, the grading time, the sandbox's notes and the academic-integrity log. PrairieLearn keeps
the whole file; no element renders that key, so a question template must not print it either.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import grader
from grader import config, core

HERE = Path(__file__).resolve().parent

MAX_BYTES = 1_000_000  # PrairieLearn: "this file should be limited to 1 MB"
NOT_GRADABLE = ("Your submission could not be graded, through no fault of your code (the autograder failed). "
                "No attempt was used; please submit again, or tell the course staff if it keeps happening.")


def paths() -> tuple[Path, Path, Path]:
    root = Path(os.environ.get("PL_GRADE_ROOT") or "/grade")
    course = os.environ.get("ATTENTION_GRADER_COURSE")
    if not course:
        for candidate in (root / "tests" / "course.toml",
                          root / "serverFilesCourse" / "attention_grader" / "course.toml",
                          HERE / "course.toml", grader.COURSE):
            if candidate.is_file():
                course = str(candidate)
                break
    return root / "student", root / "results" / "results.json", Path(course or HERE / "course.toml")


def student_id(root: Path) -> str | None:
    """Who submitted: ATTENTION_GRADER_STUDENT, else the variant's seed from /grade/data/data.json."""
    if os.environ.get("ATTENTION_GRADER_STUDENT"):
        return os.environ["ATTENTION_GRADER_STUDENT"]
    try:
        data = json.loads((root / "data" / "data.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    seed = data.get("variant_seed") if isinstance(data, dict) else None
    return None if seed is None else f"variant-{seed}"


def extra_data(result: core.GradeResult) -> dict[str, Any]:
    """For the staff, as Gradescope's extra_data: seeds, engine version, timings, sandbox notes, integrity log."""
    keep = ("seeds", "seeds_from", "student", "engine_version", "seconds", "integrity", "named", "sandbox")
    return {"max_points": result.max_score, **{k: result.extra[k] for k in keep if k in result.extra}}


def results_json(result: core.GradeResult) -> dict[str, Any]:
    if not result.gradable:
        return {"gradable": False, "message": NOT_GRADABLE, "format_errors": [NOT_GRADABLE]}
    if result.format_errors:
        return {"gradable": False, "message": f"Your submission could not be run: {result.format_errors[0]}",
                "format_errors": list(result.format_errors)}
    tests = []
    for t in result.tests:
        text = t.message if t.visibility == "visible" else t.redacted
        first, _, rest = text.partition("\n")
        tests.append({"name": t.name, "description": f"{t.function} ({t.visibility})", "points": t.points,
                      "max_points": t.max_points, "message": first, "output": rest.strip("\n")})
    score = result.score / result.max_score if result.max_score else 0.0
    return {"gradable": True, "score": min(1.0, max(0.0, score)), "message": result.message,
            "output": f"Your code printed (during the visible tests):\n{result.printed}" if result.printed else "",
            "tests": tests, "extra_data": extra_data(result)}


def _size(doc: dict[str, Any]) -> int:
    return len(json.dumps(doc, ensure_ascii=False).encode("utf-8"))


def fit(doc: dict[str, Any], limit: int = MAX_BYTES) -> dict[str, Any]:
    """The document within ``limit`` bytes: outputs, then messages, are shortened until it fits."""
    if _size(doc) <= limit:
        return doc
    note = "\n[... shortened: PrairieLearn's results are limited to 1 MB]"
    for cap in (65536, 16384, 4096, 1024, 256, 0):
        if doc.get("output") and len(doc["output"]) > cap:
            doc["output"] = doc["output"][:cap] + note
        for t in doc.get("tests", []):
            for key in ("output", "message"):
                if len(t.get(key, "")) > cap:
                    t[key] = t[key][:cap] + note
        if len(doc.get("message", "")) > max(cap, 4096):
            doc["message"] = doc["message"][:max(cap, 4096)] + note
        if _size(doc) <= limit:
            return doc
    short = {k: doc[k] for k in ("gradable", "score") if k in doc}
    if "extra_data" in doc:  # the seeds first: a regrade needs them
        short["extra_data"] = {k: doc["extra_data"][k] for k in ("seeds", "student") if k in doc["extra_data"]}
    short["message"] = doc.get("message", "")[:4096]
    short["tests"] = [{"name": t["name"][:200], "points": t["points"], "max_points": t["max_points"]}
                      for t in doc.get("tests", [])]
    if _size(short) > limit:
        short.pop("tests")
    return short


def write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)  # PrairieLearn does not create /grade/results
    data = json.dumps(fit(doc), ensure_ascii=False).encode("utf-8")
    assert len(data) <= MAX_BYTES
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def grade_submission(files: Path, course: config.Course, results_path: Path, hide: tuple[str, ...] = (),
                     log: Any = print, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """Grade the submission in ``files`` and write results.json; (exit status, the document as written).
    ``kwargs`` go to ``core.grade`` (``student``: who submitted, ``seeds``: a regrade's)."""
    result = core.grade(files, course, hide=hide + (str(results_path.parent),), log=log, **kwargs)
    doc = fit(results_json(result))
    write(results_path, doc)
    if result.gradable:
        log(f"grader: score {result.score:g}/{result.max_score:g}" + (" (format errors)" if result.format_errors
                                                                      else ""))
    else:
        log(f"grader: not gradable: {result.internal_error}")
    return (0 if result.gradable else 1), doc


def main() -> int:
    files, results_path, course_path = paths()
    root = results_path.parent.parent
    try:
        course = config.load(course_path)
        return grade_submission(files, course, results_path, hide=(str(root),), student=student_id(root))[0]
    except config.ConfigError as e:
        print(f"grader: the course file is wrong: {e}")
        write(results_path, results_json(core.GradeResult(gradable=False, internal_error=str(e))))
        return 1
    except Exception:  # noqa: BLE001 - a bug in the grader: not gradable, the traceback for the staff
        traceback.print_exc(file=sys.stdout)
        write(results_path, results_json(core.GradeResult(gradable=False, internal_error="grader crashed")))
        return 1


if __name__ == "__main__":
    sys.exit(main())
