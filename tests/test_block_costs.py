"""What a stack of blocks may cost: its /check is counted with the diagnosis's reruns (service/budget.py) and held to
what the largest one-layer /check costs, refused before any work above it; /trace, /trace/html and /export of a
stack keep the bounds they had.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import engine
from engine.bugs import applicable_bugs
from service import budget
from service.routes.check import CheckRequest
from service.routes.trace import TraceRequest
from service.settings import Settings

LIMITS = Settings()


def tokens(n: int) -> list[str]:
    return [f"w{i}" for i in range(n)]


#: the stacks the diagnosis costs most for, each at the most layers the trace size allows: many small layers
#: (Python's overhead per step), the exact GELU (math.erf one element at a time), GPT-2's proportions
DEEP = {"tokens": tokens(16), "block": "gpt2", "d_model": 8, "num_heads": 2}
ERF = {"tokens": tokens(64), "ffn": "gelu", "norm_position": "pre", "d_model": 64, "num_heads": 1, "d_ff": 4096}
GPT2 = {"tokens": tokens(64), "block": "gpt2", "d_model": 128, "num_heads": 2}


def spec(body: dict) -> TraceRequest:
    return TraceRequest.model_validate(body)


def check_cost(body: dict) -> int:
    return budget.cost("/check", [spec(body)])


def most_layers(body: dict, fits) -> int:
    """The most layers (1–96) for which ``fits(request body)`` holds, layers counted up from 1."""
    best = 0
    for layers in range(1, 97):
        if not fits({**body, "num_layers": layers}):
            break
        best = layers
    return best


def traceable(body: dict) -> bool:
    try:
        spec(body)
    except Exception:  # noqa: BLE001 (any refusal: too many numbers or weights)
        return False
    return True


def checkable(body: dict) -> bool:
    return traceable(body) and check_cost(body) <= budget.check_limit(LIMITS)


def wrong_submission(client, body: dict) -> dict:
    """Every stage of the trace as arrays (masked scores masked), weights 1 % off: the diagnosis tries every known
    mistake."""
    doc = client.post("/trace", json=body).get_json()
    sub = {}
    for sid, st in doc["stages"].items():
        if sid in ("tokens", "token_embedding", "positional_encoding", "input"):
            continue
        a = np.array(st["values"], dtype=float) * (1.01 if sid == "weights" else 1.0)  # null -> nan
        sub[sid] = np.ma.masked_invalid(a) if np.isnan(a).any() else a
    return sub


# ---------------------------------------------------------------- the count


def test_one_attention_layer_is_counted_as_before():
    one = spec({"tokens": tokens(64), "d_model": 512, "num_heads": 8, "causal": True})
    assert budget.diagnosis_cost(one) == 0
    assert budget.cost("/check", [one]) == budget.ITEM_COST + 4 * one._value_count + 4 * 512 * 512
    # the largest one-layer /check the limits allow is the bound itself, up to the numbers it cannot reach
    largest = spec({"tokens": tokens(240), "d_model": 512, "num_heads": 8})
    assert budget.check_limit(LIMITS) - budget.cost("/check", [largest]) == 4 * (LIMITS.max_trace_values
                                                                                 - largest._value_count)


def test_a_stacks_diagnosis_is_counted_per_known_mistake_number_erf_element_and_step():
    body = {**ERF, "num_layers": 2}
    s = spec(body)
    config = s.trace_config
    bugs = len(applicable_bugs(config, 64))
    steps = len(engine.layer.layer_steps(config))
    erf = 64 * 4096 * 2  # [layer, token, d_ff] through math.erf
    assert budget.diagnosis_cost(s) == bugs * (-(-s._value_count // 6) + 2 * erf + 350 * steps)
    # the tanh GELU is vectorised: no erf elements counted, the rest alike
    tanh = spec({**body, "ffn": "gelu_tanh"})
    assert budget.diagnosis_cost(tanh) == len(applicable_bugs(tanh.trace_config, 64)) * (
        -(-tanh._value_count // 6) + 350 * steps)
    # each layer adds its reruns
    assert budget.diagnosis_cost(spec({**DEEP, "num_layers": 40})) > budget.diagnosis_cost(
        spec({**DEEP, "num_layers": 20})) > 0


@pytest.mark.parametrize("body", [DEEP, ERF, GPT2], ids=["deep", "erf", "gpt2"])
def test_the_deepest_traceable_stacks_cost_more_to_check_than_one_layer_may(body):
    # the trace size alone would let these be checked; counted with their diagnosis, they are not
    traced = most_layers(body, traceable)
    checked = most_layers(body, checkable)
    assert traced >= 1 and checked < traced
    assert check_cost({**body, "num_layers": traced}) > budget.check_limit(LIMITS)
    assert budget.cost("/trace", [spec({**body, "num_layers": traced})]) <= LIMITS.max_request_cost


# ---------------------------------------------------------------- the refusal


def test_a_too_costly_stack_check_is_refused_before_any_work(client, monkeypatch):
    layers = most_layers(DEEP, checkable)
    body = {**DEEP, "num_layers": layers + 1}
    submission = {"weights": [[[[0.0]]]]}  # its shape does not matter: nothing is compared

    def no_work(*args, **kwargs):
        raise AssertionError("the stack was traced")

    monkeypatch.setattr(engine, "trace", no_work)
    start = time.process_time()
    resp = client.post("/check", json=body | {"submission": submission})
    cpu = time.process_time() - start
    assert resp.status_code == 422 and resp.mimetype == "application/problem+json"
    doc = resp.get_json()
    (error,) = doc["errors"]
    assert error["pointer"] == "" and error["type"] == "check_too_costly"
    work = check_cost(body)
    assert error["message"] == f"{work} units; the limit is {budget.check_limit(LIMITS)}"
    assert f"checking this stack of {layers + 1} block(s) would cost {work} units" in doc["detail"]
    assert "use fewer layers or tokens" in doc["detail"]
    assert cpu < 0.5  # validation only (~10 ms); a margin for a loaded machine


def test_the_same_refusal_for_an_npz_body_and_a_batch_counts_the_diagnosis(client):
    from attention_trace.client import encode_npz_check

    body = {**DEEP, "num_layers": most_layers(DEEP, checkable) + 1}
    resp = client.post("/check", data=encode_npz_check(body | {"submission": {"weights": np.zeros((1, 1, 1, 1))}}),
                       content_type="application/x-npz")
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["type"] == "check_too_costly"
    # a batch item whose trace fits the request budget but whose diagnosis does not
    small = {**DEEP, "num_layers": 40}
    assert budget.cost("/trace", [spec(small)]) <= LIMITS.max_request_cost < check_cost(small)
    resp = client.post("/check/batch", json={"items": [small | {"submission": {"weights": [[[[0.0]]]]}}]})
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["type"] == "batch_too_costly"


@pytest.mark.slow  # ~3 s of CPU
def test_the_largest_checkable_stack_is_checked_and_its_diagnosis_runs(client):
    body = {**GPT2, "num_layers": most_layers(GPT2, checkable)}
    assert body["num_layers"] >= 2
    from attention_trace.client import encode_npz_check

    # every stage is more JSON values than a /check body may hold: sent as npz, as Client.check does
    resp = client.post("/check", data=encode_npz_check(body | {"submission": wrong_submission(client, body)}),
                       content_type="application/x-npz")
    assert resp.status_code == 200, resp.get_data(as_text=True)[:500]
    doc = resp.get_json()
    assert doc["passed"] is False and doc["first_wrong_stage"] == "weights" and doc["diagnosis"]["bug"] is None


def test_a_stacks_trace_page_and_export_keep_their_bounds(client):
    # the deepest GPT-2-proportioned stack the trace size allows is traced and exported; its page is over the
    # page budget (two copies of its numbers), refused as before
    body = {**GPT2, "num_layers": most_layers(GPT2, traceable)}
    assert client.post("/trace", json=body | {"stages": ["final_norm"]}).status_code == 200
    assert client.post("/export", json=body | {"format": "bertviz"}).status_code == 200
    page = client.post("/trace/html", json=body)
    assert page.status_code == 422 and page.get_json()["errors"][0]["type"] == "page_too_costly"


def test_check_request_model_counts_as_the_trace_request():
    # /check's request resolves the same stack and numbers as /trace's, so the budget reads either alike
    body = {**GPT2, "num_layers": 3}
    check = CheckRequest.model_validate(body | {"submission": {"weights": [[[[0.0]]]]}})
    assert budget.cost("/check", [check]) == check_cost(body)


@pytest.mark.parametrize("body", [
    {"d_model": 8, "num_heads": 2},
    {"d_model": 8, "num_heads": 4, "num_kv_heads": 2},
    {"d_model": 8, "num_heads": 2, "block": "gpt2", "num_layers": 1},
    {"d_model": 8, "num_heads": 2, "block": "gpt2", "num_layers": 2},
    {"d_model": 8, "num_heads": 2, "block": "vaswani2017", "num_layers": 3, "d_ff": 12},
    {"d_model": 8, "num_heads": 2, "num_kv_heads": 1, "block": "llama", "num_layers": 2, "d_ff": 16},
    {"d_model": 8, "num_heads": 2, "norm": "rms_norm", "norm_position": "post", "num_layers": 2},
])
def test_n_parameters_and_n_matrices_count_what_the_docs_say(client, body):
    """config.n_parameters is as many numbers as include_parameters returns, and both counts follow the formulas
    of openapi.yaml's ConfigOut and README: every layer's attention and FFN, both norms' γ and β (RMSNorm: γ), the
    final norm in pre-norm; the norms' vectors are not matrices."""
    doc = client.post("/trace", json={"sentence": "the cat sat", "include_parameters": True, **body}).get_json()
    cfg = doc["config"]
    returned = sum(np.asarray(v, dtype=float).size for v in doc["parameters"].values())
    assert cfg["n_parameters"] == returned
    d, h = cfg["d_model"], cfg["num_heads"]
    g, d_k = body.get("num_kv_heads", h), cfg["d_k"]
    attention, attention_matrices = 2 * d * d + 2 * g * d_k * d, h + 2 * g + 1
    if "norm" not in cfg:
        assert (cfg["n_parameters"], cfg["n_matrices"]) == (attention, attention_matrices)
        return
    k = 3 if cfg["ffn"] == "swiglu" else 2
    norm = 2 * d if cfg["norm"] == "layer_norm" else d
    final = norm if cfg["norm_position"] == "pre" else 0
    L = cfg["num_layers"]
    assert cfg["n_parameters"] == L * (attention + k * cfg["d_ff"] * d + 2 * norm) + final
    assert cfg["n_matrices"] == L * (attention_matrices + k)
    if body.get("block") == "gpt2":  # the figures the docs quote
        assert {1: (816, 9), 2: (1616, 18)}[L] == (cfg["n_parameters"], cfg["n_matrices"])
