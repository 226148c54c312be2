"""Load and faults, the CI version of scripts/loadtest (tools/loadtest.py): real gunicorn, several
client threads for ~8 s, a mix of valid and invalid requests, and one worker
SIGKILLed by its PID halfway. The long run is `scripts/loadtest --duration 60
--kill-worker`; its figures are in docs/reliability.md."""

from __future__ import annotations


import pytest

from tools import loadtest

pytestmark = pytest.mark.integration


def test_load_with_a_worker_killed_midway():
    rep = loadtest.run(duration=8, threads=6, workers=2, kill_worker=True, kill_at=0.5, timeout=20, seed=5)
    loadtest.print_report(rep)  # shown by pytest on failure
    assert rep["requests_sent"] >= 200, rep["requests_sent"]
    assert rep["valid_sent"] and rep["invalid_sent"]
    assert rep["status_5xx"] == 0 and rep["log_5xx_lines"] == 0
    assert rep["timeouts"] == 0
    # Only the request in flight on the killed worker may fail (a sync worker holds one connection),
    # at most one per client thread.
    assert rep["unexplained_errors"] == 0, rep["error_kinds"]
    assert rep["connection_errors"] == rep["connection_errors_in_flight_at_kill"] <= 6
    # Same question, same answer: every response equals its in-process reference, byte for byte.
    assert rep["not_identical"] == 0
    assert rep["request_id_not_echoed"] == 0
    kill = rep["kill"]
    assert kill["killed_pid"] in kill["workers_before"]
    assert kill["replacement_pid"] is not None and kill["killed_pid"] not in kill["workers_after"]
    assert kill["replaced_after_s"] < 5
    assert rep["workers_at_end"] == 2
    assert rep["log_sigkill_seen"]
    assert rep["passed"], rep["problems"]
