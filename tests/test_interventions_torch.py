"""Interventions against PyTorch forward hooks on transformers' own blocks, in float64.

The same stack as tests/test_block_torch.py (transformers' ``GPT2Block`` with a final LayerNorm, ``LlamaDecoderLayer``
with its RMSNorm computed in float64 and a final RMSNorm), loaded with the engine's weights. Each intervention is
made the way TransformerLens makes it, by hooks on the library's modules:

* a head's output (its context, before W_O): a forward pre-hook on the output projection (``c_proj``,
  ``o_proj``), which reads the heads side by side, [n, h·d_k]: head i's columns i·d_k … (i + 1)·d_k;
* an MLP's output: a forward hook on the block's ``mlp``;
* the residual stream at depth l: a forward pre-hook on block l (depth num_layers: on the final norm);
* a head's pattern: neither eager nor SDPA attention has a module between the softmax and ·V, so the blocks run
  with an attention function registered through transformers' ``AttentionInterface`` (its extension point for
  attention kernels): softmax(q·kᵀ·scaling + mask) in float64, the pattern hook, then ·V (K/V heads repeated by
  the library's ``repeat_kv`` under GQA).

Patching first runs the second input through the same hooked modules and records each activation. The engine's
intervened residual stream, final norm and logits agree with the hooked reference within 1e-10 of each stage's
scale, on random stacks of 1–3 layers, for every kind of intervention.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import engine
import test_block_torch as tb
from engine import TraceConfig
from engine.interventions import Intervention, intervene
from test_block_torch import T, assert_close, causal_additive, gpt2_block, llama_angles, llama_layer, th  # noqa: F401 (th: the fixture)

WORDS = [f"w{i}" for i in range(200)]
_HOOKED = "intervention_hooks"


def _attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """softmax(q·kᵀ·scaling + mask)·V, with the running stack's pattern hook between the softmax and ·V."""
    torch = tb.torch
    from transformers.models.llama.modeling_llama import repeat_kv

    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling  # [1, h, n, n]
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1)
    weights = module._pattern_hook(weights, attention_mask)
    return torch.matmul(weights, value).transpose(1, 2), weights  # [1, n, h, d_k]


class Reference:
    """The engine's stack as transformers' blocks and a final norm, each activation an intervention can replace
    reachable by a hook: ``run(x, interventions, recorded)`` returns (each depth of the residual stream, the
    final norm's output) and records every hooked activation in ``self.seen`` (a patch reads another run's)."""

    def __init__(self, t: engine.Trace) -> None:
        from transformers import AttentionInterface

        AttentionInterface.register(_HOOKED, _attention)
        torch = tb.torch
        c = self.config = t.config
        self.llama = c.norm_kind == "rms_norm"
        build = llama_layer if self.llama else gpt2_block
        self.blocks = [build(c, p, i) for i, p in enumerate(t.parameters.layers)]
        for i in range(len(self.blocks)):
            self._modules(i)[0].config._attn_implementation = _HOOKED
        g = t.parameters.final_norm
        if self.llama:

            def ln_f(x: Any) -> Any:
                return T(g.gamma) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.eps))

            self.ln_f = _Module(ln_f)
        else:
            self.ln_f = torch.nn.LayerNorm(c.d_model, eps=c.eps, dtype=torch.float64)
            with torch.no_grad():
                self.ln_f.weight.copy_(T(g.gamma))
                self.ln_f.bias.copy_(T(g.beta))

    def _modules(self, i: int) -> tuple[Any, Any, Any]:
        b = self.blocks[i]
        return (b.self_attn, b.self_attn.o_proj, b.mlp) if self.llama else (b.attn, b.attn.c_proj, b.mlp)

    def run(
        self, x: np.ndarray, ivs: list[Intervention], source: dict[str, Any] | None = None
    ) -> tuple[list[np.ndarray], np.ndarray, dict[str, Any]]:
        torch = tb.torch
        c, d_k = self.config, self.config.d_k
        seen: dict[str, Any] = {}
        handles = []

        def rows(iv: Intervention) -> Any:
            return slice(None) if iv.positions is None else list(iv.positions)

        def replace(name: str, a: Any, mine: list[Intervention], pick: Any = None, mask: Any = None) -> Any:
            """``a`` [1, n, …] with each of ``mine``'s rows replaced; ``pick(a)`` is the view of the target."""
            if not mine:
                seen[name] = a.detach().clone()
                return a
            a = a.clone()
            for iv in mine:
                view = pick(a, iv) if pick is not None else a[0]  # [n, …]
                r = rows(iv)
                if iv.kind == "patch":
                    src = source[name]
                    view[r] = (pick(src.clone(), iv) if pick is not None else src[0])[r]
                elif iv.kind == "zero":
                    view[r] = 0.0
                elif iv.target == "head_pattern":
                    allowed = (mask[0, 0] == 0).to(torch.float64) if mask is not None else torch.ones_like(view)
                    view[r] = (allowed / allowed.sum(-1, keepdim=True))[r]
                else:
                    view[r] = view.mean(dim=0)
            seen[name] = a.detach().clone()  # as the next module reads it
            return a

        def of(target: str, layer: int) -> list[Intervention]:
            return [iv for iv in ivs if iv.target == target and iv.layer == layer]

        for i in range(c.num_layers):
            attn, w_o, mlp = self._modules(i)

            def pre_block(_m: Any, args: Any, kwargs: Any, i: int = i) -> Any:
                return (replace(f"residual{i}", args[0], of("residual", i)), *args[1:]), kwargs

            handles.append(self.blocks[i].register_forward_pre_hook(pre_block, with_kwargs=True))

            def pre_w_o(_m: Any, args: Any, i: int = i) -> Any:  # [1, n, h·d_k]: head h's columns
                return (
                    replace(
                        f"head_output{i}",
                        args[0],
                        of("head_output", i),
                        lambda a, iv: a[0][:, iv.head * d_k : (iv.head + 1) * d_k],
                    ),
                )

            handles.append(w_o.register_forward_pre_hook(pre_w_o))

            def pattern(w: Any, mask: Any, i: int = i) -> Any:  # [1, h, n, n]
                return replace(f"head_pattern{i}", w, of("head_pattern", i), lambda a, iv: a[0, iv.head], mask)

            attn._pattern_hook = pattern

            def post_mlp(_m: Any, _args: Any, out: Any, i: int = i) -> Any:
                return replace(f"mlp_output{i}", out, of("mlp_output", i))

            handles.append(mlp.register_forward_hook(post_mlp))
        L = c.num_layers

        def pre_final(_m: Any, args: Any) -> Any:
            return (replace(f"residual{L}", args[0], of("residual", L)),)

        handles.append(self.ln_f.register_forward_pre_hook(pre_final))

        h = T(x)[None]  # [1, n, d_model]
        n = h.shape[1]
        stream = []
        kwargs: dict[str, Any] = {"attention_mask": causal_additive(n)}
        if self.llama:
            kwargs["position_embeddings"] = llama_angles(n, c.d_k, c.rope_base)
        try:
            with torch.no_grad():
                for block in self.blocks:
                    out = block(h, **kwargs)
                    stream.append(seen[f"residual{len(stream)}"][0].numpy())
                    h = out[0] if isinstance(out, tuple) else out
                final = self.ln_f(h)
        finally:
            for handle in handles:
                handle.remove()
        stream.append(seen[f"residual{L}"][0].numpy())
        return stream, final[0].numpy(), seen


class _Module:
    """A plain function as a module with a forward pre-hook (the final RMSNorm's formula in float64)."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.pre = fn, []

    def register_forward_pre_hook(self, hook: Any) -> Any:
        self.pre.append(hook)
        outer = self

        class Handle:
            def remove(self) -> None:
                outer.pre.remove(hook)

        return Handle()

    def __call__(self, x: Any) -> Any:
        for hook in self.pre:
            x = hook(self, (x,))[0]
        return self.fn(x)


KINDS = [
    ("head_output", "zero"),
    ("head_output", "mean"),
    ("head_output", "patch"),
    ("head_pattern", "mean"),
    ("head_pattern", "patch"),
    ("mlp_output", "zero"),
    ("mlp_output", "mean"),
    ("mlp_output", "patch"),
    ("residual", "zero"),
    ("residual", "mean"),
    ("residual", "patch"),
]


def _random_case(
    rng: np.random.Generator, target: str, kind: str
) -> tuple[TraceConfig, list[str], list[str], list[Intervention]]:
    preset = str(rng.choice(["gpt2", "llama"]))
    L = int(rng.integers(1, 4))
    extra: dict[str, Any] = {"num_kv_heads": int(rng.choice([1, 2]))} if preset == "llama" else {}
    config = TraceConfig.preset_config(
        preset,
        d_model=32 if preset == "llama" else 24,
        num_heads=4,
        num_layers=L,
        norm_weights=str(rng.choice(["unit", "seeded"])),
        lm_head="tied",
        seed=int(rng.integers(0, 1000)),
        **extra,
    )
    n = int(rng.integers(2, 9))
    words = [str(w) for w in rng.choice(WORDS, n, replace=False)]
    other = [str(w) for w in rng.choice(WORDS, n, replace=False)]
    ivs = []
    for _ in range(int(rng.integers(1, 3))):
        layer = int(rng.integers(0, L + 1 if target == "residual" else L))
        head = int(rng.integers(0, 4)) if target.startswith("head") else None
        positions = (
            None
            if rng.random() < 0.4
            else tuple(int(p) for p in rng.choice(n, int(rng.integers(1, n + 1)), replace=False))
        )
        ivs.append(Intervention(target, layer, kind, head, positions))
    return config, words, other, ivs


@pytest.mark.slow
@pytest.mark.parametrize("target, kind", KINDS, ids=lambda v: str(v))
def test_interventions_agree_with_forward_hooks_on_transformers_blocks(th, target, kind, capsys):  # noqa: F811 (the imported fixture)
    rng = np.random.default_rng(KINDS.index((target, kind)))
    errors: dict[str, float] = {}
    for _ in range(4):
        config, words, other, ivs = _random_case(rng, target, kind)
        base = engine.trace(config, tokens=words)
        source = engine.trace(config, tokens=other) if kind == "patch" else None
        t = intervene(base, ivs, source)
        ref = Reference(base)
        recorded = ref.run(source.stages["input"].values, [])[2] if source is not None else None
        stream, final, _ = ref.run(base.stages["input"].values, ivs, recorded)
        what = f"{config.block} L={config.num_layers} {[iv.describe() for iv in ivs]}"
        for depth, x in enumerate(stream):
            assert_close(t.stages["residual_stream"].values[depth], x, f"residual_stream[{depth}] {what}")
            errors["residual_stream"] = max(
                errors.get("residual_stream", 0.0), float(np.abs(t.stages["residual_stream"].values[depth] - x).max())
            )
        assert_close(t.stages["final_norm"].values, final, f"final_norm {what}", errors)
        W_U = t.stages["unembedding"].values
        assert_close(t.stages["logits"].values, (T(final) @ T(W_U).T).numpy(), f"logits {what}", errors)
        # the intervention changed something (else the comparison above proves nothing about it)
        changed = np.abs(t.stages["final_norm"].values - base.stages["final_norm"].values).max()
        assert changed > 1e-9, what
    with capsys.disabled():
        largest: dict[str, float] = {}
        for k, v in errors.items():  # each case's keys name it: the largest per stage
            largest[k.split()[0]] = max(largest.get(k.split()[0], 0.0), v)
        print(f"\n{target} {kind}: largest error " + ", ".join(f"{k} {v:.1e}" for k, v in sorted(largest.items())))


def test_hooks_without_interventions_reproduce_the_engine(th):  # noqa: F811 (the imported fixture)
    # The reference itself, with the pattern's attention function and no hook replacing anything.
    for preset, extra in (("gpt2", {}), ("llama", {"num_kv_heads": 2})):
        config = TraceConfig.preset_config(preset, d_model=32, num_heads=4, num_layers=2, **extra)
        t = engine.trace(config, sentence="the cat sat on the mat")
        stream, final, _ = Reference(t).run(t.stages["input"].values, [])
        assert_close(t.stages["residual_stream"].values, np.stack(stream), "residual_stream")
        assert_close(t.stages["final_norm"].values, final, "final_norm")
