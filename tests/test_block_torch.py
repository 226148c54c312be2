"""The Transformer block and the stack against PyTorch's and transformers' own blocks, in float64.

Three independent references, each built in code (no hub download) with the engine's weights loaded:

* ``torch.nn.TransformerEncoderLayer`` (post-norm and ``norm_first``, ReLU and GELU, ``dropout=0``, no linear
  biases), stacked, with a final ``torch.nn.LayerNorm`` under pre-norm;
* transformers' ``GPT2Block`` (pre-norm LayerNorm, gelu_new, Conv1D weights [in, out]) and a final LayerNorm;
* transformers' ``LlamaDecoderLayer`` (RMSNorm, SwiGLU, RoPE, GQA) with the SDPA attention, float64 rotary
  angles passed as ``position_embeddings`` (by the library's own definition: ``cat(freqs, freqs)``, cos, sin),
  and its RMSNorm's formula computed in the input's dtype: as shipped, the norm casts to float32, which limits
  agreement to ~1e-7 (``test_llama_rms_norm_as_shipped_computes_in_float32`` shows it).

Forward hooks read every stage a reference exposes (each norm's input and output, the attention's output and,
where it returns them, its weights, the FFN's projections and activation, each layer's output); the norms'
statistics are torch's ``var_mean`` of the hooked norm input. Every one is compared with the engine's stage to
1e-10 of the stage's scale. torch and transformers are imported when the first test runs, as in
tests/test_variants_torch.py (see there why).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import engine
from bench.torch_compare import load_gpt2_block
from engine import TraceConfig

torch: Any = None
SENTENCE = "the cat sat on the mat because it was warm"


@pytest.fixture(scope="module")
def th():
    global torch
    try:
        import torch
        import transformers  # noqa: F401 (only whether it is installed)
    except ImportError:
        pytest.fail("tests/test_block_torch.py needs torch==2.13.0 (CPU build) and transformers==5.24.0 from "
                    "requirements-dev.txt: `make install-test`", pytrace=False)
    return torch


def T(a: np.ndarray):
    return torch.from_numpy(np.array(a, dtype=np.float64))


def assert_close(actual: np.ndarray, expected: np.ndarray, what: str, errors: dict[str, float] | None = None) -> None:
    assert actual.shape == expected.shape, f"{what}: {actual.shape} != reference {expected.shape}"
    err = float(np.abs(actual - expected).max(initial=0.0))
    if errors is not None:
        errors[what] = max(errors.get(what, 0.0), err)
    atol = 1e-10 * max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=1e-10, atol=atol, err_msg=what)


class Hooks:
    """Forward hooks that keep what modules read (``pre``) and return (``post``), by name."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}
        self.handles: list[Any] = []

    def output(self, module: Any, name: str, pick: int | None = None) -> None:
        def hook(_m: Any, _args: Any, out: Any) -> None:
            self.seen[name] = (out if pick is None else out[pick]).detach().clone()
        self.handles.append(module.register_forward_hook(hook))

    def input(self, module: Any, name: str) -> None:
        def hook(_m: Any, args: Any) -> None:
            self.seen[name] = args[0].detach().clone()
        self.handles.append(module.register_forward_pre_hook(hook))

    def __getitem__(self, name: str) -> np.ndarray:
        return self.seen[name][0].numpy() if self.seen[name].dim() >= 3 else self.seen[name].numpy()


def norm_stats(x: np.ndarray, norm_kind: str) -> dict[str, np.ndarray]:
    """The statistics torch computes for a norm of x [n, d]: var_mean (biased) or the mean square."""
    xs = T(x)
    if norm_kind == "layer_norm":
        var, mean = torch.var_mean(xs, dim=-1, unbiased=False)
        return {"mean": mean.numpy(), "variance": var.numpy()}
    return {"mean_square": xs.pow(2).mean(-1).numpy()}


def compare_layer(t: engine.Trace, layer: int, ref: dict[str, np.ndarray], errors: dict[str, float]) -> None:
    """Each reference stage of ``layer`` against the engine's (its row of the stacked stage), and the norms'
    statistics from the hooked norm inputs."""
    for sid, expected in ref.items():
        if sid.endswith("_input"):
            continue
        assert_close(t.stages[sid].values[layer], expected, sid, errors)
    kind = t.config.norm_kind
    for which in ("norm1", "norm2"):
        for stat, expected in norm_stats(ref[f"{which}_input"], kind).items():
            assert_close(t.stages[f"{which}_{stat}"].values[layer], expected, f"{which}_{stat}", errors)


def compare_final(t: engine.Trace, x_L: np.ndarray, final: np.ndarray, errors: dict[str, float]) -> None:
    assert_close(t.stages["residual_stream"].values[-1], x_L, "residual_stream", errors)
    assert_close(t.stages["final_norm"].values, final, "final_norm", errors)
    for stat, expected in norm_stats(x_L, t.config.norm_kind).items():
        assert_close(t.stages[f"final_norm_{stat}"].values, expected, f"final_norm_{stat}", errors)


def causal_additive(n: int):
    """An additive mask [1, 1, n, n]: 0 where a query may attend, −inf after it."""
    return torch.triu(torch.full((n, n), float("-inf"), dtype=torch.float64), diagonal=1)[None, None]


# ---------------------------------------------------------------- torch.nn.TransformerEncoderLayer


def encoder_layer(config: TraceConfig, p: engine.params.LayerParameters, seeded: bool):
    """torch's encoder layer with one block's weights: no linear biases (zeroed where the LayerNorm needs its β)."""
    layer = torch.nn.TransformerEncoderLayer(
        config.d_model, config.num_heads, dim_feedforward=config.ff_width, dropout=0.0,
        activation="relu" if config.ffn_kind == "relu" else "gelu", layer_norm_eps=config.eps, batch_first=True,
        norm_first=config.pre_norm, bias=seeded, dtype=torch.float64)
    a = p.attention
    d = config.d_model
    with torch.no_grad():
        layer.self_attn.in_proj_weight.copy_(T(np.concatenate([W.reshape(-1, d) for W in (a.W_Q, a.W_K, a.W_V)])))
        layer.self_attn.out_proj.weight.copy_(T(a.W_O))
        layer.linear1.weight.copy_(T(p.W_1))
        layer.linear2.weight.copy_(T(p.W_2))
        for norm, w in ((layer.norm1, p.norm1), (layer.norm2, p.norm2)):
            norm.weight.copy_(T(w.gamma))
            if seeded:
                norm.bias.copy_(T(w.beta))
        if seeded:  # the LayerNorms need bias=True for β; the linear layers then get biases, which stay 0
            for b in (layer.self_attn.in_proj_bias, layer.self_attn.out_proj.bias, layer.linear1.bias,
                      layer.linear2.bias):
                b.zero_()
    layer.train()  # dropout is 0; train mode keeps torch off its fused fast path, so every submodule's hook runs
    return layer


ENCODER_CASES = [
    dict(norm_position="post", ffn="relu"),
    dict(norm_position="post", ffn="gelu"),
    dict(norm_position="pre", ffn="relu"),
    dict(norm_position="pre", ffn="gelu"),
    dict(norm_position="post", ffn="relu", causal=True, num_layers=3),
    dict(norm_position="pre", ffn="gelu", num_layers=2, norm_weights="seeded", d_ff=40),
    dict(norm_position="post", ffn="gelu", num_layers=2, norm_weights="seeded", norm_eps=1e-3),
]


@pytest.mark.parametrize("kwargs", ENCODER_CASES, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()))
def test_the_stack_agrees_with_torch_transformer_encoder_layers(th, kwargs):
    config = TraceConfig(d_model=24, num_heads=4, norm="layer_norm", **kwargs)
    t = engine.trace(config, sentence=SENTENCE)
    errors = run_encoder(t)
    assert set(errors) >= {"output", "norm1", "norm2", "residual1", "residual2", "ffn_pre_activation",
                           "ffn_activation", "ffn_output", "norm1_mean", "norm1_variance"}


def run_encoder(t: engine.Trace) -> dict[str, float]:
    config = t.config
    x = T(t.stages["input"].values)[None]  # [1, n, d_model]
    n = x.shape[1]
    errors: dict[str, float] = {}
    mask = torch.nn.Transformer.generate_square_subsequent_mask(n, dtype=torch.float64) if config.causal else None
    for i, p in enumerate(t.parameters.layers):
        layer = encoder_layer(config, p, config.seeded_norm)
        h = Hooks()
        h.output(layer.self_attn, "output", 0)
        for which in ("norm1", "norm2"):
            h.input(getattr(layer, which), f"{which}_input")
            h.output(getattr(layer, which), which)
        h.output(layer.linear1, "ffn_pre_activation")
        h.input(layer.linear2, "ffn_activation")
        h.output(layer.linear2, "ffn_output")
        x = layer(x, src_mask=mask, is_causal=config.causal)
        ref = {sid: h[sid] for sid in ("output", "norm1", "norm2", "ffn_pre_activation", "ffn_activation",
                                       "ffn_output", "norm1_input", "norm2_input")}
        # What torch's forward adds: post-norm normalises the sums, pre-norm normalises the stream.
        if config.pre_norm:
            ref |= {"residual1": h["norm2_input"], "residual2": x[0].detach().numpy()}
        else:
            ref |= {"residual1": h["norm1_input"], "residual2": h["norm2_input"]}
        compare_layer(t, i, ref, errors)
        assert_close(t.stages["residual_stream"].values[i + 1], x[0].detach().numpy(), "layer output", errors)
    if config.final_norm:
        ln = torch.nn.LayerNorm(config.d_model, eps=config.eps, dtype=torch.float64)
        with torch.no_grad():
            ln.weight.copy_(T(t.parameters.final_norm.gamma))
            ln.bias.copy_(T(t.parameters.final_norm.beta))
        compare_final(t, x[0].detach().numpy(), ln(x)[0].detach().numpy(), errors)
    return errors


# ---------------------------------------------------------------- transformers: GPT2Block


def gpt2_block(config: TraceConfig, p: engine.params.LayerParameters, layer: int):
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    cfg = GPT2Config(n_embd=config.d_model, n_head=config.num_heads, n_inner=config.ff_width, n_positions=64,
                     activation_function="gelu_new" if config.ffn_kind == "gelu_tanh" else "gelu",
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=config.eps)
    cfg._attn_implementation = "eager"  # returns the attention weights too
    block = GPT2Block(cfg, layer_idx=layer).double().eval()
    load_gpt2_block(block, p, config.d_model, T)
    return block


GPT2_CASES = [
    dict(),
    dict(num_layers=2),
    dict(num_layers=3, norm_weights="seeded"),
    dict(num_layers=2, ffn="gelu", d_ff=56),
]


@pytest.mark.parametrize("kwargs", GPT2_CASES, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "gpt2")
def test_the_gpt2_preset_agrees_with_transformers_gpt2_block(th, kwargs):
    config = TraceConfig.preset_config("gpt2", d_model=24, num_heads=4, **kwargs)
    t = engine.trace(config, sentence=SENTENCE)
    errors = run_gpt2(t)
    assert "weights" in errors and "final_norm" in errors


def run_gpt2(t: engine.Trace) -> dict[str, float]:
    config = t.config
    x = T(t.stages["input"].values)[None]  # [1, n, d_model]
    n, d = x.shape[1], config.d_model
    errors: dict[str, float] = {}
    for i, p in enumerate(t.parameters.layers):
        block = gpt2_block(config, p, i)
        h = Hooks()
        h.output(block.attn, "output", 0)
        h.output(block.attn, "weights", 1)
        h.output(block.attn.c_attn, "qkv")
        for which, ln in (("norm1", block.ln_1), ("norm2", block.ln_2)):
            h.input(ln, f"{which}_input")
            h.output(ln, which)
        h.output(block.mlp.c_fc, "ffn_pre_activation")
        h.output(block.mlp.act, "ffn_activation")
        h.output(block.mlp.c_proj, "ffn_output")
        with torch.no_grad():
            x = block(x, attention_mask=causal_additive(n) if config.causal else None)
        qkv = h["qkv"]  # [n, 3·d_model]: q, k, v side by side, each split into heads
        ref = {sid: h[sid] for sid in ("output", "weights", "norm1", "norm2", "ffn_pre_activation", "ffn_activation",
                                       "ffn_output", "norm1_input", "norm2_input")}
        for j, sid in enumerate(("q", "k", "v")):
            ref[sid] = qkv[:, j * d:(j + 1) * d].reshape(n, config.num_heads, config.d_k).transpose(1, 0, 2)
        ref |= {"residual1": h["norm2_input"], "residual2": x[0].numpy()}
        compare_layer(t, i, ref, errors)
    ln_f = torch.nn.LayerNorm(d, eps=config.eps, dtype=torch.float64)
    with torch.no_grad():
        ln_f.weight.copy_(T(t.parameters.final_norm.gamma))
        ln_f.bias.copy_(T(t.parameters.final_norm.beta))
        compare_final(t, x[0].numpy(), ln_f(x)[0].numpy(), errors)
    return errors


# ---------------------------------------------------------------- transformers: LlamaDecoderLayer


def rms_norm_in_input_dtype(norm: Any) -> None:
    """LlamaRMSNorm's formula, weight · x · rsqrt(mean(x²) + ε), without its cast to float32."""
    def forward(x):
        return norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))
    norm.forward = forward


def llama_layer(config: TraceConfig, p: engine.params.LayerParameters, layer: int, *, as_shipped: bool = False):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    cfg = LlamaConfig(hidden_size=config.d_model, intermediate_size=config.ff_width,
                      num_attention_heads=config.num_heads, num_key_value_heads=config.kv_heads,
                      rms_norm_eps=config.eps, hidden_act="silu", attention_bias=False, mlp_bias=False,
                      max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"  # the eager attention's softmax runs in float32
    block = LlamaDecoderLayer(cfg, layer_idx=layer).double().eval()
    a, d = p.attention, config.d_model
    with torch.no_grad():
        block.self_attn.q_proj.weight.copy_(T(a.W_Q.reshape(-1, d)))
        block.self_attn.k_proj.weight.copy_(T(a.W_K.reshape(-1, d)))
        block.self_attn.v_proj.weight.copy_(T(a.W_V.reshape(-1, d)))
        block.self_attn.o_proj.weight.copy_(T(a.W_O))
        block.mlp.gate_proj.weight.copy_(T(p.W_1))
        block.mlp.up_proj.weight.copy_(T(p.W_3))
        block.mlp.down_proj.weight.copy_(T(p.W_2))
        block.input_layernorm.weight.copy_(T(p.norm1.gamma))
        block.post_attention_layernorm.weight.copy_(T(p.norm2.gamma))
    if not as_shipped:
        rms_norm_in_input_dtype(block.input_layernorm)
        rms_norm_in_input_dtype(block.post_attention_layernorm)
    return block


def llama_angles(n: int, d_k: int, base: float):
    """LlamaRotaryEmbedding's cos and sin ([1, n, d_k]) by its own definition, in float64 (it computes float32)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, d_k, 2, dtype=torch.float64) / d_k))
    freqs = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[None], emb.sin()[None]


LLAMA_CASES = [
    dict(),
    dict(num_kv_heads=2, num_layers=2),
    dict(num_kv_heads=1, num_layers=2, norm_weights="seeded", d_ff=40),
    dict(num_layers=3, rope_base=500000.0, norm_eps=1e-5),
]


@pytest.mark.parametrize("kwargs", LLAMA_CASES, ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "llama")
def test_the_llama_preset_agrees_with_transformers_llama_decoder_layer(th, kwargs):
    config = TraceConfig.preset_config("llama", d_model=32, num_heads=4, **kwargs)
    t = engine.trace(config, sentence=SENTENCE)
    errors = run_llama(t)
    assert {"q", "k", "v", "ffn_up", "ffn_gated", "final_norm"} <= set(errors)


def run_llama(t: engine.Trace, *, as_shipped: bool = False) -> dict[str, float]:
    config = t.config
    x = T(t.stages["input"].values)[None]  # [1, n, d_model]
    n = x.shape[1]
    cos_sin = llama_angles(n, config.d_k, config.rope_base)
    errors: dict[str, float] = {}
    for i, p in enumerate(t.parameters.layers):
        block = llama_layer(config, p, i, as_shipped=as_shipped)
        h = Hooks()
        attn, mlp = block.self_attn, block.mlp
        h.output(attn, "output", 0)
        for sid, proj in (("q", attn.q_proj), ("k", attn.k_proj), ("v", attn.v_proj)):
            h.output(proj, sid)
        for which, norm in (("norm1", block.input_layernorm), ("norm2", block.post_attention_layernorm)):
            h.input(norm, f"{which}_input")
            h.output(norm, which)
        h.output(mlp.gate_proj, "ffn_pre_activation")
        h.output(mlp.up_proj, "ffn_up")
        h.output(mlp.act_fn, "ffn_activation")
        h.input(mlp.down_proj, "ffn_gated")
        h.output(mlp.down_proj, "ffn_output")
        with torch.no_grad():
            x = block(x, position_embeddings=cos_sin)
        ref = {sid: h[sid] for sid in ("output", "norm1", "norm2", "ffn_pre_activation", "ffn_up", "ffn_activation",
                                       "ffn_gated", "ffn_output", "norm1_input", "norm2_input")}
        for sid, heads in (("q", config.num_heads), ("k", config.kv_heads), ("v", config.kv_heads)):
            ref[sid] = h[sid].reshape(n, heads, config.d_k).transpose(1, 0, 2)  # [n, heads·d_k] -> [heads, n, d_k]
        ref |= {"residual1": h["norm2_input"], "residual2": x[0].numpy()}
        compare_layer(t, i, ref, errors)
    final = x[0].numpy()
    gamma = t.parameters.final_norm.gamma
    ms = (final * final).mean(-1, keepdims=True)
    ref_final = T(gamma) * (T(final) * torch.rsqrt(T(ms) + config.eps))  # LlamaRMSNorm's formula, in float64
    compare_final(t, final, ref_final.numpy(), errors)
    return errors


def test_llama_rms_norm_as_shipped_computes_in_float32(th):
    # The trap the fixture avoids: LlamaRMSNorm casts to float32 whatever the dtype, so a float64 layer as
    # shipped agrees only to ~1e-7; with the formula in float64 it agrees to ~1e-15.
    config = TraceConfig.preset_config("llama", d_model=32, num_heads=4)
    t = engine.trace(config, sentence=SENTENCE)
    with pytest.raises(AssertionError):
        run_llama(t, as_shipped=True)
    assert max(run_llama(t).values()) < 1e-13


def test_reference_agreement_figures(th, capsys):
    # One run of each reference on a 2-layer stack: the largest error per stage (docs/engine.md quotes them).
    figures = {
        "TransformerEncoderLayer post-norm": run_encoder(engine.trace(TraceConfig(
            d_model=24, num_heads=4, block="vaswani2017", num_layers=2, norm_weights="seeded"), sentence=SENTENCE)),
        "TransformerEncoderLayer pre-norm": run_encoder(engine.trace(TraceConfig(
            d_model=24, num_heads=4, norm_position="pre", ffn="gelu", num_layers=2, norm_weights="seeded"),
            sentence=SENTENCE)),
        "GPT2Block": run_gpt2(engine.trace(TraceConfig.preset_config(
            "gpt2", d_model=24, num_heads=4, num_layers=2, norm_weights="seeded"), sentence=SENTENCE)),
        "LlamaDecoderLayer": run_llama(engine.trace(TraceConfig.preset_config(
            "llama", d_model=32, num_heads=4, num_kv_heads=2, num_layers=2, norm_weights="seeded"),
            sentence=SENTENCE)),
    }
    with capsys.disabled():
        for name, errors in figures.items():
            print(f"\n{name}: " + ", ".join(f"{sid} {err:.1e}" for sid, err in sorted(errors.items())))
    assert all(err < 1e-12 for errors in figures.values() for err in errors.values()), figures
    assert not math.isnan(max(max(e.values()) for e in figures.values()))
