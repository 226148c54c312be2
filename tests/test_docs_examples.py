"""The example answers in the guides carry the schema_version the service answers today.

A reader compares an example with what the service sends; an example that names an older version
(README's said 1.0.0 while the service answered 1.1.0) reads as a different contract.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.serialize import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parent.parent
#: the guides a reader follows (docs/history and CHANGELOG.md tell of older versions on purpose)
GUIDES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "grader").glob("*.md"),
                 *(ROOT / "examples").glob("*/README.md")])
EXAMPLE = re.compile(r'"schema_version":\s*"([0-9.]+)"')


def test_the_guides_are_found():
    assert ROOT / "README.md" in GUIDES and len(GUIDES) >= 10


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_answer_names_todays_schema_version(guide: Path):
    stale = [(guide.read_text(encoding="utf-8")[:m.start()].count("\n") + 1, m.group(1))
             for m in EXAMPLE.finditer(guide.read_text(encoding="utf-8")) if m.group(1) != SCHEMA_VERSION]
    assert not stale, f"{guide.relative_to(ROOT)}: example answers name schema_version {stale} (line, version), " \
                      f"the service answers {SCHEMA_VERSION}"
