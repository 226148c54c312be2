"""Every shipped course file grades the cases where mistakes hide: one head (d_k = d_model, where
scale_by_d_model and average_heads change nothing and a per-head mistake can show alone), a d_k
different from the token count (so a transposed [n, d_k] cannot pass for [d_k, n]), and both a causal
and a non-causal configuration. The single-function course had no one-head configuration, so a student
whose mistake shows only at h = 1 lost nothing there."""

from __future__ import annotations

import pytest
from grading_support import GRADING

from engine.tokenize import tokenize
from grader import config
from grader.assignment import FUNCTIONS

COURSES = sorted(GRADING.glob("*.toml"))
#: the courses that grade the attention's own functions, where its mistakes hide (a course of the language-model
#: head alone grades lm_head and next_token_probs on a stack the reference computes: no head count or mask of its own)
ATTENTION_COURSES = [p for p in COURSES if any(t.function in FUNCTIONS for t in config.load(p).tests)]


def test_the_shipped_course_files_are_found():
    assert {p.name for p in COURSES} >= {"course.toml", "course-single-function.toml"}


def test_every_course_but_the_language_model_heads_grades_the_attention():
    assert {p.name for p in COURSES} - {p.name for p in ATTENTION_COURSES} == {"course-block-lm.toml"}


@pytest.mark.parametrize("path", ATTENTION_COURSES, ids=lambda p: p.name)
def test_a_course_file_grades_one_head_a_d_k_other_than_n_causal_and_not(path):
    course = config.load(path)
    graded = [course.configurations[name] for name in sorted({n for t in course.tests for n in t.configurations})]

    def n_tokens(c: config.Configuration) -> int:
        return len(c.tokens) if c.tokens is not None else len(tokenize(c.sentence))

    assert [c.name for c in graded if c.num_heads == 1], f"{path.name}: no graded configuration has one head"
    assert [c.name for c in graded if c.d_k != n_tokens(c)], f"{path.name}: d_k equals n in every configuration"
    assert {c.causal for c in graded} == {True, False}, f"{path.name}: grades only causal={graded[0].causal}"
    # ... and the one-head case is graded by every function that runs the whole layer on it
    one_head = {c.name for c in graded if c.num_heads == 1}
    for function in {t.function for t in course.tests}:
        tests = [t for t in course.tests if t.function == function]
        assert any(one_head & set(t.configurations) for t in tests), f"{path.name}: {function} never sees h = 1"


@pytest.mark.parametrize("path", ATTENTION_COURSES, ids=lambda p: p.name)
def test_a_course_file_grades_the_softmax_where_exp_overflows(path):
    """A configuration with large scores (weight_scale), graded by the softmax: the seeded scores stay below
    about 6, where a softmax without the max subtraction still works; there, exp() overflows (above 709.78)
    for every seed tried."""
    import numpy as np

    from grader.diagnosis import engine_trace

    course = config.load(path)
    softmax = [t for t in course.tests if t.function == "softmax" or t.stage == "weights"]
    large = sorted({n for t in softmax for n in t.configurations if course.configurations[n].weight_scale > 1})
    assert large, f"{path.name}: the softmax is never graded on large scores"
    for name in large:
        for seed in range(0, 4000, 97):
            t = engine_trace(course.configurations[name], seed)
            st = t.stages["masked_scores" if course.configurations[name].causal else "scaled_scores"]
            shown = st.values if st.mask is None else np.where(st.mask, -np.inf, st.values)
            assert shown.max() > 709.79, (name, seed, shown.max())


def test_the_handout_states_the_budgets_the_dict_of_stages_and_what_hidden_tests_show():
    handout = (GRADING / "ASSIGNMENT.md").read_text(encoding="utf-8")
    limits = config.load(GRADING / "course.toml").limits
    assert f"{limits.call_seconds:g} s for each call" in handout
    assert f"{limits.total_seconds:g} s for every call of the whole submission together" in handout
    assert f"{limits.memory_mb // 1024:g} GB of memory" in handout
    assert "a dict of the stages it computed" in handout and '"output": out}' in handout
    assert "**What hidden tests show:**" in handout and "not an exception's type, message, file, function or line" \
        in handout
