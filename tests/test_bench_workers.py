"""bench/'s worker comparison: section choice and verdicts (the timing runs in `make bench`, never here)."""

from __future__ import annotations

import importlib.util

import pytest

from bench import worker_bench
from bench.run import SECTIONS, skipped_sections


def test_workers_runs_that_section_alone():
    assert skipped_sections("", "", workers=True) == set(SECTIONS) - {"workers"}
    assert skipped_sections("", "workers,http") == set(SECTIONS) - {"workers", "http"}
    assert skipped_sections("workers") == {"workers"}
    assert skipped_sections("") == set()
    with pytest.raises(ValueError, match="unknown section"):
        skipped_sections("", "wrokers")


def test_each_target_is_met_at_its_limit_and_not_beyond_in_the_worse_direction():
    assert worker_bench.verdict("S_uncached_vs_plain_floor", 0.5) == "met"
    assert worker_bench.verdict("S_uncached_vs_plain_floor", 0.49) == "not met"
    for key, limit in (("L_server_vs_encode", 1.3), ("per_byte_spread", 1.5), ("L_npz_vs_json", 0.5)):
        assert worker_bench.verdict(key, limit) == "met"
        assert worker_bench.verdict(key, limit * 1.01) == "not met"
        assert worker_bench.verdict(key, limit / 10) == "met"
    assert worker_bench.verdict("L_npz_vs_json", None) == "not measured"


def test_the_stock_classes_are_chosen_on_the_command_line_and_gevent_is_skipped_with_a_note(monkeypatch):
    classes, notes = worker_bench.worker_classes()
    assert classes[0].key == "project" and classes[0].args == ()  # the committed config as it is
    assert {c.key: c.args for c in classes[1:3]} == {"sync": ("-k", "sync"),
                                                     "gthread": ("-k", "gthread", "--threads", "4")}
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gevent" else real(name, *a))
    classes, notes = worker_bench.worker_classes()
    assert [c.key for c in classes] == ["project", "sync", "gthread"]
    assert any("gevent" in n and "skipped" in n for n in notes)


def test_the_marginal_time_a_byte_is_the_slope_whatever_the_fixed_cost():
    """Time = 400 µs + 1 ns a byte: the per-byte spread is the fixed cost's doing, and each added byte costs
    1 ns from every size to the next (1,000 µs/MB)."""
    sizes = {"n32": 600_000, "n64": 1_700_000, "n128": 5_400_000, "n256": 18_700_000}
    per_byte = {n: (400e-6 + 1e-9 * sizes[f"n{n}"]) / sizes[f"n{n}"] for n in (32, 64, 128, 256)}
    assert max(per_byte.values()) / min(per_byte.values()) > 1.5
    assert worker_bench._marginal(per_byte, sizes) == \
        "32→64: 1.00 ms/MB, 64→128: 1.00 ms/MB, 128→256: 1.00 ms/MB"
