"""Block courses (grader/course-block*.toml): layer_norm, rms_norm, ffn and block graded per function.

Without the sandbox: the course files load and what is refused in them is said; the references agree with
an independent numpy solution and with the engine's stack; the plan calls the stage functions in the
order the block computes them and gives block a process of its own; a stage function's mistake is found
from its own inputs (on the second norm too, where recomputing the whole block from the mistake on
cannot). With the sandbox (as tests/test_gradescope.py): every shipped block student graded, the correct
ones with full marks, each mistaken one losing exactly its function's tests and block's with its mistake
named; both platform adapters grading a block course chosen by ATTENTION_GRADER_COURSE, and selftest.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import tomllib
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from grading_support import (BLOCK_CORRECT, BLOCK_COURSES, BLOCK_MISTAKE_IN, BLOCK_WHOLE, GRADESCOPE_SCHEMA, GRADING,
                             PRAIRIELEARN_SCHEMA, block_students, grade_many, load_adapter, student_dir,
                             student_runtime)
from jsonschema import Draft202012Validator

import engine
from grader import block, config, core
from grader.__main__ import main as grade_cli
from grader.assignment import ALL_FUNCTIONS, parts_of
from grader.reference import EngineSource, tolerance_of

_ = student_runtime  # a pytest fixture: tests receive it by name

COURSE_FILES = {name: GRADING / name for name in BLOCK_COURSES}
GPT2 = COURSE_FILES["course-block.toml"]


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"student_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def doc_of(path: Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


# ------------------------------------------------------------------ course files


@pytest.mark.parametrize("name", sorted(COURSE_FILES))
def test_the_block_course_files_load_with_their_norm_and_a_test_for_each_block_function(name):
    course = config.load(COURSE_FILES[name])
    norm = "rms_norm" if course.block.preset == "llama" else "layer_norm"
    assert {t.function for t in course.tests} >= {norm, "ffn", "block", "multi_head_attention", "softmax"}
    assert course.max_score == 17
    for c in course.configurations.values():
        tc = c.trace_config(7)
        assert tc.has_block and tc.num_layers == 1 and tc.positional_encoding == "sinusoidal"
        assert tc.norm_kind == norm and tc.eps == 0.25 and tc.seeded_norm and not tc.grouped


@pytest.mark.parametrize(("change", "needle"), [
    (lambda d: d.pop("block"), "layer_norm is a function of the block assignment; add a [block] table"),
    (lambda d: d["block"].update(preset="gpt3"), "`preset` must be one of vaswani2017, gpt2, llama"),
    (lambda d: d["block"].update(norm="rms_norm"), "this block's norm is rms_norm ([block]), so grade rms_norm"),
    (lambda d: d["block"].update(norm_eps=2.0), "norm_eps must be a finite number greater than 0 and at most 1"),
    (lambda d: d["block"].update(num_layers=2), "unknown key(s) 'num_layers'"),
    (lambda d: d["service"].update(url="https://attention.example.edu"), '[service] url = "local"'),
    (lambda d: d["test"].append({"name": "pe", "function": "add_positional_encoding", "configurations": "@visible",
                                 "points": 1}), "grade add_positional_encoding in an attention course"),
])
def test_what_a_block_course_file_may_not_say_is_refused_with_where(change, needle):
    doc = copy.deepcopy(doc_of(GPT2))
    change(doc)
    with pytest.raises(config.ConfigError) as e:
        config.parse(doc, GPT2)
    assert needle in str(e.value)


def test_an_attention_course_has_no_block():
    course = config.load(GRADING / "course.toml")
    assert course.block is None and all(c.block is None for c in course.configurations.values())


# ------------------------------------------------------------------ references


@pytest.mark.parametrize("name", sorted(COURSE_FILES))
def test_the_reference_agrees_with_an_independent_numpy_solution(name):
    """Each block stage of the reference, from its own inputs, is what the staff's plain-numpy solution computes;
    the block's output is the solution's block on x and params; the attention's output is the stack's."""
    course = config.load(COURSE_FILES[name])
    solution = load_module(BLOCK_COURSES[name] / "correct.py")
    for cname in ("decoder-4-heads", "encoder-2-heads", "one-token"):
        c = course.configurations[cname]
        ref = block.reference(c, 11)
        a, eps = ref.arrays, ref.values["eps"]
        norms = [s for s in ("norm1", "norm2", "final_norm") if s in a]
        assert norms == (["norm1", "norm2", "final_norm"] if ref.stack.config.pre_norm else ["norm1", "norm2"])
        for s in norms:
            got = (solution.layer_norm(a[f"{s}_input"], a[f"{s}_gamma"], a[f"{s}_beta"], eps)
                   if f"{s}_beta" in a else solution.rms_norm(a[f"{s}_input"], a[f"{s}_gamma"], eps))
            np.testing.assert_allclose(got, a[s], rtol=1e-10, atol=1e-12)
            assert np.abs(a[s]).max() > 0.1  # not trivially zero
        np.testing.assert_allclose(solution.ffn(a["ffn_input"], a["W_1"], a["W_2"], a.get("W_3")), a["ffn_output"],
                                   rtol=1e-10, atol=1e-12)
        out = solution.block(a["block_input"], ref.values["block_params"], c.causal)
        np.testing.assert_allclose(out, a["block_output"], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(a["output"], ref.stack.state["output@0"], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(a["input"], ref.stack.state["attention_input@0"], rtol=0, atol=0)


def test_weight_scale_scales_the_blocks_attention_only():
    c = config.load(GPT2).configurations["large-scores"]
    scaled, plain = block.block_trace(c, 3), engine.trace(c.trace_config(3), tokens=list(c.tokens))
    np.testing.assert_allclose(scaled.parameters.layers[0].attention.W_Q, 30 * plain.parameters.layers[0].attention.W_Q)
    np.testing.assert_array_equal(scaled.parameters.layers[0].W_1, plain.parameters.layers[0].W_1)
    shown = np.where(scaled.stages["masked_scores"].mask, -np.inf, scaled.stages["masked_scores"].values)
    assert shown.max() > 709.79  # exp() overflows without the max subtracted


# ------------------------------------------------------------------ the plan: order and isolation


@pytest.mark.parametrize("name", sorted(COURSE_FILES))
def test_block_runs_alone_and_the_stage_functions_in_the_blocks_order(name):
    course = config.load(COURSE_FILES[name])
    refs = {n: block.reference(c, 5) for n, c in course.configurations.items()}
    runs, _ = core.Grader(course, Path(".")).plan(refs)
    # the hidden tests grade block alone: one process of its own for them
    assert [kind for kind, _ in runs] == ["visible", "visible-layer", "visible-block", "protected"]
    assert {c.function for c in runs[-1][1]} == {"block"}
    for kind, calls in runs:
        functions = {c.function for c in calls}
        assert functions in ({"block"}, {"multi_head_attention"}) or not functions & {"block", "multi_head_attention"}
    pre = next(iter(refs.values())).stack.config.pre_norm
    norm = "rms_norm" if course.block.preset == "llama" else "layer_norm"
    calls = runs[0][1]
    for cname in ("encoder-2-heads", "decoder-4-heads", "one-head"):
        mine = [c.key for c in calls if c.key[1] == cname]
        where = {(f, s): i for i, (f, _, s) in enumerate(mine)}
        places = [refs[cname].order[s] for _, _, s in mine]
        assert places == sorted(places), mine  # each stage's inputs are answered before it is asked
        if pre:  # the first norm's answer is the attention's input
            assert where[(norm, "norm1")] < where[("project", "q")] < where[(norm, "norm2")] < where[("ffn", "ffn_output")] \
                < where[(norm, "final_norm")]
        else:  # the FFN's answer is in the second norm's input (residual2 = norm1 + ffn_output)
            assert where[("output", "output")] < where[(norm, "norm1")] < where[("ffn", "ffn_output")] \
                < where[(norm, "norm2")]
            assert (norm, "final_norm") not in where
            np.testing.assert_allclose(refs[cname].arrays["norm2_input"],
                                       refs[cname].arrays["norm1"] + refs[cname].arrays["ffn_output"])


def test_the_block_gets_x_its_weights_by_name_and_causal():
    course = config.load(COURSE_FILES["course-block-llama.toml"])
    ref = block.reference(course.configurations["decoder-4-heads"], 2)
    (part,) = parts_of(ALL_FUNCTIONS["block"], ref)
    from grader.assignment import call_arguments

    arrays, args, kwargs = call_arguments(part, ref)
    assert kwargs == {"causal": {"value": True}}
    params = args[1]["dict"]
    assert set(params) == {"W_Q", "W_K", "W_V", "W_O", "W_1", "W_2", "W_3", "norm1_gamma", "norm2_gamma",
                           "final_norm_gamma", "eps"}  # RMSNorm: no beta
    assert params["eps"] == {"value": 0.25}
    np.testing.assert_array_equal(arrays[params["W_3"]["array"]], ref.arrays["W_3"])
    (ffn,) = parts_of(ALL_FUNCTIONS["ffn"], ref)
    assert "W_3" in call_arguments(ffn, ref)[2]
    gpt2 = block.reference(config.load(GPT2).configurations["one-head"], 2)
    assert call_arguments(parts_of(ALL_FUNCTIONS["ffn"], gpt2)[0], gpt2)[2] == {}  # no W_3 outside SwiGLU


# ------------------------------------------------------------------ diagnosis of a stage function


def _answer(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return values, np.zeros(values.shape, dtype=bool)


def test_a_norm_mistake_is_found_on_the_second_and_final_norms_from_their_own_inputs():
    """Recomputing the whole block with the mistake changes the second norm's input too; from the input it was
    given, only the function's own steps with the mistake reproduce what the student's layer_norm returns."""
    course = config.load(GPT2)
    ref = block.reference(course.configurations["encoder-2-heads"], 9)
    tol = tolerance_of(course.check)
    a, eps = ref.arrays, ref.values["eps"]

    def bessel(x, gamma, beta):
        mu = x.mean(axis=-1, keepdims=True)
        return gamma * (x - mu) / np.sqrt(x.var(axis=-1, ddof=1, keepdims=True) + eps) + beta

    for s in ("norm1", "norm2", "final_norm"):
        got = bessel(a[f"{s}_input"], a[f"{s}_gamma"], a[f"{s}_beta"])
        assert not np.allclose(got, a[s], rtol=1e-3)
        assert block.function_matches(ref, "layer_norm", s, *_answer(got), tol) == ["unbiased_variance"]
        assert block.function_matches(ref, "layer_norm", s, *_answer(a[s] * 1.01), tol) == []
    whole = engine.recompute_values(ref.stack, engine.bugs.ALL_BUGS["unbiased_variance"])["norm2"][0]
    assert not np.allclose(whole, bessel(a["norm2_input"], a["norm2_gamma"], a["norm2_beta"]), rtol=1e-3)
    outcome = block.check(ref, "layer_norm", {s: _answer(bessel(a[f"{s}_input"], a[f"{s}_gamma"], a[f"{s}_beta"]))
                                              for s in ("norm1", "norm2", "final_norm")}, tol)
    assert not outcome.passed and outcome.matches == ["unbiased_variance"]
    assert "96 of 96 values are off" in outcome.stages["norm2"].message


# ------------------------------------------------------------------ every block student, sandboxed


def expected_failures(course: config.Course, student: str) -> set[str]:
    if student in BLOCK_CORRECT:
        return set()
    where = BLOCK_MISTAKE_IN[student]
    norm = "rms_norm" if course.block.preset == "llama" else "layer_norm"
    return BLOCK_WHOLE | ({norm} if where == "norm" else {"ffn"} if where == "ffn" else set())


@pytest.fixture(scope="module")
def graded(student_runtime) -> dict[tuple[str, str], core.GradeResult]:
    courses = {name: config.load(path) for name, path in COURSE_FILES.items()}

    def job(course_name: str, path: Path):
        def run():
            import tempfile

            tmp = Path(tempfile.mkdtemp(prefix="block-student-"))
            return core.grade(student_dir(tmp, path), courses[course_name], runtime=student_runtime)
        return run

    return grade_many({(c, p.stem): job(c, p) for c, p in block_students()})


@pytest.mark.sandbox
@pytest.mark.parametrize(("course_name", "student"), [(c, p.stem) for c, p in block_students()],
                         ids=lambda x: x)
def test_each_block_student_loses_exactly_its_functions_tests_with_its_mistake_named(graded, course_name, student):
    course = config.load(COURSE_FILES[course_name])
    r = graded[(course_name, student)]
    assert r.gradable, r.internal_error
    failed = {t.name for t in r.tests if not t.passed}
    want = expected_failures(course, student)
    assert failed == want, (student, {t.name: t.message for t in r.tests if not t.passed})
    assert r.score == course.max_score - sum(t.points for t in course.tests if t.name in want)
    messages = {t.name: t.message for t in r.tests}
    for name in want:
        assert f"the known mistake '{student}'" in messages[name], messages[name]
        assert r.extra["named"][name] == [student]
    if want:
        block_message = messages["block"]
        if BLOCK_MISTAKE_IN[student] is None:
            assert "Every function block calls passes" in block_message
        else:
            assert "block runs your functions, so it also shows their mistakes" in block_message
        hidden = messages["block (hidden)"]
        assert "seed" not in hidden and "expected" not in hidden and "(token, d_model)" not in hidden, hidden


# ------------------------------------------------------------------ the platforms


@pytest.mark.sandbox
def test_gradescope_grades_a_block_course_chosen_by_its_environment(tmp_path, monkeypatch, student_runtime):
    gs = load_adapter("gradescope")
    root = tmp_path / "autograder"
    student_dir(root, BLOCK_COURSES["course-block.toml"] / "final_norm_forgotten.py")  # root/submission
    monkeypatch.setenv("AUTOGRADER_ROOT", str(root))
    monkeypatch.setenv("ATTENTION_GRADER_COURSE", str(GPT2))
    assert gs.main() == 0
    doc = json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))
    assert not list(Draft202012Validator(GRADESCOPE_SCHEMA).iter_errors(doc))
    assert {t["name"] for t in doc["tests"] if t["status"] == "failed"} == BLOCK_WHOLE
    assert doc["score"] == 13
    assert "the known mistake 'final_norm_forgotten'" in next(t for t in doc["tests"] if t["name"] == "block")["output"]


@pytest.mark.sandbox
def test_prairielearn_grades_a_block_course_from_its_tests_folder(tmp_path, monkeypatch, student_runtime):
    pl = load_adapter("prairielearn")
    root = tmp_path / "grade"
    (root / "student").mkdir(parents=True)
    (root / "tests").mkdir()
    vaswani = COURSE_FILES["course-block-vaswani.toml"]
    (root / "tests" / "course.toml").write_text(vaswani.read_text(encoding="utf-8"), encoding="utf-8")
    (root / "student" / "attention.py").write_text(
        (BLOCK_COURSES["course-block-vaswani.toml"] / "pre_norm_for_post_norm.py").read_text(encoding="utf-8"))
    monkeypatch.setenv("PL_GRADE_ROOT", str(root))
    monkeypatch.delenv("ATTENTION_GRADER_COURSE", raising=False)
    assert pl.paths()[2] == root / "tests" / "course.toml"
    assert pl.main() == 0
    doc = json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))
    assert not list(Draft202012Validator(PRAIRIELEARN_SCHEMA).iter_errors(doc))
    assert doc["gradable"] is True and abs(doc["score"] - 13 / 17) < 1e-9
    tests = {t["name"]: t for t in doc["tests"]}
    assert {n for n, t in tests.items() if t["points"] < t["max_points"]} == BLOCK_WHOLE
    assert "the known mistake 'pre_norm_for_post_norm'" in tests["block"]["output"]


@pytest.mark.sandbox
@pytest.mark.parametrize("name", sorted(COURSE_FILES))
def test_selftest_grades_each_block_courses_shipped_solution(name, capsys, student_runtime):
    assert grade_cli(["selftest", str(COURSE_FILES[name])]) == 0
    assert "selftest: OK: the correct student scored 17/17" in capsys.readouterr().out


def test_a_block_course_ignores_a_service_url_in_the_environment(monkeypatch):
    monkeypatch.setenv("ATTENTION_TRACE_URL", "http://127.0.0.1:9")
    assert isinstance(core.make_source(config.load(GPT2)), EngineSource)


class _RefusingClient:
    """A service client that fails the test if it is asked anything."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the service was asked for {name}")


@pytest.mark.sandbox
def test_a_block_course_given_a_service_grades_with_the_engine(tmp_path, student_runtime):
    sub = student_dir(tmp_path, BLOCK_COURSES["course-block.toml"] / "correct.py")
    r = core.grade(sub, config.load(GPT2), client=_RefusingClient(), runtime=student_runtime)
    assert r.gradable and r.score == r.max_score == 17, r.internal_error
    assert "grader: a block course grades with the engine; the service given is not used" in r.log


# ------------------------------------------------------------------ no answer a later call can reuse

CACHES_INPUTS = BLOCK_COURSES["course-block-vaswani.toml"] / "gaming" / "caches_inputs.py"


def _call(module: ModuleType, call) -> np.ndarray:
    """A planned call made in this process, as the harness makes it in the sandbox."""
    def arg(a):
        if "dict" in a:
            return {k: arg(v) for k, v in a["dict"].items()}
        return call.arrays[a["array"]].copy() if "array" in a else a["value"]
    return getattr(module, call.function)(*[arg(a) for a in call.args], **{k: arg(v) for k, v in call.kwargs.items()})


def test_block_could_be_answered_from_layer_norms_inputs_in_one_process():
    """The oracle the separate process closes: after the stage functions' calls, caches_inputs' block (which
    computes nothing) returns the reference's output; on its own it returns zeros."""
    course = config.load(COURSE_FILES["course-block-vaswani.toml"])
    refs = {n: block.reference(c, 4) for n, c in course.configurations.items()}
    runs = dict(core.Grader(course, Path(".")).plan(refs)[0])
    alone = load_module(CACHES_INPUTS)
    shared = load_module(CACHES_INPUTS)
    for call in runs["visible"]:
        _call(shared, call)
    normalised = {call.key[1] for call in runs["visible"] if call.function == "layer_norm"}
    assert normalised == set(next(t for t in course.tests if t.function == "layer_norm").configurations)
    assert {call.key[1] for call in runs["visible-block"]} == normalised
    for call in runs["visible-block"]:
        want = refs[call.key[1]].arrays["block_output"]
        np.testing.assert_allclose(_call(shared, call), want, rtol=1e-9, atol=1e-12)
        assert not _call(alone, call).any()


@pytest.mark.sandbox
def test_an_answer_cached_from_layer_norm_earns_no_block_points(tmp_path, student_runtime):
    course = config.load(COURSE_FILES["course-block-vaswani.toml"])
    r = core.grade(student_dir(tmp_path, CACHES_INPUTS), course, runtime=student_runtime)
    assert {t.name for t in r.tests if not t.passed} == BLOCK_WHOLE and r.score == 13
    assert "looks like a placeholder" in next(t.message for t in r.tests if t.name == "block")


# ------------------------------------------------------------------ a mistake only a hidden configuration reaches


@pytest.fixture(scope="module")
def unreached(student_runtime) -> dict[str, core.GradeResult]:
    """Each block course's student whose mask is right up to 8 tokens only (hidden_only/), and course-block.toml's
    correct student with a block that fails in a way of its own (an exception, NaN, a placeholder)."""
    import tempfile

    source = (BLOCK_COURSES["course-block.toml"] / "correct.py").read_text(encoding="utf-8")
    head = "def block(x, params, causal=False):\n"
    at = source.index(head) + len(head)
    broken = {"raises": "    raise ValueError('not finished')\n", "nan": "    return np.full(np.shape(x), np.nan)\n",
              "zeros": "    return np.zeros(np.shape(x))\n"}

    def job(name: str, student: Path | str):
        course = config.load(COURSE_FILES[name])
        return lambda: core.grade(student_dir(Path(tempfile.mkdtemp(prefix="block-unreached-")), student), course,
                                  runtime=student_runtime)

    jobs = {name: job(name, folder / "hidden_only" / "mask_from_an_8_token_table.py")
            for name, folder in BLOCK_COURSES.items()}
    jobs.update({kind: job("course-block.toml", source[:at] + body + source[at:]) for kind, body in broken.items()})
    return grade_many(jobs)


@pytest.mark.sandbox
@pytest.mark.parametrize("name", sorted(COURSE_FILES))
def test_a_mistake_only_a_hidden_configuration_reaches_is_named_not_the_wiring(unreached, name):
    r = unreached[name]
    assert r.gradable, r.internal_error
    assert {t.name for t in r.tests if not t.passed} == {"block (hidden)"}
    message = next(t.message for t in r.tests if t.name == "block (hidden)")
    assert ("your mask" in message and "it goes wrong only on a configuration the visible tests do not reach "
            "(more than 7 tokens" in message and "Fix mask there" in message), message
    assert "wiring" not in message, message
    # no value, index, input or seed of the hidden configuration
    assert "seed" not in message and "expected" not in message and not re.search(r"\[\d|\d\.\d", message), message
    assert any("mask on 'hidden-decoder'" in run for runs in r.extra["probes"] for run in runs)


@pytest.mark.sandbox
@pytest.mark.parametrize(("kind", "says"), [("raises", "raised an exception in block"),
                                             ("nan", "NaN or infinite values"),
                                             ("zeros", "every value is the same number")])
def test_a_block_that_raises_or_answers_nan_or_a_placeholder_is_told_so_not_that_its_wiring_is_wrong(unreached,
                                                                                                      kind, says):
    r = unreached[kind]
    failed = {t.name: t for t in r.tests if not t.passed}
    assert set(failed) == {"block", "block (hidden)"}, failed
    for t in failed.values():
        assert says in t.message or says in t.redacted, t.message
        assert "wiring" not in t.message, t.message
