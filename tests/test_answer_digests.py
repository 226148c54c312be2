"""The recorded corpus keeps its answers: on any CPU at a tolerance, and on this machine byte for byte.

The corpus, the golden files and their format live in tests/answer_corpus.py and tests/answer_values.py
(scripts/answer-digests is the command line). When answers change on purpose, rewrite the golden files with
``.venv/bin/python scripts/answer-digests --write`` and review the diff of tests/golden/answers/: each changed line
of answers.json is one request whose answer changed, and baseline.json lists the requests whose bytes changed.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

import answer_corpus as ad
import answer_values as av

SHOWN = 25


@pytest.fixture(scope="module")
def current() -> dict[str, ad.Answer]:
    return ad.compute()


def test_every_answer_agrees_with_the_golden_files(current: dict[str, ad.Answer]) -> None:
    golden = ad.load(ad.GOLDEN)
    problems = ad.mismatches(golden, current)
    assert not problems, (
        f"{len(problems)} of {len(golden[0])} answers differ from {ad.GOLDEN.parent.relative_to(ad.SCRIPT_ROOT)} "
        f"(id, request, then what changed; the first {min(SHOWN, len(problems))}):\n"
        + "\n".join(problems[:SHOWN])
        + "\nIf the change is intended, run: .venv/bin/python scripts/answer-digests --write"
    )


def test_the_golden_files_are_what_the_script_writes() -> None:
    """Sorted, one request a line, so a diff shows requests."""
    records, table = ad.load(ad.GOLDEN)
    assert ad.render(records) == ad.GOLDEN.read_text(encoding="utf-8")
    assert ad.render_numbers(table) == (ad.GOLDEN.parent / ad.NUMBERS_FILE).read_text(encoding="utf-8")
    referenced = {ref for rec in records.values() for f in ("numbers", "request_numbers")
                  for ref in rec.get(f, {}).values()}
    assert referenced == table.keys(), "numbers.json holds exactly the groups answers.json refers to"


def _git_history_has(commit: str) -> str | None:
    """Why the byte check cannot run here, or None."""
    if shutil.which("git") is None:
        return "git is not installed"
    try:
        ad.git("cat-file", "-e", f"{commit}^{{commit}}")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return f"the baseline commit {commit[:12]} is not in this checkout (an archive, an sdist or a shallow clone)"
    return None


@pytest.mark.slow
def test_answers_keep_their_bytes_since_the_baseline_commit(current: dict[str, ad.Answer], tmp_path) -> None:
    """Both trees answer on this machine, so their bytes must be equal but for the listed changes."""
    baseline = json.loads(ad.BASELINE.read_text(encoding="utf-8"))
    why_not = _git_history_has(baseline["commit"])
    if why_not:
        pytest.skip(f"byte check against the baseline skipped: {why_not}; the tolerance check above still ran")
    base = ad.tree_bytes(baseline["commit"], tmp_path)
    changed = ad.byte_changes(base, {k: a.bytes for k, a in current.items()})
    unexpected = [k for k in changed if k not in baseline["changed"]]
    assert not unexpected, (
        f"{len(unexpected)} answers changed their bytes since {baseline['commit'][:12]} without being listed in "
        f"{ad.BASELINE.name} (the first {min(SHOWN, len(unexpected))}):\n"
        + "\n".join(f"{k} {current[k].record['request'] if k in current else '(gone)'}" for k in unexpected[:SHOWN])
        + "\nIf the change is intended, run: .venv/bin/python scripts/answer-digests --write")


# ----------------------------------------------------------------- the comparison itself can fail


def test_a_number_moved_beyond_the_tolerance_is_reported() -> None:
    groups = {"/stages/weights/values": [0.25, 0.75], "/stages/q/values": [float(i) for i in range(100)]}
    golden = av.summarize(groups)
    assert av.compare(golden, groups) == []
    small = {**groups, "/stages/weights/values": [0.25, 0.75 + 1e-9]}
    assert "number 1" in av.compare(golden, small)[0]
    big = {**groups, "/stages/q/values": [*range(99), 99.0 + 1e-6]}
    assert "signed sum" in av.compare(golden, big)[0] or "largest magnitude" in av.compare(golden, big)[0]
    inner = {**groups, "/stages/q/values": [0.0, 1.0 + 1e-6, *map(float, range(2, 100))]}
    assert "signed sum" in av.compare(golden, inner)[0]


def test_last_bit_differences_are_within_the_tolerance() -> None:
    values = [0.1 * i + 1e-3 for i in range(100)]
    golden = av.summarize({"g": values, "s": values[:5]})
    wiggled = [v * (1 + 4e-16 * (-1) ** i) for i, v in enumerate(values)]  # a few ulp, alternating
    assert av.compare(golden, {"g": wiggled, "s": wiggled[:5]}) == []


def test_a_stage_that_cancels_to_rounding_level_is_compared_absolutely() -> None:
    # a centred row's mean: 0 in exact arithmetic, 2.8e-17 under one OpenBLAS kernel and 0 under another
    golden = av.summarize({"/stages/norm2_mean/values": [0.0, -3.5e-17, 1.4e-17]})
    assert av.compare(golden, {"/stages/norm2_mean/values": [2.8e-17, 0.0, 1.4e-17]}) == []
    wrong = av.compare(golden, {"/stages/norm2_mean/values": [0.0, -3.5e-17, 1e-6]})  # a real change shows
    assert wrong and "number 2" in wrong[0]


def test_structure_is_pinned_exactly() -> None:
    a = av.canon("application/json", b'{"tokens":["the","cat"],"n":2,"x":[0.5,1.5]}')
    same_numbers_elsewhere = av.canon("application/json", b'{"tokens":["the","cat"],"n":2,"x":[0.5,1.6]}')
    other_token = av.canon("application/json", b'{"tokens":["the","dog"],"n":2,"x":[0.5,1.5]}')
    int_for_float = av.canon("application/json", b'{"tokens":["the","cat"],"n":2,"x":[0.5,1]}')
    assert a.skeleton_sha256 == same_numbers_elsewhere.skeleton_sha256
    assert a.skeleton_sha256 != other_token.skeleton_sha256
    assert a.skeleton_sha256 != int_for_float.skeleton_sha256
    assert a.groups == {"/x": [0.5, 1.5]}
