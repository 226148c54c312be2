"""bench/'s server section: section choice, verdicts and the floors' apps (the timing runs in `make bench`,
never here)."""

from __future__ import annotations

import pytest

from bench import server_bench
from bench.run import SECTIONS, skipped_sections


def test_server_runs_that_section_alone():
    assert skipped_sections("", "", server=True) == set(SECTIONS) - {"server"}
    assert skipped_sections("", "server,engine") == set(SECTIONS) - {"server", "engine"}
    assert skipped_sections("server") == {"server"}
    assert skipped_sections("") == set()
    with pytest.raises(ValueError, match="unknown section"):
        skipped_sections("", "sevrer")


def test_each_target_is_met_at_its_limit_and_not_beyond_in_the_worse_direction():
    for key, (_, limit, higher) in server_bench.TARGETS.items():
        assert server_bench.verdict(key, limit) == "met"
        assert server_bench.verdict(key, limit * (0.99 if higher else 1.01)) == "not met"
        assert server_bench.verdict(key, limit * (10 if higher else 0.1)) == "met"
    assert server_bench.verdict("L_npz_vs_json", None) == "not measured"
    assert server_bench.verdict("S_uncached_vs_plain_floor", 0.4) == "met"
    assert server_bench.verdict("nginx_vs_direct", 0.79) == "not met"


def test_the_marginal_time_a_byte_is_the_slope_whatever_the_fixed_cost():
    """Time = 400 µs + 1 ns a byte: the per-byte spread is the fixed cost's doing, and each added byte costs
    1 ns from every size to the next (1,000 µs/MB)."""
    sizes = {"n32": 600_000, "n64": 1_700_000, "n128": 5_400_000, "n256": 18_700_000}
    per_byte = {n: (400e-6 + 1e-9 * sizes[f"n{n}"]) / sizes[f"n{n}"] for n in (32, 64, 128, 256)}
    assert max(per_byte.values()) / min(per_byte.values()) > 1.5
    assert server_bench._marginal(per_byte, sizes) == "32→64: 1.00 ms/MB, 64→128: 1.00 ms/MB, 128→256: 1.00 ms/MB"
    assert server_bench._spread(per_byte, 4) == max(per_byte.values()) / min(per_byte.values())
    assert server_bench._spread(per_byte, 5) is None  # a size not measured: no spread
    assert server_bench._spread({}, 0) is None


def test_the_traces_own_floor_answers_the_service_bytes():
    """bench/compute_floor_app.py: /trace's bytes for a body, X-Request-ID echoed (the access log names a
    request by it)."""
    from bench import compute_floor_app as bare
    from bench.service_path import render

    body = b'{"sentence": "the cat sat", "d_model": 24, "num_heads": 4}'
    client = bare.app.test_client()
    r = client.post("/trace", data=body, content_type="application/json", headers={"X-Request-ID": "pb-n32"})
    assert r.status_code == 200 and r.data == render(body, bare._settings)
    assert r.headers["X-Request-ID"] == "pb-n32"
    assert "X-Request-ID" not in client.post("/trace", data=body, content_type="application/json").headers
