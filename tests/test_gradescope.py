"""The Gradescope example: run_autograder on each student file, against real
gunicorn, and check results.json (Gradescope's format, the scores, and the
diagnosis of every known bug)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from conftest import ROOT, Gunicorn, free_port
from engine import BUGS

pytestmark = pytest.mark.integration

GRADESCOPE = ROOT / "examples" / "gradescope"
STUDENTS = GRADESCOPE / "students"
GRADED = ["scores", "scaled_scores", "masked_scores", "weights", "context", "concat", "output"]

VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
#: Gradescope's documented results.json (the fields this grader writes, and their types)
RESULTS_SCHEMA = {
    "type": "object",
    "required": ["score", "output", "visibility", "stdout_visibility", "tests"],
    "properties": {
        "score": {"type": "number", "minimum": 0},
        "execution_time": {"type": "number"},
        "output": {"type": "string"},
        "visibility": VISIBILITY,
        "stdout_visibility": VISIBILITY,
        "extra_data": {"type": "object"},
        "tests": {"type": "array", "items": {
            "type": "object",
            "required": ["name", "score", "max_score", "status", "output", "visibility"],
            "properties": {"name": {"type": "string"}, "score": {"type": "number"},
                           "max_score": {"type": "number"}, "status": {"enum": ["passed", "failed"]},
                           "output": {"type": "string"}, "visibility": VISIBILITY},
            "additionalProperties": False,
        }},
    },
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(gunicorn_server: Gunicorn) -> Gunicorn:
    """conftest's real gunicorn (2 workers) on a free loopback port."""
    return gunicorn_server


def autograde(tmp_path: Path, student: Path | str | None, url: str | None,
              script: Path = GRADESCOPE / "run_autograder", **env: str) -> tuple[int, dict, str]:
    """Lay out an /autograder tree in tmp_path, run the script, return (status, results.json, stdout)."""
    root = tmp_path / "autograder"
    (root / "submission").mkdir(parents=True, exist_ok=True)
    if isinstance(student, Path):
        shutil.copy(student, root / "submission" / "attention.py")
    elif isinstance(student, str):
        (root / "submission" / "attention.py").write_text(student)
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "AUTOGRADER_ROOT": str(root),
                "PYTHON": sys.executable, **env}
    if url is not None:
        full_env["ATTENTION_TRACE_URL"] = url
    run = subprocess.run([str(script)], env=full_env, capture_output=True, text=True, timeout=60)
    results_file = root / "results" / "results.json"
    assert results_file.exists(), run.stdout + run.stderr
    results = json.loads(results_file.read_text(encoding="utf-8"))
    errors = list(Draft202012Validator(RESULTS_SCHEMA).iter_errors(results))
    assert not errors, errors[0].message
    return run.returncode, results, run.stdout


def statuses(results: dict) -> list[str]:
    return [t["status"] for t in results["tests"]]


def test_correct_student_gets_full_marks(tmp_path, server):
    code, results, stdout = autograde(tmp_path, STUDENTS / "correct.py", server.url)
    assert code == 0, stdout
    assert results["score"] == 7 and sum(t["max_score"] for t in results["tests"]) == 7
    assert statuses(results) == ["passed"] * 7
    assert [t["name"].split(":")[1].split()[0] for t in results["tests"]] == GRADED
    assert results["extra_data"]["first_wrong_stage"] is None and results["extra_data"]["diagnosis"] is None
    assert results["output"].startswith("Score 7/7. Every stage matches the reference.")
    assert results["visibility"] == "visible" and results["stdout_visibility"] == "hidden"
    assert "grader: score 7" in stdout


@pytest.mark.parametrize("bug", list(BUGS))
def test_each_buggy_student_is_diagnosed(tmp_path, server, bug):
    code, results, stdout = autograde(tmp_path, STUDENTS / f"{bug}.py", server.url)
    assert code == 0, stdout
    first = BUGS[bug].stage
    k = GRADED.index(first)
    assert results["extra_data"]["diagnosis"] == bug, results["output"]
    assert results["extra_data"]["first_wrong_stage"] == first
    # Every stage before the first wrong one earns its point; it and every later stage fail.
    assert statuses(results) == ["passed"] * k + ["failed"] * (7 - k)
    assert results["score"] == k == sum(t["score"] for t in results["tests"])
    assert results["output"].startswith(f"Score {k}/7. Stage '{first}' (step ")
    assert f"Your numbers match the known bug '{bug}': {BUGS[bug].summary}." in results["output"]
    wrong = results["tests"][k]
    assert re.match(rf"Step \d+: {first} \(", wrong["name"]), wrong["name"]
    assert "This is the first stage that differs." in wrong["output"] and f"known bug '{bug}'" in wrong["output"]
    assert all(f"computed from '{first}'" in t["output"] for t in results["tests"][k + 1:])
    if bug == "average_heads":
        assert "the shape is wrong: expected [6, 24] (token, concat), got [6, 6]" in wrong["output"]


def test_student_errors_are_reported_to_the_student(tmp_path, server):
    code, results, _ = autograde(tmp_path / "a", None, server.url)
    assert code == 0 and results["score"] == 0 and statuses(results) == ["failed"] * 7
    assert "No attention.py in your submission" in results["output"]

    crashing = ("import numpy as np\n\n"
                "def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):\n"
                "    print('debugging', x.shape)\n"
                "    return helper(x)\n\n"
                "def helper(x):\n"
                "    return x @ np.ones((3, 3))\n")
    code, results, _ = autograde(tmp_path / "b", crashing, server.url)
    assert code == 0 and results["score"] == 0
    out = results["output"]
    assert "Your code raised an error while running multi_head_attention" in out
    assert 'attention.py", line 8, in helper' in out and "ValueError: matmul" in out
    assert "grade.py" not in out  # only the student's frames
    assert "Your code printed:\ndebugging (6, 24)" in out


def test_bad_values_fail_only_their_stage(tmp_path, server):
    student = (STUDENTS / "correct.py").read_text() + (
        "\n\n_correct = multi_head_attention\n\n"
        "def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):\n"
        "    out = _correct(x, W_Q, W_K, W_V, W_O, causal)\n"
        "    out['context'] = out['context'] * np.nan\n"
        "    del out['output']\n"
        "    return out\n")
    code, results, _ = autograde(tmp_path, student, server.url)
    # concat was computed before the NaN, so it is still right: each stage is graded on its own.
    assert code == 0 and statuses(results) == ["passed"] * 4 + ["failed", "passed", "failed"]
    assert results["score"] == 5
    context, concat, output = results["tests"][4:]
    assert "'context' holds nan at index [0, 0, 0]: every value must be a finite number" in context["output"]
    assert "This is the first stage that is wrong." in context["output"]
    assert "did not return 'output'" in output["output"]
    assert results["extra_data"]["first_wrong_stage"] == "context"
    assert results["output"].startswith("Score 5/7. The first wrong stage is 'context' (step 10): 'context' holds nan")


def test_unreachable_service_is_not_the_students_fault(tmp_path):
    code, results, stdout = autograde(tmp_path, STUDENTS / "correct.py", f"http://127.0.0.1:{free_port()}",
                                      ATTENTION_TRACE_RETRIES="1")
    assert code == 1 and results["score"] == 0 and results["tests"] == []
    assert "could not be graded: the grading service could not be reached" in results["output"]
    assert "not a problem with your code" in results["output"] and "unreachable" in stdout


def test_in_process_mode_needs_no_server(tmp_path):
    code, results, _ = autograde(tmp_path, STUDENTS / "no_scale.py", "local")
    assert code == 0 and results["extra_data"]["diagnosis"] == "no_scale" and results["score"] == 1


def test_the_zip_runs_in_gradescope_layout(tmp_path, server):
    """make-autograder-zip, unpacked as Gradescope does: source/ holds the zip, and
    /autograder/run_autograder is a copy; the URL comes from the zip's config.env."""
    zip_path = tmp_path / "autograder.zip"
    run = subprocess.run([str(GRADESCOPE / "make-autograder-zip"), "--url", server.url, str(zip_path)],
                         capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable}, timeout=60)
    assert run.returncode == 0, run.stderr
    with zipfile.ZipFile(zip_path) as z:
        names = set(z.namelist())
        assert {"setup.sh", "run_autograder", "grade.py", "requirements.txt", "config.env",
                "attention_trace/__init__.py", "attention_trace/client.py"} <= names
        assert not any("__pycache__" in n or n.endswith("cli.py") for n in names)
        root = tmp_path / "autograder"
        z.extractall(root / "source")
    for script in ("run_autograder", "setup.sh"):
        (root / "source" / script).chmod(0o755)
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    code, results, _ = autograde(tmp_path, STUDENTS / "softmax_wrong_axis.py", None, script=root / "run_autograder")
    assert code == 0 and results["extra_data"]["diagnosis"] == "softmax_wrong_axis" and results["score"] == 3
    assert subprocess.run(["bash", "-n", str(GRADESCOPE / "setup.sh")]).returncode == 0
