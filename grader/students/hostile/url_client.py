"""Hostile: reads ATTENTION_TRACE_URL and uses the shipped client (the trick that got 7/7), or imports
the reference engine from wherever the grader keeps it, or calls a service on localhost.

Every route is tried and reported on stdout; the sandbox must close them all. Run outside the sandbox
(in the grader's own environment), the engine route answers every function correctly. (A copy of the
engine elsewhere on the machine, world-readable, is public source like any other: a student could
as well paste it into the file. What must stay out of reach is the grader's.)"""

import glob
import json
import os
import sys
import urllib.request

import numpy as np

REPORT = {}
URL = os.environ.get("ATTENTION_TRACE_URL")
REPORT["ATTENTION_TRACE_URL"] = URL
REPORT["env"] = sorted(os.environ)

ENGINE = None
CANDIDATES = ["/work/main", "/autograder/source", "/grade/serverFilesCourse", "/grade/tests", "/opt/attention-grader/app",
              "/opt/attention-grader/venv/lib/python3.11/site-packages", "/autograder/venv/lib/python3.11/site-packages"]
CANDIDATES += glob.glob("/*/*/.venv/lib/python3*/site-packages") + glob.glob("/work/*")
here = os.path.dirname(os.path.abspath(__file__))
while here != "/":
    CANDIDATES.append(here)
    here = os.path.dirname(here)
for path in CANDIDATES:
    if os.path.isdir(os.path.join(path, "engine")) or os.path.isdir(os.path.join(path, "attention_trace")):
        sys.path.append(path)
try:
    from engine import attention as ENGINE  # the reference's own step functions

    REPORT["engine"] = f"imported from {ENGINE.__file__}"
except Exception as e:  # noqa: BLE001
    REPORT["engine"] = f"{type(e).__name__}: {e}"
    REPORT["engine_found_at"] = [p for p in sys.path if os.path.isdir(os.path.join(p, "engine"))]
try:
    from attention_trace.client import Client, LocalClient  # noqa: F401

    REPORT["client"] = "imported"
except Exception as e:  # noqa: BLE001
    REPORT["client"] = f"{type(e).__name__}: {e}"
for url in filter(None, [URL, "http://127.0.0.1:8000", "http://localhost:8000"]):
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as r:
            REPORT[url] = r.read().decode()
    except Exception as e:  # noqa: BLE001
        REPORT[url] = f"{type(e).__name__}: {e}"
print("routes to the reference:", json.dumps(REPORT))


def _e(name, *args):
    if ENGINE is None:
        return np.zeros(1)
    return getattr(ENGINE, name)(*args)


def add_positional_encoding(e):
    if ENGINE is None:
        return np.zeros(1)
    return ENGINE.add_positional_encoding(e, ENGINE.sinusoidal_positional_encoding(*e.shape))


def project(x, W):
    return _e("project", x, W)


def scores(q, k):
    return _e("attention_scores", q, k)


def scale(s, d_k):
    return _e("scale_scores", s, np.sqrt(d_k)) if ENGINE else np.zeros(1)


def mask(s):
    if ENGINE is None:
        return np.zeros(1)
    filled, excluded = ENGINE.apply_mask(s, ENGINE.causal_mask(s.shape[-1]))
    return np.where(excluded, -np.inf, filled)


def softmax(s):
    return _e("softmax", s)


def attend(w, v):
    return _e("weighted_values", w, v)


def concat(c):
    return _e("concat_heads", c)


def output(c, W_O):
    return _e("output_projection", c, W_O)


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    if ENGINE is None:
        return np.zeros((x.shape[0], W_O.shape[0]))
    s = scale(scores(project(x, W_Q), project(x, W_K)), W_Q.shape[1])
    return output(concat(attend(softmax(mask(s) if causal else s), project(x, W_V))), W_O)
