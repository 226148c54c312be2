"""Measure /check at its body limit: time, peak memory and answer of the largest
legitimate submission and of hostile bodies as large as the limits allow.

    scripts/measure-check [--json out.json] [--only NAME ...] [--no-gunicorn]
    python -m tools.measure_check ...    # the same, from the repository root

Each scenario runs twice, each time in a fresh process, so that the peak is the
request's own:

* in-process: a new Python process builds the app (``create_app()``, the
  default limits), answers GET /health, reads its resident set (VmRSS),
  sends the body through the Flask test client and reads its VmHWM (peak
  resident set, /proc/self/status) against the idle VmRSS;
* over gunicorn (the committed config, one worker, the default limits):
  ``tools.measure_limits.measure`` (scripts/measure-limits), which reads the fresh worker's VmHWM
  before and after the request.

The scenarios: every stage of the largest configuration graders use (d_model
512, 64 tokens, 8 heads, causal), correct and with one wrong stage (so the
diagnosis tries every known bug and the hints run), in compact JSON (what the
client's encode_json writes) and with Python json's default ", " separators;
masked entries filled with -1e9 and every value float32-rounded; a
/check/batch holding one; every stage of the largest trace the limits allow
(d_model 512, 240 tokens, 8 heads: 47 MiB as JSON, so sent as an npz body,
what Client.check does), correct and with the weights 1 % off, and the same
float32; a stack's /check at the largest the budget allows
(service/budget.py: its trace, the comparison and the diagnosis's reruns
within the largest one-layer /check's cost), every stage as npz with the
weights 1 % off so that every known mistake is tried: GPT-2's proportions at
d_model 128, many small layers (d_model 8), the most steps (d_model 2 on one
token) and the widest exact-GELU layer; the deepest stacks the trace size
allows, refused before any work (422 check_too_costly, the time to the
refusal); then hostile bodies with as many JSON
values as max_check_json_values (and max_check_body_bytes) allow: empty lists,
zeros, distinct floats, one- and two-level rows, strings and objects in a
submitted stage, and one body just over the value limit.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import cast

from tools import measure_limits
from tools.server import ROOT

LARGEST = {"tokens": [f"w{i}" for i in range(64)], "d_model": 512, "num_heads": 8, "causal": True, "seed": 1}
#: every stage of this is the largest trace the default limits allow (2 492 160 numbers)
LARGEST_TRACE = {"tokens": [f"w{i}" for i in range(240)], "d_model": 512, "num_heads": 8, "seed": 1}
NPZ = "application/x-npz"


def _tokens(n: int) -> list[str]:
    return [f"w{i}" for i in range(n)]


#: the stacks whose /check costs most for their numbers (service/budget.py diagnosis_cost): GPT-2's proportions
#: at the widest d_model its stack fits at, many small layers (Python's overhead a step), the most steps (one
#: token, d_model 2) and the exact GELU (math.erf one element at a time, its width set by d_ff)
STACK_GPT2 = {"tokens": _tokens(64), "block": "gpt2", "d_model": 128, "num_heads": 2, "seed": 1}
STACK_DEEP = {"tokens": _tokens(16), "block": "gpt2", "d_model": 8, "num_heads": 2, "seed": 1}
STACK_STEPS = {"tokens": _tokens(1), "block": "gpt2", "d_model": 2, "num_heads": 2, "seed": 1}
STACK_ERF = {"tokens": _tokens(64), "ffn": "gelu", "norm_position": "pre", "d_model": 64, "num_heads": 1, "seed": 1}

_CHILD = r"""
import json, os, sys, time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
from service import create_app
path = sys.argv[1]
body = sys.stdin.buffer.read()
client = create_app().test_client()
client.get("/health")

def vm(key):  # this process's own figures (ru_maxrss would include the parent's before exec)
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])

idle = vm("VmRSS")
start, start_cpu = time.perf_counter(), time.process_time()
resp = client.post(path, data=body, content_type=sys.argv[2])
data = resp.get_data()
wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
doc = json.loads(data)
summary = doc.get("message") or doc.get("detail") or ""
if "results" in doc:
    summary = "; ".join(str(r["status"]) + (" passed" if r["result"] and r["result"]["passed"] else "")
                        for r in doc["results"])
print(json.dumps({"status": resp.status_code, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                  "response_bytes": len(data),
                  "idle_mib": round(idle / 1024, 1), "peak_mib": round(vm("VmHWM") / 1024, 1),
                  "summary": summary[:160]}))
"""


def largest_submission(*, filled: bool = False, float32: bool = False, wrong: str | None = None,
                       request: dict | None = None) -> dict:
    """A /check body with every stage of `request` (default LARGEST), computed by the service itself."""
    import numpy as np

    from attention_trace.client import LocalClient

    request = request or LARGEST
    t = LocalClient().trace(request)
    sub = {}
    for sid, st in t.stages.items():
        if sid == "tokens":
            sub[sid] = st.values
            continue
        a = st.array()
        if float32:
            a = a.astype(np.float32).astype(np.float64)
        if wrong == sid:
            a = a * 1.01
        if st.id == "masked_scores":
            mask = cast(np.ndarray, st.mask)  # causal: every trace here has one
            a = np.where(mask, -1e9, a) if filled else np.ma.masked_array(a, mask)
        sub[sid] = a
    return {**request, "submission": sub}


def largest_npz(*, wrong: str | None = None, float32: bool = False) -> bytes:
    """Every stage of LARGEST_TRACE as the npz body Client.check sends for it (its JSON is 47 MiB)."""
    from attention_trace.client import encode_npz_check

    return encode_npz_check(largest_submission(request=LARGEST_TRACE, wrong=wrong, float32=float32))


def stack_fits(body: dict, path: str = "/check") -> bool:
    """The stack is valid and within the limits: its trace's size and weights, and for /check its cost with the
    diagnosis (service/budget.py ``check_limit``), as the service counts them before any work."""
    from service import budget
    from service.routes.trace import TraceRequest
    from service.settings import Settings

    try:
        spec = TraceRequest.model_validate(body)
    except ValueError:  # refused: too many numbers or weights
        return False
    return path != "/check" or budget.cost("/check", [spec]) <= budget.check_limit(Settings())


def largest_stack(body: dict, field: str = "num_layers", path: str = "/check", most: int = 96) -> dict:
    """`body` with `field` (num_layers or d_ff) at the most, from 1 to `most`, that `path` allows. A stack's size
    and cost only grow with either field, so the values that fit come first: bisected (~12 validations where
    counting up made up to 3,000, ~1 s)."""
    values = range(1, most + 1)
    best = bisect.bisect_left(values, True, key=lambda value: not stack_fits({**body, field: value}, path))
    if not best:
        raise ValueError(f"no {field} of {body} fits {path}")
    return {**body, field: best}


def stack_npz(request: dict) -> bytes:
    """Every stage of the stack as the npz body Client.check sends, weights 1 % off: every known mistake is tried."""
    from attention_trace.client import encode_npz_check

    return encode_npz_check(largest_submission(request=request, wrong="weights"))


def stack_requests() -> list[tuple[str, dict, str]]:
    """(name, request, what): a stack's /check at the largest the budget allows, and the deepest stacks the
    trace size allows, which the budget refuses."""
    out = []
    for name, request, what in [
        ("stack-check-gpt2", largest_stack(STACK_GPT2), "gpt2 at d_model 128, 2 heads, 64 tokens"),
        ("stack-check-deep", largest_stack(STACK_DEEP), "gpt2 at d_model 8, 2 heads, 16 tokens"),
        ("stack-check-steps", largest_stack(STACK_STEPS), "gpt2 at d_model 2, 2 heads, one token"),
        ("stack-check-erf", largest_stack({**STACK_ERF, "num_layers": 1}, "d_ff", most=8192),
         "exact GELU (pre-norm), d_model 64, 1 head, 64 tokens"),
        ("stack-check-refused-gpt2", largest_stack(STACK_GPT2, path="/trace"),
         "gpt2 at d_model 128, 2 heads, 64 tokens"),
        ("stack-check-refused-deep", largest_stack(STACK_DEEP, path="/trace"), "gpt2 at d_model 8, 2 heads, 16 tokens"),
        ("stack-check-refused-erf", largest_stack({**STACK_ERF, "d_ff": 4096}, path="/trace"),
         "exact GELU (pre-norm), d_model 64, 1 head, 64 tokens"),
    ]:
        shape = f"{request['num_layers']} layer(s)" + (f", d_ff {request['d_ff']}" if "d_ff" in request else "")
        what = (f"{what}, {shape}: " + ("the deepest the trace size allows, over the /check budget (a 422)"
                                         if "refused" in name else "the largest the /check budget allows")
                + "; every stage as npz, weights 1 % off")
        out.append((name, request, what))
    return out


def stack_scenarios():
    """stack_requests() as scenarios: /check of every stage as npz, weights 1 % off."""
    return [(name, "/check", lambda request=request: stack_npz(request), what)
            for name, request, what in stack_requests()]


def scenarios():
    """(name, path, a function making the body, what it shows): bodies are made one at a time."""
    from attention_trace.client import encode_json
    from service.settings import Settings

    limit = Settings().max_check_body_bytes
    values = Settings().max_check_json_values
    out = [
        ("check-largest-compact", "/check", lambda: encode_json(largest_submission()),
         "every stage at d_model 512, 64 tokens, 8 heads, causal: correct, compact JSON (encode_json)"),
        ("check-largest-spaced", "/check",
         lambda: json.dumps(json.loads(encode_json(largest_submission()))).encode(),
         "the same with Python json's default separators (', ', ': ')"),
        ("check-largest-float32-filled", "/check",
         lambda: encode_json(largest_submission(filled=True, float32=True)),
         "every value float32-rounded, masked scores filled with -1e9"),
        ("check-largest-wrong-weights", "/check", lambda: encode_json(largest_submission(wrong="weights")),
         "weights 1 % off: every known bug is tried and the hints run"),
        ("check-batch-largest", "/check/batch",
         lambda: encode_json({"items": [largest_submission(), largest_submission(
             request={"sentence": "the cat sat on the mat", "d_model": 24, "num_heads": 4})]}),
         "a /check/batch of one such submission and a small one"),
        ("check-largest-trace-json", "/check", lambda: encode_json(largest_submission(request=LARGEST_TRACE)),
         "every stage at d_model 512, 240 tokens, 8 heads as JSON: over both limits (a 413)"),
        ("check-largest-trace-npz", "/check", largest_npz,
         "every stage at d_model 512, 240 tokens, 8 heads as an npz body (encode_npz_check): correct"),
        ("check-largest-trace-npz-wrong-weights", "/check", lambda: largest_npz(wrong="weights"),
         "the same, weights 1 % off: every known bug is tried and the hints run"),
        ("check-largest-trace-npz-float32", "/check", lambda: largest_npz(float32=True),
         "the same, every value float32-rounded"),
        *stack_scenarios(),
    ]

    head, tail = b'{"sentence":"a","submission":{"weights":[', b"]}}"

    def hostile(name: str, unit: bytes, what: str):
        """As many units as the limits allow: max_check_json_values, then max_check_body_bytes."""
        per_unit = unit.count(b"[") + unit.count(b"{") + 1  # what bound_json_values counts for one unit
        count = min((limit - len(head) - len(tail)) // (len(unit) + 1), (values - 10) // per_unit)
        return (name, "/check", lambda: head + b",".join([unit] * count) + tail,
                f"{count:,} × {unit.decode()} in submission.weights: {what}")

    out += [
        hostile("hostile-empty-lists", b"[]", "the most lists"),
        hostile("hostile-zeros", b"0", "the most numbers"),
        hostile("hostile-floats", b"-0.12345678901234567", "the most distinct floats"),
        hostile("hostile-rows", b"[0]", "the most one-value rows"),
        hostile("hostile-nested", b"[[0]]", "the most two-level rows"),
        hostile("hostile-nan-strings", b'"-Infinity"', "the most strings"),
        hostile("hostile-objects", b"{}", "objects, which no stage holds (a 422)"),
        ("hostile-over-value-limit", "/check", lambda: head + b",".join([b"0"] * (values + 1)) + tail,
         f"{values + 1:,} zeros: one more value than max_check_json_values allows (a 413 before parsing)"),
    ]
    return out


def in_process(path: str, body: bytes, content_type: str = "application/json") -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, path, content_type], input=body, capture_output=True,
                         cwd=ROOT, timeout=600, check=True)
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    ap.add_argument("--only", nargs="*", help="run only these scenarios")
    ap.add_argument("--no-gunicorn", action="store_true", help="only the in-process measurement")
    args = ap.parse_args(argv)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one BLAS thread, as each worker runs (gunicorn.conf.py)
    from service.settings import Settings

    s = Settings()
    print(f"limits: max_check_body_bytes={s.max_check_body_bytes}, max_check_json_values="
          f"{s.max_check_json_values}, max_body_bytes={s.max_body_bytes}, max_trace_values={s.max_trace_values}")
    results = []
    every = scenarios()
    unknown = sorted(set(args.only or ()) - {name for name, *_ in every})
    if unknown:
        ap.error(f"no scenario {', '.join(unknown)}; the scenarios: {', '.join(name for name, *_ in every)}")
    for name, path, make_body, what in every:
        if args.only and name not in args.only:
            continue
        body = make_body()
        content_type = NPZ if body.startswith(b"PK") else "application/json"
        r = {"name": name, "path": path, "request_bytes": len(body), "what": what,
             "in_process": in_process(path, body, content_type)}
        if not args.no_gunicorn:
            g = measure_limits.measure(name, path, body, content_type)
            r["gunicorn"] = {k: g[k] for k in ("status", "wall_s", "response_bytes", "worker_idle_rss_mib",
                                               "worker_peak_rss_mib", "request_peak_over_idle_mib")}
        results.append(r)
        p = r["in_process"]
        line = (f"{name:30s} {len(body) / 2**20:5.2f} MiB  in-process {p['status']} {p['wall_s']:6.3f} s "
                f"(CPU {p['cpu_s']:6.3f} s) "
                f"peak {p['peak_mib']:6.1f} MiB (+{p['peak_mib'] - p['idle_mib']:.1f})")
        if "gunicorn" in r:
            g = r["gunicorn"]
            line += (f"  gunicorn {g['status']} {g['wall_s']:6.3f} s worker peak {g['worker_peak_rss_mib']:6.1f} MiB "
                     f"(+{g['request_peak_over_idle_mib']})")
        print(line + f"\n    {what}\n    -> {p['summary']}")
    if args.json:
        args.json.write_text(json.dumps({"limits": s.limits(), "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
