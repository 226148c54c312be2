"""inject_bug on a stack of Transformer blocks: each of the block's known mistakes, asked of /trace (and of its npz,
batch, page and /export answers), gives the numbers a student's stack with that mistake computes, labelled; where a
mistake cannot show it is a 422 at /inject_bug that says why.

The independent reference is the student's stack of tests/test_block_check.py, plain numpy that shares nothing with
engine/, fed the input x and the weights of the correct /trace answer.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from test_block_check import CONFIGS, SHOWS, TIGHT, json_stage, setup, student_stack

from engine import BUG_NAMES
from engine.bugs import BLOCK_BUG_NAMES, BLOCK_BUGS
from engine.layer import ALL_STAGE_IDS, BLOCK_STAGE_IDS, LAYER_STAGE_IDS

CASES = [(bug, name) for bug in SHOWS for name in CONFIGS if name in SHOWS[bug]]
REFUSED = [(bug, name) for bug in SHOWS for name in CONFIGS if name not in SHOWS[bug]]
#: the stages no step computes from the numbers (the tokens) or that come before every block step
BEFORE_THE_BLOCK = {"tokens", "token_embedding", "positional_encoding", "input"}


def quoted(names) -> str:
    """Names as pydantic's literal_error lists them: 'a', 'b' or 'c'."""
    names = [repr(n) for n in names]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def values(stage: dict) -> np.ndarray:
    return np.array(stage["values"], dtype=float)  # null (masked) -> nan


def injected(client, body: dict, bug: str) -> dict:
    resp = client.post("/trace", json=body | {"inject_bug": bug})
    assert resp.status_code == 200, resp.get_data(as_text=True)[:800]
    return resp.get_json()


def first_changed_stage(right: dict, wrong: dict, *, layer_0: bool = True) -> str | None:
    """The first stage, in walkthrough order, whose layer 0 (a whole-trace stage, or with ``layer_0`` false any
    stage: its values) differs."""
    for sid, stage in right["stages"].items():
        if sid == "tokens":
            continue
        a, b = values(stage), values(wrong["stages"][sid])
        if layer_0 and sid in LAYER_STAGE_IDS:
            a, b = a[0], b[0]
        if a.shape != b.shape or not np.array_equal(a, b, equal_nan=True):
            return sid
    return None


# ---------------------------------------------------------------- every mistake where it shows


@pytest.mark.parametrize("bug, name", CASES, ids=[f"{b}-{n}" for b, n in CASES])
def test_an_injected_block_mistake_is_a_students_stack_with_that_mistake(client, bug, name):
    body, ref, cfg, x, weights = setup(client, name)
    if bug == "post_norm_for_pre_norm":
        cfg = cfg | {"pre_norm_asked": True}  # the stack asked for keeps its final norm
    doc = injected(client, body, bug)
    assert doc["injected_bug"] == {
        "name": bug, "summary": BLOCK_BUGS[bug].summary,
        "warning": f"These numbers are deliberately wrong: the known bug '{bug}' was injected on request."}
    assert list(doc["stages"]) == list(ref["stages"])  # the stack's stages, in its order
    student = student_stack(x, weights, cfg, bug)
    unchecked = set(doc["stages"]) - set(student) - BEFORE_THE_BLOCK
    stats = {sid for sid in doc["stages"] if sid.endswith(("_mean", "_variance", "_mean_square"))}
    if bug == "norm_over_tokens":  # a student's norm over the tokens has no per-token statistics to compare
        assert unchecked == stats, unchecked
    elif bug == "final_norm_forgotten":  # the forgotten norm's statistics: the correct trace's, before its output
        assert unchecked == {sid for sid in stats if sid.startswith("final_norm")}, unchecked
        assert all(doc["stages"][sid] == ref["stages"][sid] for sid in unchecked)
    else:
        assert not unchecked, unchecked
    for sid, a in student.items():
        got = values(doc["stages"][sid])
        want = np.where(np.isneginf(a), np.nan, a)
        assert got.shape == want.shape, sid
        assert np.allclose(got, want, rtol=1e-10, atol=1e-12, equal_nan=True), (sid, np.nanmax(abs(got - want)))
    for sid in BEFORE_THE_BLOCK & set(doc["stages"]):  # the embeddings are no block's step: untouched
        assert doc["stages"][sid] == ref["stages"][sid]


@pytest.mark.parametrize("bug, name", CASES, ids=[f"{b}-{n}" for b, n in CASES])
def test_it_changes_the_trace_from_its_stage_on_and_check_names_it(client, bug, name):
    body, ref, *_ = setup(client, name)
    doc = injected(client, body, bug)
    # layer 0 agrees with the correct trace up to the stage the mistake touches, and differs there; a post-norm
    # block written for a pre-norm one feeds its first norm x + MHA(x), so the norm's statistics change first
    stage = BLOCK_BUGS[bug].stage
    if bug == "post_norm_for_pre_norm":
        stage = "norm1_mean" if "norm1_mean" in ref["stages"] else "norm1_mean_square"
    assert first_changed_stage(ref, doc) == stage
    # the injected numbers, submitted to /check (without inject_bug), are diagnosed as that very mistake
    sub = {sid: json_stage(np.where(np.isnan(values(st)), -np.inf, values(st)))
           for sid, st in doc["stages"].items() if sid not in BEFORE_THE_BLOCK}
    resp = client.post("/check", json=body | TIGHT | {"submission": sub})
    assert resp.status_code == 200, resp.get_data(as_text=True)[:800]
    check = resp.get_json()
    assert check["passed"] is False and check["diagnosis"]["bug"] == bug, (check["first_wrong_stage"],
                                                                           check["diagnosis"])
    # /check compares whole stages (every layer): its first wrong one is the first that differs in any layer
    assert check["first_wrong_stage"] == first_changed_stage(ref, doc, layer_0=False)


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("bug, name", REFUSED, ids=[f"{b}-{n}" for b, n in REFUSED])
def test_a_block_mistake_that_cannot_show_is_a_422_at_inject_bug(client, bug, name):
    resp = client.post("/trace", json={"sentence": "the cat sat", **CONFIGS[name], "inject_bug": bug})
    assert resp.status_code == 422 and resp.mimetype == "application/problem+json"
    (error,) = resp.get_json()["errors"]
    assert error["pointer"] == "/inject_bug" and error["type"] == "bug_not_applicable"
    assert error["message"].startswith(f"the {bug} bug cannot be shown here: ")


@pytest.mark.parametrize("bug, config, reason", [
    ("final_norm_forgotten", CONFIGS["vaswani2017"], "a post-norm stack has no final norm"),
    ("swiglu_gate_up_swapped", CONFIGS["gpt2"], 'the feed-forward network has no gate; show it with ffn "swiglu"'),
    ("unbiased_variance", CONFIGS["llama"], "RMSNorm has no variance"),
    ("gelu_approximation_swapped", CONFIGS["llama"], "the feed-forward network has no GELU"),
    ("pre_norm_for_post_norm", CONFIGS["gpt2"], "pre-norm already; its mistake is post_norm_for_pre_norm"),
    ("post_norm_for_pre_norm", CONFIGS["vaswani2017"], "post-norm already; its mistake is pre_norm_for_post_norm"),
    ("unbiased_variance", {"norm": "layer_norm", "d_model": 1, "num_heads": 1}, "d_model − 1 = 0"),
    # an attention mistake that a stack cannot show: its keys read the residual stream, not the embeddings
    ("positional_encoding_queries_only", CONFIGS["gpt2"], "one attention layer (no block field)"),
])
def test_each_refusal_says_why(client, bug, config, reason):
    resp = client.post("/trace", json={"sentence": "the cat sat", **config, "inject_bug": bug})
    assert resp.status_code == 422
    (error,) = resp.get_json()["errors"]
    assert error["pointer"] == "/inject_bug" and reason in error["message"], error


@pytest.mark.parametrize("bug", BLOCK_BUG_NAMES)
@pytest.mark.parametrize("path", ["/trace", "/trace/html", "/export"])
def test_a_block_mistake_without_a_block_field_says_to_add_one(client, bug, path):
    body = {"sentence": "the cat sat", "d_model": 8, "num_heads": 2, "inject_bug": bug}
    resp = client.post(path, json=body | ({"format": "bertviz"} if path == "/export" else {}))
    assert resp.status_code == 422 and resp.mimetype == "application/problem+json"
    (error,) = resp.get_json()["errors"]
    assert error["pointer"] == "/inject_bug" and error["type"] == "bug_not_applicable"
    assert "this trace is one attention layer" in error["message"]
    assert 'give block ("vaswani2017", "gpt2" or "llama") or another block field' in error["message"]


def test_an_unknown_bug_lists_the_block_mistakes_only_to_a_stack(client):
    one_layer = client.post("/trace", json={"sentence": "the cat sat", "inject_bug": "off_by_one"})
    stack = client.post("/trace", json={"sentence": "the cat sat", "block": "gpt2", "inject_bug": "off_by_one"})
    for resp, names in ((one_layer, BUG_NAMES), (stack, BUG_NAMES + BLOCK_BUG_NAMES)):
        assert resp.status_code == 422
        (error,) = resp.get_json()["errors"]
        # a one-layer request's message is word for word what it was before the block's mistakes were injectable
        assert error == {"pointer": "/inject_bug", "type": "literal_error",
                         "message": f"Input should be {quoted(names)}"}
    wrong_type = client.post("/trace", json={"sentence": "the cat sat", "block": "gpt2", "inject_bug": 3})
    assert wrong_type.status_code == 422 and wrong_type.get_json()["errors"][0]["pointer"] == "/inject_bug"


def test_a_mistake_that_changes_no_number_of_these_very_numbers_is_refused(client):
    # a ReLU network whose pre-activations are all positive (seed 3's weights, asserted) computes the same numbers
    # without its ReLU; seed 0's has a negative one, so there the mistake shows
    body = {"tokens": ["a", "b"], "d_model": 2, "num_heads": 1, "ffn": "relu", "d_ff": 2, "norm": "rms_norm"}
    for seed, shows in ((3, False), (0, True)):
        pre = values(client.post("/trace", json=body | {"seed": seed}).get_json()["stages"]["ffn_pre_activation"])
        assert bool((pre > 0).all()) is not shows
        resp = client.post("/trace", json=body | {"seed": seed, "inject_bug": "ffn_without_activation"})
        if shows:
            assert resp.status_code == 200 and resp.get_json()["injected_bug"]["name"] == "ffn_without_activation"
        else:
            assert resp.status_code == 422, resp.get_data(as_text=True)[:500]
            (error,) = resp.get_json()["errors"]
            assert error["pointer"] == "/inject_bug" and error["type"] == "bug_changes_nothing"
            assert "with this input and these weights it computes the correct values" in error["message"]


# ---------------------------------------------------------------- every answer that takes inject_bug


def test_npz_batch_page_and_export_carry_the_injected_mistake(client):
    body = {"sentence": "the cat sat", **CONFIGS["llama"], "inject_bug": "swiglu_gate_up_swapped"}
    doc = injected(client, body, "swiglu_gate_up_swapped")
    arrays = client.post("/trace", json=body, headers={"Accept": "application/x-npz"})
    assert arrays.status_code == 200 and arrays.mimetype == "application/x-npz"
    z = np.load(io.BytesIO(arrays.data))
    for sid in ("ffn_activation", "ffn_gated", "final_norm"):  # bit for bit the JSON's numbers
        assert np.array_equal(z[f"stages/{sid}/values"], values(doc["stages"][sid]))
    batch = client.post("/trace/batch", json={"items": [body, body | {"inject_bug": "unbiased_variance"}]})
    first, second = batch.get_json()["results"]
    assert first["status"] == 200 and first["result"] == doc
    assert second["status"] == 422 and second["problem"]["errors"][0]["pointer"] == "/items/1/inject_bug"
    page = client.post("/trace/html", json=body)
    # the page embeds the trace and its scale-flipped comparison, each with the mistake injected and labelled
    label = "the known bug 'swiglu_gate_up_swapped' was injected on request"
    assert page.status_code == 200 and page.get_data(as_text=True).count(label) == 2
    export = client.post("/export", json=body | {"format": "bertviz"})
    assert export.status_code == 200, export.get_data(as_text=True)[:500]
    ex = export.get_json()
    assert ex["injected_bug"] == doc["injected_bug"]
    # bertviz's attention: one [1, head, query, key] array per layer, the injected trace's weights
    for layer, att in enumerate(ex["data"]["attention"]):
        assert np.allclose(np.array(att)[0], values(doc["stages"]["weights"])[layer], rtol=0, atol=0)



# ---------------------------------------------------------------- GET /version


def test_version_lists_the_blocks_mistakes_and_stage_ids_beside_the_attentions(client):
    doc = client.get("/version").get_json()
    # the existing fields are as before: the attention layer's stage ids and known bugs only
    assert doc["stage_ids"] == list(ALL_STAGE_IDS) and list(doc["bugs"]) == list(BUG_NAMES)
    assert doc["block_bugs"] == {name: bug.summary for name, bug in BLOCK_BUGS.items()}
    assert list(doc["block_bugs"]) == list(BLOCK_BUG_NAMES) and not set(doc["block_bugs"]) & set(doc["bugs"])
    assert doc["block_stage_ids"] == list(BLOCK_STAGE_IDS)
    # every stage a stack answers is one of the two lists, in their order
    stack = client.post("/trace", json={"sentence": "the cat", **CONFIGS["gpt2"]}).get_json()
    order = doc["stage_ids"] + doc["block_stage_ids"]
    assert set(stack["stages"]) <= set(order) and set(doc["block_stage_ids"]) & set(stack["stages"])
    block_stages = [sid for sid in stack["stages"] if sid in doc["block_stage_ids"]]
    assert block_stages == sorted(block_stages, key=order.index)
