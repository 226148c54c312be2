"""The Gradescope example (examples/gradescope) on the shared grading core, with the sandbox for real.

Every shipped student is graded through the Gradescope adapter (grade_submission: the code main()
runs), two at a time: the correct and float32 students get full marks; each buggy student loses
exactly the tests of the function with its mistake (and of multi_head_attention, which runs it),
and that function's message names the mistake; each hostile student earns nothing its own code did
not, leaves no process behind, and gets a valid results.json. Then run_autograder and the uploaded
zip run end to end as Gradescope runs them, a course may grade against a running service (real
gunicorn), and an unreachable one records no score.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import venv
import zipfile
from pathlib import Path

import pytest
from grading_support import (BUG_FAILS, BUG_STUDENTS, COURSE, CORRECT_STUDENTS, EXAMPLES, GRADESCOPE_SCHEMA,
                             HOSTILE, HOSTILE_EARNS, HOSTILE_STUDENTS, ROOT, STUDENTS, course_with, fast_course,
                             grade_many, load_adapter, sandbox_processes, student_dir, student_runtime)
from jsonschema import Draft202012Validator

import engine
from grader import config
from tools.server import free_port

#: runs student code in the real grading sandbox (namespaces, seccomp, rlimits)
pytestmark = pytest.mark.sandbox
_ = student_runtime  # a pytest fixture: tests receive it by name

GRADESCOPE = EXAMPLES / "gradescope"


def valid(doc: dict) -> dict:
    errors = list(Draft202012Validator(GRADESCOPE_SCHEMA).iter_errors(doc))
    assert not errors, errors[0].message
    return doc


def by_name(doc: dict) -> dict[str, dict]:
    return {t["name"]: t for t in doc["tests"]}


def failed(doc: dict) -> set[str]:
    return {t["name"] for t in doc["tests"] if t["status"] == "failed"}


@pytest.fixture(scope="module")
def graded(tmp_path_factory, student_runtime) -> dict[str, tuple[int, dict, list[str]]]:
    """Every shipped student, graded through the adapter; results.json read back from disk."""
    gs = load_adapter("gradescope")
    course = config.load(COURSE)
    hostile_course = fast_course()
    base = tmp_path_factory.mktemp("gradescope")

    def job(path: Path, c: config.Course):
        def run():
            root = base / path.stem
            sub = student_dir(root, path)
            results = root / "results" / "results.json"
            log: list[str] = []
            code, _ = gs.grade_submission(sub, c, results, hide=(str(root),), log=log.append)
            doc = json.loads(results.read_text(encoding="utf-8")) if results.exists() else None
            return code, doc, log
        return run

    jobs = {p.stem: job(p, course) for p in STUDENTS.glob("*.py")}
    jobs.update({f"hostile/{p.stem}": job(p, hostile_course) for p in HOSTILE.glob("*.py")})
    return grade_many(jobs)


@pytest.mark.parametrize("student", CORRECT_STUDENTS)
def test_correct_students_get_full_marks(graded, student):
    code, doc, log = graded[student]
    assert code == 0 and doc is not None, log
    valid(doc)
    total = sum(t["max_score"] for t in doc["tests"])
    assert doc["score"] == total == config.load(COURSE).max_score, doc["output"]
    assert all(t["status"] == "passed" for t in doc["tests"]), [t["output"] for t in doc["tests"]]
    assert doc["output"].startswith(f"Score {total:g}/{total:g}.")
    assert {t["visibility"] for t in doc["tests"]} == {"visible", "after_published", "hidden"}
    assert doc["stdout_visibility"] == "hidden" and doc["output_format"] == "text"
    assert doc["extra_data"]["sandbox"]["visible"]["leftover_processes"] == 0


def test_every_known_bug_has_a_buggy_student():
    """No bug is skipped: the shipped buggy students are exactly the engine's known bugs."""
    assert set(BUG_STUDENTS) == set(engine.BUGS) == set(BUG_FAILS)


@pytest.mark.parametrize("bug", sorted(BUG_FAILS))
def test_each_buggy_student_loses_exactly_its_function(graded, bug):
    code, doc, log = graded[bug]
    assert code == 0 and doc is not None, log
    valid(doc)
    fails, named_in = BUG_FAILS[bug]
    assert failed(doc) == fails, (bug, doc["output"])
    tests = by_name(doc)
    assert doc["score"] == sum(t["max_score"] for n, t in tests.items() if n not in fails)
    assert f"known mistake '{bug}'" in tests[named_in]["output"], tests[named_in]["output"]
    assert bug in doc["extra_data"]["named"][named_in]  # named plainly: it explains every failing configuration
    # one bug, one function: every other function passes on the reference's own inputs
    for name, t in tests.items():
        if name not in fails:
            assert t["status"] == "passed" and t["score"] == t["max_score"], (name, t["output"])


@pytest.mark.parametrize("student", HOSTILE_STUDENTS)
def test_hostile_students_earn_nothing_they_did_not_write(graded, student):
    code, doc, log = graded[f"hostile/{student}"]
    assert code == 0 and doc is not None, log  # a valid results.json, every time
    valid(doc)
    earns = HOSTILE_EARNS[student]
    tests = by_name(doc)
    passed = {n for n, t in tests.items() if t["status"] == "passed"}
    if earns is None:
        assert passed == set(tests), doc["output"]
    else:
        assert passed == earns, doc["output"]
    assert doc["score"] == sum(tests[n]["max_score"] for n in passed)
    for box in doc["extra_data"]["sandbox"].values():
        assert box["leftover_processes"] == 0
    assert not sandbox_processes()


def test_how_each_hostile_student_is_stopped(graded):
    """The evidence, per trick: the message the student gets says what stopped it."""
    out = {s: graded[f"hostile/{s}"][1] for s in HOSTILE_STUDENTS}
    assert "could not be run: it was still importing your file when the time limit of 1.5 s" in \
        out["bare_except_loop"]["output"]
    assert "could not be run: it was still importing your file when the time limit" in out["fork_bomb"]["output"]
    assert "printed more than 16 MiB" in out["big_print"]["output"]
    assert out["big_print"]["extra_data"]["sandbox"]["visible"]["output_bytes"] <= 17 * 2**20
    assert "exited (status 0) while running" in out["os_exit"]["output"] and "os._exit()" in out["os_exit"]["output"]
    assert "crashed with a segmentation fault while running project" in out["segfault"]["output"]
    assert "still running softmax on configuration 'encoder-2-heads' when the time limit" in \
        out["signal_alarm"]["output"]
    assert "no client anywhere" in out["stack_walker"]["output"]
    routes = json.loads(re.search(r"routes to the reference: (\{.*\})", out["url_client"]["output"]).group(1))
    assert routes["ATTENTION_TRACE_URL"] is None and "ATTENTION_TRACE_URL" not in routes["env"]
    assert routes["client"].startswith("ModuleNotFoundError")  # no client it could run (nor a service to ask)
    # The grader's own engine is out of reach (its tree is covered); a copy elsewhere on the machine would
    # be public source, and even then the runtime lacks what the engine needs beyond numpy.
    assert routes["engine"].startswith("ModuleNotFoundError"), routes["engine"]
    assert not any(Path(p).resolve().is_relative_to(ROOT) for p in routes.get("engine_found_at", []))
    assert all("Errno" in str(routes[u]) or "URLError" in str(routes[u])
               for u in ("http://127.0.0.1:8000", "http://localhost:8000"))
    tricks = by_name(out["answer_file_tricks"])["scores"]["output"]
    assert "an array of shape [1000000000] is too large" in tricks  # the lying header is caught before numpy
    assert "unlink: Permission denied" in out["answer_file_tricks"]["output"]
    assert "'extra file: Permission denied'" in out["answer_file_tricks"]["output"]
    fill = out["fill_disk"]["output"]
    assert "'/tmp': '16 MiB, then No space left on device'" in fill, fill
    assert out["replace_grader"]["score"] == 0


def test_run_autograder_end_to_end(tmp_path, monkeypatch):
    """run_autograder as Gradescope runs it (root, /autograder layout), reference in-process."""
    root = tmp_path / "autograder"
    student_dir(root, STUDENTS / "softmax_wrong_axis.py")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "AUTOGRADER_ROOT": str(root), "PYTHON": sys.executable}
    run = subprocess.run([str(GRADESCOPE / "run_autograder")], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    doc = valid(json.loads((root / "results" / "results.json").read_text()))
    assert failed(doc) == BUG_FAILS["softmax_wrong_axis"][0]
    assert "grader: score" in run.stdout and "seeds" in run.stdout  # the staff's log


def test_the_zip_runs_in_gradescope_layout(tmp_path):
    """make-autograder-zip, unpacked as Gradescope does (source/ holds the zip, run_autograder is a
    copy in /autograder), the project in it installed into $ROOT/venv as setup.sh installs it (the
    grader is an installed package, not a path), graded with that install and the zip's course file."""
    zip_path = tmp_path / "autograder.zip"
    run = subprocess.run([str(GRADESCOPE / "make-autograder-zip"), str(zip_path)], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": sys.executable}, timeout=60)
    assert run.returncode == 0, run.stderr
    root = tmp_path / "autograder"
    with zipfile.ZipFile(zip_path) as z:
        names = set(z.namelist())
        z.extractall(root / "source")
        modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
    assert {"setup.sh", "run_autograder", "grade.py", "course.toml", "attention-trace/grader/core.py",
            "attention-trace/grader/sandbox.py", "attention-trace/grader/launcher.py",
            "attention-trace/grader/harness.py", "attention-trace/grader/students/correct.py",
            "attention-trace/pyproject.toml", "attention-trace/requirements.txt", "attention-trace/engine/bugs.py",
            "attention-trace/service/routes/check.py", "attention-trace/attention_trace/client.py"} <= names
    assert not any("__pycache__" in n or "/hostile/" in n for n in names)
    assert modes["setup.sh"] & 0o100 and modes["run_autograder"] & 0o100
    for script in ("run_autograder", "setup.sh"):
        (root / "source" / script).chmod(0o755)
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    # setup.sh's install, without the network: the zip's project with pip (no dependencies), the
    # dependencies from this test's environment (a .pth line: the editable install of the clone is
    # not on it, so the grader can only come from the zip).
    venv.EnvBuilder(with_pip=True).create(root / "venv")
    py = root / "venv" / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    here = subprocess.run([sys.executable, "-c", "import numpy, pathlib; print(pathlib.Path(numpy.__file__).parents[1])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "test-deps.pth").write_text(here + "\n")
    pip = subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                          str(root / "source" / "attention-trace")], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    student_dir(root, STUDENTS / "concat_token_major.py")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "AUTOGRADER_ROOT": str(root)}
    run = subprocess.run([str(root / "run_autograder")], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    doc = valid(json.loads((root / "results" / "results.json").read_text()))
    assert failed(doc) == BUG_FAILS["concat_token_major"][0]
    assert f"core {Path(site) / 'grader'}, course {root / 'source' / 'course.toml'}" in run.stdout
    assert subprocess.run(["bash", "-n", str(GRADESCOPE / "setup.sh")]).returncode == 0


@pytest.mark.slow
def test_the_zip_grades_from_an_empty_root_with_only_what_it_holds(tmp_path):
    """What Gradescope does with the zip, and nothing more: unpacked into an empty root, setup.sh runs
    there (its own fresh venv, installed from the zip's project and pinned requirements, the sandbox's
    runtime, the self-test), then run_autograder grades a correct and a buggy student. Every process
    starts with an empty environment: no PYTHONPATH, no virtualenv, no path into this repository, a
    working directory outside it; so whatever the grader needs must be in the zip."""
    zip_path = tmp_path / "autograder.zip"
    run = subprocess.run([str(GRADESCOPE / "make-autograder-zip"), str(zip_path)], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": sys.executable}, timeout=60, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    with zipfile.ZipFile(zip_path) as z:
        names = set(z.namelist())
        assert "attention-trace/service/openapi.yaml" in names  # a file, not the repository's link
        root = tmp_path / "autograder"
        z.extractall(root / "source")
        for info in z.infolist():
            (root / "source" / info.filename).chmod(info.external_attr >> 16)
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    # The student runtime must be readable by the student's uid (tmp_path is not) and must not be the
    # machine's shared one (/opt/attention-trace/student-python), which other runs use.
    runtime_dir = Path(tempfile.mkdtemp(prefix="attention-zip-runtime-", dir="/tmp"))
    runtime_dir.chmod(0o755)
    path = ":".join(d for d in os.environ.get("PATH", "/usr/bin:/bin").split(":")
                    if d and not Path(d).resolve().is_relative_to(ROOT) and "virtualenv" not in d) or "/usr/bin:/bin"
    env = {"PATH": path, "HOME": str(tmp_path / "home"), "AUTOGRADER_ROOT": str(root),
           "ATTENTION_GRADER_RUNTIME": str(runtime_dir / "student-python")}
    # pip's own settings (an index or wheel directory of this machine, its certificates) are the machine's
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
    (tmp_path / "home").mkdir()
    try:
        setup = subprocess.run(["bash", str(root / "source" / "setup.sh")], env=env, cwd=root / "source",
                               capture_output=True, text=True, timeout=900)
        assert setup.returncode == 0, setup.stdout[-4000:] + setup.stderr[-4000:]
        assert "sandbox: works" in setup.stdout and "selftest: OK" in setup.stdout, setup.stdout[-2000:]
        py = root / "venv" / "bin" / "python"
        where = subprocess.run([str(py), "-c", "import grader, engine, service, sys; print(grader.__file__); "
                                "print(engine.__file__); print(service.find_openapi()); print(sys.path)"],
                               env=env, cwd=root, capture_output=True, text=True, check=True).stdout
        assert str(ROOT) not in where, where  # the grader, the engine and the contract all come from the zip
        for student, fails in (("correct", set()), ("log_softmax", BUG_FAILS["log_softmax"][0])):
            shutil.rmtree(root / "submission", ignore_errors=True)
            student_dir(root, STUDENTS / f"{student}.py")
            graded = subprocess.run([str(root / "run_autograder")], env=env, cwd=root, capture_output=True,
                                    text=True, timeout=300)
            assert graded.returncode == 0, graded.stdout[-4000:] + graded.stderr[-4000:]
            doc = valid(json.loads((root / "results" / "results.json").read_text()))
            assert failed(doc) == fails, doc["output"]
            if fails:
                assert "known mistake 'log_softmax'" in by_name(doc)["softmax"]["output"]
            else:
                assert doc["score"] == config.load(COURSE).max_score
            assert f"core {root / 'venv'}" in graded.stdout and str(ROOT) not in graded.stdout
    finally:
        shutil.rmtree(runtime_dir, ignore_errors=True)


def test_an_unreachable_service_records_no_score(tmp_path):
    """With a URL and the service down: no results.json (Gradescope records no score, not a 0), exit 1,
    and the reason in the staff's log."""
    course = course_with()
    doc_path = tmp_path / "course.toml"
    doc_path.write_text(COURSE.read_text().replace('url = "local"', f'url = "http://127.0.0.1:{free_port()}"')
                        .replace("retries = 3", "retries = 0"))
    assert course.url == "local"
    root = tmp_path / "autograder"
    student_dir(root, STUDENTS / "correct.py")
    (root / "results").mkdir()
    (root / "results" / "results.json").write_text('{"score": 99}')  # a stale file must not survive
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "AUTOGRADER_ROOT": str(root), "PYTHON": sys.executable,
           "ATTENTION_GRADER_COURSE": str(doc_path)}
    run = subprocess.run([str(GRADESCOPE / "run_autograder")], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert not (root / "results" / "results.json").exists()
    assert "NOT GRADED" in run.stdout and "could not connect" in run.stdout


@pytest.mark.integration
def test_a_course_may_grade_against_a_running_service(tmp_path, gunicorn_server):
    """URL mode: the same grading, the reference from a real gunicorn service over HTTP."""
    root = tmp_path / "autograder"
    student_dir(root, STUDENTS / "average_heads.py")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "AUTOGRADER_ROOT": str(root), "PYTHON": sys.executable,
           "ATTENTION_TRACE_URL": gunicorn_server.url}
    run = subprocess.run([str(GRADESCOPE / "run_autograder")], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    doc = valid(json.loads((root / "results" / "results.json").read_text()))
    assert failed(doc) == BUG_FAILS["average_heads"][0]
    assert "known mistake 'average_heads'" in by_name(doc)["concat"]["output"]
