"""A long-lived worker's memory over many requests of a mixed load, with recycling off.

    scripts/soak-memory [--requests 40000] [--every 1000] [--largest-share 0.01] [--workers 1]
                        [--clients 2] [--seed 13] [--env K=V ...] [--json out.json]
    python -m tools.soak_memory ...    # the same, from the repository root

Starts gunicorn with the committed gunicorn.conf.py on a free 127.0.0.1 port,
its workers never replaced (GUNICORN_MAX_REQUESTS=0, unless --env sets it),
and lets --clients kept-alive connections (tools/loadtest.py's client) send
--requests requests of a seeded mix, one at a time each:

  - tools/loadtest.py's mix: small traces, /health, /version and 4xx errors
    (malformed JSON, unknown fields, wrong media type, unknown paths);
  - S with a new word in every request ("the cat sat<N>": the embedding and
    answer caches fill and churn), M (16 tokens, d_model 64, 4 heads, one of
    8 weight seeds) as JSON, gzip, br and npz, L (128 tokens, d_model 512,
    8 heads) as JSON, gzip and npz;
  - /check of S and M with the weights 1 % off (the diagnosis runs), a
    /check/batch, /trace/html of S and M, /trace/batch of three small items;
  - and, --largest-share of the requests, tools/measure_memory.py's largest
    requests the limits allow (the most numbers, d_model 512 with its weights,
    the largest n² stages, a batch at the budget, an 8 MB /check, br, the
    largest page), each with a new seed; its slow reader is read at once here.

Every --every answered requests it reads each worker's VmRSS (/proc/PID/status)
and PSS (/proc/PID/smaps_rollup), and what was in flight at that moment; at
the end each worker's VmHWM (its peak) and its RSS once the load has stopped.
A request that is not answered, a 5xx, an invalid request answered 2xx or a
valid one answered 4xx, or a worker replaced meanwhile is a problem (exit 1).
The figures back docs/deploy.md's "Worker recycling". Only 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tools import measure_memory
from tools.loadtest import JSON, MIX, KeptAlive, Req
from tools.measure_memory import status_kib
from tools.server import Gunicorn, shown

NPZ = "application/x-npz"
#: the columns of docs/deploy.md's table (the readings the run has of them)
DOC_COLUMNS = (1_000, 2_000, 5_000, 8_000, 10_000, 20_000, 30_000, 40_000)


@dataclass(frozen=True)
class SoakReq(Req):
    """A request of the mix with headers of its own (Accept, Accept-Encoding)."""

    headers: tuple[tuple[str, str], ...] = ()


class Connection(KeptAlive):
    """tools/loadtest.py's kept-alive connection, sending each request's own headers too."""

    @staticmethod
    def request_bytes(r: Req, request_id: str) -> bytes:
        extra = "".join(f"{name}: {value}\r\n" for name, value in getattr(r, "headers", ()))
        return KeptAlive.request_bytes(r, request_id).replace(b"\r\n", b"\r\n" + extra.encode(), 1)  # after the request line


def pss_kib(pid: int) -> int | None:
    """The process's proportional set size (its shared pages split among their sharers), or None if unreadable."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _json(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def wrong_check(request: dict) -> bytes:
    """A /check body of every stage of `request` with the weights 1 % off (tools/measure_check.py builds it)."""
    from attention_trace.client import encode_json
    from tools.measure_check import largest_submission

    return encode_json(largest_submission(request=request, wrong="weights"))


def soak_mix(rng: random.Random, largest_share: float, check: bytes) -> Callable[[int], SoakReq]:
    """A seeded picker of the next request (`seq` numbers S's new word); `check` is measure_memory's largest
    /check body (tools/measure_memory.py check_body)."""
    s = {"sentence": "the cat sat", "d_model": 24, "num_heads": 4}
    m = {"tokens": [f"m{i}" for i in range(16)], "d_model": 64, "num_heads": 4}
    large = {"tokens": [f"l{i}" for i in range(128)], "d_model": 512, "num_heads": 8}
    checks = {"check-s": wrong_check(s), "check-m": wrong_check(m)}
    check_batch = b'{"items":[' + checks["check-s"] + b"," + checks["check-m"] + b"]}"
    batch = _json({"items": [{**s, "seed": i} for i in range(3)]})
    largest = measure_memory.requests_mix(rng, check)

    def post(name: str, path: str, body: bytes, weight: int, *headers: tuple[str, str]) -> SoakReq:
        return SoakReq(name, "POST", path, body, JSON, True, weight, headers)

    def traced(name: str, body: dict, weight: int, *headers: tuple[str, str],
               path: str = "/trace") -> Callable[[int], SoakReq]:
        """`body` with one of 8 weight seeds: the weight cache (4 sets) fills and churns."""
        return lambda seq: post(name, path, _json({**body, "seed": rng.randrange(8)}), weight, *headers)

    own: list[tuple[int, Callable[[int], SoakReq]]] = [
        (r.weight, lambda seq, r=r: r) for r in MIX  # loadtest's: small traces, /health, /version, the 4xx
    ] + [(w, f) for w, f in [
        (12, lambda seq: post("s-new-word", "/trace", _json({**s, "sentence": f"the cat sat{seq}"}), 12)),
        (10, traced("m", m, 10)),
        (5, traced("m-gzip", m, 5, ("Accept-Encoding", "gzip"))),
        (3, traced("m-br", m, 3, ("Accept-Encoding", "br"))),
        (4, traced("m-npz", m, 4, ("Accept", NPZ))),
        (2, traced("l", large, 2)),
        (1, traced("l-gzip", large, 1, ("Accept-Encoding", "gzip"))),
        (1, traced("l-npz", large, 1, ("Accept", NPZ))),
        (6, lambda seq: post("check-s", "/check", checks["check-s"], 6)),
        (3, lambda seq: post("check-m", "/check", checks["check-m"], 3)),
        (1, lambda seq: post("check-batch", "/check/batch", check_batch, 1)),
        (3, traced("html-s", s, 3, path="/trace/html")),
        (2, traced("html-m", m, 2, path="/trace/html")),
        (4, lambda seq: post("batch", "/trace/batch", batch, 4)),
    ]]
    weights = [w for w, _ in own]

    def pick(seq: int) -> SoakReq:
        if rng.random() < largest_share:
            kind, path, body, headers, _slow = largest()  # read at once: a kept-alive client reads each answer whole
            return post(f"largest-{kind}", path, body, 0, *headers.items())
        return rng.choices(own, weights)[0][1](seq)

    return pick


def reading(server: Gunicorn, done: int, in_flight: dict[int, str]) -> dict:
    """Each worker's RSS and PSS now, with what the clients have in flight."""
    mib = lambda kib: None if kib is None else round(kib / 1024, 1)  # noqa: E731 (a one-line unit conversion)
    workers = {}
    for pid in server.worker_pids():
        workers[str(pid)] = {"rss_mib": mib(status_kib(pid).get("VmRSS")), "pss_mib": mib(pss_kib(pid))}
    return {"requests": done, "workers": workers, "in_flight": sorted(in_flight.values())}


def line(r: dict) -> str:
    """A reading as the run prints it: requests answered, each worker's RSS / PSS, what was in flight."""
    done = r["requests"] if isinstance(r["requests"], str) else f"{r['requests']:,}"
    return (f"  {done:>8}   " + "   ".join(f"{pid}: {w['rss_mib']} / {w['pss_mib']}" for pid, w in r["workers"].items())
            + (f"   in flight: {', '.join(r['in_flight'])}" if r["in_flight"] else ""))


def drive(server: Gunicorn, requests: int, every: int, clients: int, seed: int, largest_share: float,
          timeout: float) -> tuple[dict, list[dict], list[str]]:
    """Send `requests` requests from `clients` kept-alive connections; the statuses by request, the readings
    taken every `every` answers, and the problems."""
    lock = threading.Lock()
    stats: dict[str, dict[str, int]] = {}
    readings: list[dict] = []
    problems: list[str] = []
    in_flight: dict[int, str] = {}
    counter = {"sent": 0, "done": 0, "unexpected": 0}
    check = measure_memory.check_body(7) if largest_share else b""  # ~1 s of this process's CPU: only if sent
    picks = [soak_mix(random.Random(seed * 100 + i), largest_share, check) for i in range(clients)]

    def client(i: int) -> None:
        conn = Connection(server.port, timeout)
        try:
            while True:
                with lock:
                    if counter["sent"] >= requests:
                        return
                    counter["sent"] += 1
                    seq = counter["sent"]
                r = picks[i](seq)
                with lock:
                    in_flight[i] = r.name
                (answer,) = conn.exchange([(r, f"soak-{seed}-{seq}")])
                with lock:
                    del in_flight[i]
                    status = type(answer).__name__ if isinstance(answer, Exception) else answer[0]
                    by = stats.setdefault(r.name, {})
                    by[str(status)] = by.get(str(status), 0) + 1
                    if isinstance(status, str) or status >= 500 or (status < 400) != r.valid:
                        counter["unexpected"] += 1
                        if len(problems) < 20:  # the first few; the count says how many in all
                            problems.append(f"{r.name} ({'valid' if r.valid else 'invalid'}) answered {status}")
                    counter["done"] += 1
                    if counter["done"] % every == 0:
                        readings.append(reading(server, counter["done"], in_flight))
                        print(line(readings[-1]), flush=True)  # as it goes: a full run takes minutes
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # each request is bounded by the client's timeout
    if counter["unexpected"] > len(problems):
        problems.append(f"{counter['unexpected']} unexpected answers in all")
    return stats, readings, problems


def table(readings: list[dict], workers: list[str]) -> list[str]:
    """docs/deploy.md's table: RSS (and PSS) by requests answered, at its columns when the run has them."""
    done = [r["requests"] for r in readings]
    columns = [r for r in readings if r["requests"] in DOC_COLUMNS or r["requests"] == done[-1]] \
        if len(readings) > 10 else readings
    rows = [["requests", *(f"{r['requests']:,}" for r in columns)]]
    for k, pid in enumerate(workers):
        who = "" if len(workers) == 1 else f"worker {k + 1} "
        for key, label in (("rss_mib", "RSS"), ("pss_mib", "PSS")):
            rows.append([f"{who}{label} (MiB)", *(f"{(r['workers'].get(pid) or {}).get(key) or 0:.0f}"
                                                  for r in columns)])
    out = ["| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])]
    return out + ["| " + " | ".join(row) + " |" for row in rows[1:]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=40_000, help="requests in all (default 40000)")
    ap.add_argument("--every", type=int, default=1_000, help="read the workers' memory every this many answers "
                    "(default 1000)")
    ap.add_argument("--largest-share", type=float, default=0.01,
                    help="the share of tools/measure_memory.py's largest requests (default 0.01)")
    ap.add_argument("--workers", type=int, default=1, help="gunicorn workers (default 1)")
    ap.add_argument("--clients", type=int, default=2, help="kept-alive clients (default 2)")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request client timeout in seconds")
    ap.add_argument("--seed", type=int, default=13, help="seed of the request mix (default 13)")
    ap.add_argument("--env", action="append", default=[], help="K=V for the server (repeatable)")
    ap.add_argument("--json", type=Path, help="also write the report as JSON here")
    args = ap.parse_args(argv)
    if not (1 <= args.every <= args.requests and 0 <= args.largest_share <= 1 and 1 <= args.workers <= 16
            and 1 <= args.clients <= 64):
        ap.error("--every must be in [1, --requests], --largest-share in [0, 1], --workers in [1, 16], "
                 "--clients in [1, 64]")
    env = {"GUNICORN_MAX_REQUESTS": "0", **dict(kv.split("=", 1) for kv in args.env)}
    server = Gunicorn(workers=args.workers, env=env, log_name="soak-memory")
    try:
        time.sleep(1.0)  # the workers' imports are done once /health answers; let them settle
        workers = [str(p) for p in server.worker_pids()]
        idle = reading(server, 0, {})
        recycling = "off" if env["GUNICORN_MAX_REQUESTS"] == "0" else "every " + env["GUNICORN_MAX_REQUESTS"]
        print(f"soak: {args.requests:,} requests from {args.clients} kept-alive clients to {args.workers} "
              f"worker(s), recycling {recycling}, {args.largest_share:.0%} the largest requests")
        print("  requests   each worker's RSS / PSS (MiB), by its PID; what the clients had in flight")
        print(line({**idle, "requests": "idle"}), flush=True)
        start = time.monotonic()
        stats, readings, problems = drive(server, args.requests, args.every, args.clients, args.seed,
                                          args.largest_share, args.timeout)
        elapsed = time.monotonic() - start
        time.sleep(2.0)  # no request in flight: what the workers keep
        settled = reading(server, args.requests, {})
        peak = {pid: round(status_kib(int(pid)).get("VmHWM", 0) / 1024, 1) for pid in workers}
        now = [str(p) for p in server.worker_pids()]
        restarts = server.log_text().count("Autorestarting")
    finally:
        server.stop()
    if now != workers or restarts:
        problems.append(f"workers replaced during the run: {workers} -> {now} ({restarts} autorestarts)")
    if not readings:
        problems.append("no reading taken")
    late = [r for r in readings if r["requests"] >= args.requests // 5]  # once the caches have filled
    rss = [w["rss_mib"] for r in late for w in r["workers"].values() if w["rss_mib"]]
    pss = [w["pss_mib"] for r in late for w in r["workers"].values() if w["pss_mib"]]
    report = {
        "command": {"requests": args.requests, "every": args.every, "largest_share": args.largest_share,
                    "workers": args.workers, "clients": args.clients, "seed": args.seed, "env": env},
        "elapsed_s": round(elapsed, 1),
        "requests": stats,
        "idle": idle["workers"],
        "readings": readings,
        "from_a_fifth_on": {"from_requests": args.requests // 5,
                            "rss_mib": [min(rss), max(rss)] if rss else None,
                            "pss_mib": [min(pss), max(pss)] if pss else None},
        "settled_after_load": settled["workers"],
        "worker_peak_mib": peak,
        "problems": problems,
        "passed": not problems,
        "log": shown(server.log),
    }
    print(f"\n{args.requests:,} requests in {elapsed:.0f} s\n")
    print("\n".join(table(readings, workers)) if readings else "(no reading)")
    print()
    f = report["from_a_fifth_on"]
    print(f"  from {f['from_requests']:,} requests on: RSS {f['rss_mib']} MiB, PSS {f['pss_mib']} MiB")
    print("  after the load: " + ", ".join(f"RSS {w['rss_mib']} PSS {w['pss_mib']}" for w in
                                          settled["workers"].values()) + " MiB")
    print("  peak (VmHWM): " + ", ".join(f"{v} MiB" for v in peak.values()))
    print("  answers: " + ", ".join(f"{name} {by}" for name, by in sorted(stats.items())))
    print(f"  gunicorn log: {report['log']}")
    print("PASS" if report["passed"] else "FAIL: " + "; ".join(problems))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
