"""What a failed test tells the student, and what it may never tell them, each shown with the student file it
is about (grader/students/unlisted/: realistic mistakes that are not known ones; grader/students/gaming/: tricks):

* a known mistake is named only when it reproduces the numbers on every configuration where the function is
  wrong (scale_by_sqrt_n matches two known mistakes on one token only, where √n = 1); a constant factor that
  differs between configurations is named as an expression of the sizes (√d_k/√n);
* a placeholder (every value 0) gets its own plain message, never a mistake's name (zeros_stub);
* when every stage function passes and the layer fails, the layer's wiring is named (the engine's wiring
  mistakes, recomputed from the layer's own inputs);
* a hidden test repeats nothing the student's code chose: no exception type, message, file, function or line
  (error_encodes_inputs, through both adapters);
* no input hands over the answer of a later call: the layer runs in a process of its own, not in the one
  where output() was given concat (caches_inputs);
* a configuration with large scores fails a softmax without the max subtraction (unstable_softmax);
* running out of the submission's total time says so (slow_calls); masked keys are -inf in the messages;
* the course's needs: seeds derived from the student and a secret, the academic-integrity log (staff only),
  the batch command's table and its timings.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import hmac
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from grading_support import (COURSE, HOSTILE, STUDENTS, course_doc, course_with, fast_course, grade_many,
                             load_adapter, student_dir, student_runtime)

import engine
from grader import config, core

#: runs student code in the real grading sandbox (namespaces, seccomp, rlimits)
pytestmark = pytest.mark.sandbox

_ = student_runtime
UNLISTED = STUDENTS / "unlisted"
GAMING = STUDENTS / "gaming"
#: the mistakes made only in how multi_head_attention calls correct functions
LAYER_ONLY = ["scale_by_d_model", "mask_after_softmax", "same_w_for_q_and_k", "positional_encoding_queries_only",
              "mask_not_applied", "output_projection_missing"]
PLAIN = "Your numbers match the known mistake"


def by_name(r: core.GradeResult) -> dict[str, core.TestResult]:
    return {t.name: t for t in r.tests}


def failed(r: core.GradeResult) -> set[str]:
    return {t.name for t in r.tests if not t.passed}


def student_texts(r: core.GradeResult) -> str:
    """Everything the student may see before publication (PrairieLearn shows every test, redacted)."""
    return "\n".join([r.message, r.printed, *r.format_errors] + [
        t.message if t.visibility == "visible" else t.redacted for t in r.tests])


@pytest.fixture(scope="module")
def graded(tmp_path_factory, student_runtime) -> dict[str, core.GradeResult]:
    base = tmp_path_factory.mktemp("feedback")
    course = config.load(COURSE)
    paths = {p: STUDENTS / f"{p}.py" for p in ["unlisted/scale_by_sqrt_n", "unlisted/zeros_stub",
                                                "unlisted/unstable_softmax", "softmax_wrong_axis",
                                                "mask_includes_diagonal", "finite_mask_fill", *LAYER_ONLY]}
    jobs = {name: (lambda name=name, path=path: core.grade(student_dir(base / name.replace("/", "-"), path), course))
            for name, path in paths.items()}
    return grade_many(jobs)


# ------------------------------------------------------------------ a name only where it explains the numbers


def test_a_mistake_is_named_only_where_it_explains_the_numbers(graded):
    """Dividing by √n: on one token √n = 1, the numbers of no_scale and scale_after_softmax; nowhere else."""
    r = graded["unlisted/scale_by_sqrt_n"]
    assert failed(r) == {"scale", "multi_head_attention", "multi_head_attention (after publication)",
                         "multi_head_attention (hidden)"}
    scale = by_name(r)["scale"]
    for text in (scale.message, scale.redacted):
        assert PLAIN not in text and "They also match" not in text, text
        assert ("Only on 'one-token' do your numbers match the known mistakes 'scale_after_softmax' and 'no_scale'; "
                "on 'encoder-2-heads', 'decoder-4-heads', 'one-head', 'eight-heads-16-tokens', 'repeated-token', "
                "where this function is wrong too, they do not, so neither is what your code does.") in text, text
        assert ("your scaled_scores is the expected one times √d_k/√n" in text
                and "as if you divided by √n where the reference divides by √d_k" in text), text
    assert "1.1547 on 'encoder-2-heads'" in scale.message  # √(8/6): the factor of each configuration, visible only
    assert not re.search(r"\d\.\d", scale.redacted), scale.redacted
    assert r.extra.get("named", {}).get("scale") is None  # nothing named plainly


def test_a_hidden_tests_hints_hold_no_number(tmp_path):
    """Through a service, /check's hints come too; in a hidden test their numbers (a factor, an index) are
    values of the hidden configurations, so they are left out there."""
    from attention_trace.client import LocalClient
    from grader.reference import ServiceSource

    doc = copy.deepcopy(course_doc())
    next(t for t in doc["test"] if t["name"] == "scale")["visibility"] = "hidden"
    course = config.parse(doc, COURSE)
    r = core.grade(student_dir(tmp_path, UNLISTED / "scale_by_sqrt_n.py"), course, source=ServiceSource(LocalClient()))
    scale = by_name(r)["scale"]
    hints = [line for line in scale.message.splitlines() if line.startswith("Hint")]
    assert hints and scale.message == scale.redacted
    for line in hints:
        assert not re.search(r"\d", re.sub(r"'[^']*'", "", line)), line
    assert len(hints) == 1  # one line for the configurations that had the same hint, numbers aside


def test_a_placeholder_is_not_a_mistake(graded):
    """Stubs that return zeros get a plain message, never a known mistake's name (mask_includes_diagonal gives
    zeros on one token, where the only query sees no key)."""
    r = graded["unlisted/zeros_stub"]
    assert failed(r) == {"attend", "concat", "output", "multi_head_attention",
                         "multi_head_attention (after publication)", "multi_head_attention (hidden)"}
    for name, stage in (("attend", "context"), ("concat", "concat"), ("output", "output")):
        t = by_name(r)[name]
        assert f"{stage}: every value is 0, but the expected values differ: this looks like a placeholder" in t.message
        assert "every value is the same number, but the expected values differ" in t.redacted
        assert "the known mistake" not in t.message and "the known mistake" not in t.redacted
    for t in r.tests:
        assert "the known mistake" not in t.message, (t.name, t.message)
    assert not r.extra.get("named")


@pytest.mark.parametrize("bug", LAYER_ONLY)
def test_a_layer_only_mistake_says_the_wiring_is_wrong_and_names_it(graded, bug):
    r = graded[bug]
    assert {t.name for t in r.tests if not t.passed and t.function != "multi_head_attention"} == set()
    layer = by_name(r)["multi_head_attention"]
    for text in (layer.message, layer.redacted):
        assert "Every stage function passes, so the wiring in multi_head_attention is wrong" in text, text
        assert f"{PLAIN} '{bug}'" in text, text
        assert "compare your step" not in text  # not pointed at step 12's ·W_Oᵀ
    assert bug in r.extra["named"]["multi_head_attention"]
    hidden = by_name(r)["multi_head_attention (hidden)"]
    assert hidden.passed or f"{PLAIN} '{bug}'" in hidden.message


def test_a_function_mistake_is_not_called_wiring(graded):
    r = graded["softmax_wrong_axis"]
    layer = by_name(r)["multi_head_attention"]
    assert "wiring" not in layer.message
    assert "multi_head_attention runs your functions, so it also shows their mistakes: softmax fails its own test" \
        in layer.message


def test_masked_keys_are_minus_inf_in_the_messages(graded):
    """A student writes -inf where a key is masked; the messages say -inf, not JSON's null."""
    diag = by_name(graded["mask_includes_diagonal"])["mask"].message
    fill = by_name(graded["finite_mask_fill"])["mask"].message
    assert re.search(r"expected -?\d[\d.e-]*, got -inf \(masked\)", diag), diag
    # the student multiplies by a lower-triangular mask: a negative score times 0 is -0.0 (random seeds)
    assert re.search(r"expected -inf \(a masked key\), got -?0\b", fill), fill
    assert "null" not in diag and "null" not in fill


# ------------------------------------------------------------------ large scores


def test_a_softmax_without_the_max_subtraction_fails_on_large_scores(graded):
    r = graded["unlisted/unstable_softmax"]
    assert failed(r) == {"softmax", "multi_head_attention"}
    softmax = by_name(r)["softmax"]
    assert "Failed on 1 of 7 configurations (softmax, graded as weights): 'large-scores'." in softmax.message
    assert "weights: it holds nan" in softmax.message and "subtract each row's maximum before exp()" in softmax.message
    assert "subtract each row's maximum before exp()" in softmax.redacted


# ------------------------------------------------------------------ nothing the student chose, in hidden feedback


def _codes(a: np.ndarray) -> list[str]:
    """What error_encodes_inputs makes of an array's first values, and their plain reprs."""
    out = []
    for v in np.asarray(a, dtype=np.float64).ravel()[:3]:
        out.append(("n" if v < 0 else "p") + f"{abs(float(v)):.10f}".replace(".", "_"))
        out.append(repr(float(v)))
    return out


@pytest.mark.parametrize("platform", ["prairielearn", "gradescope"])
def test_hidden_feedback_repeats_nothing_the_students_code_chose(tmp_path, student_runtime, platform):
    """error_encodes_inputs raises, in multi_head_attention, an exception whose type name, message, file name,
    function name and line number all encode the inputs. None of it reaches the student for a hidden
    configuration (nor, before publication, for the after_published one)."""
    adapter = load_adapter(platform)
    root = tmp_path / platform
    sub = student_dir(root, GAMING / "error_encodes_inputs.py")
    results = root / "results" / "results.json"
    code, _ = adapter.grade_submission(sub, config.load(COURSE), results, hide=(str(root),), log=lambda s: None)
    assert code == 0
    doc = json.loads(results.read_text(encoding="utf-8"))
    seeds = doc["extra_data"]["seeds"]
    if platform == "prairielearn":
        shown = json.dumps({k: v for k, v in doc.items() if k != "extra_data"}, ensure_ascii=False)
        before = shown
    else:
        shown = json.dumps([doc["output"]] + [t["output"] for t in doc["tests"]], ensure_ascii=False)
        before = json.dumps([doc["output"]] + [t["output"] for t in doc["tests"] if t["visibility"] == "visible"],
                            ensure_ascii=False)
    course = config.load(COURSE)
    visible_layer = next(t for t in doc["tests"] if t["name"] == "multi_head_attention")
    assert "Leak_" in json.dumps(visible_layer)  # visible configurations: the student's own error, in full
    for name in ("hidden-decoder", "hidden-encoder", "published-encoder"):
        c = course.configurations[name]
        t = engine.trace(engine.TraceConfig(d_model=c.d_model, num_heads=c.num_heads, causal=c.causal,
                                            seed=seeds[name]), tokens=list(c.tokens))
        secret = _codes(t.stages["input"].values) + _codes(t.parameters.W_Q)
        seen = before if name == "published-encoder" else shown
        leaked = [s for s in secret if s in seen]
        assert not leaked, (name, leaked)
    for test in doc["tests"]:
        if test["name"] == "multi_head_attention (hidden)":
            text = json.dumps(test)
            assert "raised an exception in multi_head_attention" in text
            assert not re.search(r"Leak_|file_|fn_|line \d", text), text


# ------------------------------------------------------------------ no answer a later call can reuse


def test_the_layer_runs_in_a_process_of_its_own():
    """No process that is given a stage function's inputs is asked for the whole layer."""
    course = config.load(COURSE)
    from grader.reference import EngineSource
    src = EngineSource()
    refs = {n: src.reference(c, 1) for n, c in course.configurations.items()}
    runs, _ = core.Grader(course, Path(".")).plan(refs)
    assert [kind for kind, _ in runs] == ["visible", "visible-layer", "protected"]
    for kind, calls in runs:
        functions = {c.function for c in calls}
        assert functions == {"multi_head_attention"} or "multi_head_attention" not in functions, (kind, functions)


def test_an_answer_cached_from_an_earlier_call_earns_nothing(tmp_path):
    """caches_inputs remembers concat·W_Oᵀ from output()'s inputs and answers the (broken) layer from it. With
    output() and the layer in one process it earned the visible layer test; the layer now runs in its own."""
    doc = copy.deepcopy(course_doc())
    layer = next(t for t in doc["test"] if t["name"] == "multi_head_attention")
    layer["configurations"] = "@visible"  # exactly output()'s configurations: each one could be remembered
    course = config.parse(doc, COURSE)
    r = core.grade(student_dir(tmp_path, GAMING / "caches_inputs.py"), course)
    assert failed(r) == {"multi_head_attention", "multi_head_attention (after publication)",
                         "multi_head_attention (hidden)"}, r.message
    assert r.score == r.max_score - 4


# ------------------------------------------------------------------ the time budget


def test_running_out_of_the_total_time_says_so(tmp_path):
    """slow_calls spends 3 s in each call: within the 4 s per call, but not within 5 s for them all.

    The 5 s run out in the middle of the second call whatever the student's process takes to start, up to 2 s.
    With 1.5 s calls they ran out just as the third call ended (a start of ~0.5 s): its answer then came in
    time and the budget ran out between two calls, where no call was stopped to say so."""
    r = core.grade(student_dir(tmp_path, UNLISTED / "slow_calls.py"), course_with(call_seconds=4, total_seconds=5))
    assert "when the time for the whole submission ran out: 5 s for every call together" in r.message, r.message
    assert "s per call ran out" not in r.message
    texts = "\n".join(t.message for t in r.tests)
    assert "not run: the time for the whole submission (5 s, every call together) ran out" in texts


def test_running_out_of_the_total_time_between_two_calls_says_so(tmp_path, monkeypatch):
    """The budget can also run out while no call is running: then no call is stopped to say so, and the
    summary must say it itself. The first sandboxed process's calls run in full; the grader then waits out the
    budget before the next, whose calls are never started."""
    real_run = core.Grader.run
    ran: list[tuple[float, float]] = []  # (when each run ended, the deadline)

    def run_then_wait(self, calls, hide, runtime, deadline, broken):
        if ran:  # every run after the first starts when the budget is spent
            time.sleep(max(0.0, deadline - time.monotonic()) + 0.05)
        r = real_run(self, calls, hide, runtime, deadline, broken)
        ran.append((time.monotonic(), deadline))
        return r

    monkeypatch.setattr(core.Grader, "run", run_then_wait)
    r = core.grade(student_dir(tmp_path, STUDENTS / "correct.py"), course_with(call_seconds=4, total_seconds=15))
    assert len(ran) >= 2 and ran[0][0] < ran[0][1], "the first process's calls must end inside the budget"
    assert "The time for the whole submission ran out: 15 s for every call together" in r.message, r.message
    assert "Your code was stopped" not in r.message and "also stopped" not in r.message, r.message
    texts = "\n".join(t.message for t in r.tests)
    assert "not run: the time for the whole submission (15 s, every call together) ran out" in texts
    assert any(t.passed for t in r.tests) and not all(t.passed for t in r.tests)


# ------------------------------------------------------------------ seeds from the student and a secret


def test_seeds_derived_from_the_student_reproduce_on_regrade(tmp_path, monkeypatch):
    doc = copy.deepcopy(course_doc())
    doc["seeds"] = {"derive": "student"}
    course = config.parse(doc, COURSE)
    secret = "a course secret of at least sixteen bytes"
    monkeypatch.setenv("ATTENTION_GRADER_SECRET", secret)
    jobs = {(who, i): (lambda who=who, i=i: core.grade(student_dir(tmp_path / f"{who}{i}", STUDENTS / "no_scale.py"),
                                                       course, student=who))
            for who, i in (("alice", 1), ("alice", 2), ("bob", 1))}
    r = grade_many(jobs)
    a1, a2, b = r[("alice", 1)], r[("alice", 2)], r[("bob", 1)]
    assert a1.extra["seeds"] == a2.extra["seeds"] != b.extra["seeds"]
    assert [(t.message, t.redacted) for t in a1.tests] == [(t.message, t.redacted) for t in a2.tests]
    # HMAC-SHA256 over the student and the configuration, written here independently
    for name, seed in a1.extra["seeds"].items():
        msg = b"attention-trace-grader seed v1\0alice\0" + name.encode()
        assert seed == int.from_bytes(hmac.new(secret.encode(), msg, hashlib.sha256).digest()[:4], "big")
    monkeypatch.delenv("ATTENTION_GRADER_SECRET")
    no_secret = core.grade(student_dir(tmp_path / "n", STUDENTS / "correct.py"), course, student="alice")
    assert not no_secret.gradable and "has no secret" in no_secret.internal_error
    monkeypatch.setenv("ATTENTION_GRADER_SECRET", secret)
    nobody = core.grade(student_dir(tmp_path / "x", STUDENTS / "correct.py"), course)
    assert not nobody.gradable and "no student id" in nobody.internal_error


# ------------------------------------------------------------------ the integrity log


def test_the_integrity_log_records_what_was_refused_for_the_staff_only(tmp_path, student_runtime):
    course = fast_course()
    jobs = {name: (lambda name=name, path=path: core.grade(student_dir(tmp_path / name, path), course))
            for name, path in (("correct", STUDENTS / "correct.py"), ("url_client", HOSTILE / "url_client.py"),
                               ("fork_bomb", HOSTILE / "fork_bomb.py"), ("replace_grader", HOSTILE / "replace_grader.py"))}
    r = grade_many(jobs)
    assert r["correct"].extra["integrity"] == {}, r["correct"].extra["integrity"]
    url = r["url_client"].extra["integrity"]
    assert url["network"]["count"] >= 2 and any("127.0.0.1" in e for e in url["network"]["examples"]), url
    assert url["files"]["count"] >= 1  # it searched the file system for the grader's code
    assert r["fork_bomb"].extra["integrity"]["processes"]["count"] >= 1
    assert r["fork_bomb"].extra["integrity"]["limits"]["count"] >= 1  # the import ran out of time
    assert r["replace_grader"].extra["integrity"], r["replace_grader"].extra
    for res in r.values():
        assert "integrity" not in student_texts(res).lower()
        assert any(line.startswith("grader: integrity log: ") for line in res.log)


def test_a_stage_function_wrong_only_on_a_hidden_configuration_is_named_not_the_layers_wiring(tmp_path,
                                                                                             student_runtime):
    """course.toml: scale from a table of √d_k for d_k up to 8 (every visible configuration's) raises on the
    hidden encoder's d_k 14; multi_head_attention (hidden) names scale there, and never says the wiring."""
    source = (STUDENTS / "correct.py").read_text(encoding="utf-8")
    old = "def scale(scores, d_k):\n    return scores / np.sqrt(d_k)\n"
    table = ("ROOTS = [np.sqrt(d) for d in range(9)]  # every d_k the visible tests use\n\n\n"
             "def scale(scores, d_k):\n    return scores / ROOTS[d_k]\n")
    assert old in source
    r = core.grade(student_dir(tmp_path, source.replace(old, table)), fast_course(), runtime=student_runtime)
    failed = {t.name: t for t in r.tests if not t.passed}
    assert set(failed) == {"multi_head_attention (hidden)"}, {n: t.message for n, t in failed.items()}
    message = failed["multi_head_attention (hidden)"].message
    assert ("On 'hidden-encoder', your scale raises an exception, although it passes its own test: it goes wrong "
            "only on a configuration the visible tests do not reach (a head size d_k none of them has)") in message
    assert "wiring" not in message and "14" not in message, message


#: scores() of correct.py, then a way of reaching past it: each a student of its own
INTEGRITY_SCORES = {
    "getframe": "    import sys\n    sys._getframe(1).f_locals  # the harness's frame\n",
    "inspect_stack": "    import inspect\n    [f.frame.f_globals for f in inspect.stack()]\n",
    "refused_allocation": "    np.ones(1_500_000_000)  # 12 GB: more than the whole address space it may have\n",
    "hoard_then_hang": ("    hoard = []\n    try:\n        while True:\n"
                        "            hoard.append(np.empty(8_000_000))  # 64 MB at a time, until the limit says no\n"
                        "    except MemoryError:\n        pass\n    while True:\n        pass\n"),
}


def integrity_student(kind: str) -> str:
    """correct.py whose scores() first does ``INTEGRITY_SCORES[kind]``."""
    source = (STUDENTS / "correct.py").read_text(encoding="utf-8")
    head = "def scores(q, k):\n"
    at = source.index(head) + len(head)
    return source[:at] + INTEGRITY_SCORES[kind] + source[at:]


def test_the_integrity_log_records_frame_and_stack_inspection(tmp_path, student_runtime):
    course = fast_course()
    jobs = {kind: (lambda kind=kind: core.grade(student_dir(tmp_path / kind, integrity_student(kind)), course))
            for kind in ("getframe", "inspect_stack")}
    r = grade_many(jobs)
    for kind, res in r.items():
        seen = res.extra["integrity"].get("introspection")
        assert seen and any("sys._getframe" in e for e in seen["examples"]), (kind, res.extra["integrity"])
        assert res.score == course.max_score  # evidence for the staff, never a grade
        assert "integrity" not in student_texts(res).lower() and "_getframe" not in student_texts(res)


def test_the_integrity_log_records_the_memory_limit_as_the_memory_limit(tmp_path, student_runtime):
    course = course_with(call_seconds=3, total_seconds=40)
    jobs = {kind: (lambda kind=kind: core.grade(student_dir(tmp_path / kind, integrity_student(kind)), course))
            for kind in ("refused_allocation", "hoard_then_hang")}
    r = grade_many(jobs)
    refused = r["refused_allocation"].extra["integrity"]
    assert any("raised MemoryError" in e for e in refused["memory"]["examples"]), refused
    hung = r["hoard_then_hang"].extra["integrity"]
    # stopped by the clock, but at the memory limit: the log says both
    assert any("timeout" in e for e in hung["limits"]["examples"]), hung
    assert any("at the memory limit" in e for e in hung["memory"]["examples"]), hung
    for res in r.values():
        assert not any(t.passed for t in res.tests if t.function == "scores")
        assert "integrity" not in student_texts(res).lower()


# ------------------------------------------------------------------ the batch command


def test_the_batch_command_grades_a_directory_into_one_table(tmp_path):
    folder = tmp_path / "submissions"
    folder.mkdir()
    (folder / "ada.py").write_bytes((STUDENTS / "correct.py").read_bytes())
    (folder / "bert.py").write_bytes((STUDENTS / "log_softmax.py").read_bytes())
    (folder / "cleo").mkdir()
    (folder / "cleo" / "attention.py").write_bytes((UNLISTED / "zeros_stub.py").read_bytes())
    out_csv, out_json = tmp_path / "results.csv", tmp_path / "results.json"
    run = subprocess.run([sys.executable, "-m", "grader", "batch", str(COURSE), str(folder), "--out", str(out_csv),
                          "--jobs", "2"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    with out_csv.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["student"] for r in rows] == ["ada", "bert", "cleo"]
    max_score = config.load(COURSE).max_score
    assert float(rows[0]["score"]) == max_score and float(rows[1]["score"]) == max_score - 5  # softmax and the layer
    assert rows[1]["softmax"] == "0" and "softmax: log_softmax" in rows[1]["named_mistakes"]
    assert all(float(r["seconds"]) > 0 for r in rows) and all(json.loads(r["seeds"]) for r in rows)
    assert "300 submissions take" in run.stderr
    run = subprocess.run([sys.executable, "-m", "grader", "batch", str(COURSE), str(folder), "--out", str(out_json),
                          "--jobs", "1"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    doc = json.loads(out_json.read_text(encoding="utf-8"))
    assert doc["summary"]["submissions"] == 3 and doc["summary"]["minutes_for_300"] > 0
    assert doc["submissions"][2]["tests"]["attend"] == 0


# ------------------------------------------------------------------ selftest over many draws of seeds


def _selftest(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader", "selftest", *args], capture_output=True, text=True,
                          timeout=300)


def test_selftest_draws_grades_the_solution_once_per_draw_with_fresh_seeds():
    run = _selftest(str(COURSE), "--draws", "3")
    assert run.returncode == 0, run.stdout + run.stderr
    max_score = config.load(COURSE).max_score
    assert f"selftest: OK: the correct student scored full marks ({max_score:g}) on 3 of 3 draws" in run.stdout
    assert "draw " not in run.stdout.replace("draws", "")  # no draw fell short


def test_selftest_draws_prints_each_draw_that_falls_short_with_the_options_that_replay_it(tmp_path):
    """A solution that loses points is reported on every draw, each with `grade --seed ...` options; replaying
    them grades with exactly those seeds and loses the same tests."""
    run = _selftest(str(COURSE), "--solution", str(STUDENTS / "no_scale.py"), "--draws", "2")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "selftest: FAILED: the correct student scored full marks" in run.stdout and "on 0 of 2 draws" in run.stdout
    lines = [line for line in run.stdout.splitlines() if line.startswith("draw ")]
    assert [line.split(":")[0] for line in lines] == ["draw 1", "draw 2"]
    replays = [re.findall(r"--seed (\S+)=(\d+)", line) for line in lines]
    assert replays[0] != replays[1]  # drawn afresh
    names = set(config.load(COURSE).configurations)
    for line, seeds in zip(lines, replays):
        assert {n for n, _ in seeds} == names, line
        failed = set(line.split("failed ")[1].split(";")[0].split(", "))
        out = tmp_path / "replay.json"
        submission = student_dir(tmp_path, STUDENTS / "no_scale.py")
        subprocess.run([sys.executable, "-m", "grader", "grade", str(COURSE), str(submission), "--json", str(out),
                        *[a for n, v in seeds for a in ("--seed", f"{n}={v}")]],
                       capture_output=True, text=True, timeout=300, check=True)
        replayed = json.loads(out.read_text())
        assert replayed["extra"]["seeds"] == {n: int(v) for n, v in seeds}
        assert {t["name"] for t in replayed["tests"] if not t["passed"]} == failed


def test_selftest_refuses_fewer_than_one_draw():
    run = _selftest(str(COURSE), "--draws", "0")
    assert run.returncode == 2 and "--draws must be at least 1" in run.stderr


def test_selftest_draws_says_so_when_every_seed_is_fixed(tmp_path):
    fixed = tmp_path / "fixed.toml"
    fixed.write_text(COURSE.read_text(encoding="utf-8").replace('seed = "random"', "seed = 7"), encoding="utf-8")
    assert all(c.seed == 7 for c in config.load(fixed).configurations.values())
    run = _selftest(str(fixed), "--draws", "2")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "every configuration's seed is fixed in the course file" in run.stderr
    assert "every configuration's seed is fixed" not in _selftest(str(COURSE), "--draws", "2").stderr
