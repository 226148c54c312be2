"""Shared helpers of the autograder tests (test_grading_sandbox.py, test_grading_core.py,
test_gradescope.py, test_prairielearn.py): paths, the student runtime fixture, course variants,
grading many students at once, results schemas, and what each shipped buggy student must lose.

The sandbox runs for real here: as root (as these tests run on the project's machines) the student's
code runs as a fresh unprivileged uid in new network, IPC and mount namespaces, from the student
runtime that ``attention-trace-grade setup-sandbox`` builds (the session fixture below builds it, as the
platforms' setup scripts do).
"""

from __future__ import annotations

import copy
import importlib.util
import shutil
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

from grader import config, runtime, sandbox  # noqa: E402 (beside the paths it is used with)

GRADING = ROOT / "grader"
STUDENTS = GRADING / "students"
HOSTILE = STUDENTS / "hostile"
SINGLE = STUDENTS / "single_function"
COURSE = GRADING / "course.toml"
CORRECT_STUDENTS = ["correct", "float32_einsum", "float32_loop", "w_o_per_head"]
HOSTILE_STUDENTS = sorted(p.stem for p in HOSTILE.glob("*.py"))
BUG_STUDENTS = sorted(p.stem for p in STUDENTS.glob("*.py") if p.stem not in CORRECT_STUDENTS)

PROJECT = "project (Q, K and V)"
MHA_ALL = {"multi_head_attention", "multi_head_attention (after publication)", "multi_head_attention (hidden)"}
# The after_published configuration is not causal: a mask mistake cannot show there.
MHA_CAUSAL = {"multi_head_attention", "multi_head_attention (hidden)"}

#: bug -> (the tests of course.toml it must fail, the test whose message must name it). Each shipped
#: buggy student has its mistake in one function (or, for scale_by_d_model, mask_after_softmax and the wiring
#: mistakes, in how multi_head_attention puts correct functions together); multi_head_attention runs them all.
BUG_FAILS: dict[str, tuple[set[str], str]] = {
    "scale_after_softmax": ({"scale"} | MHA_ALL, "scale"),
    "scale_by_d_model": (MHA_ALL, "multi_head_attention"),
    "double_scale": ({"scale"} | MHA_ALL, "scale"),
    "no_scale": ({"scale"} | MHA_ALL, "scale"),
    "finite_mask_fill": ({"mask"} | MHA_CAUSAL, "mask"),
    "softmax_wrong_axis": ({"softmax"} | MHA_ALL, "softmax"),
    "average_heads": ({"concat"} | MHA_ALL, "concat"),
    "projection_not_transposed": ({PROJECT} | MHA_ALL, PROJECT),
    "heads_split_without_transpose": ({PROJECT} | MHA_ALL, PROJECT),
    "mask_includes_diagonal": ({"mask"} | MHA_CAUSAL, "mask"),
    "mask_after_softmax": (MHA_CAUSAL, "multi_head_attention"),
    "log_softmax": ({"softmax"} | MHA_ALL, "softmax"),
    "concat_token_major": ({"concat"} | MHA_ALL, "concat"),
    "average_heads_sliced_W_O": ({"concat"} | MHA_ALL, "concat"),
    "positional_encoding_missing": ({"add_positional_encoding"}, "add_positional_encoding"),
    "positional_encoding_twice": ({"add_positional_encoding"}, "add_positional_encoding"),
    # wiring mistakes: every function is right, the layer that calls them is not
    "same_w_for_q_and_k": (MHA_ALL, "multi_head_attention"),
    "positional_encoding_queries_only": (MHA_ALL, "multi_head_attention"),
    "mask_not_applied": (MHA_CAUSAL, "multi_head_attention"),
    "output_projection_missing": (MHA_ALL, "multi_head_attention"),
}

#: hostile student -> the points it earns with its own code under course.toml (None: every test 0)
HOSTILE_EARNS: dict[str, set[str]] = {
    "answer_file_tricks": set(),
    "bare_except_loop": set(),
    "big_print": set(),
    "fill_disk": None,  # type: ignore[dict-item]  # correct, once the disk says no
    "fork_bomb": set(),
    "os_exit": set(),
    "print_inputs": None,  # type: ignore[dict-item]  # a correct student: everything
    "replace_grader": set(),
    "segfault": {"scores"},  # its scores() is right
    "signal_alarm": {"add_positional_encoding", PROJECT, "scores", "scale", "mask", "attend", "concat", "output"},
    "stack_walker": set(),
    "url_client": set(),
}


@pytest.fixture(scope="session")
def student_runtime() -> runtime.Runtime:
    """The student runtime, built (or found current) as the platforms' setup scripts build it."""
    return runtime.build()


def course_doc() -> dict[str, Any]:
    with open(COURSE, "rb") as f:
        return tomllib.load(f)


def course_with(**limits: Any) -> config.Course:
    """course.toml with other [limits] (the hostile students get a short clock)."""
    doc = copy.deepcopy(course_doc())
    doc["limits"].update(limits)
    return config.parse(doc, COURSE)


def fast_course() -> config.Course:
    return course_with(call_seconds=1.5, total_seconds=30)


def student_dir(tmp: Path, student: Path | str, name: str = "attention.py") -> Path:
    d = tmp / "submission"
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(student, Path):
        shutil.copy(student, d / name)
    else:
        (d / name).write_text(student)
    return d


def load_adapter(platform: str) -> Any:
    """examples/<platform>/grade.py as a module."""
    path = EXAMPLES / platform / "grade.py"
    spec = importlib.util.spec_from_file_location(f"{platform}_grade", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def grade_many(jobs: dict[str, Callable[[], Any]], workers: int = 2) -> dict[str, Any]:
    """Run the grading jobs two at a time (the sandboxed processes wait more than they compute)."""
    with ThreadPoolExecutor(workers) as ex:
        futures = {name: ex.submit(fn) for name, fn in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


def sandbox_processes() -> list[tuple[int, int]]:
    """(pid, uid) of every live process running as a uid this test process gave a student: there must
    be none after grading. (Only ours: another test run on the machine may be grading right now.)"""
    return [(pid, uid) for uid in sorted(sandbox._used_uids) for pid in sandbox.processes_of(uid)]


VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
FORMAT = {"enum": ["text", "html", "simple_format", "md", "ansi"]}
#: Gradescope's results.json (https://gradescope-autograders.readthedocs.io/en/latest/specs/)
GRADESCOPE_SCHEMA = {
    "type": "object",
    "required": ["score", "output", "visibility", "stdout_visibility", "tests"],
    "properties": {
        "score": {"type": "number", "minimum": 0},
        "execution_time": {"type": "number"},
        "output": {"type": "string"},
        "output_format": FORMAT, "test_output_format": FORMAT, "test_name_format": FORMAT,
        "visibility": VISIBILITY,
        "stdout_visibility": VISIBILITY,
        "extra_data": {"type": "object"},
        "tests": {"type": "array", "items": {
            "type": "object",
            "required": ["name", "score", "max_score", "status", "output", "visibility"],
            "properties": {"name": {"type": "string"}, "score": {"type": "number", "minimum": 0},
                           "max_score": {"type": "number", "minimum": 0}, "status": {"enum": ["passed", "failed"]},
                           "number": {"type": "string"}, "output": {"type": "string"}, "output_format": FORMAT,
                           "name_format": FORMAT, "visibility": VISIBILITY},
            "additionalProperties": False,
        }},
    },
    "additionalProperties": False,
}
#: PrairieLearn's results.json (docs/externalGrading.md)
PRAIRIELEARN_SCHEMA = {
    "type": "object",
    "required": ["gradable"],
    "properties": {
        "gradable": {"type": "boolean"},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "message": {"type": "string"},
        "output": {"type": "string"},
        "format_errors": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "extra_data": {"type": "object"},  # "any additional data" (PrairieLearn's docs): the staff's, not rendered
        "tests": {"type": "array", "items": {
            "type": "object",
            "required": ["name", "points", "max_points"],
            "properties": {"name": {"type": "string"}, "description": {"type": "string"},
                           "points": {"type": "number", "minimum": 0}, "max_points": {"type": "number", "minimum": 0},
                           "message": {"type": "string"}, "output": {"type": "string"}},
            "additionalProperties": False,
        }},
    },
    "if": {"properties": {"gradable": {"const": True}}},
    "then": {"required": ["gradable", "score", "tests"]},
    "else": {"not": {"required": ["score"]}},
    "additionalProperties": False,
}


# ------------------------------------------------------------------ block courses (tests/test_grader_block.py)

#: each block course file -> the folder of its students (each named for its known mistake, or correct)
BLOCK_COURSES: dict[str, Path] = {"course-block.toml": STUDENTS / "block",
                                  "course-block-llama.toml": STUDENTS / "block_llama",
                                  "course-block-vaswani.toml": STUDENTS / "block_vaswani"}
BLOCK_CORRECT = {"correct", "float32"}
BLOCK_WHOLE = {"block", "block (hidden)"}
#: the block students' mistakes -> the function it is in (its test, then block's, fail; both name it), or None
#: for a mistake of block itself (every function it calls passes; block's tests name it)
BLOCK_MISTAKE_IN: dict[str, str | None] = {
    "norm_over_tokens": "norm", "unbiased_variance": "norm", "eps_outside_sqrt": "norm",
    "gelu_approximation_swapped": "ffn", "ffn_without_activation": "ffn", "swiglu_gate_up_swapped": "ffn",
    "residual_forgotten": None, "post_norm_for_pre_norm": None, "pre_norm_for_post_norm": None,
    "final_norm_forgotten": None,
}


def block_students() -> list[tuple[str, Path]]:
    """(course file name, student file) of every shipped block student."""
    return [(course, p) for course, folder in BLOCK_COURSES.items() for p in sorted(folder.glob("*.py"))]
