"""Every request of scripts/answer-digests' corpus keeps a byte-identical answer.

The corpus, the digests and the golden file's format live in tests/answer_corpus.py
(scripts/answer-digests is its command line); tests/golden/answers/digests.json holds the digests
of the answers at the commit that wrote it. When an answer changes on purpose,
rewrite the file with ``.venv/bin/python scripts/answer-digests --write`` and
review the diff: each changed line is one request whose answer changed.
"""

from __future__ import annotations

import answer_corpus as ad

SHOWN = 25


def test_every_answer_matches_the_golden_digests() -> None:
    golden = ad.load(ad.GOLDEN)
    current = ad.compute()
    problems = ad.mismatches(golden, current)
    assert not problems, (
        f"{len(problems)} of {len(golden)} answers differ from {ad.GOLDEN.relative_to(ad.SCRIPT_ROOT)} "
        f"(id, request, then what changed; the first {min(SHOWN, len(problems))}):\n"
        + "\n".join(problems[:SHOWN])
        + "\nIf the change is intended, run: .venv/bin/python scripts/answer-digests --write"
    )


def test_the_golden_file_is_what_the_script_writes() -> None:
    """The golden file is in --write's format (sorted, one request a line), so a diff shows requests."""
    text = ad.GOLDEN.read_text(encoding="utf-8")
    assert ad.render(ad.load(ad.GOLDEN)) == text
