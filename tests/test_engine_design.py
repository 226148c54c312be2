"""The engine's design: mistakes are data, each rule has one home, a trace recomputes from any step.

docs/engine.md ("How the engine is built") describes what these tests hold in place.
"""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import engine
from engine import BUGS, TraceConfig
from engine.bugs import refusal
from engine.checks import check_trace_size
from engine.layer import check_stages, formulas, initial_state, layer_steps, run, trace_value_count

ROOT = Path(__file__).resolve().parent.parent

# Sizes where the mistakes' edge cases live: one head (d_k = d_model), d_k = 1, d_model = 1.
SIZES = [(24, 1), (24, 4), (4, 4), (1, 1), (6, 2)]
CASES = [(TraceConfig(d_model=d, num_heads=h, scale=scale, causal=causal), sentence)
         for (d, h), scale, causal, sentence in itertools.product(SIZES, (True, False), (True, False),
                                                                   ("a", "the cat sat"))]


# ------------------------------------------------------- the v1 defect, now a test


@pytest.mark.parametrize("bug", ["no_scale", "double_scale", "scale_after_softmax"])
def test_a_scaling_bug_with_scale_off_is_refused_with_the_reason(client, bug):
    # v1 answered 200 with the correct numbers, labelled "deliberately wrong", under false formulas.
    body = {"sentence": "the cat sat", "d_model": 24, "num_heads": 4, "scale": False, "inject_bug": bug}
    resp = client.post("/trace", json=body)
    assert resp.status_code == 422 and resp.mimetype == "application/problem+json"
    message = (f"the {bug} bug changes no number of this trace: with scale: false the scores are not divided "
               "at all; choose another bug or configuration")
    assert resp.get_json()["errors"] == [{"pointer": "/inject_bug", "type": "bug_changes_nothing", "message": message}]
    with pytest.raises(engine.BugNotApplicableError) as exc:
        engine.trace(TraceConfig(d_model=24, num_heads=4, scale=False), sentence="the cat sat", bug=bug)
    assert exc.value.message == message


@pytest.mark.parametrize("config, sentence", CASES, ids=lambda c: str(c) if isinstance(c, str) else
                         f"d{c.d_model}h{c.num_heads}{'s' if c.scale else ''}{'c' if c.causal else ''}")
def test_a_bug_is_refused_exactly_when_it_would_change_no_number(config, sentence):
    # Each bug's own rule (refuse) against the numbers themselves, both ways:
    # never refuse a bug that shows something, never label correct numbers as wrong.
    t = engine.trace(config, sentence=sentence)
    for bug in BUGS.values():
        refused = refusal(bug, config, t.n_tokens)
        if refused is not None and refused.code != "bug_changes_nothing":
            assert refused.code == "bug_not_applicable" or (refused.code == "bug_needs_causal" and not config.causal)
            continue
        unchanged = engine.same_numbers(engine.recompute(t, bug), t, list(t.stages))
        assert (refused is not None) == unchanged, (bug.name, refused)
        if refused is None:
            assert engine.trace(config, sentence=sentence, bug=bug.name).bug == bug.name
        else:
            with pytest.raises(engine.BugNotApplicableError):
                engine.trace(config, sentence=sentence, bug=bug.name)


def test_a_bug_that_changes_nothing_for_these_numbers_is_refused_too():
    # The configuration allows no_scale, but with zero queries every score is 0 whatever the divisor.
    params = engine.explicit_parameters(np.zeros((1, 2, 2)), np.eye(2)[None], np.eye(2)[None], np.eye(2),
                                        d_model=2, num_heads=1)
    with pytest.raises(engine.BugNotApplicableError, match="with this input and these weights"):
        engine.trace(TraceConfig(d_model=2), tokens=["a", "b"], input=np.eye(2), parameters=params, bug="no_scale")


# ------------------------------------------------------------ recompute from a step


@pytest.mark.parametrize("name", list(BUGS))
def test_recomputing_from_a_bugs_step_equals_a_full_run_and_reuses_the_arrays_before_it(name):
    config = TraceConfig(d_model=24, num_heads=4, causal=True)
    t = engine.trace(config, sentence="the cat sat on the mat")
    bug = BUGS[name]
    wrong = engine.recompute(t, bug)

    # The same swapped steps, every one of them run from the start.
    swap = {s.name: s for s in bug.replaces}
    steps = tuple(swap.get(s.name, s) for s in layer_steps(config))
    state = initial_state(config, t.state["tokens"], vars(t.parameters))
    run(steps, state)
    for sid, stage in wrong.stages.items():
        if sid != "tokens":
            assert np.array_equal(stage.values, state[sid]), sid
        assert stage.formula == formulas(steps)[sid]

    first = min(i for i, s in enumerate(steps) if s.name in swap)
    for step in steps[:first]:
        for out in step.writes:
            assert wrong.state[out] is t.state[out], f"{out} was recomputed, not reused"
    # ...and the first stage it changes is the one the bug declares.
    changed = [sid for sid in t.stages if sid != "tokens" and not (
        wrong.stages[sid].shape == t.stages[sid].shape and np.array_equal(wrong.stages[sid].values, t.stages[sid].values)
        and np.array_equal(wrong.stages[sid].mask, t.stages[sid].mask))]
    assert changed[0] == bug.stage


def test_a_recomputed_trace_leaves_the_original_untouched():
    t = engine.trace(TraceConfig(d_model=8, num_heads=2, causal=True), sentence="a b c")
    before = {k: np.array(v) for k, v in t.state.items() if isinstance(v, np.ndarray)}
    for bug in BUGS.values():
        engine.recompute(t, bug)
    assert all(np.array_equal(t.state[k], v) for k, v in before.items())


# ------------------------------------------------------------------ mistakes as data


def _generated(part: str) -> bool:
    """A directory that tools and test runs make (hidden ones: .venv, .git, .hypothesis, .pytest_cache …)."""
    return (part.startswith(".") or part in {"__pycache__", "build", "dist", "artifacts", "node_modules"}
            or part.endswith(".egg-info"))


def _code_files() -> list[Path]:
    """Every tracked file that is code (not tests, docs, the spec or data)."""
    try:
        names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        files = [ROOT / n for n in names.splitlines()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist, an archive): the source files
        files = [p for p in ROOT.rglob("*") if not any(_generated(part) for part in p.relative_to(ROOT).parts)]
    skip_dirs = {"tests", "docs"}
    skip_ext = {".md", ".yaml", ".yml", ".json", ".png", ".txt", ".toml", ".ico", ".svg", ".cfg", ".ini"}
    # examples/*/students/ are sample submissions, one per known bug and named after it: test fixtures.
    return [p for p in files if p.is_file() and not skip_dirs & set(p.relative_to(ROOT).parts)
            and "students" not in p.relative_to(ROOT).parts
            and p.suffix not in skip_ext and p.relative_to(ROOT).as_posix() != "engine/bugs.py"]


def test_no_bug_name_appears_in_code_outside_engine_bugs():
    names = re.compile(r"\b(" + "|".join(map(re.escape, BUGS)) + r")\b")
    files = _code_files()
    assert any(p.name == "core.py" for p in files) and any(p.name == "tracing.py" for p in files)
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in files
             for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if names.search(line)]
    assert not found, "bug names belong in engine/bugs.py only:\n" + "\n".join(found)


def test_every_bug_swaps_steps_that_the_layer_has():
    for config in (TraceConfig(causal=True), TraceConfig(num_heads=4, causal=True)):
        names = {s.name for s in layer_steps(config)}
        for bug in BUGS.values():
            assert {s.name for s in bug.replaces} <= names, bug.name
            assert bug.summary and bug.stage in engine.STAGE_IDS


# --------------------------------------------------------------- one home per rule


def _one_error(resp) -> tuple[str, str, str]:
    assert resp.status_code == 422, resp.get_data(as_text=True)
    errors = resp.get_json()["errors"]
    assert len(errors) == 1, errors
    return errors[0]["pointer"], errors[0]["type"], errors[0]["message"]


def _engine_error(call) -> tuple[str, str, str]:
    with pytest.raises(engine.EngineError) as exc:
        call()
    return exc.value.pointer, exc.value.code, exc.value.message


W = {"W_Q": np.zeros((1, 24, 24)), "W_K": np.zeros((1, 24, 24)), "W_V": np.zeros((1, 24, 24)), "W_O": np.zeros((24, 24))}
RULES = {
    "head division": ({"sentence": "a", "num_heads": 5}, lambda: TraceConfig(num_heads=5)),
    "one source": ({"sentence": "a", "tokens": ["a"]}, lambda: engine.trace(TraceConfig(), sentence="a", tokens=["a"])),
    "no source": ({}, lambda: engine.trace(TraceConfig())),
    "blank sentence": ({"sentence": " \t"}, lambda: engine.trace(TraceConfig(), sentence=" \t")),
    "blank token": ({"tokens": ["a", "  "]}, lambda: engine.trace(TraceConfig(), tokens=["a", "  "])),
    "token list limit": ({"tokens": ["a"] * 257}, lambda: engine.trace(TraceConfig(), tokens=["a"] * 257)),
    "sentence limit": ({"sentence": "a " * 257}, lambda: engine.trace(TraceConfig(), sentence="a " * 257)),
    "input shape": ({"sentence": "a b", "input": [[0.0] * 24]},
                    lambda: engine.trace(TraceConfig(), sentence="a b", input=np.zeros((1, 24)))),
    "ragged input": ({"sentence": "a b", "input": [[0.0] * 24, [0.0]]},
                     lambda: engine.trace(TraceConfig(), sentence="a b", input=[[0.0] * 24, [0.0]])),
    "parameter shape": ({"sentence": "a", "parameters": {k: v.tolist() for k, v in (W | {"W_K": np.zeros((1, 24, 2))}).items()}},
                        lambda: engine.explicit_parameters(**(W | {"W_K": np.zeros((1, 24, 2))}), d_model=24,
                                                           num_heads=1)),
    "stage needs causal": ({"sentence": "a", "stages": ["masked_scores"]},
                           lambda: check_stages(["masked_scores"], TraceConfig(), explicit_input=False,
                                                field="stages")),
    "stage not computed": ({"sentence": "a", "input": [[0.0] * 24], "submission": {"token_embedding": [[0.0] * 24]}},
                           lambda: check_stages(["token_embedding"], TraceConfig(), explicit_input=True,
                                                field="submission", keyed=True)),
    "bug needs causal": ({"sentence": "a b", "inject_bug": "finite_mask_fill"},
                         lambda: engine.trace(TraceConfig(), sentence="a b", bug="finite_mask_fill")),
    "bug changes nothing": ({"sentence": "a b", "inject_bug": "average_heads"},
                            lambda: engine.trace(TraceConfig(), sentence="a b", bug="average_heads")),
    "trace size": ({"tokens": ["a"] * 256, "d_model": 512, "num_heads": 64},
                   lambda: check_trace_size(trace_value_count(TraceConfig(d_model=512, num_heads=64), 256,
                                                              with_parameters=False), 2_500_000,
                                            n=256, d_model=512, num_heads=64)),
}


@pytest.mark.integration  # starts another process
@pytest.mark.parametrize("rule", list(RULES))
def test_the_service_and_the_engine_enforce_each_rule_with_the_same_words(client, rule):
    body, call = RULES[rule]
    path = "/check" if "submission" in body else "/trace"
    assert _one_error(client.post(path, json=body)) == _engine_error(call)


def test_one_handler_turns_any_engine_error_into_the_same_422(client, monkeypatch):
    from service.models import TraceSpec

    def overflow(*args, **kwargs):
        raise engine.NumericOverflowError("the explicit input and parameters overflow float64; use smaller values")

    monkeypatch.setattr(TraceSpec, "run_trace", overflow)
    expected = {"pointer": "/input", "type": "numeric_overflow",
                "message": "the explicit input and parameters overflow float64; use smaller values"}
    for path, body in (("/trace", {"sentence": "a"}), ("/check", {"sentence": "a", "submission": {"tokens": ["a"]}})):
        resp = client.post(path, json=body)
        assert resp.status_code == 422 and resp.mimetype == "application/problem+json"
        assert resp.get_json()["errors"] == [expected]
        item = client.post(path + "/batch", json={"items": [body]}).get_json()["results"][0]
        assert item["status"] == 422 and item["problem"]["errors"] == [{**expected, "pointer": "/items/0/input"}]
        assert item["problem"]["detail"] == resp.get_json()["detail"]


# -------------------------------------------------------- LocalClient is the service


def test_local_client_answers_through_the_app_itself():
    from attention_trace import LocalClient

    local = LocalClient()
    t = local.trace(sentence="the cat sat", d_model=8, num_heads=2, request_id="design-test-1")
    assert t.request_id == "design-test-1"  # the app's own request-id middleware answered
    raw = local._http.post("/trace", json={"sentence": "the cat sat", "d_model": 8, "num_heads": 2})
    assert np.array_equal(t.array("weights"), np.array(raw.get_json()["stages"]["weights"]["values"]))


def test_the_check_values_docs_engine_md_gives_to_ports():
    import hashlib

    from engine.params import stream_key, token_embedding_vector

    doc = (ROOT / "docs" / "engine.md").read_text(encoding="utf-8")
    key = stream_key("embedding", seed=0, d_model=24, text="the")
    assert key == "attention-trace:v1:embedding:seed=0:d_model=24:text=the"
    values = {
        hashlib.shake_256(key.encode()).hexdigest(8),
        repr(float(token_embedding_vector(0, 24, "the")[0])),
        repr(float(engine.generate_parameters(0, 24, 4).W_Q[0, 0, 0])),
        engine.trace(TraceConfig(d_model=24, num_heads=4), sentence="the cat sat").parameters_digest,
    }
    assert all(f"`{v}`" in doc for v in values), values
    for text, tokens in (("你\u200d好", ["你", "\u200d", "好"]), ("a\u200db", ["a\u200db"]),
                         ("café's", ["café", "'", "s"]), ("ー漢字かなカナabc", ["ー", "漢", "字", "か", "な", "カ", "ナ", "abc"])):
        assert [t.text for t in engine.tokenize(text)] == tokens


# ------------------------------------------------------------------ one recipe, printed


def test_decoding_runs_the_full_traces_recipe_with_a_cache():
    """Decoding's steps are the full trace's from the projections on, with the cache between the rotation and
    the scores, and no mask (the cache holds only the visible keys): one recipe, two uses."""
    from engine.layer import decode_steps

    for kwargs in (dict(causal=True), dict(d_model=16, num_heads=4, num_kv_heads=2, causal=True, window=2,
                                           positional_encoding="rope")):
        config = TraceConfig(**kwargs)
        full = [s.name for s in layer_steps(config)]
        dec = [s.name for s in decode_steps(config)]
        cached = [n for n in dec if n not in ("k_cache", "v_cache")]
        assert cached == full[full.index("q"):], (full, dec)
        assert dec.index("k_cache") < dec.index("scores")
        assert {s.fn for s in decode_steps(config)} - {s.fn for s in layer_steps(config)} <= {
            s.fn for s in decode_steps(config) if s.name in ("k_cache", "v_cache", "rope_angles", "mask")}


def test_the_recipe_of_any_configuration_prints(capsys):
    from engine import recipe

    assert recipe.main(["--d-model", "8", "--heads", "2", "--rope"]) == 0
    out = capsys.readouterr().out
    assert "q_rotated" in out and "RoPE(Q)RoPE(K)ᵀ/√d_k" in out and "positional_encoding " not in out.split("\n", 2)[2]
    assert recipe.main(["--heads", "4", "--kv-heads", "2", "--causal", "--window", "3", "--decode"]) == 0
    out = capsys.readouterr().out
    assert "append_to_window_cache(k_cache, k, window)" in out and "share_kv_heads(k_cache, kv_group)" in out
    assert recipe.main(["--causal", "--bug", "mask_includes_diagonal"]) == 0
    assert "✗ masked_scores, excluded" in capsys.readouterr().out
    assert recipe.main(["--bug", "no_scale", "--no-scale"]) == 2
    assert "changes no number" in capsys.readouterr().err


def test_a_stage_made_on_the_fast_path_is_the_dataclasss_own():
    """engine.tracing._stage fills a Stage without its frozen __init__ (one per stage of every trace): it gives
    every field of the dataclass, and the object equals Stage(...) made the ordinary way. A field added to Stage
    and not to _stage fails here, not as a missing attribute in an answer."""
    import dataclasses

    from engine.tracing import STAGE_INFO, Stage, _stage

    values, mask = np.arange(6.0).reshape(2, 3), np.eye(2, 3, dtype=bool)
    args = (STAGE_INFO["scores"], "Q·Kᵀ", values, mask, ("head", "query"), ("tokens", None))
    fast, ordinary = _stage(*args), Stage(*args)
    assert set(vars(fast)) == {f.name for f in dataclasses.fields(Stage)}
    assert fast == ordinary and type(fast) is Stage and fast.shape == (2, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.formula = "x"
