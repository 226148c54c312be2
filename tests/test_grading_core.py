"""The grader (grader/): the course file, what the shipped course grades, the
hidden tests' secrecy, answers copied from a public trace, the metric passed to /check, the
single-function form, and what happens when the reference cannot be had (no grade, never a 0)."""

from __future__ import annotations

import copy
import json
import re
import textwrap

import numpy as np
import pytest
from grading_support import (BUG_STUDENTS, COURSE, CORRECT_STUDENTS, HOSTILE, SINGLE, STUDENTS, course_doc,
                             course_with, grade_many, student_dir, student_runtime)

from attention_trace.client import LocalClient, ProblemError, TransportError
from grader import config, core, reference
from grader.assignment import FUNCTIONS

#: runs student code in the real grading sandbox (namespaces, seccomp, rlimits)
pytestmark = pytest.mark.sandbox

_ = student_runtime


# ------------------------------------------------------------------ the course file


@pytest.mark.parametrize("change, message", [
    (lambda d: d["test"][0].update(function="softmaxx"), "unknown function 'softmaxx'"),
    (lambda d: d["test"][0].update(configurations=["nope"]), "no configuration named 'nope'"),
    (lambda d: d["test"][0].update(configurations="@nope"), "no set 'nope'"),
    (lambda d: d["test"][0].update(visibility="secret"), "`visibility` must be one of"),
    (lambda d: d["test"][0].update(points=-1), "`points` must be a non-negative number"),
    (lambda d: d["test"][0].update(extra=1), "unknown key(s) 'extra'"),
    (lambda d: d["test"][4].update(configurations=["encoder-2-heads"]), "graded on causal configurations only"),
    (lambda d: d["configuration"][0].update(num_heads=3), "must be a positive multiple of num_heads"),
    (lambda d: d["configuration"][0].update(seed=-1), '`seed` must be "random" or an integer'),
    (lambda d: d["configuration"][0].update(sentence="x"), "give exactly one of `tokens`"),
    (lambda d: d["check"].update(metric="close"), '`metric` must be "allclose" or "rel_error"'),
    (lambda d: d["check"].update(tolerance=1e-3), "unknown key(s) 'tolerance'"),
    (lambda d: d["check"].update(rtol=2.0), "`rtol` must be at most 1"),
    (lambda d: d.update(check={"metric": "rel_error", "atol": 1e-6}), '`atol` belongs to metric "allclose"'),
    (lambda d: d.update(check={"threshold": 1e-3}), '`threshold` belongs to metric "rel_error"'),
    (lambda d: d["limits"].update(memory_mb=64), "below 256"),
    (lambda d: d["service"].update(url="ftp://x"), '`url` must be "local" or an http(s):// URL'),
    (lambda d: d["test"].append(dict(d["test"][0])), "two tests have the same name"),
])
def test_course_file_mistakes_are_reported_with_where(change, message):
    doc = copy.deepcopy(course_doc())
    change(doc)
    with pytest.raises(config.ConfigError) as e:
        config.parse(doc)
    assert message in str(e.value)


def test_the_shipped_course_covers_what_the_issue_asks():
    """h in {1, 2, 4, 8}; d_k ≠ n everywhere and d_k ≠ d_model with more than one head; n from 1 to 16;
    causal and not; a repeated token; hidden configurations drawn per submission; every function."""
    course = config.load(COURSE)
    configs = course.configurations.values()
    assert {c.num_heads for c in configs} == {1, 2, 4, 8}
    for c in configs:
        n = len(c.tokens)
        assert c.d_k != n, c.name
        assert c.num_heads == 1 or c.d_k != c.d_model, c.name
        assert c.seed is None, c.name  # drawn for every submission
    assert min(len(c.tokens) for c in configs) == 1 and max(len(c.tokens) for c in configs) == 16
    assert {c.causal for c in configs} == {True, False}
    assert any(len(set(c.tokens)) < len(c.tokens) for c in configs)
    hidden = {n for t in course.tests if t.hidden for n in t.configurations}
    shown = {n for t in course.tests if not t.hidden for n in t.configurations}
    assert hidden and not hidden & shown
    assert {t.function for t in course.tests} == set(FUNCTIONS)
    assert {t.visibility for t in course.tests} == {"visible", "after_published", "hidden"}
    single = config.load(COURSE.with_name("course-single-function.toml"))
    assert single.form == "single" and {t.function for t in single.tests} == {"multi_head_attention"}


# ------------------------------------------------------------------ grading


def grade(tmp_path, student, course=None, **kw) -> core.GradeResult:
    return core.grade(student_dir(tmp_path, student), course or config.load(COURSE), **kw)


def student_texts(r: core.GradeResult, now: bool = False) -> str:
    """Everything a student can ever see of a result (not extra, not the log); with ``now``, what
    they see before the grades are published (after_* tests show their details only then)."""
    return "\n".join([r.message, r.printed, *r.format_errors] + [
        t.message if not now or t.visibility == "visible" else t.redacted for t in r.tests])


def test_hidden_inputs_never_reach_the_student(tmp_path):
    """print_inputs prints every input it gets: the visible ones come back to it, the hidden and
    after-publication ones never do, and hidden tests' messages hold no number at all."""
    r = grade(tmp_path, HOSTILE / "print_inputs.py")
    assert r.score == r.max_score
    seeds = r.extra["seeds"]
    course = config.load(COURSE)
    client = LocalClient()
    texts, now = student_texts(r), student_texts(r, now=True)

    def values(name, *stages):
        t = client.trace(course.configurations[name].request(seeds[name]), include_parameters=True)
        arrays = [t.array(s) for s in stages if s in t.stages] + [getattr(t.parameters, s) for s in stages
                                                                   if s.startswith("W_")]
        return [repr(float(v)) for a in arrays for v in a.ravel()[:40]]

    # what it printed first, the embeddings of the first visible configuration, is shown back to it:
    # so the check below would see a leak
    assert any(v in r.printed for v in values("encoder-2-heads", "token_embedding"))
    for name in ("hidden-decoder", "hidden-encoder", "published-encoder"):  # multi_head_attention printed these
        seen = now if name == "published-encoder" else texts
        leaked = [v for v in values(name, "input", "W_Q", "W_O") if v in seen]
        assert not leaked, (name, leaked[:3])
        assert str(seeds[name]) not in seen
    assert r.extra["protected_output_bytes"] > 0  # it did print there
    bug = grade(tmp_path / "b", STUDENTS / "softmax_wrong_axis.py")
    hidden = next(t for t in bug.tests if t.visibility == "hidden")
    assert not hidden.passed and not re.search(r"\d\.\d|\[\d", hidden.message), hidden.message
    assert "known mistake 'softmax_wrong_axis'" in hidden.message


def test_answers_copied_from_a_public_trace_are_worth_nothing(tmp_path):
    """A student who hard-codes the answers of a public trace of each configuration (seed 0): every
    seed is drawn per submission, so none of them is right. (With fixed seeds it would pass the
    visible tests: that is what the per-submission seeds are for.)"""
    course = config.load(COURSE)
    client = LocalClient()
    table = {}
    for name, c in course.configurations.items():
        t = client.trace(c.request(0), include_parameters=True)
        for sid in ("input", "q", "k", "v", "scores", "scaled_scores", "weights", "context", "concat", "output"):
            table[f"{name}:{sid}"] = t.array(sid).tolist()
        if c.causal:
            table[f"{name}:masked_scores"] = np.nan_to_num(t.array("masked_scores"), nan=-np.inf).tolist()
    source = ("import json\nimport numpy as np\n\nTABLE = json.loads(" + repr(json.dumps(table)) + ")\n"
              + textwrap.dedent('''
        def _find(stage, shape):
            for key, value in TABLE.items():
                if key.endswith(":" + stage) and np.shape(value) == shape:
                    return np.array(value)
            return np.zeros(shape)

        def add_positional_encoding(e): return _find("input", e.shape)
        def project(x, W):
            for s in ("q", "k", "v"):
                a = _find(s, (W.shape[0], x.shape[0], W.shape[1]))
                if a.any(): return a
            return a
        def scores(q, k): return _find("scores", (q.shape[0], q.shape[1], q.shape[1]))
        def scale(s, d_k): return _find("scaled_scores", s.shape)
        def mask(s): return _find("masked_scores", s.shape)
        def softmax(s): return _find("weights", s.shape)
        def attend(w, v): return _find("context", v.shape)
        def concat(c): return _find("concat", (c.shape[1], c.shape[0] * c.shape[2]))
        def output(c, W_O): return _find("output", (c.shape[0], W_O.shape[0]))
        def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False): return _find("output", x.shape)
    '''))
    r = grade(tmp_path / "a", source)
    assert r.score == 0, r.message
    fixed = grade(tmp_path / "b", source, seeds={n: 0 for n in course.configurations})
    assert {t.name for t in fixed.tests if t.passed} >= {"scores", "softmax", "attend", "concat"}


def test_a_function_that_returns_nan_fails_alone(tmp_path):
    source = (STUDENTS / "correct.py").read_text().replace("    return weights @ v  #",
                                                          "    return weights @ v * np.nan  #")
    r = grade(tmp_path, source)
    assert {t.name for t in r.tests if not t.passed} == {"attend", "multi_head_attention",
                                                         "multi_head_attention (after publication)",
                                                         "multi_head_attention (hidden)"}
    attend = next(t for t in r.tests if t.name == "attend")
    assert "context: it holds nan at [0, 0, 0] (head, token, d_k)" in attend.message


def test_the_course_metric_goes_to_check(tmp_path):
    """[check] is sent with every /check as is, and the service applies it: here CS231n's rel_error.
    (Not float32-fair at 1e-3: a value near zero makes float32's relative error large, which is why
    the service's default is allclose with a stage-relative term; course.toml says so.)"""
    sent, echoed = [], []

    class Recording(LocalClient):
        def check(self, body=None, /, **kw):
            sent.append(dict(body or {}, **kw))
            result = super().check(body, **kw)
            echoed.append(result.raw["tolerance"])
            return result

    doc = copy.deepcopy(course_doc())
    doc["check"] = {"metric": "rel_error", "threshold": 1e-3}
    course = config.parse(doc, COURSE)
    r = grade(tmp_path, STUDENTS / "correct.py", course, client=Recording())
    assert sent and all(b["metric"] == "rel_error" and b["threshold"] == 1e-3 for b in sent)
    assert all(t["metric"] == "rel_error" and t["threshold"] == 1e-3 for t in echoed), echoed[0]
    assert r.gradable and r.score == r.max_score, r.message
    bug = grade(tmp_path / "b", STUDENTS / "double_scale.py", course, client=Recording())
    assert {t.name for t in bug.tests if not t.passed} >= {"scale"}


class Failing:
    """A client whose service is down (trace) or broken (check)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.local = LocalClient()

    def trace(self, *a, **kw):
        if self.where == "trace":
            raise TransportError("could not connect to http://x after 4 attempts", url="http://x", attempts=4)
        return self.local.trace(*a, **kw)

    def check(self, *a, **kw):
        raise ProblemError(500, "urn:attention-trace:problem:internal", "Internal Server Error", "boom")

    def version(self):
        return self.local.version()

    def close(self):
        pass


@pytest.mark.parametrize("where", ["trace", "check"])
def test_a_service_failure_is_no_grade_never_a_zero(tmp_path, where):
    r = grade(tmp_path, STUDENTS / "correct.py", client=Failing(where))
    assert r.gradable is False and r.tests == [] and r.score == 0 and not r.format_errors
    assert "could not be graded, through no fault of your code" in r.message
    assert ("could not connect" if where == "trace" else "/check answered 500") in r.internal_error


@pytest.mark.parametrize("source, status, text", [
    (None, "missing", "there is no attention.py in your submission (it has: nothing)"),
    ("def f(:\n", "syntax", "attention.py has a syntax error on line 1"),
    ("raise RuntimeError('boom')\n", "import", "attention.py raised RuntimeError while being imported: boom"),
])
def test_a_file_that_cannot_run_is_a_format_error(tmp_path, source, status, text):
    sub = tmp_path / "submission"
    sub.mkdir()
    if source is not None:
        (sub / "attention.py").write_text(source)
    r = core.grade(sub, course_with(call_seconds=2))
    assert r.gradable and r.format_errors and text in r.format_errors[0], r.format_errors
    assert r.score == 0 and all(not t.passed for t in r.tests)


def test_a_regrade_with_the_logged_seeds_gives_the_same_result(tmp_path):
    first = grade(tmp_path / "a", STUDENTS / "finite_mask_fill.py")
    again = grade(tmp_path / "b", STUDENTS / "finite_mask_fill.py", seeds=first.extra["seeds"])
    assert [t.message for t in first.tests] == [t.message for t in again.tests]
    assert json.dumps(first.extra["seeds"]) == json.dumps(again.extra["seeds"])


def test_the_single_function_form(tmp_path):
    course = config.load(COURSE.with_name("course-single-function.toml"))
    ok = grade(tmp_path / "ok", SINGLE / "correct.py", course)
    assert ok.score == ok.max_score == 9, ok.message
    bad = grade(tmp_path / "bad", SINGLE / "softmax_wrong_axis.py", course)
    assert {t.name for t in bad.tests if not t.passed} == {"weights", "context", "concat", "output", "output (hidden)"}
    weights = next(t for t in bad.tests if t.name == "weights")
    context = next(t for t in bad.tests if t.name == "context")
    assert "known mistake 'softmax_wrong_axis'" in weights.message
    assert "'context' is computed from 'weights', which is already wrong here" in context.message


# ------------------------------------------------------------------ the engine is the reference


def test_the_engine_and_the_service_grade_every_shipped_student_alike(tmp_path):
    """The default source (the engine in this process, no HTTP) and /check through LocalClient give the
    same points and the same messages, named mistakes included, for every shipped student."""
    course = config.load(COURSE)
    seeds = {name: 5 for name in course.configurations}
    jobs = {}
    for name in CORRECT_STUDENTS + BUG_STUDENTS:
        for kind in ("engine", "service"):
            src = (lambda: reference.EngineSource()) if kind == "engine" else \
                (lambda: reference.ServiceSource(LocalClient()))
            jobs[(name, kind)] = (lambda name=name, kind=kind, src=src:
                                  grade(tmp_path / name / kind, STUDENTS / f"{name}.py", course, seeds=seeds,
                                        source=src()))
    results = grade_many(jobs)
    for name in CORRECT_STUDENTS + BUG_STUDENTS:
        a, b = results[(name, "engine")], results[(name, "service")]
        assert a.gradable and b.gradable, (name, a.internal_error, b.internal_error)
        assert [(t.name, t.points, t.message, t.redacted) for t in a.tests] == \
            [(t.name, t.points, t.message, t.redacted) for t in b.tests], name
        assert a.extra["engine_version"] == b.extra["engine_version"]


def test_the_engine_gives_the_hints_the_service_gives(tmp_path):
    """A mistake no known bug reproduces (the scores as k·qᵀ): from the engine too, the grade names no
    mistake and gives /check's hints on what the numbers show, in the same words as through the service;
    hidden tests give them with their numbers cut out."""
    student = (STUDENTS / "correct.py").read_text().replace("return q @ k.transpose(0, 2, 1)",
                                                             "return k @ q.transpose(0, 2, 1)")
    assert "k @ q.transpose" in student
    course = config.load(COURSE)
    seeds = {name: 5 for name in course.configurations}
    a = grade(tmp_path / "engine", student, course, seeds=seeds, source=reference.EngineSource())
    b = grade(tmp_path / "service", student, course, seeds=seeds, source=reference.ServiceSource(LocalClient()))
    assert [(t.name, t.points, t.message) for t in a.tests] == [(t.name, t.points, t.message) for t in b.tests]
    scores = next(t for t in a.tests if t.name == "scores")
    assert not scores.passed and "known mistake" not in scores.message
    assert "Hint: Your values are the transposes of the expected ones" in scores.message, scores.message
    # The output times 1.5, from the engine: the visible test's hint names the factor, the hidden one's does not.
    student = (STUDENTS / "correct.py").read_text().replace("return concat @ W_O.T  #", "return 1.5 * concat @ W_O.T  #")
    r = grade(tmp_path / "factor", student, course, seeds=seeds)
    visible = next(t for t in r.tests if t.name == "output")
    assert "Hint: Your values are the expected ones times a constant c = 1.5" in visible.message, visible.message
    hidden = next(t for t in r.tests if t.visibility == "hidden")
    assert not hidden.passed and not re.search(r"\d\.\d|\[\d", hidden.message), hidden.message
    assert "Hint: Your values are the expected ones times a constant c = …." in hidden.message, hidden.message


def test_the_default_source_is_the_engine_and_needs_no_web_framework(tmp_path):
    assert isinstance(core.make_source(config.load(COURSE)), reference.EngineSource)
    r = grade(tmp_path, STUDENTS / "correct.py")
    assert r.score == r.max_score, r.message


class BrokenEngine(reference.EngineSource):
    def reference(self, c, seed):
        raise reference.SourceError("the engine refused configuration 'x': boom")


def test_a_reference_that_cannot_be_computed_is_no_grade_never_a_zero(tmp_path):
    r = grade(tmp_path, STUDENTS / "correct.py", source=BrokenEngine())
    assert r.gradable is False and r.tests == [] and r.score == 0 and not r.format_errors
    assert "could not be graded, through no fault of your code" in r.message
    assert "the engine refused configuration 'x': boom" in r.internal_error
