"""A stack of Transformer blocks: a GPT-2-small-shaped trace against torch's float64 forward with hooks.

GPT-2 small's shape: d_model 768, 12 heads, 12 layers, d_ff 3072, here on 64 tokens, the ``gpt2`` preset
(pre-norm LayerNorm, GELU's tanh approximation, causal, a final norm). Side by side in one run, one thread each:

* the engine: ``engine.trace`` of the configuration, with its weights generated and cached beforehand (the
  service's steady state: a weight set is generated once per process), so every stage of every layer is
  computed and kept (the norms' statistics, q, k, v, scores, scaled and masked scores, weights, context, concat,
  the attention's output, both residual sums, the FFN's three stages, the residual stream, the final norm);
* torch: transformers' ``GPT2Block`` × 12 and a final ``torch.nn.LayerNorm``, float64, the eager attention (it
  returns the weights), loaded with the same weights, with forward hooks that clone every stage those modules
  expose (each norm's input and output, q, k, v, the attention's weights and output, the FFN's projections and
  activation, each block's output, the final norm). Agreement is checked before timing.

    python -m bench.block_bench                  # the GPT-2-small row
    python -m bench.block_bench --layers 2 --d-model 256 --heads 4 --tokens 16   # a quick look

bench.run runs it as its "block" section (``--skip block`` leaves it out).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, cast

import numpy as np

import engine
from engine.params import BlockParameters, NormParameters, set_cache_bytes

from . import torch_compare
from .common import Table, fmt_ratio, fmt_time, interleaved

#: the target: the engine's trace within this factor of torch's forward with hooks
TARGET = 1.5


def gpt2_config(d_model: int = 768, num_heads: int = 12, num_layers: int = 12) -> engine.TraceConfig:
    return engine.TraceConfig.preset_config("gpt2", d_model=d_model, num_heads=num_heads, num_layers=num_layers,
                                            max_tokens=1024)


class TorchGPT2:
    """transformers' GPT2Block × L and a final LayerNorm with the engine's weights, hooks on every exposed stage."""

    def __init__(self, t: engine.Trace) -> None:
        torch, why = torch_compare.load()
        if torch is None:
            raise RuntimeError(why)
        from transformers import GPT2Config
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block

        self.torch = torch
        c = t.config
        cfg = GPT2Config(n_embd=c.d_model, n_head=c.num_heads, n_inner=c.ff_width, n_positions=max(64, t.n_tokens),
                         activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         layer_norm_epsilon=c.eps)
        cfg._attn_implementation = "eager"
        d = c.d_model
        T = self._tensor
        self.blocks = []
        stack = cast(BlockParameters, t.parameters)  # a stack's
        for i, p in enumerate(stack.layers):
            b = GPT2Block(cfg, layer_idx=i).double().eval()
            torch_compare.load_gpt2_block(b, p, d, T)
            self.blocks.append(b)
        self.ln_f = torch.nn.LayerNorm(d, eps=c.eps, dtype=torch.float64)
        with torch.no_grad():
            final = cast(NormParameters, stack.final_norm)  # GPT-2: pre-norm, LayerNorm
            self.ln_f.weight.copy_(T(final.gamma))
            self.ln_f.bias.copy_(T(cast(np.ndarray, final.beta)))
        self.kept: list[Any] = []
        for b in self.blocks:
            for module in (b.ln_1, b.attn.c_attn, b.ln_2, b.mlp.c_fc, b.mlp.act, b.mlp.c_proj, b):
                module.register_forward_hook(self._keep_output)
            b.attn.register_forward_hook(self._keep_output)  # (output, weights)
            b.ln_2.register_forward_pre_hook(self._keep_input)  # the first residual sum
        self.ln_f.register_forward_hook(self._keep_output)
        n = t.n_tokens
        self.mask = torch.triu(torch.full((n, n), float("-inf"), dtype=torch.float64), diagonal=1)[None, None]

    @staticmethod
    def _tensor(a: np.ndarray) -> Any:
        import torch
        return torch.from_numpy(np.array(a, dtype=np.float64))  # a writable copy: the engine's arrays are read-only

    def _keep_output(self, _m: Any, _args: Any, out: Any) -> None:
        self.kept.extend(o.clone() for o in (out if isinstance(out, tuple) else (out,)) if o is not None)

    def _keep_input(self, _m: Any, args: Any) -> None:
        self.kept.append(args[0].clone())

    def __call__(self, x: Any) -> Any:
        self.kept = []
        with self.torch.inference_mode():
            for b in self.blocks:
                x = b(x, attention_mask=self.mask)
            return self.ln_f(x)


def run(repeats: int, budget_s: float, results: dict[str, Any], *, d_model: int = 768, num_heads: int = 12,
        num_layers: int = 12, n_tokens: int = 64) -> Table:
    config = gpt2_config(d_model, num_heads, num_layers)
    tokens = [f"t{i}" for i in range(n_tokens)]
    set_cache_bytes(weights=4 * 1024 ** 3)  # hold this weight set (12 layers of GPT-2 small: ~680 MB)
    t = engine.trace(config, tokens=tokens)  # generates and caches the weights and their digest
    table = Table(f"Block: a GPT-2-small-shaped stack (d_model {d_model}, {num_heads} heads, {num_layers} layers, "
                  f"d_ff {config.ff_width}, {n_tokens} tokens), median, one thread each",
                  ["what", "engine.trace (every stage kept)", "torch GPT2Block × L + hooks", "engine / torch"])

    def run_engine() -> Any:
        return engine.trace(config, tokens=tokens)

    values = sum(st.array.size for sid, st in t.stages.items() if sid != "tokens")
    row: dict[str, Any] = {"shape": [d_model, num_heads, num_layers, n_tokens], "values": values}
    torch, why = torch_compare.load()
    if torch is None:
        (engine_s,) = interleaved([run_engine], repeats, budget_s=budget_s)
        row["engine_s"] = engine_s
        table.add("trace", fmt_time(engine_s), "–", "–")
        table.notes.append(f"torch column skipped: {why}")
        results.update(row)
        return table
    ref = TorchGPT2(t)
    x = ref._tensor(t.stages["input"].array)[None]  # [1, n, d_model]
    out = ref(x)
    diff = float(np.abs(out[0].numpy() - t.stages["final_norm"].values).max())
    kept = sum(k.numel() for k in ref.kept)
    assert diff < 1e-10, f"torch and the engine disagree by {diff:.1e}"
    engine_s, torch_s = interleaved([run_engine, lambda: ref(x)], repeats, budget_s=budget_s)
    row |= {"engine_s": engine_s, "torch_s": torch_s, "ratio": engine_s / torch_s, "torch_values_kept": kept,
            "max_abs_diff": diff}
    results.update(row)
    table.add("forward, all stages", fmt_time(engine_s), fmt_time(torch_s), fmt_ratio(engine_s / torch_s))
    table.notes.append(f"numbers kept: engine {values:,} (every stage, stats aside), torch {kept:,} (what the "
                       "modules expose to hooks; no scores, scaled or masked scores, context, concat or norm "
                       "statistics)")
    table.notes.append(f"agreement before timing: final norm max |torch − engine| = {diff:.1e}; torch "
                       f"{torch_compare.version()}; weights generated and cached before timing on both sides")
    table.notes.append(f"target: engine / torch ≤ {TARGET:g}")
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.block_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="as bench.run's --clock")
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    from .common import print_table, use_cpu_clock

    use_cpu_clock(args.clock == "cpu")

    with threadpool_limits(1, user_api="blas"):
        results: dict[str, Any] = {}
        print_table(run(args.repeats, 120.0, results, d_model=args.d_model, num_heads=args.heads,
                        num_layers=args.layers, n_tokens=args.tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
