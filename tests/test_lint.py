"""The tree passes ruff with the project's rule set, and every suppression says why.

ruff's rules are in pyproject.toml ([tool.ruff]); RUF100 there fails on a `noqa` that suppresses nothing.
This test adds what ruff cannot: a `noqa` comment must give its reason after the codes, e.g.
`# noqa: E402 (after sys.path names the repository)`, so a reader knows the rule was set aside on purpose.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from conftest import ROOT

DIRECTIVE = re.compile(r"#\s*noqa\b")
JUSTIFIED = re.compile(r"noqa: [A-Z]+[0-9]+(, [A-Z]+[0-9]+)*\s+[(\-–]\s*\S")


def _ruff() -> str | None:
    found = Path(sys.executable).parent / "ruff"
    return str(found) if found.exists() else shutil.which("ruff")


def test_ruff_passes():
    ruff = _ruff()
    assert ruff, "ruff is in requirements-dev.txt: run make install-test"
    run = subprocess.run([ruff, "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


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


@pytest.mark.parametrize("comment, ok", [("# noqa: E402 (after the path is set)", True),
                                         ("# noqa: BLE001 - a hostile __str__", True),
                                         ("# noqa: E402", False), ("# noqa", False), ("# noqa: F401  ", False)])
def test_the_justification_rule_itself(comment, ok):
    assert bool(JUSTIFIED.search(comment)) is ok
