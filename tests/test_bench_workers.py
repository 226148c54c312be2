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
    assert worker_bench._spread(per_byte, 4) == max(per_byte.values()) / min(per_byte.values())
    assert worker_bench._spread(per_byte, 5) is None  # a size not measured: no spread
    assert worker_bench._spread({}, 0) is None


def test_the_traces_own_floor_answers_the_service_bytes_and_speaks_the_workers_protocol(monkeypatch):
    """bench/compute_floor_app.py: /trace's bytes for a body; X-Request-ID echoed (the access log names a
    request by it); the service's own cost estimate for a /trace body, and none for anything else; and a
    request the worker validated is taken as it is, never validated again."""
    from bench import compute_floor_app as bare
    from bench.service_path import render
    from service.edge import VALIDATED
    from service.routes.trace import TraceRequest
    from service.routes.trace import request_cost as service_cost

    body = b'{"sentence": "the cat sat", "d_model": 24, "num_heads": 4}'
    client = bare.app.test_client()
    r = client.post("/trace", data=body, content_type="application/json", headers={"X-Request-ID": "pb-n32"})
    assert r.status_code == 200 and r.data == render(body, bare._settings)
    assert r.headers["X-Request-ID"] == "pb-n32"
    assert "X-Request-ID" not in client.post("/trace", data=body, content_type="application/json").headers

    seconds, extra = bare.app.request_cost("POST", "/trace", body)
    assert seconds == service_cost(body, bare._settings)[0] > 0
    assert bare.app.request_cost("GET", "/trace", body) is None
    assert bare.app.request_cost("POST", "/health", body) is None
    assert bare.app.request_cost("POST", "/trace", b"{") is None

    other = b'{"sentence": "the dog sat", "d_model": 24, "num_heads": 4}'
    want, want_other = render(body, bare._settings), render(other, bare._settings)
    calls = []
    real = TraceRequest.model_validate_json
    monkeypatch.setattr(TraceRequest, "model_validate_json",
                        classmethod(lambda cls, *a, **k: calls.append(a) or real(*a, **k)))
    r = client.post("/trace", data=body, content_type="application/json", environ_overrides=extra)
    assert r.status_code == 200 and r.data == want
    assert calls == []  # the carried request, not validated again
    r = client.post("/trace", data=other, content_type="application/json",
                    environ_overrides={VALIDATED: extra[VALIDATED]})
    assert r.data == want_other and len(calls) == 1  # another body: validated, never mixed up
