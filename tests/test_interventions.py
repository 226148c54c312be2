"""Interventions (engine.interventions): what each replaces, the rules over HTTP and in the engine alike, the
answer's effect, /check of an intervened trace, and the induction experiment.

The induction experiment: the induction preset (a previous-token head in layer 0, the match in layer 1; gpt2,
d_model 64, causal) with a tied language-model head at temperature 0.1 predicts B after "… A B … A". Zeroing
layer 0's head must drop B's probability below 0.2 on at least 95 % of the sentences where it was at least 0.9;
in a corrupted copy (the first A replaced by a token that is nowhere else), patching that head's output from the
clean run must bring B back to at least 0.9. The sentences come from a fixed numpy seed.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import engine
from engine import TraceConfig
from engine.errors import EngineError
from engine.interventions import Intervention, apply, check_interventions, intervene, max_abs_delta, target_effect
from test_constructed_heads import VOCABULARY, _induction_sentences

INDUCTION = dict(
    d_model=64,
    num_heads=1,
    head_weights=["induction"],
    num_layers=2,
    block="gpt2",
    causal=True,
    lm_head="tied",
    temperature=0.1,
)


@pytest.fixture(scope="module")
def client():
    from service import create_app
    from service.settings import Settings

    return create_app(Settings()).test_client()


def test_each_kind_replaces_the_rows_it_names():
    v = np.arange(2 * 3 * 2, dtype=float).reshape(2, 3, 2)  # [head, n, d_k]
    out = apply(Intervention("head_output", 0, "zero", head=1, positions=(0, 2)), v)
    assert (out[1, [0, 2]] == 0).all() and (out[1, 1] == v[1, 1]).all() and (out[0] == v[0]).all()
    out = apply(Intervention("head_output", 0, "mean", head=0), v)
    np.testing.assert_array_equal(out[0], np.broadcast_to(v[0].mean(0), (3, 2)))
    src = -v
    out = apply(Intervention("head_output", 0, "patch", head=0, positions=(1,)), v, src)
    assert (out[0, 1] == src[0, 1]).all() and (out[0, 0] == v[0, 0]).all()
    w = np.full((1, 3, 3), 0.5)
    causal = np.triu(np.ones((3, 3), bool), 1)[None]  # [h, n, n]: True = excluded
    out = apply(Intervention("head_pattern", 0, "mean", head=0), w, excluded=causal)
    np.testing.assert_allclose(out[0], [[1, 0, 0], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]])
    assert (v == np.arange(12).reshape(2, 3, 2)).all()  # the input is left as it was


def test_a_later_stage_reads_the_replaced_value_and_the_earlier_stages_are_the_baselines():
    config = TraceConfig.preset_config("gpt2", d_model=24, num_heads=4, num_layers=3)
    base = engine.trace(config, sentence="the cat sat on the mat")
    t = intervene(base, [Intervention("head_output", 1, "zero", head=2)])
    ctx = t.stages["context"].values
    assert (ctx[1, 2] == 0).all() and (ctx[0] == base.stages["context"].values[0]).all()
    d = max_abs_delta(base, t)
    assert d["context"][0] == 0 and d["context"][1] > 0 and d["residual_stream"][:2] == [0.0, 0.0]
    assert d["residual_stream"][2] > 0 and d["residual_stream"][3] > 0
    # layer 1's output is concat·W_Oᵀ of the zeroed context
    np.testing.assert_allclose(
        t.stages["output"].values[1],
        t.stages["concat"].values[1] @ base.parameters.layers[1].attention.W_O.T,
        rtol=0,
        atol=1e-12,
    )
    assert base.stages["context"].values[1, 2].any()  # the baseline is untouched


def test_a_patch_from_the_same_sentence_changes_nothing():
    config = TraceConfig.preset_config("llama", d_model=32, num_heads=4, num_kv_heads=2, num_layers=2, lm_head="tied")
    base = engine.trace(config, sentence="the cat sat on the mat")
    t = intervene(
        base,
        [
            Intervention(target, 1, "patch", head=0 if target.startswith("head") else None)
            for target in ("head_output", "head_pattern", "mlp_output", "residual")
        ],
        base,
    )
    assert all((np.asarray(v) == 0).all() for v in max_abs_delta(base, t).values())


RULES = [
    # (interventions and extra fields, pointer, type)
    (
        {"interventions": [{"target": "head_output", "layer": 2, "head": 0}]},
        "/interventions/0/layer",
        "intervention_out_of_range",
    ),
    (
        {"interventions": [{"target": "head_output", "layer": 0, "head": 1}]},
        "/interventions/0/head",
        "intervention_out_of_range",
    ),
    ({"interventions": [{"target": "head_output", "layer": 0}]}, "/interventions/0/head", "intervention_out_of_range"),
    (
        {"interventions": [{"target": "mlp_output", "layer": 0, "head": 0}]},
        "/interventions/0/head",
        "intervention_out_of_range",
    ),
    ({"interventions": [{"target": "residual", "layer": 3}]}, "/interventions/0/layer", "intervention_out_of_range"),
    (
        {"interventions": [{"target": "residual", "layer": 0, "positions": [4]}]},
        "/interventions/0/positions/0",
        "intervention_out_of_range",
    ),
    (
        {"interventions": [{"target": "residual", "layer": 0, "positions": [1, 1]}]},
        "/interventions/0/positions",
        "intervention_out_of_range",
    ),
    (
        {"interventions": [{"target": "head_pattern", "layer": 0, "head": 0, "kind": "zero"}]},
        "/interventions/0/kind",
        "pattern_not_zeroed",
    ),
    (
        {"interventions": [{"target": "residual", "layer": 0, "kind": "patch"}]},
        "/interventions/0/kind",
        "patch_needs_sentence",
    ),
    (
        {"interventions": [{"target": "residual", "layer": 0, "kind": "patch"}], "patch_sentence": "a b c"},
        "/patch_sentence",
        "patch_length_mismatch",
    ),
    (
        {"interventions": [{"target": "residual", "layer": 0}], "patch_sentence": "a b c d"},
        "/patch_sentence",
        "patch_sentence_unused",
    ),
    ({"patch_sentence": "a b c d"}, "/patch_sentence", "needs_interventions"),
    ({"target_token": "v2"}, "/target_token", "needs_interventions"),
    (
        {"interventions": [{"target": "residual", "layer": 0}], "target_token": "zz"},
        "/target_token",
        "target_not_in_vocabulary",
    ),
    (
        {"interventions": [{"target": "residual", "layer": 0}], "inject_bug": "no_scale"},
        "/interventions",
        "interventions_conflict",
    ),
    (
        {"interventions": [{"target": "residual", "layer": 0}], "generate": 1},
        "/interventions",
        "interventions_conflict",
    ),
]


@pytest.mark.parametrize("extra, pointer, kind", RULES, ids=[r[2] + str(i) for i, r in enumerate(RULES)])
def test_a_bad_intervention_is_a_422_naming_the_field(client, extra, pointer, kind):
    body = {"sentence": "v1 v2 v3 v1", **INDUCTION, **extra}
    r = client.post("/trace", json=body)
    assert r.status_code == 422 and r.headers["Content-Type"] == "application/problem+json", r.get_data(True)
    errors = r.get_json()["errors"]
    assert (pointer, kind) in [(e["pointer"], e["type"]) for e in errors], errors


def test_the_engine_refuses_what_http_refuses_with_the_same_pointer_and_message(client):
    config = TraceConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in INDUCTION.items()})
    cases = [([Intervention("head_output", 2, head=0)], None), ([Intervention("residual", 0, "patch")], 3)]
    for ivs, patch_n in cases:
        with pytest.raises(EngineError) as e:
            check_interventions(ivs, config, 4, patch_n=patch_n)
        body = {
            "sentence": "v1 v2 v3 v1",
            **INDUCTION,
            "interventions": [{"target": iv.target, "layer": iv.layer, "kind": iv.kind, "head": iv.head} for iv in ivs],
            **({"patch_sentence": "a b c"} if patch_n else {}),
        }
        got = client.post("/trace", json=body).get_json()["errors"][0]
        assert (got["pointer"], got["type"], got["message"]) == (e.value.pointer, e.value.code, e.value.message)


def test_mlp_and_residual_need_a_block(client):
    r = client.post("/trace", json={"sentence": "the cat sat", "interventions": [{"target": "mlp_output", "layer": 0}]})
    assert r.status_code == 422 and r.get_json()["errors"][0]["type"] == "intervention_needs_block"
    r = client.post(
        "/trace",
        json={
            "sentence": "the cat sat",
            "d_model": 8,
            "num_heads": 2,
            "interventions": [{"target": "head_pattern", "layer": 0, "head": 1, "kind": "mean"}],
        },
    )
    assert r.status_code == 200
    w = r.get_json()["stages"]["weights"]["values"][1]
    np.testing.assert_array_equal(w, np.full((3, 3), 1 / 3))


def test_the_answer_shows_the_effect_and_the_baseline_request_answers_the_baseline(client):
    body = {
        "sentence": "v7 v1 v2 v3 v4 v1",
        **INDUCTION,
        "interventions": [{"target": "head_output", "layer": 0, "head": 0}],
    }
    r = client.post("/trace", json=body)
    assert r.status_code == 200, r.get_data(True)
    doc = r.get_json()
    iv = doc["intervention"]
    assert iv["interventions"][0]["description"] == (
        "layer 0 head 0 output (context, before W_O): set to 0 at every position"
    )
    assert iv["target"]["token"] == "v2" and iv["target"]["probability"]["baseline"] > 0.99
    assert iv["target"]["probability"]["intervened"] < 0.01 and iv["target"]["logit"]["delta"] < -1
    assert iv["max_abs_delta"]["context"][0] > 0 and iv["max_abs_delta"]["residual_stream"][0] == 0
    base = client.post("/trace", json=iv["baseline_request"]).get_json()
    assert iv["baseline_stages"]["next_token_probs"] == base["stages"]["next_token_probs"]["values"]
    import hashlib

    canonical = json.dumps(iv["baseline_request"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert iv["baseline_digest"] == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    assert doc["stages"]["context"]["values"][0][0] == [[0.0] * 64] * 6  # the answer's stages are intervened
    # the batch answers the same bytes
    batch = client.post("/trace/batch", json={"items": [body]}).get_json()["results"][0]["result"]
    assert batch == doc


def test_check_grades_the_intervened_trace(client):
    body = {
        "sentence": "the cat sat",
        "d_model": 8,
        "num_heads": 2,
        "interventions": [{"target": "head_output", "layer": 0, "head": 1}],
    }
    want = client.post("/trace", json=body).get_json()["stages"]["output"]["values"]
    plain = client.post("/trace", json={k: v for k, v in body.items() if k != "interventions"}).get_json()
    ok = client.post("/check", json={**body, "submission": {"output": want}}).get_json()
    assert ok["passed"] is True, ok
    wrong = client.post("/check", json={**body, "submission": {"output": plain["stages"]["output"]["values"]}})
    assert wrong.get_json()["passed"] is False


@pytest.mark.slow
def test_the_induction_experiment(capsys):
    cfg = TraceConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in INDUCTION.items()})
    rng = np.random.default_rng(0)
    ablate = [Intervention("head_output", 0, "zero", head=0)]
    patch = [Intervention("head_output", 0, "patch", head=0)]
    eligible = dropped = corrupted_low = restored = 0
    for words, a, B in _induction_sentences(300, seed=11):
        clean = engine.trace(cfg, tokens=words)
        before = target_effect(clean, intervene(clean, ablate), B)["probability"]
        if before["baseline"] < 0.9:
            continue
        eligible += 1
        dropped += before["intervened"] < 0.2
        C = next(str(w) for w in rng.choice(VOCABULARY, 8) if w not in words)
        corrupt = engine.trace(cfg, tokens=[C if i == a else w for i, w in enumerate(words)])
        after = target_effect(corrupt, intervene(corrupt, patch, clean), B)["probability"]
        corrupted_low += after["baseline"] < 0.2
        restored += after["intervened"] >= 0.9
    with capsys.disabled():
        print(
            f"\ninduction: {eligible}/300 at p(B) >= 0.9; ablated below 0.2: {dropped}; corrupted below 0.2: "
            f"{corrupted_low}; patched back to >= 0.9: {restored}"
        )
    assert eligible >= 285
    assert dropped >= 0.95 * eligible and restored >= 0.95 * eligible and corrupted_low >= 0.95 * eligible


def test_the_cli_ablates_and_patches_a_head(capsys):
    from test_cli import in_process

    induction_head_0_ablated = (
        "v7 v1 v2 v3 v4 v1",
        "--block",
        "gpt2",
        "--layers",
        "2",
        "--d-model",
        "64",
        "--head-weights",
        "induction",
        "--ablate",
        "0.0",
    )
    code, out, _ = in_process(
        capsys,
        *induction_head_0_ablated,
        "--json",
    )
    doc = json.loads(out)
    assert code == 0 and doc["intervention"]["interventions"][0]["kind"] == "zero"
    assert doc["stages"]["context"]["values"][0][0] == [[0.0] * 64] * 6
    code, out, _ = in_process(
        capsys,
        *induction_head_0_ablated,
        "--patch-from",
        "v7 v1 v2 v3 v4 v1",
        "--query",
        "5",
    )
    assert code == 0 and "patched from the second input" in out and "max |Δ| output: 0.000, 0.000" in out, out
    code, _, err = in_process(capsys, "the cat sat", "--ablate", "3.0")
    assert code == 2 and "--ablate (/interventions/0/layer): layer 3 does not exist" in err, err
    code, _, err = in_process(capsys, "the cat sat", "--patch-from", "a b c")
    assert code == 2 and "--patch-from patches the heads of --ablate" in err, err


def test_the_client_reads_the_intervention():
    from attention_trace import LocalClient

    with LocalClient() as client:
        t = client.trace(
            sentence="the cat sat",
            d_model=8,
            num_heads=2,
            interventions=[{"target": "head_output", "layer": 0, "head": 0}],
        )
        assert t.intervention["max_abs_delta"]["context"] > 0
        assert client.trace(sentence="the cat sat").intervention is None


def test_explain_refuses_interventions(client):
    r = client.post(
        "/explain",
        json={
            "sentence": "the cat sat",
            "d_model": 8,
            "num_heads": 2,
            "query": 1,
            "key": 0,
            "head": 0,
            "interventions": [{"target": "head_output", "layer": 0, "head": 0}],
        },
    )
    assert r.status_code == 422 and r.get_json()["errors"][0]["type"] == "interventions_conflict", r.get_data(True)


def test_the_budget_counts_the_baseline_and_the_second_input():
    from service.routes.trace import TraceRequest

    body = {"sentence": "the cat sat", "d_model": 8, "num_heads": 2, "block": "gpt2", "num_layers": 2}
    plain = TraceRequest.model_validate(body).value_count
    ablated = TraceRequest.model_validate({**body, "interventions": [{"target": "mlp_output", "layer": 1}]})
    patched = TraceRequest.model_validate(
        {
            **body,
            "patch_sentence": "a dog ran",
            "interventions": [{"target": "mlp_output", "layer": 1, "kind": "patch"}],
        }
    )
    assert (ablated.value_count, patched.value_count) == (2 * plain, 3 * plain)


from hypothesis import given, settings  # noqa: E402 (the property below only)
from hypothesis import strategies as st  # noqa: E402 (the property below only)


@st.composite
def _case(draw: st.DrawFn) -> tuple[dict, int, int, int | None, str | None]:
    """A body whose interventions are mostly valid for its configuration; now and then one field is out of range."""
    block = draw(st.sampled_from([None, "gpt2", "llama"]))
    layers = draw(st.integers(1, 3)) if block else 1
    n = draw(st.integers(2, 5))
    patch = draw(st.sampled_from([None, "same", "other"]))
    ivs = []
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(["head_output", "head_pattern", *(("mlp_output", "residual") if block else ())]))
        kind = draw(st.sampled_from(["mean", "patch"] if target == "head_pattern" else ["zero", "mean", "patch"]))
        iv: dict = {
            "target": target,
            "kind": kind,
            "layer": draw(st.integers(0, layers if target == "residual" else layers - 1)),
        }
        if target.startswith("head"):
            iv["head"] = draw(st.integers(0, 3))
        if draw(st.booleans()):
            iv["positions"] = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
        if draw(st.integers(0, 9)) == 0:  # one field out of range
            iv[draw(st.sampled_from(["layer", "positions"]))] = [n] if iv.get("positions") else layers + 1
        ivs.append(iv)
    if any(iv["kind"] == "patch" for iv in ivs) and patch is None:
        patch = "same"
    sentence = " ".join(f"p{i}" for i in range(n + (patch == "other" and draw(st.booleans()))))
    return {"interventions": ivs}, block, layers, n, None if patch is None else sentence


_STATUSES: list[int] = []


@settings(max_examples=60, deadline=None, derandomize=True)
@given(case=_case())
def test_any_intervention_is_answered_or_refused_never_a_500(client, case):
    extra, block, layers, n, patch = case
    ivs = extra["interventions"]
    body: dict = {"tokens": [f"t{i}" for i in range(n)], "d_model": 16, "num_heads": 4, "interventions": ivs}
    if block:
        body |= {"block": block, "num_layers": layers, "lm_head": "tied"}
    if patch:
        body["patch_sentence"] = patch
    r = client.post("/trace", json=body)
    assert r.status_code in (200, 422), r.get_data(True)
    _STATUSES.append(r.status_code)
    doc = r.get_json()
    if r.status_code == 422:
        assert all(e["pointer"].startswith(("/interventions", "/patch_sentence")) for e in doc["errors"]), doc
        return
    # the engine, called directly, gives the same numbers
    config = (
        TraceConfig.preset_config(block, d_model=16, num_heads=4, num_layers=layers, lm_head="tied")
        if block
        else TraceConfig(d_model=16, num_heads=4)
    )
    base = engine.trace(config, tokens=body["tokens"])
    source = engine.trace(config, sentence=patch) if patch else None
    t = intervene(
        base,
        [
            Intervention(
                iv["target"],
                iv["layer"],
                iv["kind"],
                iv.get("head"),
                tuple(iv["positions"]) if "positions" in iv else None,
            )
            for iv in ivs
        ],
        source,
    )
    last = "next_token_probs" if block else "output"
    np.testing.assert_array_equal(np.array(doc["stages"][last]["values"]), t.stages[last].values)
    assert np.isfinite(np.array(doc["stages"]["weights"]["values"], dtype=float)).all()


def test_the_property_above_saw_answers_and_refusals():
    # run after it (pytest keeps the file's order): a property that only ever met 422s would prove little
    if not _STATUSES:
        pytest.skip("run with the property above")
    assert _STATUSES.count(200) >= 10 and _STATUSES.count(422) >= 10, (_STATUSES.count(200), _STATUSES.count(422))
