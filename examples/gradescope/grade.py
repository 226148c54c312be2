#!/usr/bin/env python3
"""Gradescope autograder for a numpy multi-head self-attention assignment.

1. Gets the inputs from the attention-trace service: POST /trace with
   ``include_parameters: true`` gives the input x and W_Q, W_K, W_V, W_O.
2. Runs the student's ``multi_head_attention`` from ``attention.py`` on them.
3. POSTs the student's stages to /check, which compares them with the
   reference, names the first wrong stage and the known bug that explains it.
4. Writes results.json in Gradescope's format: one test per stage.

Environment (all optional):
  ATTENTION_TRACE_URL     the service (default http://127.0.0.1:8000); "local" computes
                          in-process instead (needs the full attention-trace package)
  ATTENTION_TRACE_RETRIES retries on a connection error or a 503 (default 3, with backoff)
  AUTOGRADER_ROOT         default /autograder
  AUTOGRADER_SUBMISSION   default $AUTOGRADER_ROOT/submission
  AUTOGRADER_RESULTS      default $AUTOGRADER_ROOT/results/results.json

Exit status: 0 when results.json holds a grade (whatever the score); 1 when
the submission could not be graded (service unreachable, or a bug here):
results.json then says so, with a score of 0, for the student to see.

The student API is documented in README.md next to this file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from attention_trace.client import CheckResult, Client, ClientError, ProblemError, TransportError

# ----------------------------------------------------------------- settings

#: The one configuration every submission is graded on: 4 heads (d_k = 6, not
#: d_model = 24, so scaling by the wrong width shows), causal (the mask is
#: tested), and a repeated token ("the"). The same request always gives the
#: same numbers, so every student gets the same inputs.
CONFIG: dict[str, Any] = {"sentence": "the cat sat on the mat", "d_model": 24, "num_heads": 4, "causal": True}

#: (stage id, points, what it is), in walkthrough order
STAGES: list[tuple[str, float, str]] = [
    ("scores", 1.0, "raw scores QKᵀ"),
    ("scaled_scores", 1.0, "scaled scores QKᵀ/√d_k"),
    ("masked_scores", 1.0, "causal mask"),
    ("weights", 1.0, "softmax weights"),
    ("context", 1.0, "per-head context, weights·V"),
    ("concat", 1.0, "heads side by side"),
    ("output", 1.0, "output projection, concat·W_Oᵀ"),
]
STEPS = {"scores": 6, "scaled_scores": 7, "masked_scores": 8, "weights": 9, "context": 10, "concat": 11, "output": 12}

STUDENT_FILE = "attention.py"
STUDENT_FUNCTION = "multi_head_attention"
STUDENT_TIMEOUT = 60  # seconds for importing and running the student's code
DEFAULT_URL = "http://127.0.0.1:8000"
MAX_STUDENT_PRINT = 2000  # characters of the student's own prints shown back

VISIBILITY = "visible"  # of the tests and the score: visible, hidden, after_due_date, after_published
STDOUT_VISIBILITY = "hidden"  # this script's log is for the staff


def graded_stages() -> list[tuple[str, float, str]]:
    """masked_scores exists only under a causal mask."""
    return [s for s in STAGES if s[0] != "masked_scores" or CONFIG.get("causal")]


# ------------------------------------------------------------ student code


class StudentTimeout(BaseException):
    """Raised in the student's code when it runs too long (a BaseException, so
    a bare ``except Exception`` in their code cannot swallow it)."""


class StudentError(Exception):
    """The student's code could not be loaded or run; the message is for them."""

    printed = ""  # what their code printed before it failed


def _student_traceback(e: BaseException, sub_dir: Path) -> str:
    """The traceback frames in the student's files only, then the error."""
    frames = traceback.extract_tb(e.__traceback__)
    mine = [f for f in frames if Path(f.filename).resolve().is_relative_to(sub_dir.resolve())]
    return "".join(traceback.format_list(mine) + traceback.format_exception_only(type(e), e)).rstrip()


@contextlib.contextmanager
def _time_limit(seconds: int):
    def on_alarm(signum: int, frame: Any) -> None:
        raise StudentTimeout(f"your code ran for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_student(sub_dir: Path, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, str]:
    """Import attention.py and call the function; returns (its result, what it printed)."""
    path = sub_dir / STUDENT_FILE
    if not path.is_file():
        found = sorted(p.name for p in sub_dir.iterdir()) if sub_dir.is_dir() else []
        raise StudentError(f"No {STUDENT_FILE} in your submission (it has: {', '.join(found) or 'nothing'}). "
                           f"Submit a file named {STUDENT_FILE} that defines {STUDENT_FUNCTION}(...).")
    printed = io.StringIO()
    sys.path.insert(0, str(sub_dir))  # the student's own helper modules
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed), _time_limit(STUDENT_TIMEOUT):
            step = f"importing {STUDENT_FILE}"
            try:
                spec = importlib.util.spec_from_file_location("student_attention", path)
                module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
                spec.loader.exec_module(module)  # type: ignore[union-attr]
                fn = getattr(module, STUDENT_FUNCTION, None)
                if not callable(fn):
                    raise StudentError(f"{STUDENT_FILE} does not define a function {STUDENT_FUNCTION}"
                                       "(x, W_Q, W_K, W_V, W_O, causal=False).")
                step = f"running {STUDENT_FUNCTION}"
                result = fn(*args, **kwargs)
            except (StudentError, KeyboardInterrupt):
                raise
            except BaseException as e:  # noqa: BLE001 - anything the student's code does, including sys.exit
                raise StudentError(f"Your code raised an error while {step}:\n{_student_traceback(e, sub_dir)}") \
                    from None
    except StudentError as e:
        e.printed = printed.getvalue()
        raise
    finally:
        sys.path.remove(str(sub_dir))
    return result, printed.getvalue()


def to_submission(sid: str, value: Any) -> list[Any]:
    """A student's array as /check wants it, or StudentError saying what is wrong with it.

    In masked_scores, -inf (or a masked entry of a numpy masked array) means
    "excluded" and is sent as null.
    """
    if value is None:
        raise StudentError(f"'{sid}' is None")
    null = None
    if sid == "masked_scores" and isinstance(value, np.ma.MaskedArray):
        null, value = np.ma.getmaskarray(value), value.filled(-np.inf)
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise StudentError(f"'{sid}' is not a rectangular array of numbers ({e})") from None
    if not 1 <= arr.ndim <= 3:
        raise StudentError(f"'{sid}' has {arr.ndim} dimensions (shape {list(arr.shape)}); it should have "
                           f"{'2' if sid in ('concat', 'output') else '3'}")
    if sid == "masked_scores":
        null = np.isneginf(arr) if null is None else (null | np.isneginf(arr))
    else:
        null = np.zeros(arr.shape, dtype=bool)
    bad = ~null & ~(np.isfinite(arr) & (np.abs(arr) <= 1e300))
    if bad.any():
        idx = [int(i) for i in np.argwhere(bad)[0]]
        hint = " (only masked entries may be -inf)" if sid == "masked_scores" else ""
        raise StudentError(f"'{sid}' holds {arr[tuple(idx)]} at index {idx}: every value must be a finite number{hint}")
    return np.where(null, None, arr).tolist() if null.any() else arr.tolist()


# ----------------------------------------------------------------- results


def _test(sid: str, points: float, what: str, passed: bool, output: str) -> dict[str, Any]:
    return {"name": f"Step {STEPS[sid]}: {sid} ({what})", "score": points if passed else 0.0, "max_score": points,
            "status": "passed" if passed else "failed", "output": output, "visibility": VISIBILITY}


def build_results(stages: list[tuple[str, float, str]], problems: dict[str, str], check: CheckResult | None,
                  run_output: str, check_error: str | None = None, run_error: str | None = None) -> dict[str, Any]:
    """Gradescope's results.json: one test per stage, and a summary naming the first wrong stage."""
    if run_error is not None:  # nothing to compare: every stage fails for the same reason
        tests = [_test(sid, points, what, False, f"Not graded: your code did not run.\n\n{run_error}")
                 for sid, points, what in stages]
        output = f"Score 0/{sum(t['max_score'] for t in tests):g}. {run_error}"
        return {"score": 0.0, "output": output + (f"\n\n{run_output}" if run_output else ""),
                "visibility": VISIBILITY, "stdout_visibility": STDOUT_VISIBILITY, "tests": tests,
                "extra_data": {"first_wrong_stage": None, "diagnosis": None, "run_error": run_error,
                               "config": CONFIG}}
    tests = []
    first_wrong: str | None = None
    for sid, points, what in stages:
        sc = check.stages.get(sid) if check is not None else None
        if sid in problems:
            passed, why = False, problems[sid]
        elif sc is not None:
            passed, why = sc.passed, sc.message
        else:
            passed, why = False, check_error or "not checked"
        if not passed and first_wrong is None:
            first_wrong = sid
            if check is not None and check.first_wrong_stage == sid:
                why += f"\n\nThis is the first stage that differs. {check.diagnosis.message}"
            else:
                why += "\n\nThis is the first stage that is wrong."
        elif not passed and first_wrong is not None:
            why += (f"\n\nThis stage is computed from '{first_wrong}', which is already wrong: "
                    "fix that one first, and this one may follow.")
        tests.append(_test(sid, points, what, passed, why))

    score = sum(t["score"] for t in tests)
    max_score = sum(t["max_score"] for t in tests)
    if first_wrong is None:
        summary = f"Score {score:g}/{max_score:g}. Every stage matches the reference. " + (check.message if check else "")
    elif check is not None and check.first_wrong_stage == first_wrong:
        summary = f"Score {score:g}/{max_score:g}. {check.message}"
    else:
        summary = (f"Score {score:g}/{max_score:g}. The first wrong stage is '{first_wrong}' (step {STEPS[first_wrong]}): "
                   f"{problems.get(first_wrong, check_error or '')}")
    if run_output:
        summary += "\n\n" + run_output
    extra: dict[str, Any] = {"first_wrong_stage": first_wrong, "config": CONFIG}
    if check is not None:
        extra.update(diagnosis=check.diagnosis.bug, matches=check.diagnosis.matches,
                     check_first_wrong_stage=check.first_wrong_stage, engine_version=check.engine_version,
                     parameters_digest=check.parameters_digest, request_id=check.request_id)
    else:
        extra["diagnosis"] = None
    return {"score": score, "output": summary, "visibility": VISIBILITY, "stdout_visibility": STDOUT_VISIBILITY,
            "tests": tests, "extra_data": extra}


def not_graded(reason: str) -> dict[str, Any]:
    """results.json when the submission could not be graded at all (not the student's fault)."""
    return {"score": 0.0, "output": f"Your submission could not be graded: {reason} This is not a problem with "
            "your code; please resubmit later, or tell the course staff if it keeps happening.",
            "visibility": VISIBILITY, "stdout_visibility": STDOUT_VISIBILITY, "tests": [],
            "extra_data": {"error": reason}}


# -------------------------------------------------------------------- main


def make_client(url: str) -> Any:
    if url == "local":
        from attention_trace.client import LocalClient

        return LocalClient()
    return Client(url, timeout=(3.05, 60.0), retries=int(os.environ.get("ATTENTION_TRACE_RETRIES") or 3))


def _printed(text: str) -> str:
    """The student's own prints, shown back to them (shortened)."""
    if not text.strip():
        return ""
    cut = text[:MAX_STUDENT_PRINT] + ("\n[… cut]" if len(text) > MAX_STUDENT_PRINT else "")
    return f"Your code printed:\n{cut}"


def grade(client: Any, sub_dir: Path) -> dict[str, Any]:
    stages = graded_stages()
    inputs = client.trace(CONFIG, include_parameters=True, stages=["input"])
    p = inputs.parameters
    x = inputs.array("input")  # [token, d_model]
    args = (x.copy(), p.W_Q.copy(), p.W_K.copy(), p.W_V.copy(), p.W_O.copy())

    problems: dict[str, str] = {}
    try:
        result, printed = run_student(sub_dir, args, {"causal": bool(CONFIG.get("causal"))})
    except StudentError as e:
        return build_results(stages, {}, None, _printed(e.printed), run_error=str(e))
    run_output = _printed(printed)
    if not isinstance(result, dict):
        error = (f"{STUDENT_FUNCTION} returned {type(result).__name__}; it must return a dict with the keys "
                 f"{', '.join(s for s, _, _ in stages)}.")
        return build_results(stages, {}, None, run_output, run_error=error)

    submission: dict[str, Any] = {}
    for sid, _, _ in stages:
        if sid not in result:
            problems[sid] = (f"{STUDENT_FUNCTION} did not return '{sid}' (it returned: "
                             f"{', '.join(map(str, result)) or 'nothing'}).")
            continue
        try:
            submission[sid] = to_submission(sid, result[sid])
        except StudentError as e:
            problems[sid] = str(e)
    check, check_error = None, None
    if submission:
        try:
            check = client.check(CONFIG, submission=submission)
        except ProblemError as e:
            if e.status >= 500:
                raise
            check_error = f"the grading service refused these numbers: {e.detail}"
    return build_results(stages, problems, check, run_output, check_error)


def paths() -> tuple[Path, Path]:
    root = Path(os.environ.get("AUTOGRADER_ROOT") or "/autograder")
    sub_dir = Path(os.environ.get("AUTOGRADER_SUBMISSION") or root / "submission")
    results = Path(os.environ.get("AUTOGRADER_RESULTS") or root / "results" / "results.json")
    return sub_dir, results


def main() -> int:
    start = time.monotonic()
    sub_dir, results_path = paths()
    url = os.environ.get("ATTENTION_TRACE_URL") or DEFAULT_URL
    status = 0
    try:
        with make_client(url) as client:
            results = grade(client, sub_dir)
    except TransportError as e:
        print(f"grader: the service is unreachable: {e}")
        results, status = not_graded("the grading service could not be reached."), 1
    except (ProblemError, ClientError) as e:
        print(f"grader: the service failed: {e!r}")
        results, status = not_graded("the grading service answered with an error."), 1
    except Exception:  # a bug in this grader: keep the traceback for the staff (stdout is hidden)
        traceback.print_exc(file=sys.stdout)
        results, status = not_graded("the autograder failed."), 1
    results["execution_time"] = round(time.monotonic() - start, 3)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = results_path.with_name(results_path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(results_path)
    extra = results.get("extra_data", {})
    print(f"grader: score {results['score']:g}; first wrong stage {extra.get('first_wrong_stage')}; "
          f"diagnosis {extra.get('diagnosis')}; results in {results_path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
