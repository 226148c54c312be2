"""The Transformer block and the stack in the engine: configuration, weights, stages, sizes and rules.

The numbers themselves are checked against torch and transformers in tests/test_block_torch.py; the known
mistakes in tests/test_block_bugs.py. docs/engine.md ("The Transformer block") documents what is pinned here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import engine
from engine import TraceConfig
from engine.errors import DecodeUnavailableError, InvalidSizeError, StageUnavailableError, VariantConflictError
from engine.layer import (ALL_STAGE_IDS, BLOCK_STAGE_IDS, check_stages, layer_steps, stage_ids, stage_shape,
                          swiglu_width, trace_value_count)
from engine.params import block_parameters_digest
from engine_reference import reference_values

VASWANI = TraceConfig(d_model=8, num_heads=2, block="vaswani2017", num_layers=2, norm_weights="seeded")
GPT2 = TraceConfig.preset_config("gpt2", d_model=8, num_heads=2)
LLAMA = TraceConfig.preset_config("llama", d_model=8, num_heads=2, num_kv_heads=1, d_ff=16)

# docs/engine.md's check values (seed 0, "the cat sat")
CHECK_VALUES = [
    (VASWANI, "norm1_mean", (1, 0), 0.3071378913290354),
    (VASWANI, "norm1_variance", (1, 0), 1.2030786763516483),
    (VASWANI, "norm1", (1, 0, 0), -1.3323575460253623),
    (VASWANI, "residual1", (1, 0, 0), -0.7497994568886979),
    (VASWANI, "ffn_pre_activation", (1, 0, 0), 1.2847956426090061),
    (VASWANI, "ffn_output", (1, 0, 0), -0.9733795177037498),
    (VASWANI, "residual2", (1, 0, 0), -2.305737063729112),
    (VASWANI, "norm2", (1, 0, 0), -2.2312054378547352),
    (VASWANI, "residual_stream", (2, 0, 0), -2.2312054378547352),
    (GPT2, "norm1", (0, 0, 1), 1.4996213095276392),
    (GPT2, "ffn_activation", (0, 0, 1), 0.6903466282418038),
    (GPT2, "residual2", (0, 0, 1), -0.3021614457070688),
    (GPT2, "final_norm_mean", (1,), 0.20780958996161597),
    (GPT2, "final_norm_variance", (1,), 1.1667222611830863),
    (GPT2, "final_norm", (0, 1), 0.10098110235643162),
    (LLAMA, "norm1_mean_square", (0, 1), 0.36400953366873023),
    (LLAMA, "norm1", (0, 0, 1), 1.3272278720962325),
    (LLAMA, "ffn_up", (0, 0, 1), -1.1003902812119886),
    (LLAMA, "ffn_activation", (0, 0, 1), -0.11216430661488017),
    (LLAMA, "ffn_gated", (0, 0, 1), 0.12342451289789569),
    (LLAMA, "ffn_output", (0, 0, 1), 0.30642496313316175),
    (LLAMA, "final_norm_mean_square", (1,), 1.2153463194350018),
    (LLAMA, "final_norm", (0, 1), 1.8461132073677269),
    (TraceConfig(d_model=8, num_heads=2, ffn="gelu"), "ffn_activation", (0, 0, 1), 0.14100108988285454),
]


@pytest.mark.parametrize("config, sid, index, value", CHECK_VALUES,
                         ids=[f"{c.block or c.ffn}-{sid}" for c, sid, _, _ in CHECK_VALUES])
def test_the_documented_check_values(config, sid, index, value):
    got = engine.trace(config, sentence="the cat sat").stages[sid].values[index]
    assert math.isclose(got, value, rel_tol=1e-13, abs_tol=1e-15)


def test_the_seeded_weights_follow_the_documented_keys():
    # Written from docs/engine.md's key table, through the reference's SHAKE-256 steps (not the engine's code).
    p = engine.trace(VASWANI, sentence="the cat sat").parameters
    W_1 = reference_values("attention-trace:v1:W_1:seed=0:d_model=8:d_ff=32:layer=1", 32 * 8, 1 / 8)
    W_2 = reference_values("attention-trace:v1:W_2:seed=0:d_model=8:d_ff=32:layer=0", 8 * 32, 1 / 32)
    W_Q = reference_values("attention-trace:v1:W_Q:seed=0:d_model=8:num_heads=2:layer=1:head=1", 4 * 8, 1 / 8)
    W_O = reference_values("attention-trace:v1:W_O:seed=0:d_model=8:num_heads=2:layer=1", 8 * 8, 1 / 8)
    gamma = reference_values("attention-trace:v1:norm2_gamma:seed=0:d_model=8:layer=1", 8, 1 / 16)
    beta = reference_values("attention-trace:v1:norm1_beta:seed=0:d_model=8:layer=0", 8, 1 / 16)
    assert p.layers[1].W_1.ravel().tolist() == W_1
    assert p.layers[0].W_2.ravel().tolist() == W_2
    assert p.layers[1].attention.W_Q[1].ravel().tolist() == W_Q
    assert p.layers[1].attention.W_O.ravel().tolist() == W_O
    assert p.layers[1].norm2.gamma.tolist() == [1.0 + v for v in gamma]
    assert p.layers[0].norm1.beta.tolist() == beta
    # layer 0's attention is engine 1.0's, key for key
    assert np.array_equal(p.layers[0].attention.W_Q, engine.generate_parameters(0, 8, 2).W_Q)
    # llama's W_3 and the GQA key order (num_kv_heads before layer)
    q = engine.trace(TraceConfig.preset_config("llama", d_model=8, num_heads=2, num_kv_heads=1, d_ff=16,
                                               num_layers=2), sentence="a").parameters
    W_3 = reference_values("attention-trace:v1:W_3:seed=0:d_model=8:d_ff=16:layer=1", 16 * 8, 1 / 8)
    W_K = reference_values("attention-trace:v1:W_K:seed=0:d_model=8:num_heads=2:num_kv_heads=1:layer=1:head=0",
                           4 * 8, 1 / 8)
    assert q.layers[1].W_3.ravel().tolist() == W_3 and q.layers[1].attention.W_K.ravel().tolist() == W_K
    final = reference_values("attention-trace:v1:final_norm_gamma:seed=0:d_model=8", 8, 1 / 16)
    seeded = engine.trace(TraceConfig(d_model=8, num_heads=2, block="gpt2", norm_weights="seeded"),
                          sentence="a").parameters
    assert seeded.final_norm.gamma.tolist() == [1.0 + v for v in final]


def test_unit_norm_weights_and_the_documented_digests():
    p = engine.trace(GPT2, sentence="a").parameters
    assert (p.layers[0].norm1.gamma == 1).all() and (p.layers[0].norm1.beta == 0).all()
    assert p.final_norm is not None and engine.trace(VASWANI, sentence="a").parameters.final_norm is None
    assert engine.trace(LLAMA, sentence="a").parameters.layers[0].norm1.beta is None  # RMSNorm: no bias
    t = engine.trace(VASWANI, sentence="the cat sat")
    assert t.parameters_digest == block_parameters_digest(t.parameters) == \
        "sha256:7b304e679a93564d48b82663344d219b035d1199004f2273b1daebdcc00fee39"
    assert engine.trace(GPT2, sentence="a").parameters_digest == \
        "sha256:26058d544c2f7ad66ed2644648e63d116bce4ba015bc9ed8ca62d0399a2cfd5c"


def test_presets_and_defaults():
    assert (GPT2.norm_kind, GPT2.pre_norm, GPT2.ffn_kind, GPT2.causal, GPT2.eps) == \
        ("layer_norm", True, "gelu_tanh", True, 1e-5)
    assert (LLAMA.norm_kind, LLAMA.pre_norm, LLAMA.ffn_kind, LLAMA.rope, LLAMA.causal, LLAMA.eps) == \
        ("rms_norm", True, "swiglu", True, True, 1e-6)
    v = TraceConfig(block="vaswani2017")
    assert (v.norm_kind, v.pre_norm, v.ffn_kind, v.causal, v.ff_width) == ("layer_norm", False, "relu", False, 96)
    # a block field alone is a 2017 block with that change; the preset's own settings yield to given fields
    assert TraceConfig(ffn="gelu").has_block and TraceConfig(ffn="gelu").norm_kind == "layer_norm"
    assert TraceConfig.preset_config("llama", positional_encoding="sinusoidal").rope is False
    assert TraceConfig(block="llama").rope is False  # the dataclass sets only what it is given
    assert not TraceConfig().has_block and TraceConfig(num_layers=1).n_parameters == TraceConfig().n_parameters
    # Llama's rounding: 2/3 of 4·d_model, up to a multiple of 256 (Llama 7B: 11008, 13B: 13824)
    assert [swiglu_width(d) for d in (8, 768, 4096, 5120)] == [256, 2048, 11008, 13824]
    assert TraceConfig(block="llama", d_model=32).ff_width == 256 and TraceConfig(block="llama", d_ff=40).ff_width == 40


def test_without_a_block_field_the_recipe_and_stages_are_the_attention_layers():
    for kwargs in ({}, {"causal": True, "num_heads": 4}, {"positional_encoding": "rope", "num_heads": 2}):
        config = TraceConfig(**kwargs)
        assert not any("@" in s.name for s in layer_steps(config))
        assert set(stage_ids(config)) <= set(ALL_STAGE_IDS)
        t = engine.trace(config, sentence="the cat sat")
        assert t.stages["weights"].axes[0] == "head" and t.entropy.ndim == 2


@pytest.mark.parametrize("config", [VASWANI, GPT2, LLAMA,
                                    TraceConfig(d_model=12, num_heads=3, norm_position="pre", ffn="swiglu",
                                                norm="layer_norm", d_ff=20, num_layers=3, causal=True, window=2)])
def test_every_stage_has_its_documented_shape_and_the_count_is_exact(config):
    t = engine.trace(config, sentence="the cat sat on")
    n = t.n_tokens
    count = 0
    for sid, st in t.stages.items():
        assert st.shape == stage_shape(sid, config, n), sid
        assert len(st.axes) == len(st.shape) and len(st.axis_tokens) == len(st.shape), sid
        if sid != "tokens":
            count += st.values.size
        assert not isinstance(st.values, np.ndarray) or np.isfinite(st.values).all()
    assert t.entropy.shape == t.max_weight.shape == (config.num_layers, config.num_heads, n)
    count += t.entropy.size + t.max_weight.size
    assert count == trace_value_count(config, n, with_parameters=False)
    assert trace_value_count(config, n, with_parameters=True) - count == config.n_parameters \
        == t.parameters.n_parameters
    assert config.n_matrices == t.parameters.n_matrices
    assert t.stages["residual_stream"].axes == ("depth", "token", "d_model")
    assert t.stages["q"].axes[0] == "layer" and t.stages["input"].axes == ("token", "d_model")
    assert t.stages["residual_stream"].values[0].tolist() == t.stages["input"].values.tolist()


def test_the_layers_chain_and_each_stage_stacks_its_layers():
    t = engine.trace(TraceConfig(d_model=8, num_heads=2, norm_position="pre", num_layers=3), sentence="a b c")
    s = t.stages
    for layer in range(3):
        assert np.array_equal(s["residual_stream"].values[layer + 1], s["residual2"].values[layer])
        assert np.array_equal(s["residual1"].values[layer], s["residual_stream"].values[layer] + s["output"].values[layer])
    # the stages follow the pre-norm block's order: the norm before the attention
    order = list(s)
    assert order.index("norm1") < order.index("q") < order.index("residual1") < order.index("norm2") \
        < order.index("ffn_pre_activation") < order.index("residual2") < order.index("final_norm")
    post = list(engine.trace(VASWANI, sentence="a b").stages)
    assert post.index("output") < post.index("residual1") < post.index("norm1") < post.index("residual2") \
        < post.index("norm2") and "final_norm" not in post


def test_a_layer_norm_of_a_constant_row_gives_its_bias_and_never_divides_by_zero():
    config = TraceConfig(d_model=4, num_heads=1, norm_position="pre", norm_weights="seeded")
    t = engine.trace(config, tokens=["a", "b"], input=np.ones((2, 4)))
    beta = t.parameters.layers[0].norm1.beta
    assert np.array_equal(t.stages["norm1"].values[0], np.tile(beta, (2, 1)))
    assert t.input_source == "explicit" and "token_embedding" not in t.stages


@pytest.mark.parametrize("kwargs, code, field", [
    ({"num_layers": 2}, "layers_need_block", "num_layers"),
    ({"num_layers": 0, "block": "gpt2"}, "invalid_size", "num_layers"),
    ({"num_layers": 97, "block": "gpt2"}, "invalid_size", "num_layers"),
    ({"block": "bert"}, "invalid_size", "block"),
    ({"norm": "batch_norm"}, "invalid_size", "norm"),
    ({"norm_position": "sandwich"}, "invalid_size", "norm_position"),
    ({"ffn": "gelu_new"}, "invalid_size", "ffn"),
    ({"d_ff": 0}, "invalid_size", "d_ff"),
    ({"norm_eps": 0.0}, "invalid_size", "norm_eps"),
    ({"norm_eps": float("nan")}, "invalid_size", "norm_eps"),
    ({"norm_weights": "random"}, "invalid_size", "norm_weights"),
])
def test_each_block_setting_is_checked(kwargs, code, field):
    with pytest.raises((InvalidSizeError, VariantConflictError)) as e:
        TraceConfig(**kwargs)
    assert (e.value.code, e.value.field) == (code, field)


def test_a_block_refuses_cross_attention_and_decoding_and_wrong_stages():
    with pytest.raises(VariantConflictError) as e:
        engine.trace(TraceConfig(block="vaswani2017"), sentence="a b", context_sentence="c d")
    assert e.value.code == "block_cross_attention"
    with pytest.raises(DecodeUnavailableError) as e:
        engine.decode(engine.trace(GPT2, sentence="a b"))
    assert e.value.code == "decode_block"
    with pytest.raises(StageUnavailableError) as e:
        check_stages(["norm1_variance", "final_norm_variance", "weights"], LLAMA, explicit_input=False, field="stages")
    assert [x.code for x in e.value.errors] == ["stage_needs_block", "stage_needs_block"]
    assert "RMSNorm has a mean square" in e.value.message
    with pytest.raises(StageUnavailableError, match="one attention layer"):
        check_stages(["norm1"], TraceConfig(), explicit_input=False, field="stages")
    check_stages(list(stage_ids(LLAMA)), LLAMA, explicit_input=False, field="stages")
    assert set(stage_ids(LLAMA)) - set(ALL_STAGE_IDS) <= set(BLOCK_STAGE_IDS)


def test_the_size_limit_counts_every_layer_and_the_weights():
    one = trace_value_count(TraceConfig(d_model=64, num_heads=4, block="gpt2"), 32, with_parameters=True)
    twelve = trace_value_count(TraceConfig(d_model=64, num_heads=4, block="gpt2", num_layers=12), 32,
                               with_parameters=True)
    final_norm = 2 * 32 + 32 * 64 + 2 * 64  # stats, output and γ, β: once for the stack
    embed = 2 * 32 * 64  # token_embedding, positional_encoding, input, residual_stream[0]: once too, mostly
    assert twelve > 11 * (one - final_norm - embed)
    config = TraceConfig(d_model=8, num_heads=2, block="gpt2", num_layers=4)
    assert config.n_parameters == 4 * (4 * 64 + 2 * 32 * 8 + 4 * 8) + 2 * 8


def test_a_known_mistake_recomputes_from_its_step_and_reuses_the_arrays_before_it():
    t = engine.trace(GPT2, sentence="the cat sat")
    wrong = engine.recompute(t, engine.bugs.ALL_BUGS["gelu_approximation_swapped"])
    for name in ("norm1@0", "q@0", "weights@0", "residual1@0", "ffn_pre_activation@0"):
        assert wrong.state[name] is t.state[name]
    assert not np.array_equal(wrong.stages["ffn_activation"].values, t.stages["ffn_activation"].values)
    assert np.abs(wrong.stages["ffn_activation"].values - t.stages["ffn_activation"].values).max() < 1e-3


def test_docs_engine_md_gives_these_check_values_and_keys():
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "engine.md").read_text(encoding="utf-8")
    section = doc.split("## The Transformer block", 1)[1].split("## Versions and reproducibility", 1)[0]
    for config, sid, index, value in CHECK_VALUES:
        assert f"`{value!r}`" in section, (sid, value)
    p = engine.trace(VASWANI, sentence="the cat sat").parameters
    for value in (p.layers[0].W_1[0, 0], p.layers[0].W_2[0, 0], p.layers[1].attention.W_Q[0, 0, 0],
                  p.layers[1].attention.W_O[0, 0], p.layers[0].norm1.gamma[0], p.layers[0].norm1.beta[0],
                  engine.trace(LLAMA, sentence="a").parameters.layers[0].W_3[0, 0]):
        assert f"`{float(value)!r}`" in section, value
    for name in engine.bugs.BLOCK_BUGS:
        assert f"| `{name}` | `{engine.bugs.BLOCK_BUGS[name].stage}` |" in section, name
