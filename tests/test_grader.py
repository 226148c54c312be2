"""Grader support: bring-your-own matrices, injected bugs, /check and batches."""

from __future__ import annotations

import math

import numpy as np
import pytest

import engine
from engine import BUGS, TraceConfig

D = 24


def seed_article_request(scale: bool) -> dict:
    """The first seed's worked example: raw scores 3.877, 14.905, 8.293 for the query "cat".

    With W_Q = W_K = I (d_model = d_k = 24, one head), scores = x·xᵀ, so rows of
    x are chosen to give exactly those dot products with x_cat.
    """
    x = np.zeros((3, D))
    c = math.sqrt(14.905)
    x[1, 0] = c  # cat·cat = 14.905
    x[0, 0], x[0, 1] = 3.877 / c, 1.0  # the·cat = 3.877
    x[2, 0], x[2, 2] = 8.293 / c, 1.0  # sat·cat = 8.293
    eye = np.eye(D)[None]  # [1, d_k, d_model]
    params = {"W_Q": eye.tolist(), "W_K": eye.tolist(), "W_V": eye.tolist(), "W_O": np.eye(D).tolist()}
    return {"tokens": ["the", "cat", "sat"], "d_model": D, "num_heads": 1, "scale": scale,
            "input": x.tolist(), "parameters": params}


@pytest.mark.parametrize(("scale", "percent"), [(True, [7.7, 73.3, 19.0]), (False, [0.0, 99.9, 0.1])])
def test_seed_article_worked_example(client, scale, percent):
    doc = client.post("/trace", json=seed_article_request(scale)).get_json()
    cat_scores = doc["stages"]["scores"]["values"][0][1]
    assert np.allclose(cat_scores, [3.877, 14.905, 8.293], rtol=1e-12)
    if scale:
        assert np.allclose(doc["stages"]["scaled_scores"]["values"][0][1], [0.791, 3.042, 1.693], atol=5e-4)
        assert doc["config"]["scale_factor"] == math.sqrt(24)  # 4.899
    weights = doc["stages"]["weights"]["values"][0][1]
    assert [round(100 * w, 1) for w in weights] == percent
    assert "token_embedding" not in doc["stages"] and "positional_encoding" not in doc["stages"]
    assert doc["stages"]["input"]["values"] == seed_article_request(scale)["input"]


def test_explicit_parameters_are_used_and_digested(client):
    req = seed_article_request(True)
    doc = client.post("/trace", json=req | {"include_parameters": True}).get_json()
    assert doc["parameters"]["W_Q"] == req["parameters"]["W_Q"]
    p = engine.explicit_parameters(*(np.array(req["parameters"][k]) for k in ("W_Q", "W_K", "W_V", "W_O")),
                                   d_model=D, num_heads=1)
    assert doc["parameters_digest"] == engine.parameters_digest(p)
    generated = client.post("/trace", json={"tokens": ["the", "cat", "sat"]}).get_json()
    assert generated["parameters_digest"] != doc["parameters_digest"]


@pytest.mark.parametrize(
    ("change", "pointer", "needle"),
    [
        (lambda r: r.update(input=r["input"][:2]), "/input", "input has shape [2, 24] but must be [3, 24]"),
        (lambda r: r["input"][1].append(0.0), "/input", "input has a ragged array"),
        (lambda r: r["parameters"].update(W_Q=[[[1.0] * 24] * 24] * 2), "/parameters/W_Q",
         "parameters.W_Q has shape [2, 24, 24] but must be [1, 24, 24]"),
        (lambda r: r["parameters"].update(W_O=[[1.0] * 24] * 23), "/parameters/W_O", "[d_model, num_heads·d_k]"),
        (lambda r: r["parameters"].pop("W_V"), "/parameters/W_V", "Field required"),
        (lambda r: r["input"][0].__setitem__(0, "1"), "/input/0/0", "valid number"),
    ],
)
def test_explicit_arrays_with_wrong_shapes_are_422(client, change, pointer, needle):
    req = seed_article_request(True)
    change(req)
    resp = client.post("/trace", json=req)
    assert resp.status_code == 422
    errors = resp.get_json()["errors"]
    assert any(e["pointer"] == pointer and needle in e["message"] for e in errors), errors


def test_non_finite_explicit_values_are_rejected(client):
    body = b'{"tokens": ["a"], "d_model": 2, "input": [[NaN, 1.0]]}'
    resp = client.post("/trace", data=body, content_type="application/json")
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["pointer"] == "/input/0/0"
    huge = {"tokens": ["a", "b"], "d_model": 2, "input": [[1e300, 1.0], [1.0, -1.0]]}
    resp = client.post("/trace", json=huge)
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["pointer"] == "/input/0/0"
    # The largest allowed values cannot overflow any stage.
    big = {"tokens": ["a", "b"], "d_model": 2, "scale": False, "input": [[1e6, -1e6], [1e6, 1e6]],
           "parameters": {"W_Q": [[[1e6, 1e6], [1e6, -1e6]]], "W_K": [[[1e6, 1e6], [-1e6, 1e6]]],
                          "W_V": [[[1e6, 1e6], [1e6, 1e6]]], "W_O": [[1e6, 1e6], [1e6, 1e6]]}}
    doc = client.post("/trace", json=big).get_json()
    assert np.isfinite(np.array(doc["stages"]["output"]["values"])).all()
    assert np.allclose(np.array(doc["stages"]["weights"]["values"]).sum(-1), 1.0)


def test_engine_refuses_overflowing_explicit_input():
    with pytest.raises(engine.NumericOverflowError, match="overflow float64"):
        engine.trace(TraceConfig(d_model=2), tokens=["a", "b"], input=np.array([[1e300, 1e300], [1e300, -1e300]]))


# ------------------------------------------------------------------- inject_bug

BUGGY = {"sentence": "the cat sat on the mat", "d_model": 24, "num_heads": 4, "causal": True}
# Every bug a trace of BUGGY can show (a log-softmax's −inf under the mask cannot be: tests/test_bugs.py).
SHOWN = [name for name, b in BUGS.items()
         if engine.bugs.refusal(b, TraceConfig(d_model=24, num_heads=4, causal=True), 6) is None]


def test_buggy_config_shows_all_but_the_log_softmax():
    assert set(BUGS) - set(SHOWN) == {"log_softmax"}


@pytest.mark.parametrize("bug", SHOWN)
def test_injected_bug_is_labelled_and_matches_the_engine(client, bug):
    doc = client.post("/trace", json=BUGGY | {"inject_bug": bug}).get_json()
    assert doc["injected_bug"]["name"] == bug
    assert doc["injected_bug"]["summary"] == BUGS[bug].summary
    assert "deliberately wrong" in doc["injected_bug"]["warning"]
    t = engine.trace(TraceConfig(d_model=24, num_heads=4, causal=True), sentence=BUGGY["sentence"], bug=bug)
    assert np.array_equal(np.array(doc["stages"]["output"]["values"]), t.stages["output"].values)
    correct = client.post("/trace", json=BUGGY).get_json()
    first = BUGS[bug].stage
    assert doc["stages"][first] != correct["stages"][first], f"{bug} should change {first}"
    assert "injected_bug" not in correct


def test_injected_bugs_do_what_their_names_say(client):
    def weights(bug):
        return np.array(client.post("/trace", json=BUGGY | {"inject_bug": bug}).get_json()
                        ["stages"]["weights"]["values"])

    d_k = 6
    assert np.allclose(weights("scale_after_softmax").sum(-1), 1 / math.sqrt(d_k))
    assert np.allclose(weights("softmax_wrong_axis").sum(-2), 1)
    upper = np.triu_indices(6, 1)
    assert weights("finite_mask_fill")[:, upper[0], upper[1]].min() > 0  # future tokens get weight
    # Sharper without the divisor, flatter with it twice (row 0 is always [1] under the mask).
    assert weights("no_scale").max(-1)[:, 1:].mean() > weights("double_scale").max(-1)[:, 1:].mean()
    doc = client.post("/trace", json=BUGGY | {"inject_bug": "average_heads"}).get_json()
    context = np.array(doc["stages"]["context"]["values"])
    assert np.allclose(np.array(doc["stages"]["concat"]["values"]), context.mean(0))
    assert doc["stages"]["concat"]["shape"] == [6, 6]
    scaled = np.array(client.post("/trace", json=BUGGY | {"inject_bug": "scale_by_d_model"}).get_json()
                      ["stages"]["scaled_scores"]["values"])
    raw = np.array(client.post("/trace", json=BUGGY).get_json()["stages"]["scores"]["values"])
    assert np.allclose(scaled, raw / math.sqrt(24))


def test_bug_validation(client):
    resp = client.post("/trace", json={"sentence": "a b", "inject_bug": "finite_mask_fill"})
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["pointer"] == "/inject_bug"
    resp = client.post("/trace", json={"sentence": "a b", "inject_bug": "off_by_one"})
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["pointer"] == "/inject_bug"


# ---------------------------------------------------------------------- /check

CHECKED = ["scores", "scaled_scores", "masked_scores", "weights", "context", "concat", "output"]


def submission_from(client, body, bug=None, stages=CHECKED):
    extra = {"inject_bug": bug} if bug else {}
    doc = client.post("/trace", json=body | extra | {"stages": stages}).get_json()
    return {sid: doc["stages"][sid]["values"] for sid in stages}


def test_correct_submission_passes(client):
    sub = submission_from(client, BUGGY)
    doc = client.post("/check", json=BUGGY | {"submission": sub}).get_json()
    assert doc["passed"] is True and doc["first_wrong_stage"] is None
    assert doc["diagnosis"] == {"bug": None, "summary": None, "matches": [], "hints": [],
                                "message": "No bug: every submitted stage matches the reference."}
    assert list(doc["stages"]) == CHECKED
    assert all(s["passed"] and s["mismatches"] == 0 and s["max_abs_error"] == 0.0 for s in doc["stages"].values())
    assert doc["tolerance"] == {"metric": "allclose", "rtol": 1e-5, "atol": 1e-8, "stage_rtol": 1e-4,
                                "threshold": None,
                                "rule": "|received − expected| ≤ atol + rtol·|expected| + stage_rtol·max|expected "
                                        "of the stage|"}


@pytest.mark.parametrize("bug", SHOWN)
def test_each_known_bug_is_diagnosed(client, bug):
    first = engine.STAGE_IDS.index(BUGS[bug].stage)
    stages = list(dict.fromkeys([*engine.STAGE_IDS[first:first + 3], *CHECKED]))  # from the bug's stage on
    sub = submission_from(client, BUGGY, bug, stages=stages)
    if bug == "average_heads":
        sub["concat"] = sub["concat"]  # [n, d_k]: the shape itself is part of the evidence
    doc = client.post("/check", json=BUGGY | {"submission": sub}).get_json()
    assert doc["passed"] is False
    assert doc["diagnosis"]["bug"] == bug, doc["diagnosis"]
    assert doc["first_wrong_stage"] == BUGS[bug].stage
    assert f"known bug '{bug}'" in doc["message"]
    assert doc["message"].startswith(f"Stage '{BUGS[bug].stage}'")


def test_float32_student_passes_within_default_tolerance(client):
    sub = submission_from(client, BUGGY, stages=["weights", "output"])
    sub = {k: np.float32(np.array(v, dtype=float)).astype(float).tolist() for k, v in sub.items()}
    doc = client.post("/check", json=BUGGY | {"submission": sub}).get_json()
    assert doc["passed"], doc["message"]
    strict = client.post("/check", json=BUGGY | {"submission": sub, "rtol": 0.0, "atol": 1e-12}).get_json()
    assert not strict["passed"] and strict["tolerance"]["rtol"] == 0.0


def test_check_reports_first_mismatch_and_errors(client):
    body = {"sentence": "the cat sat", "d_model": 4}
    sub = submission_from(client, body, stages=["weights"])
    sub["weights"][0][1][2] += 0.01
    doc = client.post("/check", json=body | {"submission": sub}).get_json()
    w = doc["stages"]["weights"]
    assert w["mismatches"] == 1 and w["first_mismatch"]["index"] == [0, 1, 2]
    assert math.isclose(w["max_abs_error"], 0.01, rel_tol=1e-9)
    assert w["first_mismatch"]["received"] == sub["weights"][0][1][2]
    assert doc["diagnosis"]["bug"] is None and "do not match any known bug" in doc["diagnosis"]["message"]


def test_check_wrong_shape_and_nulls(client):
    sub = {"weights": [[0.5, 0.5], [0.5, 0.5]]}
    doc = client.post("/check", json={"sentence": "a b", "d_model": 4, "submission": sub}).get_json()
    w = doc["stages"]["weights"]
    assert w["shape_ok"] is False and w["expected_shape"] == [1, 2, 2] and w["received_shape"] == [2, 2]
    ragged = client.post("/check", json={"sentence": "a b", "d_model": 4,
                                         "submission": {"weights": [[[1.0], [0.5, 0.5]]]}}).get_json()
    assert ragged["stages"]["weights"]["received_shape"] is None
    body = {"sentence": "a b", "d_model": 4, "causal": True}
    masked = submission_from(client, body, stages=["masked_scores"])
    assert masked["masked_scores"][0][0][1] is None
    assert client.post("/check", json=body | {"submission": masked}).get_json()["passed"]
    masked["masked_scores"][0][0][1] = -1e9  # students' fill for a masked key: counted as masked
    doc = client.post("/check", json=body | {"submission": masked}).get_json()
    assert doc["passed"] and doc["stages"]["masked_scores"]["treated_as_masked"] == 1
    masked["masked_scores"][0][0][1] = 0.0  # a finite value where the key must be excluded
    doc = client.post("/check", json=body | {"submission": masked}).get_json()
    assert doc["stages"]["masked_scores"]["first_mismatch"] == {"index": [0, 0, 1], "expected": None,
                                                                "received": 0.0}


@pytest.mark.parametrize(("sub", "pointer"), [
    ({"weights": [["x"]]}, "/submission/weights"),
    ({"weights": [[True]]}, "/submission/weights"),
    ({"weights": [[[[[1.0]]]]]}, "/submission/weights"),
    ({"masked_scores": [[[1.0]]]}, "/submission/masked_scores"),
    ({"weight": [1.0]}, "/submission/weight"),
    ({}, "/submission"),
])
def test_check_bad_submissions_are_422(client, sub, pointer):
    resp = client.post("/check", json={"sentence": "a b", "d_model": 4, "submission": sub})
    assert resp.status_code == 422
    assert any(e["pointer"].startswith(pointer) for e in resp.get_json()["errors"]), resp.get_json()


def test_check_is_deterministic(client):
    sub = submission_from(client, BUGGY, "no_scale")
    a = client.post("/check", json=BUGGY | {"submission": sub}).get_data()
    assert a == client.post("/check", json=BUGGY | {"submission": sub}).get_data()


# ---------------------------------------------------------------------- batch


def test_trace_batch_answers_each_item_in_order(client):
    items = [{"sentence": "the cat"}, {"sentence": "a", "num_heads": 5}, {"tokens": ["x"], "d_model": 4}]
    doc = client.post("/trace/batch", json={"items": items}).get_json()
    assert [r["index"] for r in doc["results"]] == [0, 1, 2]
    assert [r["status"] for r in doc["results"]] == [200, 422, 200]
    assert doc["results"][0]["result"] == client.post("/trace", json=items[0]).get_json()
    problem = doc["results"][1]["problem"]
    assert problem["errors"][0]["pointer"] == "/items/1/num_heads"
    assert doc["results"][1]["result"] is None


def test_check_batch(client):
    sub = submission_from(client, BUGGY, "softmax_wrong_axis", stages=["weights"])
    items = [BUGGY | {"submission": sub}, {"sentence": "a", "submission": {"weights": [[[1.0]]]}}]
    doc = client.post("/check/batch", json={"items": items}).get_json()
    assert doc["results"][0]["result"]["diagnosis"]["bug"] == "softmax_wrong_axis"
    assert doc["results"][1]["result"]["passed"] is True


def test_batch_limits(app_factory):
    small = app_factory(max_batch_items=2, max_trace_values=5000).test_client()
    resp = small.post("/trace/batch", json={"items": [{"sentence": "a"}] * 3})
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["pointer"] == "/items"
    resp = small.post("/trace/batch", json={"items": [{"sentence": "a b c d e f g h", "d_model": 64}] * 2})
    assert resp.status_code == 422 and "split it into smaller batches" in resp.get_json()["detail"]
    assert small.post("/trace/batch", json={"items": []}).status_code == 422
    assert small.post("/trace/batch", json={"items": [1]}).status_code == 422
