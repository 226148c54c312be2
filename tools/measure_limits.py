"""Measure what the default limits allow: wall time, the worker's peak RSS and
the response size of the largest requests, each on a fresh gunicorn worker.

    scripts/measure-limits [--json out.json] [--only NAME ...] [--hostile]
    python -m tools.measure_limits ...    # the same, from the repository root

For each scenario: start gunicorn (committed config, one worker, the default
limits, GUNICORN_TIMEOUT=300 so that nothing is cut short) on 127.0.0.1, warm
it up with GET /health, read the worker's VmHWM (peak resident set) from
/proc/<pid>/status, send the request, and read VmHWM again. The worker is
fresh, so its VmHWM after the request is the peak that request caused (on top
of the idle worker's, which is reported as the baseline).

The scenarios: the /trace request with the most numbers the limits allow
(found by search over d_model, num_heads, causal and include_parameters at the
token limit), the one with the largest n² stages, one at the largest d_model
with parameters, and the largest /trace/batch if the API has one. With
--hostile, also requests that the limits should make cheap but may not (they
are what docs/reliability.md reports as defects when they are expensive).
Only 127.0.0.1; everything started is stopped by PID.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import sys
import time
from pathlib import Path

from tools.server import ROOT, Gunicorn


def vm(pid: int) -> dict[str, int]:
    """VmHWM and VmRSS of a process, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0])
    return out


def largest_trace() -> dict:
    """The /trace request with the most numbers under the default limits (a new dict each call)."""
    return {**_largest_trace(), "tokens": list(_largest_trace()["tokens"])}


@functools.cache
def _largest_trace() -> dict:
    """largest_trace, searched once a process (the search takes seconds; the attacks ask from many threads)."""
    from engine.checks import divisors
    from engine.layer import TraceConfig, trace_value_count
    from service.settings import Settings

    s = Settings()
    best: tuple[int, int, int, bool, bool] | None = None
    for d in range(1, s.max_d_model + 1):
        for h in divisors(d):
            if h > s.max_heads:
                continue
            for causal in (False, True):
                for params in (False, True):
                    config = TraceConfig(d_model=d, num_heads=h, causal=causal)
                    c = trace_value_count(config, s.max_tokens, with_parameters=params)
                    if c <= s.max_trace_values and (best is None or c > best[0]):
                        best = (c, d, h, causal, params)
    assert best is not None  # d_model 1 with 1 head fits any limit
    _, d, h, causal, params = best
    return {"tokens": [f"t{i}" for i in range(s.max_tokens)], "d_model": d, "num_heads": h, "causal": causal,
            "include_parameters": params, "seed": 1}


def scenarios(hostile: bool) -> list[tuple[str, str, bytes, str]]:
    """(name, path, body, what it shows)."""
    from service.settings import Settings

    s = Settings()
    toks = [f"t{i}" for i in range(s.max_tokens)]
    out = [
        ("trace-most-numbers", "/trace", json.dumps(largest_trace()).encode(),
         "the /trace request with the most numbers the default limits allow"),
        ("trace-largest-n2", "/trace", json.dumps({"tokens": toks, "d_model": 512, "num_heads": 4, "causal": True,
                                                   "seed": 2}).encode(),
         "256 tokens, d_model 512, 4 heads, causal: the largest [head, query, key] stages"),
        ("trace-d512-parameters", "/trace", json.dumps({"tokens": toks, "d_model": 512, "num_heads": 1,
                                                        "causal": True, "include_parameters": True,
                                                        "seed": 3}).encode(),
         "256 tokens at d_model 512 with the 4·512² weights returned"),
        ("sentence-256-words", "/trace", json.dumps({"sentence": " ".join(["w"] * 256)[: s.max_sentence_chars],
                                                         "d_model": 512, "num_heads": 4}).encode(),
         "a 256-word sentence at d_model 512, 4 heads"),
    ]
    spec = (ROOT / "openapi.yaml").read_text(encoding="utf-8")
    if "/trace/batch:" in spec:
        n_items = getattr(s, "max_batch_items", 32)
        items = [{"tokens": ["a"], "d_model": 512, "num_heads": 8, "seed": 100 + i} for i in range(n_items)]
        out.append(("trace-batch-distinct-weights", "/trace/batch", json.dumps({"items": items}).encode(),
                    f"{n_items} one-token items at d_model 512, each with its own seed: "
                    f"{n_items} weight sets of 4·512² generated"))
    if hostile:
        out += [
            ("hostile-300k-unknown-fields", "/trace",
             b"{" + b",".join(b'"k%d":0' % i for i in range(300_000)) + b"}",
             "a 3.5 MB body of unknown fields: one 422 error entry each"),
            ("hostile-1.5M-invalid-stages", "/trace",
             b'{"sentence":"a","stages":[' + b",".join([b"1"] * 1_500_000) + b"]}",
             "a 3 MB body: 1.5 M invalid stage ids, one 422 error entry each"),
        ]
    return out


def measure(name: str, path: str, body: bytes, content_type: str = "application/json") -> dict:
    """One request on a fresh one-worker gunicorn: its status, sizes, wall time and the worker's peak RSS."""
    server = Gunicorn(workers=1, env={"GUNICORN_TIMEOUT": "300"}, log_name="measure-limits")
    try:
        (pid,) = server.worker_pids()
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
        conn.request("GET", "/health")
        conn.getresponse().read()
        conn.close()
        before = vm(pid)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
        start = time.monotonic()
        conn.request("POST", path, body=body, headers={"Content-Type": content_type, "Connection": "close"})
        resp = conn.getresponse()
        first_byte = time.monotonic() - start
        data = resp.read()
        wall = time.monotonic() - start
        conn.close()
        after = vm(pid)
        return {
            "name": name, "path": path, "status": resp.status, "request_bytes": len(body),
            "response_bytes": len(data), "wall_s": round(wall, 3), "first_byte_s": round(first_byte, 3),
            "worker_idle_rss_mib": round(before["VmRSS"] / 1024, 1),
            "worker_peak_rss_mib": round(after["VmHWM"] / 1024, 1),
            "request_peak_over_idle_mib": round((after["VmHWM"] - before["VmRSS"]) / 1024, 1),
        }
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    ap.add_argument("--only", nargs="*", help="run only these scenarios")
    ap.add_argument("--hostile", action="store_true", help="also measure the hostile (error-amplification) bodies")
    args = ap.parse_args(argv)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one BLAS thread, as each worker runs (gunicorn.conf.py)
    from service.settings import Settings

    limits = Settings().limits()
    print("default limits: " + ", ".join(f"{k}={v}" for k, v in limits.items() if k != "cors_origins"))
    results = []
    for name, path, body, what in scenarios(args.hostile):
        if args.only and name not in args.only:
            continue
        r = measure(name, path, body)
        r["what"] = what
        if path == "/trace" and r["status"] == 200:
            r["config"] = {k: v for k, v in json.loads(body).items() if k != "tokens"}
        results.append(r)
        print(f"{name:32s} {r['status']}  {r['wall_s']:7.3f} s  response {r['response_bytes'] / 2**20:7.1f} MiB  "
              f"worker peak RSS {r['worker_peak_rss_mib']:7.1f} MiB (idle {r['worker_idle_rss_mib']} MiB, "
              f"+{r['request_peak_over_idle_mib']} MiB)  [{what}]")
    if args.json:
        args.json.write_text(json.dumps({"limits": limits, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
