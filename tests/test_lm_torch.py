"""The language-model head against transformers' GPT2LMHeadModel and LlamaForCausalLM, in float64.

Each reference is built in code (no hub download) with the engine's weights: the vocabulary's token embeddings
as the model's token embedding table (``wte``, ``embed_tokens``), the head tied to it (the library's own
``tie_word_embeddings``), each layer's weights as tests/test_block_torch.py loads them, the final norm's γ (and
β). GPT-2's learned position table ``wpe`` holds the engine's sinusoidal encodings (the gpt2 preset keeps the
request's encoding). The sentence's token ids are its tokens' columns in the vocabulary.

Two of transformers' computations run in float32 whatever the model's dtype, as tests/test_block_torch.py
explains: LlamaRMSNorm (replaced by its formula in the input's dtype) and LlamaRotaryEmbedding's angles
(replaced by the library's own definition computed in float64). Then, on random stacks of 1–4 layers, the
logits agree within 1e-10 of their scale, the next-token probabilities too, and ``generate(do_sample=False)``
picks the engine's greedy tokens.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

import engine
from bench.torch_compare import load_gpt2_block
from engine import TraceConfig
from engine.attention import sinusoidal_positional_encoding
from engine.decoding import generate

torch: Any = None
WORDS = "the cat sat on a mat and dog ran to it was warm red blue sun".split()


@pytest.fixture(scope="module")
def th():
    global torch
    try:
        import torch
        import transformers  # noqa: F401 (only whether it is installed)
    except ImportError:
        pytest.fail("tests/test_lm_torch.py needs torch and transformers from requirements-dev.txt", pytrace=False)
    return torch


def T(a: np.ndarray):
    return torch.from_numpy(np.array(a, dtype=np.float64))


def assert_close(actual: np.ndarray, expected: np.ndarray, what: str) -> float:
    assert actual.shape == expected.shape, f"{what}: {actual.shape} != reference {expected.shape}"
    err = float(np.abs(actual - expected).max(initial=0.0))
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    assert err <= 1e-10 * scale, f"{what}: off by {err:.3g} (scale {scale:.3g})"
    return err


def random_case(rng: random.Random) -> tuple[list[str], list[str]]:
    tokens = [rng.choice(WORDS) for _ in range(rng.randint(2, 12))]
    candidates = rng.sample(["zebra", "moon", *WORDS], rng.randint(0, 4))
    return tokens, candidates


def ids_of(t: engine.Trace) -> Any:
    column = {text: j for j, text in enumerate(t.vocabulary)}
    return torch.tensor([[column[tok.text] for tok in t.tokens]])


# ---------------------------------------------------------------- GPT2LMHeadModel


def gpt2_model(t: engine.Trace, n_positions: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    c = t.config
    cfg = GPT2Config(
        vocab_size=len(t.vocabulary),
        n_embd=c.d_model,
        n_head=c.num_heads,
        n_layer=c.num_layers,
        n_inner=c.ff_width,
        n_positions=n_positions,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=c.eps,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    cfg._attn_implementation = "eager"
    model = GPT2LMHeadModel(cfg).double().eval()
    with torch.no_grad():
        model.transformer.wte.weight.copy_(T(t.stages["unembedding"].values))  # the vocabulary's embeddings
        model.transformer.wpe.weight.copy_(T(sinusoidal_positional_encoding(n_positions, c.d_model)))
        for block, p in zip(model.transformer.h, t.parameters.layers):
            load_gpt2_block(block, p, c.d_model, T)
        model.transformer.ln_f.weight.copy_(T(t.parameters.final_norm.gamma))
        model.transformer.ln_f.bias.copy_(T(t.parameters.final_norm.beta))
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()  # tied by the library
    return model


# ---------------------------------------------------------------- LlamaForCausalLM


def llama_model(t: engine.Trace):
    from transformers import LlamaConfig, LlamaForCausalLM

    c = t.config
    cfg = LlamaConfig(
        vocab_size=len(t.vocabulary),
        hidden_size=c.d_model,
        intermediate_size=c.ff_width,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.kv_heads,
        rms_norm_eps=c.eps,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        max_position_embeddings=128,
        rope_theta=c.rope_base,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    cfg._attn_implementation = "sdpa"  # the eager attention's softmax runs in float32
    model = LlamaForCausalLM(cfg).double().eval()
    d = c.d_model
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(T(t.stages["unembedding"].values))
        for layer, p in zip(model.model.layers, t.parameters.layers):
            a = p.attention
            layer.self_attn.q_proj.weight.copy_(T(a.W_Q.reshape(-1, d)))
            layer.self_attn.k_proj.weight.copy_(T(a.W_K.reshape(-1, d)))
            layer.self_attn.v_proj.weight.copy_(T(a.W_V.reshape(-1, d)))
            layer.self_attn.o_proj.weight.copy_(T(a.W_O))
            layer.mlp.gate_proj.weight.copy_(T(p.W_1))
            layer.mlp.up_proj.weight.copy_(T(p.W_3))
            layer.mlp.down_proj.weight.copy_(T(p.W_2))
            layer.input_layernorm.weight.copy_(T(p.norm1.gamma))
            layer.post_attention_layernorm.weight.copy_(T(p.norm2.gamma))
        model.model.norm.weight.copy_(T(t.parameters.final_norm.gamma))
    for norm in [
        model.model.norm,
        *(n for layer in model.model.layers for n in (layer.input_layernorm, layer.post_attention_layernorm)),
    ]:
        norm.forward = _rms_in_dtype(norm)
    base, d_k = c.rope_base, c.d_k

    def angles(x: Any, position_ids: Any) -> tuple[Any, Any]:  # LlamaRotaryEmbedding's definition, in float64
        inv_freq = 1.0 / (base ** (torch.arange(0, d_k, 2, dtype=torch.float64) / d_k))
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    model.model.rotary_emb.forward = angles
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def _rms_in_dtype(norm: Any):
    def forward(x: Any) -> Any:
        return norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))

    return forward


# ---------------------------------------------------------------- the comparisons


def compare(t: engine.Trace, model: Any, new_tokens: int) -> dict[str, float]:
    ids = ids_of(t)
    with torch.no_grad():
        ref = model(ids).logits[0].numpy()  # [n, vocab]
    errors = {"logits": assert_close(t.stages["logits"].values, ref, "logits")}
    probs = torch.softmax(torch.from_numpy(ref[-1] / t.config.temperature), dim=-1).numpy()
    errors["next_token_probs"] = assert_close(t.stages["next_token_probs"].values, probs, "next_token_probs")
    with torch.no_grad():
        # attention_mask given: generate would otherwise take every token equal to pad_token_id for padding
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
    expected = [t.vocabulary[j] for j in out[0, ids.shape[1] :].tolist()]
    assert [s.token for s in generate(t, new_tokens)] == expected
    return errors


@pytest.mark.parametrize("seed", range(8))
def test_gpt2_lm_head_model_agrees_on_random_stacks(th, seed):
    rng = random.Random(seed)
    tokens, candidates = random_case(rng)
    config = TraceConfig.preset_config(
        "gpt2",
        d_model=rng.choice([16, 24, 32]),
        num_heads=rng.choice([1, 2, 4]),
        num_layers=rng.randint(1, 4),
        seed=seed,
        norm_weights=rng.choice(["unit", "seeded"]),
        lm_head="tied",
        candidates=tuple(candidates) or None,
        temperature=rng.choice([1.0, 0.7, 1.5]),
    )
    t = engine.trace(config, tokens=tokens)
    compare(t, gpt2_model(t, n_positions=len(tokens) + 6), new_tokens=5)


@pytest.mark.parametrize("seed", range(8))
def test_llama_for_causal_lm_agrees_on_random_stacks(th, seed):
    rng = random.Random(100 + seed)
    tokens, candidates = random_case(rng)
    heads = rng.choice([2, 4])
    config = TraceConfig.preset_config(
        "llama",
        d_model=32,
        num_heads=heads,
        num_kv_heads=rng.choice([1, heads]),
        num_layers=rng.randint(1, 4),
        seed=seed,
        d_ff=rng.choice([24, 40]),
        norm_weights=rng.choice(["unit", "seeded"]),
        lm_head="tied",
        candidates=tuple(candidates) or None,
        temperature=rng.choice([1.0, 0.5]),
    )
    t = engine.trace(config, tokens=tokens)
    compare(t, llama_model(t), new_tokens=5)


def test_the_reference_is_not_blind(th):
    # The comparison fails when the head reads the unnormalised stream (the final norm skipped): it can fail.
    config = TraceConfig.preset_config(
        "gpt2", d_model=24, num_heads=4, num_layers=2, norm_weights="seeded", lm_head="tied"
    )
    t = engine.trace(config, sentence="the cat sat on the mat")
    model = gpt2_model(t, n_positions=16)
    model.transformer.ln_f.forward = lambda x: x
    with pytest.raises(AssertionError):
        compare(t, model, new_tokens=2)
