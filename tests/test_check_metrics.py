"""/check's tolerance (metric, defaults, float32 fairness), non-finite values,
masked fills, general hints, and the client's reading of the new fields.

The float32 students here are written independently of the service: every
stage in float32 from float32 copies of the seeded embeddings and weights.
scripts/measure-tolerance runs the same kind of students over the whole grid
of configurations and many seeds (docs/checking.md has its figures); these
tests run a bounded sample of it, plus the largest configuration once.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import engine
from attention_trace.client import CheckResult, LocalClient, Tolerance, encode_json
from engine.checking import compare
from engine.checking.compare import Received, Tolerance as ServiceTolerance

BODY = {"sentence": "the cat sat on the mat", "d_model": 24, "num_heads": 4}
CAUSAL = BODY | {"causal": True}


def trace_arrays(client, body: dict) -> dict:
    doc = client.post("/trace", json=body).get_json()
    return {sid: st["values"] for sid, st in doc["stages"].items()}


def check(client, body: dict, submission: dict, **extra) -> dict:
    raw = encode_json(body | extra | {"submission": submission})
    resp = client.post("/check", data=raw, content_type="application/json")
    assert resp.status_code == 200, resp.get_data()[:500]
    return json.loads(resp.get_data(), parse_constant=_no_constants)  # a NaN or Infinity in an answer fails here


def _no_constants(name: str):
    raise AssertionError(f"the answer holds the JSON constant {name}")


# ------------------------------------------------------------------ float32 students


def _pe32(n: int, d: int) -> np.ndarray:
    pos = np.arange(n, dtype=np.float32)[:, None]
    pair = (np.arange(d) // 2 * 2).astype(np.float32)
    angle = pos / np.power(np.float32(10000), pair / np.float32(d))
    return np.where(np.arange(d) % 2 == 0, np.sin(angle), np.cos(angle)).astype(np.float32)


def einsum_student(t: engine.Trace) -> dict[str, np.ndarray]:
    """Every stage in float32, whole tensors at a time; masked scores filled with -inf."""
    cfg, f = t.config, np.float32
    W = {m: getattr(t.parameters, m).astype(f) for m in ("W_Q", "W_K", "W_V", "W_O")}
    E = t.stages["token_embedding"].values.astype(f)
    n = E.shape[0]
    pe = _pe32(n, cfg.d_model) if cfg.positional_encoding == "sinusoidal" else np.zeros_like(E)
    x = E + pe
    q, k, v = (np.einsum("nd,hkd->hnk", x, W[m]) for m in ("W_Q", "W_K", "W_V"))
    scores = np.einsum("hqd,hkd->hqk", q, k)
    scaled = scores / (np.sqrt(f(cfg.d_k)) if cfg.scale else f(1))
    masked = np.where(np.triu(np.ones((n, n), bool), 1), f(-np.inf), scaled) if cfg.causal else scaled
    e = np.exp(masked - masked.max(-1, keepdims=True))
    weights = e / e.sum(-1, keepdims=True)
    context = np.einsum("hqk,hkd->hqd", weights, v)
    concat = context.transpose(1, 0, 2).reshape(n, -1)
    out = {"token_embedding": E, "positional_encoding": pe, "input": x, "q": q, "k": k, "v": v, "scores": scores,
           "scaled_scores": scaled, "masked_scores": masked, "weights": weights, "context": context,
           "concat": concat, "output": concat @ W["W_O"].T}
    return {sid: a for sid, a in out.items() if sid in t.stages}


def loop_student(t: engine.Trace) -> dict[str, np.ndarray]:
    """Every stage in float32, one head at a time and one softmax row at a time; masked scores filled with -1e9."""
    cfg, f = t.config, np.float32
    E = t.stages["token_embedding"].values.astype(f)
    n, d = E.shape
    pe = np.zeros((n, d), f)
    if cfg.positional_encoding == "sinusoidal":
        for pos in range(n):
            for j in range(d):
                angle = f(pos) / f(10000.0) ** (f(2 * (j // 2)) / f(d))
                pe[pos, j] = np.sin(angle) if j % 2 == 0 else np.cos(angle)
    x = E + pe
    per_head: dict[str, list[np.ndarray]] = {s: [] for s in ("q", "k", "v", "scores", "scaled_scores",
                                                            "masked_scores", "weights", "context")}
    for i in range(cfg.num_heads):
        q, k, v = (x @ getattr(t.parameters, m)[i].astype(f).T for m in ("W_Q", "W_K", "W_V"))
        s = q @ k.T
        sc = s / math.sqrt(cfg.d_k) if cfg.scale else s
        ms = sc.copy()
        if cfg.causal:
            for r in range(n):
                ms[r, r + 1:] = -1e9
        w = np.empty_like(ms)
        for r in range(n):
            row = np.exp(ms[r] - ms[r].max())
            w[r] = row / row.sum()
        for name, a in zip(per_head, (q, k, v, s, sc, ms, w, w @ v)):
            per_head[name].append(a)
    out = {name: np.stack(a) for name, a in per_head.items()}
    concat = np.concatenate(per_head["context"], axis=-1)
    out |= {"token_embedding": E, "positional_encoding": pe, "input": x, "concat": concat,
            "output": concat @ t.parameters.W_O.astype(f).T}
    return {sid: a for sid, a in out.items() if sid in t.stages}


def _grid() -> list[tuple[engine.TraceConfig, list[str]]]:
    """A bounded sample of the graders' grid, every configuration with its own seed."""
    vocab = ["the", "cat", "sat", "on", "mat", ",", "a", "dog"]
    out = []
    for i, (h, d_model, n, causal) in enumerate(
            (h, d, n, c) for h in (1, 2, 4, 8) for d in (24, 40, 64) for n in (1, 2, 5, 9, 16) for c in (False, True)):
        rng = np.random.default_rng(i)
        out.append((engine.TraceConfig(d_model=d_model, num_heads=h, seed=1000 + i, causal=causal,
                                       scale=i % 17 != 0, positional_encoding="none" if i % 19 == 0 else "sinusoidal"),
                    [str(w) for w in rng.choice(vocab, size=n)]))  # repeated tokens included
    return out


GRID = _grid()


def _request(cfg: engine.TraceConfig, toks: list[str]) -> dict:
    return {"tokens": toks, "d_model": cfg.d_model, "num_heads": cfg.num_heads, "seed": cfg.seed,
            "causal": cfg.causal, "scale": cfg.scale, "positional_encoding": cfg.positional_encoding}


@pytest.mark.parametrize("student", [einsum_student, loop_student])
def test_float32_students_pass_every_stage_with_the_default_tolerance(client, student):
    for cfg, toks in GRID:
        t = engine.trace(cfg, tokens=toks)
        doc = check(client, _request(cfg, toks), student(t))
        assert doc["passed"], (cfg, toks, doc["message"])
        assert doc["tolerance"]["metric"] == "allclose" and doc["tolerance"]["stage_rtol"] == 1e-4
        if cfg.causal and len(toks) > 1:
            assert doc["stages"]["masked_scores"]["treated_as_masked"] == cfg.num_heads * len(toks) * (len(toks) - 1) // 2


def _bug_fails(t: engine.Trace, bug: engine.Bug, tol: ServiceTolerance) -> tuple[bool, list[str]]:
    """Whether the bug's numbers fail its first changed stage (and the stages it changes)."""
    buggy = engine.recompute(t, bug)
    changed = [sid for sid in t.stages if sid != "tokens" and not engine.same_numbers(buggy, t, [sid])]
    for sid in changed:
        exp, b = t.stages[sid], buggy.stages[sid]
        if tuple(b.shape) != tuple(exp.shape):
            return True, changed  # a wrong shape always fails
        mask = b.mask if b.mask is not None else np.zeros(b.shape, bool)
        received = Received(b.shape, np.where(mask, 0.0, b.values), mask)  # the bug's nulls sent as null
        return not compare.compare(np.asarray(exp.values), exp.mask, received, tol).passed, changed
    return False, changed


def test_every_applicable_known_bug_fails_its_first_changed_stage_with_the_default_tolerance():
    """Read engine.BUGS when the test runs: bugs added later are checked too."""
    tol = ServiceTolerance.default()
    seen = set()
    for cfg, toks in GRID:
        t = engine.trace(cfg, tokens=toks)
        for bug in engine.applicable_bugs(cfg, len(toks)):
            failed, changed = _bug_fails(t, bug, tol)
            if not changed:
                continue  # these very numbers do not show it (inject_bug refuses it too)
            assert failed, f"{bug.name} passes the default tolerance at {cfg} n={len(toks)}"
            seen.add(bug.name)
    assert seen == set(engine.BUGS), f"never exercised: {set(engine.BUGS) - seen}"


LARGEST = {"tokens": [f"w{i}" for i in range(64)], "d_model": 512, "num_heads": 8, "causal": True, "seed": 3}


@pytest.mark.slow  # ~2 s of CPU
def test_largest_configuration_float32_passes_the_default_and_failed_the_old_default(client):
    """d_model 512, 64 tokens, 8 heads: the whole submission (~7.5 MiB of JSON, over the 4 MiB
    /trace limit) is accepted; float32 passes the default and failed numpy's defaults (schema 1.0.0)."""
    cfg = engine.TraceConfig(d_model=512, num_heads=8, seed=3, causal=True)
    t = engine.trace(cfg, tokens=LARGEST["tokens"])
    for student in (einsum_student, loop_student):
        sub = student(t)
        doc = check(client, LARGEST, sub)
        assert doc["passed"], doc["message"]
    old = check(client, LARGEST, sub, rtol=1e-5, atol=1e-8)  # rtol/atol alone: exactly numpy.isclose's rule
    assert not old["passed"] and old["tolerance"]["stage_rtol"] == 0.0
    tol = ServiceTolerance.default()
    for bug in engine.applicable_bugs(cfg, len(LARGEST["tokens"])):
        failed, changed = _bug_fails(t, bug, tol)
        assert failed or not changed, bug.name


# ------------------------------------------------------------------ the tolerance


def test_default_tolerance_is_echoed_and_rtol_atol_alone_mean_numpy(client):
    sub = {"weights": trace_arrays(client, BODY)["weights"]}
    assert check(client, BODY, sub)["tolerance"] == {
        "metric": "allclose", "rtol": 1e-5, "atol": 1e-8, "stage_rtol": 1e-4, "threshold": None,
        "rule": "|received − expected| ≤ atol + rtol·|expected| + stage_rtol·max|expected of the stage|"}
    numpy_rule = {"metric": "allclose", "rtol": 1e-3, "atol": 1e-8, "stage_rtol": 0.0, "threshold": None,
                  "rule": "|received − expected| ≤ atol + rtol·|expected|"}
    assert check(client, BODY, sub, rtol=1e-3)["tolerance"] == numpy_rule
    assert check(client, BODY, sub, metric="allclose", atol=0.5)["tolerance"]["rtol"] == 1e-5
    assert check(client, BODY, sub, stage_rtol=1e-3)["tolerance"]["stage_rtol"] == 1e-3
    assert check(client, BODY, sub, metric="allclose")["tolerance"]["stage_rtol"] == 1e-4
    assert check(client, BODY, sub, metric="rel_error")["tolerance"] == {
        "metric": "rel_error", "rtol": None, "atol": None, "stage_rtol": None, "threshold": 1e-3,
        "rule": "|received − expected| / max(1e-8, |received| + |expected|) ≤ threshold"}
    assert check(client, BODY, sub, metric="rel_error", threshold=0.05)["tolerance"]["threshold"] == 0.05


@pytest.mark.parametrize(("extra", "pointer", "type_"), [
    ({"metric": "rel_error", "rtol": 1e-3}, "/rtol", "tolerance_conflict"),
    ({"metric": "rel_error", "stage_rtol": 1e-3}, "/stage_rtol", "tolerance_conflict"),
    ({"threshold": 1e-3}, "/threshold", "tolerance_conflict"),
    ({"metric": "allclose", "threshold": 1e-3}, "/threshold", "tolerance_conflict"),
    ({"metric": "isclose"}, "/metric", "literal_error"),
    ({"threshold": 2.0, "metric": "rel_error"}, "/threshold", "less_than_equal"),
    ({"stage_rtol": -1.0}, "/stage_rtol", "greater_than_equal"),
])
def test_tolerance_mistakes_are_422_with_a_pointer(client, extra, pointer, type_):
    resp = client.post("/check", json=BODY | extra | {"submission": {"weights": [[[1.0]]]}})
    assert resp.status_code == 422
    errors = resp.get_json()["errors"]
    assert any(e["pointer"] == pointer and e["type"] == type_ for e in errors), errors


def test_allclose_and_rel_error_judge_each_value_as_documented(client):
    """Against independent computations: numpy.isclose with the stage term folded into atol, and CS231n's rel_error."""
    exp = np.array(trace_arrays(client, BODY)["scores"])
    rng = np.random.default_rng(7)
    got = exp * (1 + rng.normal(0, 3e-4, exp.shape)) + rng.normal(0, 3e-4, exp.shape)
    scale = np.abs(exp).max()
    for kwargs in ({}, {"rtol": 1e-4, "atol": 1e-4}, {"stage_rtol": 1e-3}, {"rtol": 0.0, "atol": 0.0}):
        doc = check(client, BODY, {"scores": got}, **kwargs)
        tol = doc["tolerance"]
        want = ~np.isclose(got, exp, rtol=tol["rtol"], atol=tol["atol"] + tol["stage_rtol"] * scale)
        s = doc["stages"]["scores"]
        assert s["mismatches"] == int(want.sum()), kwargs
        assert s["abs_tolerance"] == pytest.approx(tol["atol"] + tol["stage_rtol"] * scale, rel=1e-12)
        if want.any():
            assert s["first_mismatch"]["index"] == [int(i) for i in np.argwhere(want)[0]]
    rel = np.abs(got - exp) / np.maximum(1e-8, np.abs(got) + np.abs(exp))
    for threshold in (1e-3, 1e-4, 1e-2):
        doc = check(client, BODY, {"scores": got}, metric="rel_error", threshold=threshold)
        s = doc["stages"]["scores"]
        assert s["rel_error"] == pytest.approx(rel.max(), rel=1e-12)
        assert s["mismatches"] == int((rel > threshold).sum()) and s["abs_tolerance"] is None
        assert s["passed"] == (rel.max() <= threshold)


def test_rel_error_cannot_be_fair_to_float32_and_the_default_is(client):
    """Near-zero values carry float32's absolute error as a large relative one (docs/checking.md)."""
    cfg = engine.TraceConfig(d_model=64, num_heads=8, seed=1)
    toks = ["the", "cat", "sat", "on", "the", "mat", "and", "slept"]
    sub = einsum_student(engine.trace(cfg, tokens=toks))
    body = _request(cfg, toks)
    assert check(client, body, sub)["passed"]
    strict = check(client, body, sub, metric="rel_error")
    assert not strict["passed"] and max(s["rel_error"] for s in strict["stages"].values() if s["rel_error"]) > 1e-3


# ------------------------------------------------------------------ non-finite values


def test_nan_and_infinity_fail_only_their_stage_with_indices_and_200(client):
    arrays = trace_arrays(client, CAUSAL)
    weights = np.array(arrays["weights"])
    weights[0, 1, 0], weights[2, 3, 3], weights[3, 5, 5] = np.nan, np.inf, -np.inf
    sub = {"scores": arrays["scores"], "weights": weights, "output": arrays["output"]}
    doc = check(client, CAUSAL, sub)  # encode_json writes the literals NaN, Infinity, -Infinity
    w = doc["stages"]["weights"]
    assert not w["passed"] and w["mismatches"] == 3
    assert w["non_finite"] == {"count": 3, "first": [{"index": [0, 1, 0], "value": "NaN"},
                                                     {"index": [2, 3, 3], "value": "Infinity"},
                                                     {"index": [3, 5, 5], "value": "-Infinity"}]}
    assert w["first_mismatch"] == {"index": [0, 1, 0], "expected": arrays["weights"][0][1][0], "received": "NaN"}
    assert "NaN at [0, 1, 0], Infinity at [2, 3, 3], -Infinity at [3, 5, 5]" in w["message"]
    assert w["max_abs_error"] == 0.0  # over the finite pairs: the other values are exact
    assert doc["stages"]["scores"]["passed"] and doc["stages"]["output"]["passed"]  # the rest of the report stands
    assert doc["first_wrong_stage"] == "weights" and "not finite" in doc["message"]
    assert [h["code"] for h in doc["diagnosis"]["hints"]] == ["non_finite"]


def test_non_finite_strings_and_out_of_range_numbers_count_as_non_finite(client):
    scores = trace_arrays(client, BODY)["scores"]
    raw = encode_json(BODY | {"submission": {"scores": scores}})
    first = json.dumps(scores[0][0][0]).encode()
    for sent, name in [(b'"NaN"', "NaN"), (b'"Infinity"', "Infinity"), (b'"-Infinity"', "-Infinity"),
                       (b"1e400", "Infinity"), (b"-1e999", "-Infinity"), (b"9" * 400, "Infinity"),
                       (b"-" + b"9" * 400, "-Infinity")]:
        resp = client.post("/check", data=raw.replace(first, sent, 1), content_type="application/json")
        assert resp.status_code == 200, (sent[:20], resp.get_data()[:300])
        s = resp.get_json()["stages"]["scores"]
        assert s["non_finite"] == {"count": 1, "first": [{"index": [0, 0, 0], "value": name}]}, sent[:20]
        assert s["first_mismatch"]["received"] == name


def test_many_non_finite_values_are_summarised(client):
    scores = np.array(trace_arrays(client, BODY)["scores"])
    scores[1] = np.nan  # 36 values
    s = check(client, BODY, {"scores": scores})["stages"]["scores"]
    assert s["non_finite"]["count"] == 36 and len(s["non_finite"]["first"]) == compare.MAX_NON_FINITE_SHOWN
    assert "and 31 more" in s["message"]


@pytest.mark.parametrize(("body", "pointer"), [
    (b'{"tokens":["a"],"d_model":2,"input":[[NaN,1.0]],"submission":{"weights":[[[1.0]]]}}', "/input/0/0"),
    (b'{"tokens":["a"],"d_model":2,"rtol":NaN,"submission":{"weights":[[[1.0]]]}}', "/rtol"),
    (b'{"tokens":["a"],"d_model":2,"metric":"rel_error","threshold":Infinity,"submission":{"weights":[[[1.0]]]}}',
     "/threshold"),
    (b'{"tokens":["a"],"d_model":2,"submission":{"weights":[[["nan"]]]}}', "/submission/weights"),
    (b'{"tokens":["a"],"d_model":2,"submission":{"weights":[[["inf"]]]}}', "/submission/weights"),
    (b'{"tokens":["a"],"d_model":2,"submission":{"weights":[[[true]]]}}', "/submission/weights"),
])
def test_non_finite_values_stay_forbidden_outside_submissions(client, body, pointer):
    resp = client.post("/check", data=body, content_type="application/json")
    assert resp.status_code == 422, resp.get_data()
    assert any(e["pointer"] == pointer for e in resp.get_json()["errors"]), resp.get_json()


@pytest.mark.parametrize("value", [1.7976931348623157e308, -1.7976931348623157e308, 1e300, 5e-324, 0.0])
@pytest.mark.parametrize("metric", ["allclose", "rel_error"])
def test_extreme_finite_values_are_judged_without_overflow(client, value, metric):
    """Any finite float is a value like any other: no warning, no 500, no infinity in the answer."""
    for sid, shape in (("weights", (4, 6, 6)), ("masked_scores", (4, 6, 6)), ("concat", (6, 24)), ("q", (6, 4, 6))):
        doc = check(client, CAUSAL, {sid: np.full(shape, value)}, metric=metric)
        s = doc["stages"][sid]
        assert not s["passed"] and s["non_finite"] is None
        for key in ("max_abs_error", "max_rel_error", "rel_error"):
            assert s[key] is None or math.isfinite(s[key])


def test_non_finite_in_tokens_stage_is_just_a_string(client):
    doc = check(client, {"tokens": ["NaN", "x"], "d_model": 4}, {"tokens": ["NaN", "x"]})
    assert doc["passed"]


# ------------------------------------------------------------------ masked entries


@pytest.mark.parametrize("fill", [-1e9, -1e30, -3.4028234663852886e38, -1.7976931348623157e308, -math.inf, None])
def test_masked_fills_count_as_masked_and_say_so(client, fill):
    arrays = trace_arrays(client, CAUSAL)
    masked = np.array(arrays["masked_scores"], dtype=object)
    upper = np.equal(masked, None)
    sub = np.where(upper, fill, masked)
    doc = check(client, CAUSAL, {"masked_scores": sub.tolist()})
    s = doc["stages"]["masked_scores"]
    assert doc["passed"], s["message"]
    count = 0 if fill is None else int(upper.sum())
    assert s["treated_as_masked"] == count and s["non_finite"] is None
    assert ("treated as masked" in s["message"]) == (count > 0)


def test_fills_where_the_reference_does_not_mask_are_wrong_values(client):
    arrays = trace_arrays(client, CAUSAL)
    masked = np.array(arrays["masked_scores"], dtype=object)
    masked[0, 2, 1] = -1e9  # key 1 ≤ query 2: a real score
    s = check(client, CAUSAL, {"masked_scores": masked.tolist()})["stages"]["masked_scores"]
    assert not s["passed"] and s["mismatches"] == 1 and s["non_finite"] is None
    assert s["first_mismatch"] == {"index": [0, 2, 1], "expected": arrays["masked_scores"][0][2][1], "received": -1e9}
    masked[0, 2, 1] = -math.inf  # -inf there is a non-finite value
    s = check(client, CAUSAL, {"masked_scores": masked.tolist()})["stages"]["masked_scores"]
    assert s["non_finite"] == {"count": 1, "first": [{"index": [0, 2, 1], "value": "-Infinity"}]}
    masked = np.array(arrays["masked_scores"], dtype=object)
    for bad, name in ((-5e8, -5e8), (math.inf, "Infinity"), (math.nan, "NaN")):  # not a fill, where it is masked
        masked[1, 0, 4] = bad
        s = check(client, CAUSAL, {"masked_scores": masked.tolist()})["stages"]["masked_scores"]
        assert s["first_mismatch"] == {"index": [1, 0, 4], "expected": None, "received": name}


def test_a_fill_of_zero_is_still_the_known_bug(client):
    sub = {sid: v for sid, v in client.post("/trace", json=CAUSAL | {"inject_bug": "finite_mask_fill"})
           .get_json()["stages"].items() if sid in ("masked_scores", "weights")}
    doc = check(client, CAUSAL, {sid: st["values"] for sid, st in sub.items()})
    assert doc["diagnosis"]["bug"] == "finite_mask_fill" and doc["diagnosis"]["hints"] == []


# ------------------------------------------------------------------ hints


def _hints(client, body: dict, sub: dict) -> list[dict]:
    doc = check(client, body, sub)
    assert not doc["passed"] and doc["diagnosis"]["bug"] is None, doc["diagnosis"]
    hints = doc["diagnosis"]["hints"]
    assert all(h["message"] in doc["message"] for h in hints) and ("Hints: " in doc["message"]) == bool(hints)
    return hints


def _codes(hints: list[dict]) -> list[str]:
    return [h["code"] for h in hints]


def test_hint_rows_do_not_sum_to_1_and_constant_factor(client):
    w = np.array(trace_arrays(client, BODY)["weights"])
    hints = _hints(client, BODY, {"weights": w * 0.9})
    assert _codes(hints) == ["rows_do_not_sum_to_1", "constant_factor"]
    assert "sums to 0.9" in hints[0]["message"] and "c = 0.9" in hints[1]["message"]


@pytest.mark.parametrize(("factor", "name"), [(math.sqrt(6), "√d_k = √6"), (6.0, "d_k = 6"),
                                              (1 / math.sqrt(6), "1/√d_k = 1/√6"), (math.sqrt(24), "√d_model = √24")])
def test_hint_constant_factor_names_the_factor(client, factor, name):
    s = np.array(trace_arrays(client, BODY)["scores"])
    (hint,) = _hints(client, BODY, {"scores": s * factor})
    assert hint["code"] == "constant_factor" and f"c = {factor:.6g}" in hint["message"] and name in hint["message"]


def test_hint_transposed_scores(client):
    s = np.array(trace_arrays(client, BODY)["scores"])
    assert _codes(_hints(client, BODY, {"scores": s.swapaxes(-1, -2)})) == ["transposed"]
    q = np.array(trace_arrays(client, BODY)["q"])  # [h, n, d_k] sent as [h, d_k, n]
    (hint,) = _hints(client, BODY, {"q": q.swapaxes(-1, -2)})
    assert hint["code"] == "transposed" and "(token and d_k)" in hint["message"]


def test_hint_permutation_of_concat_and_of_the_head_split(client):
    arrays = trace_arrays(client, BODY)
    concat = np.array(arrays["concat"]).reshape(6, 4, 6)[:, ::-1, :].reshape(6, 24)  # heads in reverse order
    (hint,) = _hints(client, BODY, {"concat": concat})
    assert hint["code"] == "permutation" and "transpose(1, 0, 2)" in hint["message"]
    q = np.array(arrays["q"]).transpose(1, 0, 2)  # [n, h, d_k]: the split without the transpose
    (hint,) = _hints(client, BODY, {"q": q})
    assert hint["code"] == "permutation" and "shape [6, 4, 6] instead of [4, 6, 6]" in hint["message"]


def test_hint_diagonal_masked(client):
    sc = np.array(trace_arrays(client, BODY)["scaled_scores"])
    x = np.where(np.eye(6, dtype=bool), -np.inf, sc)
    e = np.exp(x - x.max(-1, keepdims=True))
    (hint,) = _hints(client, BODY, {"weights": e / e.sum(-1, keepdims=True)})  # non-causal: no known bug
    assert hint["code"] == "diagonal_masked" and "Without causal: true" in hint["message"]
    masked = np.array(trace_arrays(client, CAUSAL)["masked_scores"], dtype=object)
    masked[:, np.arange(6), np.arange(6)] = None
    masked[0, 5, 0] += 1.0  # and one more difference, so no known bug reproduces it
    hints = _hints(client, CAUSAL, {"masked_scores": masked.tolist()})
    assert "diagonal_masked" in _codes(hints) and "np.triu(…, k=1)" in hints[0]["message"]


def test_hints_for_cross_attention_weights_never_fail(client):
    """Cross-attention's weights are [head, query, context key]: not square, no query has an own key.
    A transposed submission once made the diagonal hint index past the key axis (a 500)."""
    body = {"sentence": "le chat", "context_sentence": "the cat sat", "num_heads": 2, "d_model": 8}
    w = np.array(trace_arrays(client, body)["weights"])  # [2, 2, 3]
    r = client.post("/check", json=body | {"submission": {"weights": np.swapaxes(w, -1, -2).tolist()}})
    assert r.status_code == 200
    doc = r.get_json()
    assert doc["first_wrong_stage"] == "weights" and "diagonal_masked" not in _codes(doc["diagnosis"]["hints"])
    square = {"sentence": "le chat sat", "context_sentence": "the cat sat", "num_heads": 2, "d_model": 8}
    w = np.array(trace_arrays(client, square)["weights"])  # [2, 3, 3]: square, yet no own key
    w[..., np.arange(3), np.arange(3)] = 0.0
    doc = client.post("/check", json=square | {"submission": {"weights": w.tolist()}}).get_json()
    assert "diagonal_masked" not in _codes(doc["diagnosis"]["hints"])


def test_no_hints_when_a_known_bug_matches_or_nothing_is_wrong(client):
    w = client.post("/trace", json=BODY | {"inject_bug": "softmax_wrong_axis"}).get_json()["stages"]["weights"]
    doc = check(client, BODY, {"weights": w["values"]})
    assert doc["diagnosis"]["bug"] == "softmax_wrong_axis" and doc["diagnosis"]["hints"] == []
    assert "Hints" not in doc["message"]
    out = np.array(trace_arrays(client, BODY)["output"])
    assert _hints(client, BODY, {"output": out + 1.0}) == []  # an offset is none of the patterns


# ------------------------------------------------------------------ the client


def test_client_reads_the_new_fields_and_a_1_0_0_document():
    local = LocalClient()
    w = np.array(local.trace(BODY).stages["weights"].values)
    w[0, 0, 0] = np.nan
    r = local.check(BODY, submission={"weights": w * 0.9})
    assert r.schema_version == "1.3.0" and r.tolerance.metric == "allclose" and r.tolerance.stage_rtol == 1e-4
    s = r.stages["weights"]
    assert s.non_finite.count == 1 and s.non_finite.first == [([0, 0, 0], "NaN")]
    assert s.first_mismatch.received == "NaN" and s.rel_error is not None and s.abs_tolerance is not None
    assert [h.code for h in r.diagnosis.hints][:1] == ["non_finite"]
    assert str(r.tolerance) == "rtol 1e-05 · atol 1e-08 · stage_rtol 0.0001"
    assert str(local.check(BODY, submission={"weights": w}, metric="rel_error").tolerance) == "rel_error ≤ 0.001"
    # A document from a 1.0.0 service: no metric, stage_rtol, threshold, hints or per-stage additions.
    old = json.loads(json.dumps(r.raw))
    old["schema_version"] = "1.0.0"
    old["tolerance"] = {"rtol": 1e-5, "atol": 1e-8, "rule": "|received − expected| ≤ atol + rtol·|expected|"}
    del old["diagnosis"]["hints"]
    for st in old["stages"].values():
        for key in ("rel_error", "abs_tolerance", "non_finite", "treated_as_masked"):
            del st[key]
        if st["first_mismatch"]:
            st["first_mismatch"]["received"] = 0.5
    parsed = CheckResult.from_json(old)
    assert parsed.tolerance == Tolerance(old["tolerance"])  # read as sent, the rest filled in
    assert (parsed.tolerance.rtol, parsed.tolerance.atol, parsed.tolerance.threshold) == (1e-5, 1e-8, None)
    assert parsed.tolerance.metric == "allclose" and parsed.tolerance.stage_rtol == 0.0
    assert parsed.diagnosis.hints == [] and parsed.stages["weights"].non_finite is None
    assert parsed.stages["weights"].treated_as_masked == 0 and str(parsed.tolerance) == "rtol 1e-05 · atol 1e-08"
