"""Each worker's steady and peak memory at the largest requests the limits allow.

    scripts/measure-memory [--workers 2] [--duration 40] [--clients 3] [--env K=V ...] [--json out.json]
    python -m tools.measure_memory ...    # the same, from the repository root

Starts gunicorn with the committed gunicorn.conf.py on a free 127.0.0.1 port
and, for --duration seconds, keeps --clients connections busy with the most
memory-hungry requests the default limits allow, in a seeded random order and
with a new seed each time (so the weight and response caches fill and churn):

  - the /trace with the most numbers (2.5 M numbers, ~40 MB of JSON);
  - 256 tokens at d_model 512 with the weights returned (~47 MB);
  - the largest n² stages (256 tokens, d_model 512, 4 heads, causal);
  - a /trace/batch at the work budget (3 weight sets at d_model 512);
  - a /check of a whole submission at d_model 512 (an ~8 MB body);
  - a mid-size trace with Accept-Encoding: br (compressed);
  - a client that asks for the largest trace and reads it slowly (held output);
  - the largest /trace/html page the budget allows (128 tokens, d_model 512,
    8 heads: ~19.6 MB of page).

Every 100 ms it reads VmRSS of the master and of every worker from /proc, and
at the end each worker's VmHWM (its peak). It reports, per worker: idle RSS
after boot, steady RSS (median over the second half of the load, and after
the load once the caches are full), peak RSS, and the largest sum over all
processes at one instant (what a memory cgroup must hold). The figures size
deploy/k8s.yaml, deploy/compose.yaml and docs/deploy.md. Only 127.0.0.1.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

from tools import measure_limits
from tools.server import Gunicorn, shown


def status_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB (measure_limits.vm); nothing for a process that is gone."""
    try:
        return measure_limits.vm(pid)
    except OSError:
        return {}


def check_body(seed: int) -> bytes:
    """A whole (wrong) submission at d_model 512, 64 tokens: the largest /check body class."""
    from service import create_app

    toks = [f"t{i}" for i in range(64)]
    client = create_app().test_client()
    doc = client.post("/trace", json={"tokens": toks, "d_model": 512, "num_heads": 8, "seed": seed}).get_json()
    sub = {sid: st["values"] for sid, st in doc["stages"].items()}
    sub["weights"] = [[[0.0] * len(row) for row in head] for head in sub["weights"]]  # wrong: bugs are tried
    return json.dumps({"tokens": toks, "d_model": 512, "num_heads": 8, "seed": seed, "submission": sub},
                      separators=(",", ":")).encode()


def requests_mix(rng: random.Random, check: bytes):
    largest = measure_limits.largest_trace()
    toks = [f"t{i}" for i in range(256)]

    def pick() -> tuple[str, str, bytes, dict, bool]:
        seed = rng.randrange(2**31 - 8)
        kind = rng.choice(["most-numbers", "d512-parameters", "n2", "batch", "check", "br", "slow-read", "html"])
        h: dict[str, str] = {}
        if kind in ("most-numbers", "slow-read"):
            body = {**largest, "seed": seed}
        elif kind == "d512-parameters":
            body = {"tokens": toks, "d_model": 512, "num_heads": 1, "causal": True, "include_parameters": True,
                    "seed": seed}
        elif kind == "n2":
            body = {"tokens": toks, "d_model": 512, "num_heads": 4, "causal": True, "seed": seed}
        elif kind == "batch":
            body = {"items": [{"tokens": ["a", "b"], "d_model": 512, "num_heads": 8, "seed": seed + i}
                              for i in range(3)]}
            return kind, "/trace/batch", json.dumps(body).encode(), h, False
        elif kind == "check":
            return kind, "/check", check, h, False
        elif kind == "html":  # the largest page within the budget (service/budget.py page_cost): 19.6 MB
            body = {"tokens": toks[:128], "d_model": 512, "num_heads": 8, "seed": seed}
            return kind, "/trace/html", json.dumps(body).encode(), h, False
        else:
            body = {"tokens": toks[:64], "d_model": 256, "num_heads": 4, "seed": seed}
            h = {"Accept-Encoding": "br"}
        return kind, "/trace", json.dumps(body).encode(), h, kind == "slow-read"

    return pick


def client(port: int, pick, deadline: float, stats: dict, lock: threading.Lock) -> None:
    while time.monotonic() < deadline:
        kind, path, body, headers, slow = pick()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json",
                                                           "Connection": "close", **headers})
            resp = conn.getresponse()
            if slow:  # read 1 MiB a second for a few seconds (256 KiB every 0.25 s), then the rest
                for _ in range(16):
                    resp.read(1 << 18)
                    time.sleep(0.25)
            resp.read()
            status: int | str = resp.status
            conn.close()
        except (OSError, http.client.HTTPException) as e:
            status = type(e).__name__
        with lock:
            stats.setdefault(kind, {}).setdefault(str(status), 0)
            stats[kind][str(status)] += 1


def drive(port: int, duration: float, clients: int, seed: int, check: bytes) -> dict:
    """Keep `clients` connections busy with the mix for `duration` seconds; the answers' statuses by kind."""
    deadline = time.monotonic() + duration
    stats: dict = {}
    lock = threading.Lock()
    rngs = [random.Random(seed * 100 + i) for i in range(clients)]
    threads = [threading.Thread(target=client, args=(port, requests_mix(r, check), deadline, stats, lock),
                                daemon=True) for r in rngs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration + 150)
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    env = dict(kv.split("=", 1) for kv in args.env)
    check = check_body(7)
    server = Gunicorn(workers=args.workers, env=env, log_name="measure-memory")
    samples: list[tuple[float, dict[int, int], int]] = []
    hwm: dict[int, int] = {}
    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            pids = server.worker_pids()
            rss = {p: status_kib(p).get("VmRSS", 0) for p in pids}
            for p in pids:
                hwm[p] = max(hwm.get(p, 0), status_kib(p).get("VmHWM", 0))
            samples.append((time.monotonic(), rss, status_kib(server.proc.pid).get("VmRSS", 0)))
            stop.wait(0.1)

    try:
        time.sleep(1.0)
        idle = {p: status_kib(p)["VmRSS"] for p in server.worker_pids()}
        master_idle = status_kib(server.proc.pid)["VmRSS"]
        st = threading.Thread(target=sampler, daemon=True)
        st.start()
        t0 = time.monotonic()
        stats = drive(server.port, args.duration, args.clients, args.seed, check)
        t_load_end = time.monotonic()
        time.sleep(3.0)  # settle: no request in flight
        stop.set()
        st.join(5)
        settled = {p: status_kib(p).get("VmRSS", 0) for p in server.worker_pids()}
        restarts = server.log_text().count("Autorestarting")
    finally:
        stop.set()
        server.stop()

    mib = lambda kib: round(kib / 1024, 1)  # noqa: E731 (a one-line unit conversion)
    second_half = [rss for t, rss, _ in samples if t0 + args.duration / 2 <= t <= t_load_end]
    per_sample_worker = [v for rss in second_half for v in rss.values()]
    totals = [sum(rss.values()) + m for _, rss, m in samples]
    report = {
        "command": {"workers": args.workers, "duration_s": args.duration, "clients": args.clients, "env": env},
        "requests": stats,
        "master_idle_mib": mib(master_idle),
        "worker_idle_mib": sorted(mib(v) for v in idle.values()),
        "worker_steady_under_load_median_mib": mib(statistics.median(per_sample_worker)) if per_sample_worker else None,
        "worker_settled_after_load_mib": sorted(mib(v) for v in settled.values()),
        "worker_peak_mib": sorted(mib(v) for v in hwm.values()),
        "worker_peak_max_mib": mib(max(hwm.values())),
        "all_processes_max_sum_mib": mib(max(totals)),
        "worker_restarts": restarts,
        "log": shown(server.log),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
