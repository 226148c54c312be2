"""The attention variants against PyTorch's own attention, in float64.

``torch.nn.functional.scaled_dot_product_attention`` with a boolean
``attn_mask`` (True = may attend) and ``enable_gqa=True`` is the reference for
the causal and sliding-window masks, grouped-query attention and
cross-attention. The rotations are written the way the two model families
write them: Hugging Face's Llama ``apply_rotary_pos_emb`` (rotate-half) and
Meta's Llama ``apply_rotary_emb`` (interleaved pairs as complex numbers). The
weights come out of SDPA too: attending with V = the identity returns them.

The engine's numbers are fed in only as x and the weight matrices; torch
computes everything from there. Agreement is required to 1e-10.

torch is a test dependency of this file only. It must not be skipped silently:
without it the tests fail and say how to install the CPU build. It is imported
when the first test here runs, not when pytest collects the file: importing it
adds ~200 MiB to the pytest process, and tests/test_resources.py measures a
child process that inherits its parent's peak RSS through fork and exec.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import engine
from engine import TraceConfig

torch = F = None  # imported by the fixture


@pytest.fixture(scope="module")
def th():
    global torch, F
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        pytest.fail("tests/test_variants_torch.py needs torch to compare the variants with "
                    "torch.nn.functional.scaled_dot_product_attention; install the CPU build with "
                    "`.venv/bin/pip install torch==2.13.0` (never plain `torch`, which pulls a CUDA build)",
                    pytrace=False)
    return torch


def _rotate_half(x):
    """Hugging Face transformers, models/llama: rotate_half."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_rope(q, k, base: float):
    """Hugging Face's LlamaRotaryEmbedding + apply_rotary_pos_emb, in float64. q, k: [heads, n, d_k]."""
    n, d_k = q.shape[-2], q.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, d_k, 2, dtype=torch.float64) / d_k))
    freqs = torch.outer(torch.arange(n, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def meta_rope(q, k, base: float):
    """Meta's llama/model.py: precompute_freqs_cis + apply_rotary_emb (pairs (2i, 2i+1) as complex numbers)."""
    n, d_k = q.shape[-2], q.shape[-1]
    freqs = 1.0 / (base ** (torch.arange(0, d_k, 2, dtype=torch.float64)[: d_k // 2] / d_k))
    freqs_cis = torch.polar(torch.ones(n, d_k // 2, dtype=torch.float64),
                            torch.outer(torch.arange(n, dtype=torch.float64), freqs))

    def apply(x):
        x_ = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(x_ * freqs_cis).flatten(-2)

    return apply(q), apply(k)


def torch_attention(x: np.ndarray, p: engine.Parameters, config: TraceConfig, context: np.ndarray | None = None):
    """The layer in torch: projections, RoPE, SDPA with a boolean mask and enable_gqa, W_O."""
    h, g, d_k = config.num_heads, config.kv_heads, config.d_k
    xs = torch.from_numpy(np.array(x))
    xc = xs if context is None else torch.from_numpy(np.array(context))
    n, m = xs.shape[0], xc.shape[0]

    def project(inp, W, heads):  # nn.Linear with weight [heads·d_k, d_model], then split the heads
        return F.linear(inp, torch.from_numpy(np.array(W)).reshape(heads * d_k, -1)) \
            .view(inp.shape[0], heads, d_k).transpose(0, 1)

    q, k, v = project(xs, p.W_Q, h), project(xc, p.W_K, g), project(xc, p.W_V, g)
    out = {"q": q, "k": k, "v": v}
    if config.rope:
        q, k = (hf_rope if config.rope_pairing == "rotate_half" else meta_rope)(q, k, config.rope_base)
        out.update(q_rotated=q, k_rotated=k)
    mask = None
    if config.causal:
        i, j = torch.arange(n)[:, None], torch.arange(m)[None, :]
        mask = j <= i  # True = may attend
        if config.window is not None:
            mask &= (i - j) < config.window
    scale = 1.0 / math.sqrt(d_k) if config.scale else 1.0
    sdpa = dict(attn_mask=mask, scale=scale, enable_gqa=True)
    context_rows = F.scaled_dot_product_attention(q[None], k[None], v[None], **sdpa)[0]  # [h, n, d_k]
    eye = torch.eye(m, dtype=torch.float64).expand(g, m, m)
    out["weights"] = F.scaled_dot_product_attention(q[None], k[None], eye[None], **sdpa)[0]  # [h, n, m]
    out["context"] = context_rows
    concat = context_rows.transpose(0, 1).reshape(n, h * d_k)
    out["output"] = F.linear(concat, torch.from_numpy(np.array(p.W_O)))
    return {name: t.numpy() for name, t in out.items()}


def assert_close(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: {actual.shape} != torch {expected.shape}"
    atol = 1e-10 * max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=1e-10, atol=atol, err_msg=what)


CASES = [
    (dict(d_model=24, num_heads=4), None),
    (dict(d_model=24, num_heads=4, causal=True), None),
    (dict(d_model=24, num_heads=4, causal=True, scale=False), None),
    (dict(d_model=16, num_heads=2, positional_encoding="rope"), None),
    (dict(d_model=16, num_heads=2, positional_encoding="rope", causal=True), None),
    (dict(d_model=16, num_heads=4, positional_encoding="rope", rope_pairing="interleaved", causal=True), None),
    (dict(d_model=32, num_heads=4, positional_encoding="rope", rope_pairing="interleaved", rope_base=500000.0), None),
    (dict(d_model=32, num_heads=8, num_kv_heads=2, causal=True), None),
    (dict(d_model=32, num_heads=8, num_kv_heads=1, causal=True), None),
    (dict(d_model=32, num_heads=8, num_kv_heads=4, positional_encoding="rope", causal=True), None),
    (dict(d_model=32, num_heads=8, num_kv_heads=2, positional_encoding="rope", rope_pairing="interleaved"), None),
    (dict(d_model=24, num_heads=4, causal=True, window=1), None),
    (dict(d_model=24, num_heads=4, causal=True, window=3), None),
    (dict(d_model=32, num_heads=8, num_kv_heads=2, causal=True, window=4, positional_encoding="rope"), None),
    (dict(d_model=24, num_heads=4), "le chat était assis sur le tapis"),
    (dict(d_model=24, num_heads=4, num_kv_heads=2), "le chat"),
    (dict(d_model=32, num_heads=8, num_kv_heads=1, positional_encoding="none"), "un deux trois quatre cinq six sept"),
]


@pytest.mark.parametrize("kwargs, context", CASES,
                         ids=lambda v: "" if v is None else v if isinstance(v, str) else
                         "-".join(f"{a}={b}" for a, b in v.items()))
def test_every_variant_agrees_with_torch_scaled_dot_product_attention(th, kwargs, context):
    config = TraceConfig(**kwargs)
    t = engine.trace(config, sentence="the cat sat on the mat because it was warm", context_sentence=context)
    x_ctx = None if context is None else t.stages["context_input"].values
    ref = torch_attention(t.stages["input"].values, t.parameters, config, x_ctx)
    for name, expected in ref.items():
        assert_close(t.stages[name].values, expected, name)


@pytest.mark.parametrize("kwargs", [dict(d_model=32, num_heads=8, num_kv_heads=2, positional_encoding="rope"),
                                    dict(d_model=24, num_heads=4, num_kv_heads=1, window=3)])
def test_kv_cache_decoding_agrees_with_torch_row_by_row(th, kwargs):
    config = TraceConfig(causal=True, **kwargs)
    t = engine.trace(config, sentence="the cat sat on the mat because it was warm")
    ref = torch_attention(t.stages["input"].values, t.parameters, config)
    for step in engine.decode(t):
        assert_close(step.weights, ref["weights"][:, step.position, list(step.cache_positions)], "weights")
        assert_close(step.output, ref["output"][step.position], "output")
