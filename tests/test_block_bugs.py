"""The block's known mistakes are the mistakes students make: a Transformer stack written here independently, the
way a student writes it in numpy (a layer_norm, an ffn and a block function), with one mistake at a time, is
named by the engine's diagnosis on four configurations.

The student code shares nothing with engine/ (no step functions, no bug steps): a mistake's numbers match only if
engine/bugs.py computes what its summary says.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import engine
from engine import TraceConfig
from engine.bugs import ALL_BUGS, BLOCK_BUGS, BUGS, LM_BUGS, check_bug, refusal
from engine.errors import BugNotApplicableError

SENTENCE = "the cat sat on the mat"

CONFIGS = {
    "vaswani2017": TraceConfig(d_model=24, num_heads=4, block="vaswani2017", num_layers=2, norm_weights="seeded"),
    "gpt2": TraceConfig.preset_config("gpt2", d_model=24, num_heads=4, num_layers=2, norm_weights="seeded"),
    "llama": TraceConfig.preset_config("llama", d_model=32, num_heads=4, num_kv_heads=2, num_layers=2,
                                       norm_weights="seeded", d_ff=48),
    "post-gelu": TraceConfig(d_model=16, num_heads=2, norm_position="post", ffn="gelu", num_layers=3, seed=5,
                             causal=True),
}


# ---------------------------------------------------------------- a student's stack


def layer_norm(x, gamma, beta, eps, mistake=None):
    """LayerNorm over the features; returns the output and the statistics the student reports."""
    axis = 0 if mistake == "norm_over_tokens" else -1
    mu = x.mean(axis=axis, keepdims=True)
    var = x.var(axis=axis, keepdims=True, ddof=1 if mistake == "unbiased_variance" else 0)
    denom = np.sqrt(var) + eps if mistake == "eps_outside_sqrt" else np.sqrt(var + eps)
    stats = {} if mistake == "norm_over_tokens" else {"mean": mu[:, 0], "variance": var[:, 0]}
    return (x - mu) / denom * gamma + beta, stats


def rms_norm(x, gamma, eps, mistake=None):
    axis = 0 if mistake == "norm_over_tokens" else -1
    ms = (x ** 2).mean(axis=axis, keepdims=True)
    denom = np.sqrt(ms) + eps if mistake == "eps_outside_sqrt" else np.sqrt(ms + eps)
    stats = {} if mistake == "norm_over_tokens" else {"mean_square": ms[:, 0]}
    return x / denom * gamma, stats


def gelu_exact(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def ffn(x, p, kind, mistake=None):
    """The feed-forward network; returns its stages."""
    out = {"ffn_pre_activation": x @ p["W_1"].T}
    if kind == "swiglu":
        out["ffn_up"] = x @ p["W_3"].T
        gate, up = out["ffn_pre_activation"], out["ffn_up"]
        if mistake == "swiglu_gate_up_swapped":
            gate, up = up, gate
        silu = gate / (1 + np.exp(-gate))
        out["ffn_activation"] = gate if mistake == "ffn_without_activation" else silu
        out["ffn_gated"] = out["ffn_activation"] * up
        hidden = out["ffn_gated"]
    else:
        if mistake == "gelu_approximation_swapped":
            kind = {"gelu": "gelu_tanh", "gelu_tanh": "gelu"}[kind]
        act = {"relu": lambda z: np.maximum(z, 0), "gelu": gelu_exact, "gelu_tanh": gelu_tanh}[kind]
        pre = out["ffn_pre_activation"]
        out["ffn_activation"] = pre if mistake == "ffn_without_activation" else act(pre)
        hidden = out["ffn_activation"]
    out["ffn_output"] = hidden @ p["W_2"].T
    return out


def attention(x, p, cfg):
    """Multi-head (grouped-query) self-attention with the causal mask and rotate-half RoPE when asked."""
    h, g, d_k = cfg.num_heads, cfg.kv_heads, cfg.d_k
    n = x.shape[0]
    q = (x @ p["W_Q"].reshape(h * d_k, -1).T).reshape(n, h, d_k).transpose(1, 0, 2)
    k = (x @ p["W_K"].reshape(g * d_k, -1).T).reshape(n, g, d_k).transpose(1, 0, 2)
    v = (x @ p["W_V"].reshape(g * d_k, -1).T).reshape(n, g, d_k).transpose(1, 0, 2)
    out = {"q": q, "k": k, "v": v}
    if cfg.rope:
        inv = cfg.rope_base ** (-np.arange(0, d_k, 2) / d_k)
        ang = np.arange(n)[:, None] * inv[None, :]
        cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

        def rot(t):
            return t * cos + np.concatenate([-t[..., d_k // 2:], t[..., :d_k // 2]], -1) * sin
        q, k = rot(q), rot(k)
        out |= {"q_rotated": q, "k_rotated": k}
    k, v = np.repeat(k, h // g, axis=0), np.repeat(v, h // g, axis=0)
    s = q @ k.transpose(0, 2, 1)
    out["scores"] = s
    s = s / math.sqrt(d_k)
    out["scaled_scores"] = s
    if cfg.causal:
        s = np.where(np.triu(np.ones((n, n), bool), 1), -np.inf, s)
    e = np.exp(s - s.max(-1, keepdims=True))
    w = e / e.sum(-1, keepdims=True)
    out["weights"] = w
    out["context"] = w @ v
    out["concat"] = np.concatenate(list(out["context"]), axis=-1)
    out["output"] = out["concat"] @ p["W_O"].T
    return out


def student_stack(x, params, cfg, mistake=None):
    """The student's stack: its stages, each layer's stacked, as the trace lays them out."""
    pre = cfg.pre_norm
    if mistake == "pre_norm_for_post_norm":
        pre = True
    elif mistake == "post_norm_for_pre_norm":
        pre = False
    eps, kind = cfg.eps, cfg.norm_kind

    def norm(z, which, p):
        if kind == "layer_norm":
            y, stats = layer_norm(z, p[f"{which}_gamma"], p[f"{which}_beta"], eps, mistake)
        else:
            y, stats = rms_norm(z, p[f"{which}_gamma"], eps, mistake)
        return y, {f"{which}_{k}": v for k, v in stats.items()} | {which: y}

    def add(stream, sub):
        return sub if mistake == "residual_forgotten" else stream + sub

    layers, streams = [], [x]
    for p in params:
        st = {}
        if pre:
            a, s1 = norm(x, "norm1", p)
            st |= s1 | attention(a, p, cfg)
            h = add(x, st["output"])
            b, s2 = norm(h, "norm2", p)
            st |= s2 | ffn(b, p, cfg.ffn_kind, mistake)
            x = add(h, st["ffn_output"])
            st |= {"residual1": h, "residual2": x}
        else:
            st |= attention(x, p, cfg)
            y = add(x, st["output"])
            h, s1 = norm(y, "norm1", p)
            st |= s1 | ffn(h, p, cfg.ffn_kind, mistake)
            z = add(h, st["ffn_output"])
            x, s2 = norm(z, "norm2", p)
            st |= s2 | {"residual1": y, "residual2": z}
        layers.append(st)
        streams.append(x)
    out = {sid: np.stack([st[sid] for st in layers]) for sid in layers[0]}
    out["residual_stream"] = np.stack(streams)
    if cfg.final_norm:
        if mistake == "final_norm_forgotten":
            out["final_norm"] = x
        else:
            f = {"final_norm_gamma": params[0]["final_norm_gamma"], "final_norm_beta": params[0].get("final_norm_beta")}
            y, stats = norm(x, "final_norm", f)
            out |= stats
    return out


def student_params(t: engine.Trace) -> list[dict[str, np.ndarray]]:
    """The weights as a grader hands them out (the answer's ``parameters``), one dict per layer."""
    stacked = t.parameters.stacked()
    layers = [{name: a[i] for name, a in stacked.items() if not name.startswith("final_norm")}
              for i in range(t.num_layers)]
    for p in layers:
        p |= {name: a for name, a in stacked.items() if name.startswith("final_norm")}
    return layers


# ---------------------------------------------------------------- /check's diagnosis, engine side


def _agrees(sub: dict[str, np.ndarray]):
    def agrees(values, sids):
        for sid in sids:
            got = values[sid]
            if got is None or got.shape != sub[sid].shape or not np.allclose(sub[sid], got, rtol=1e-7, atol=1e-9):
                return False
        return True
    return agrees


def diagnose(t: engine.Trace, sub: dict[str, np.ndarray]) -> tuple[str | None, list[str]]:
    """What /check does with a submission: the first wrong stage, and the bugs that reproduce it."""
    order = [sid for sid in t.stages if sid in sub]
    first = next((sid for sid in order
                  if sub[sid].shape != t.stages[sid].shape
                  or not np.allclose(sub[sid], t.stages[sid].values, rtol=1e-7, atol=1e-9)), None)
    if first is None:
        return None, []
    return first, engine.diagnose(t, first, order, _agrees(sub))


@pytest.mark.parametrize("name", CONFIGS)
def test_a_correct_student_stack_passes_and_every_block_mistake_is_named(name):
    config = CONFIGS[name]
    t = engine.trace(config, sentence=SENTENCE)
    x, params = t.stages["input"].values, student_params(t)
    correct = student_stack(x, params, config)
    assert diagnose(t, correct) == (None, [])
    named = []
    for bug in BLOCK_BUGS.values():
        if refusal(bug, config, t.n_tokens) is not None:
            continue
        sub = student_stack(x, params, config, bug.name)
        first, matches = diagnose(t, sub)
        assert first is not None, bug.name
        assert matches and matches[0] == bug.name, (bug.name, first, matches)
        # Stages stack every layer, so a later layer's q can be the first wrong stage id; the bug's own stage
        # is wrong in the student's numbers either way.
        own = t.stages[bug.stage].values
        assert sub[bug.stage].shape != own.shape or not np.allclose(sub[bug.stage], own), (bug.name, first)
        named.append(bug.name)
    assert len(named) >= 6, named


def test_every_block_mistake_is_named_on_four_configurations():
    named = {name: 0 for name in BLOCK_BUGS}
    for config in CONFIGS.values():
        for bug in BLOCK_BUGS.values():
            named[bug.name] += refusal(bug, config, 6) is None
    # each applies (and the test above names it) on at least one of the four; most on all four
    assert all(count >= 1 for count in named.values()), named
    assert sum(named.values()) >= 26, named


def test_each_block_mistake_is_refused_exactly_where_it_changes_nothing_or_cannot_show():
    for config in [*CONFIGS.values(), TraceConfig(d_model=8, num_heads=2, norm="rms_norm", ffn="swiglu", d_ff=8),
                   TraceConfig(d_model=8, num_heads=2, norm_position="pre", ffn="gelu_tanh", num_layers=2)]:
        for sentence in ("a", "the cat sat"):
            t = engine.trace(config, sentence=sentence)
            for bug in BLOCK_BUGS.values():
                refused = refusal(bug, config, t.n_tokens)
                if refused is not None:
                    assert refused.code == "bug_not_applicable", (bug.name, refused)
                    continue
                wrong = engine.recompute(t, bug)
                assert not engine.same_numbers(wrong, t, list(t.stages)), bug.name
                assert wrong.stages[bug.stage].formula != t.stages[bug.stage].formula or bug.name in (
                    "pre_norm_for_post_norm", "post_norm_for_pre_norm", "norm_over_tokens"), bug.name


def test_a_trace_without_a_block_knows_only_the_attention_mistakes():
    config = TraceConfig(d_model=24, num_heads=4, causal=True)
    assert [b.name for b in engine.applicable_bugs(config, 3)] == [b.name for b in BUGS.values()
                                                                   if refusal(b, config, 3) is None]
    with pytest.raises(BugNotApplicableError, match="a Transformer block"):
        check_bug("residual_forgotten", config, 3)
    with pytest.raises(engine.UnknownBugError) as e:
        check_bug("off_by_one", config, 3)
    assert "residual_forgotten" not in e.value.message
    assert set(ALL_BUGS) == set(BUGS) | set(BLOCK_BUGS) | set(LM_BUGS) and not set(BUGS) & set(BLOCK_BUGS)
    assert not (set(BUGS) | set(BLOCK_BUGS)) & set(LM_BUGS)


@pytest.mark.parametrize("bug, config, reason", [
    ("unbiased_variance", CONFIGS["llama"], "RMSNorm has no variance"),
    ("pre_norm_for_post_norm", CONFIGS["gpt2"], "pre-norm already"),
    ("post_norm_for_pre_norm", CONFIGS["vaswani2017"], "post-norm already"),
    ("gelu_approximation_swapped", CONFIGS["vaswani2017"], "no GELU"),
    ("swiglu_gate_up_swapped", CONFIGS["gpt2"], "no gate"),
    ("final_norm_forgotten", CONFIGS["vaswani2017"], "no final norm"),
])
def test_a_block_mistake_that_cannot_show_says_why(bug, config, reason):
    with pytest.raises(BugNotApplicableError, match=reason) as e:
        engine.trace(config, sentence=SENTENCE, bug=bug)
    assert e.value.code == "bug_not_applicable"


def test_an_injected_block_mistake_shows_in_the_formulas():
    t = engine.trace(CONFIGS["gpt2"], sentence=SENTENCE, bug="eps_outside_sqrt")
    assert t.bug == "eps_outside_sqrt"
    assert t.stages["norm1"].formula.startswith("LN₁(x) = γ₁ ⊙ (x − μ)/(√σ² + ε) + β₁")
    assert t.stages["final_norm"].formula.startswith("LN_f(x_L) = γ_f ⊙ (x_L − μ)/(√σ² + ε) + β_f")
    t = engine.trace(CONFIGS["vaswani2017"], sentence=SENTENCE, bug="residual_forgotten")
    assert t.stages["residual1"].formula.startswith("y = MHA(x)") and t.stages["residual2"].formula.startswith("z = FFN(h)")
    t = engine.trace(CONFIGS["llama"], sentence=SENTENCE, bug="swiglu_gate_up_swapped")
    assert t.stages["ffn_activation"].formula.startswith("SiLU(RMSNorm₂(h)·W_3ᵀ)")
