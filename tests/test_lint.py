"""Every suppression says why.

ruff, its formatter check, mypy and the import contracts run in `make lint` (part of `make check` and `make
test`; settings in pyproject.toml). RUF100 fails on a `noqa` that suppresses nothing, mypy's warn_unused_ignores
on a `type: ignore` that does, and ignore-without-code on one without its error code. This test adds what they
cannot: a `noqa` gives its reason after the codes, e.g. `# noqa: E402 (after sys.path names the repository)`, and
a `type: ignore[code]` its reason after it or in a comment on the line above, so a reader knows the rule was set
aside on purpose.
"""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

from conftest import ROOT

DIRECTIVE = re.compile(r"#\s*noqa\b")
JUSTIFIED = re.compile(r"noqa: [A-Z]+[0-9]+(, [A-Z]+[0-9]+)*\s+[(\-–]\s*\S")
TYPE_IGNORE = re.compile(r"type:\s*ignore\b")
#: the code(s), then a reason as a comment of its own: "# type: ignore[arg-type]  # why"
TYPE_IGNORE_JUSTIFIED = re.compile(r"type: ignore\[[a-z-]+(, ?[a-z-]+)*\]\s+#\s*\S")
#: what mypy checks (pyproject.toml [tool.mypy] files), where a type: ignore means something
TYPED = ("engine/", "service/", "grader/", "attention_trace/", "viewer/", "tools/", "bench/")


def _python_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "*.py", "scripts/*"], cwd=ROOT, capture_output=True, text=True,
                           check=False).stdout.split()
    if not names:  # not a git checkout
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if ".venv" not in p.parts]
    files = [ROOT / n for n in names if not n.startswith("grader/students/")]  # students write as they like
    return [p for p in files if p.is_file() and (p.suffix == ".py" or p.read_bytes().startswith(b"#!/usr/bin/env python"))]


def test_every_noqa_says_why():
    bare = []
    for path in _python_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        if "noqa" not in text:
            continue
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
        except (tokenize.TokenError, SyntaxError):
            continue
        for tok in tokens:  # comments only: a "noqa" inside a string is a student's code, not ours
            if tok.type == tokenize.COMMENT and DIRECTIVE.search(tok.string) and not JUSTIFIED.search(tok.string):
                bare.append(f"{path.relative_to(ROOT)}:{tok.start[0]}: {tok.string.strip()}")
    assert not bare, "give each noqa its reason, e.g. '# noqa: E402 (after the path is set)':\n" + "\n".join(bare)


def test_every_type_ignore_says_why():
    bare = []
    for path in _python_files():
        rel = str(path.relative_to(ROOT))
        text = path.read_text(encoding="utf-8", errors="replace")
        if not rel.startswith(TYPED) or "type:" not in text:
            continue
        lines = text.splitlines()
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type != tokenize.COMMENT or not TYPE_IGNORE.search(tok.string):
                continue
            above = lines[tok.start[0] - 2].strip() if tok.start[0] > 1 else ""
            if not TYPE_IGNORE_JUSTIFIED.search(tok.string) and not above.startswith("#"):
                bare.append(f"{rel}:{tok.start[0]}: {tok.string.strip()}")
    assert not bare, ("give each type: ignore its code and reason, e.g. '# type: ignore[arg-type]  # numpy's stubs "
                      "miss this', or a comment on the line above:\n" + "\n".join(bare))


@pytest.mark.parametrize("comment, ok", [("# type: ignore[arg-type]  # numpy's stubs", True),
                                         ("# type: ignore[arg-type]  (mypy reads no reason so)", False),
                                         ("# type: ignore[arg-type]", False), ("# type: ignore", False)])
def test_the_type_ignore_rule_itself(comment, ok):
    assert bool(TYPE_IGNORE_JUSTIFIED.search(comment)) is ok


@pytest.mark.parametrize("comment, ok", [("# noqa: E402 (after the path is set)", True),
                                         ("# noqa: BLE001 - a hostile __str__", True),
                                         ("# noqa: E402", False), ("# noqa", False), ("# noqa: F401  ", False)])
def test_the_justification_rule_itself(comment, ok):
    assert bool(JUSTIFIED.search(comment)) is ok
