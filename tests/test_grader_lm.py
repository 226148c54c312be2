"""A block course that grades the language-model head (grader/course-block-lm.toml): lm_head and
next_token_probs each earn their own points, and each shipped student with a known mistake of the head loses
exactly its function's tests, with its mistake named."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import numpy as np
import pytest
from grading_support import GRADING, STUDENTS, grade_many, student_dir, student_runtime  # noqa: F401 (a fixture)

from grader import block, config, core, reference

COURSE = GRADING / "course-block-lm.toml"
FOLDER = STUDENTS / "block_lm"
#: each student's mistake -> the function it is in
MISTAKE_IN = {
    "temperature_multiplied": "next_token_probs",
    "softmax_over_positions": "next_token_probs",
    "next_token_from_first_position": "next_token_probs",
    "lm_head_transposed": "lm_head",
}


def test_the_reference_is_the_engines_head_on_the_blocks_output():
    course = config.load(COURSE)
    ref = block.reference(course.configurations["decoder-4-heads"], 3)
    a = ref.arrays
    assert a["unembedding"].shape == (7, 20) and a["logits"].shape == (9, 7)  # the vocabulary's 7 tokens
    np.testing.assert_allclose(a["logits"], a["lm_input"] @ a["unembedding"].T, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(a["lm_input"], a["final_norm"])
    z = a["logits"][-1] / 0.7
    np.testing.assert_allclose(a["next_token_probs"], np.exp(z - z.max()) / np.exp(z - z.max()).sum(), rtol=1e-12)
    assert ref.order["final_norm"] < ref.order["logits"] < ref.order["next_token_probs"]


def test_the_softmax_allowance_counts_next_token_probs_logits_over_the_temperature():
    """grader/README.md, "Fair on every seed": L is the largest |logit| any softmax of the configuration reads."""
    ref = block.reference(config.load(COURSE).configurations["decoder-4-heads"], 3)
    attention = np.abs(ref.get("softmax_input")[np.isfinite(ref.get("softmax_input"))]).max()
    head = np.abs(ref.arrays["logits"][-1]).max() / 0.7
    assert head > attention  # so the head's logits decide L here
    assert reference.logit_scale(ref) == pytest.approx(head, rel=1e-15)


def test_the_heads_functions_need_a_head_in_the_block():
    with open(COURSE, "rb") as f:
        doc = tomllib.load(f)
    doc = copy.deepcopy(doc)
    del doc["block"]["lm_head"], doc["block"]["temperature"]
    with pytest.raises(config.ConfigError, match="add lm_head"):
        config.parse(doc, COURSE)


@pytest.fixture(scope="module")
def graded(student_runtime):  # noqa: F811 (the fixture imported from grading_support)
    course = config.load(COURSE)

    def job(path: Path):
        def run():
            import tempfile

            return core.grade(
                student_dir(Path(tempfile.mkdtemp(prefix="lm-student-")), path), course, runtime=student_runtime
            )

        return run

    return grade_many({p.stem: job(p) for p in sorted(FOLDER.glob("*.py"))})


@pytest.mark.sandbox
@pytest.mark.parametrize("student", sorted(p.stem for p in FOLDER.glob("*.py")))
def test_each_head_student_loses_exactly_its_functions_tests_with_its_mistake_named(graded, student):
    r = graded[student]
    assert r.gradable, r.internal_error
    failed = {t.name for t in r.tests if not t.passed}
    if student in ("correct", "float32"):
        assert not failed and r.score == r.max_score == 5
        return
    fn = MISTAKE_IN[student]
    assert failed == {t.name for t in r.tests if t.function == fn}, failed
    for t in r.tests:
        if not t.passed:
            assert f"'{student}'" in t.message, t.message
