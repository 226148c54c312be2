"""bench/guard.py's verdict (the timing itself runs in CI as `make bench-guard`, not here)."""

from __future__ import annotations

import json

from bench.guard import BASELINE, HTTP_RATIOS, RATIOS, judge


def test_the_baseline_holds_every_ratio_for_both_load_generators():
    doc = json.loads(BASELINE.read_text(encoding="utf-8"))
    assert set(doc["in_process"]) == set(RATIOS) - set(HTTP_RATIOS)
    for generator in ("wrk", "python"):
        assert set(doc["http"][generator]) == set(HTTP_RATIOS)
    assert all(v > 0 for v in doc["in_process"].values())


def test_it_fails_only_beyond_the_factor_in_the_worse_direction():
    base = {"trace_S_vs_floor": 0.6, "L_render_vs_encode": 1.3}
    ok = judge({"trace_S_vs_floor": 0.31, "L_render_vs_encode": 2.59}, base, 2.0)
    assert all(r["ok"] for r in ok)
    bad = judge({"trace_S_vs_floor": 0.29, "L_render_vs_encode": 2.61}, base, 2.0)
    assert [r["ok"] for r in bad] == [False, False]
    better = judge({"trace_S_vs_floor": 5.0, "L_render_vs_encode": 0.1}, base, 2.0)  # faster never fails
    assert all(r["ok"] for r in better)
    assert judge({"check_vs_trace_S": 0.01}, {}, 2.0)[0]["ok"]  # no baseline yet: recorded, not judged
