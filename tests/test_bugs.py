"""Every known bug is the mistake a student really makes: written here independently, the way
students write attention in numpy, its numbers are named by /check on several configurations.

The student code below shares nothing with engine/ (no step functions, no bug steps): a
mistake's numbers match only if engine/bugs.py computes what the summary says.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import engine
from engine import BUGS, TraceConfig

CONFIGS = [
    {"sentence": "the cat sat on the mat", "d_model": 24, "num_heads": 4, "causal": True},
    {"sentence": "the cat sat on the mat", "d_model": 24, "num_heads": 4, "causal": False},
    {"sentence": "a b c d e", "d_model": 32, "num_heads": 8, "causal": True, "seed": 3},
    {"sentence": "one two three one two three one", "d_model": 16, "num_heads": 2, "causal": False, "seed": 11},
]


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - np.max(z, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def student(E, PE, W_Q, W_K, W_V, W_O, *, causal: bool, mistake: str | None = None) -> dict[str, np.ndarray]:
    """Multi-head self-attention as a student writes it, with at most one mistake."""
    h, d_k, d_model = W_Q.shape
    n = E.shape[0]
    if mistake == "positional_encoding_missing":
        x = E
    elif mistake == "positional_encoding_twice":
        x = E + PE
        x = x + PE
    else:
        x = E + PE

    def project(W, x=x):
        W_all = W.reshape(h * d_k, d_model)
        y = x @ W_all if mistake == "projection_not_transposed" else x @ W_all.T
        if mistake == "heads_split_without_transpose":
            return y.reshape(h, n, d_k)
        return y.reshape(n, h, d_k).transpose(1, 0, 2)

    q, k, v = project(W_Q), project(W_K), project(W_V)
    if mistake == "same_w_for_q_and_k":
        k = project(W_Q)
    elif mistake == "positional_encoding_queries_only":
        k, v = project(W_K, E), project(W_V, E)
    scores = np.einsum("hid,hjd->hij", q, k)
    divisor = {"no_scale": 1.0, "scale_by_d_model": math.sqrt(d_model), "double_scale": float(d_k),
               "scale_after_softmax": 1.0}.get(mistake or "", math.sqrt(d_k))
    scaled = scores / divisor
    out = {"input": x, "q": q, "k": k, "v": v, "scores": scores, "scaled_scores": scaled}
    logits = scaled
    if causal:
        future = np.triu(np.ones((n, n), dtype=bool), k=0 if mistake == "mask_includes_diagonal" else 1)
        fill = 0.0 if mistake == "finite_mask_fill" else -np.inf
        logits = scaled if mistake == "mask_not_applied" else np.where(future, fill, scaled)
        out["masked_scores"] = logits
    if mistake == "mask_after_softmax":
        weights = np.where(future, 0.0, _softmax(scaled))
    elif mistake == "log_softmax":
        shifted = logits - logits.max(axis=-1, keepdims=True)
        weights = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    elif mistake == "softmax_wrong_axis":
        weights = np.swapaxes(_softmax(np.swapaxes(logits, -1, -2)), -1, -2)
    else:
        weights = _softmax(logits)
    if mistake == "scale_after_softmax":
        weights = weights / math.sqrt(d_k)
    context = weights @ v
    if mistake in ("average_heads", "average_heads_sliced_W_O"):
        concat = context.mean(axis=0)
        W = W_O[:, :d_k] if mistake == "average_heads_sliced_W_O" else sum(
            W_O[:, i * d_k:(i + 1) * d_k] for i in range(h))  # tiling the mean = summing W_O's blocks
        output = concat @ W.T
    else:
        concat = (context.reshape(n, h * d_k) if mistake == "concat_token_major"
                  else np.concatenate(list(context), axis=-1))
        output = concat if mistake == "output_projection_missing" else concat @ W_O.T
    out.update(weights=weights, context=context, concat=concat, output=output)
    return out


def _as_submission(stages: dict[str, np.ndarray], causal: bool) -> dict[str, list]:
    sub = {}
    for sid, a in stages.items():
        if sid == "masked_scores":
            sub[sid] = np.where(np.isneginf(a), None, a).tolist()  # masked entries are null
        else:
            sub[sid] = a.tolist()
    return sub


def _reference(client, body: dict) -> dict:
    doc = client.post("/trace", json=body | {"include_parameters": True}).get_json()
    return doc


def _arrays(doc: dict) -> dict[str, np.ndarray]:
    st, p = doc["stages"], doc["parameters"]
    return {"E": np.array(st["token_embedding"]["values"]), "PE": np.array(st["positional_encoding"]["values"]),
            **{k: np.array(v) for k, v in p.items()}}


@pytest.mark.parametrize("body", CONFIGS, ids=lambda b: f"d{b['d_model']}h{b['num_heads']}{'c' if b['causal'] else ''}")
def test_a_correct_student_passes_and_every_known_bug_is_named(client, body):
    ref = _arrays(_reference(client, body))
    correct = student(**ref, causal=body["causal"])
    doc = client.post("/check", json=body | {"submission": _as_submission(correct, body["causal"])}).get_json()
    assert doc["passed"], doc["message"]

    config = TraceConfig(**{k: body[k] for k in ("d_model", "num_heads", "causal")}, seed=body.get("seed", 0))
    n = len(engine.tokenize(body["sentence"]))
    named = []
    for name, bug in BUGS.items():
        if engine.bugs.refusal(bug, config, n) is not None:
            assert (bug.needs_causal and not body["causal"]) or (name == "log_softmax" and body["causal"]), name
            continue
        with np.errstate(invalid="ignore"):  # the diagonal mistake's first row is NaN in the student's code
            stages = student(**ref, causal=body["causal"], mistake=name)
        if name == "mask_includes_diagonal":
            # The first query sees no key: a student's softmax gives NaN there, so grade the mask itself.
            stages = {sid: stages[sid] for sid in ("scaled_scores", "masked_scores")}
        check = client.post("/check", json=body | {"submission": _as_submission(stages, body["causal"])}).get_json()
        assert not check["passed"], name
        assert check["first_wrong_stage"] == bug.stage, (name, check["first_wrong_stage"])
        assert check["diagnosis"]["bug"] == name, (name, check["diagnosis"])
        assert f"known bug '{name}'" in check["message"]
        named.append(name)
    assert len(named) >= 12


def test_new_bugs_show_in_traces_with_their_formulas(client):
    body = {"sentence": "the cat sat on the mat", "d_model": 24, "num_heads": 4, "causal": True}
    formulas = {
        "projection_not_transposed": ("q", "Qᵢ = x·W (W stacked [h·d_k, d_model], not transposed)"),
        "mask_includes_diagonal": ("masked_scores", "mask_diag(QKᵀ/√d_k): keys at and after the query are "
                                                     "excluded, the query's own key too"),
        "mask_after_softmax": ("weights", "mask(softmax(QKᵀ/√d_k))"),
        "concat_token_major": ("concat", "reshape(context, [n, h·d_k]) (no transpose)"),
        "average_heads_sliced_W_O": ("output", "Mean(head₁, …, head_h)·W_O[:, :d_k]ᵀ"),
        "positional_encoding_twice": ("input", "x = E + PE + PE"),
        "same_w_for_q_and_k": ("k", "Kᵢ = x·W_Qᵢᵀ (W_Q, not W_K)"),
        "positional_encoding_queries_only": ("v", "Vᵢ = E·W_Vᵢᵀ (no PE)"),
        "mask_not_applied": ("masked_scores", "QKᵀ/√d_k (not masked): the keys after the query are not excluded"),
        "output_projection_missing": ("output", "Concat(head₁, …, head_h) (W_O not applied)"),
    }
    for name, (sid, formula) in formulas.items():
        doc = client.post("/trace", json=body | {"inject_bug": name}).get_json()
        assert doc["injected_bug"]["name"] == name
        assert doc["stages"][sid]["formula"] == formula


def test_a_mask_that_hides_the_diagonal_leaves_the_first_query_attending_to_nothing(client):
    body = {"sentence": "the cat sat", "d_model": 8, "num_heads": 2, "causal": True, "inject_bug": "mask_includes_diagonal"}
    doc = client.post("/trace", json=body).get_json()
    weights = np.array(doc["stages"]["weights"]["values"])
    assert np.all(weights[:, 0, :] == 0.0)  # never NaN: no key to attend to
    assert np.allclose(weights[:, 1:, :].sum(-1), 1.0)
    assert np.all(weights[:, 2, 2:] == 0.0) and np.all(weights[:, 1, 1:] == 0.0)
    masked = doc["stages"]["masked_scores"]["values"]
    assert all(masked[hh][i][j] is None for hh in range(2) for i in range(3) for j in range(i, 3))


@pytest.mark.parametrize("body, code", [
    ({"sentence": "a b", "causal": True, "inject_bug": "log_softmax"}, "bug_not_applicable"),
    ({"sentence": "a b", "positional_encoding": "none", "inject_bug": "positional_encoding_twice"},
     "bug_changes_nothing"),
    ({"tokens": ["a", "b"], "d_model": 2, "input": [[1, 0], [0, 1]], "inject_bug": "positional_encoding_missing"},
     "bug_not_applicable"),
    ({"sentence": "a b", "inject_bug": "mask_after_softmax"}, "bug_needs_causal"),
    ({"sentence": "a b", "num_heads": 1, "inject_bug": "concat_token_major"}, "bug_changes_nothing"),
    ({"sentence": "a", "num_heads": 2, "inject_bug": "heads_split_without_transpose"}, "bug_changes_nothing"),
    ({"sentence": "a b", "num_heads": 2, "num_kv_heads": 1, "inject_bug": "same_w_for_q_and_k"}, "bug_not_applicable"),
    ({"sentence": "a b", "positional_encoding": "rope", "inject_bug": "positional_encoding_queries_only"},
     "bug_not_applicable"),
    ({"sentence": "a b", "inject_bug": "mask_not_applied"}, "bug_needs_causal"),
    ({"sentence": "a", "causal": True, "inject_bug": "mask_not_applied"}, "bug_changes_nothing"),
])
def test_a_new_bug_that_cannot_show_here_is_refused_with_the_reason(client, body, code):
    resp = client.post("/trace", json=body)
    assert resp.status_code == 422
    error = resp.get_json()["errors"][0]
    assert error["pointer"] == "/inject_bug" and error["type"] == code
    assert body["inject_bug"] in error["message"]
