"""Section 1: engine time per workload.

* ``engine.trace`` with the parameter and embedding caches warm, and cold
  (``cache_clear()`` on both before every call), interleaved;
* the attention core, ``engine.layer.attend`` (projections to output), against
  torch's ``nn.MultiheadAttention`` in float64, one thread each, on the same
  input and weights, checked to agree to 1e-12 before timing, interleaved.

numpy's BLAS is held to one thread by threadpoolctl for the whole process
(bench.run), as gunicorn.conf.py holds each worker to one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import engine
from engine.params import generate_parameters, token_embedding_vector
from engine.layer import attend

from . import torch_compare
from .common import Table, fmt_ratio, fmt_time, interleaved
from .workloads import Workload


def config_of(w: Workload) -> engine.TraceConfig:
    return engine.TraceConfig(d_model=w.d_model, num_heads=w.num_heads, causal=w.causal)


def engine_caches() -> list[Any]:
    """Every functools cache in the engine's modules: the parameters and embeddings, and any added later."""
    import engine.attention
    import engine.layer
    import engine.params
    import engine.tracing

    found = {generate_parameters, token_embedding_vector}
    for mod in (engine.params, engine.layer, engine.tracing, engine.attention):
        found |= {f for f in vars(mod).values()
                  if not isinstance(f, type) and callable(getattr(f, "cache_clear", None))}  # not the cache classes
    return sorted(found, key=lambda f: f.__qualname__)


def clear_caches() -> None:
    for f in engine_caches():
        f.cache_clear()


def run(workloads: list[Workload], repeats: int, budget_s: float, results: dict[str, Any]) -> Table:
    torch, why_not = torch_compare.load()
    table = Table(
        "1. Engine time per workload (median; numpy BLAS and torch one thread each)",
        ["workload", "shape", "trace, warm cache", "trace, cold cache", "cold / warm",
         "attention core (numpy)", "torch MHA", "numpy / torch"],
    )
    checks = []
    for w in workloads:
        cfg = config_of(w)
        sentence = w.body["sentence"]

        def run_trace() -> Any:
            return engine.trace(cfg, sentence=sentence)

        t = run_trace()
        reps = max(3, repeats // 3) if w.n_tokens >= 128 else repeats

        def cold() -> Any:
            clear_caches()  # costs nothing next to a trace; the warm call after it finds the caches refilled
            return run_trace()

        warm, cold_t = interleaved([run_trace, cold], reps, budget_s=budget_s)
        run_trace()  # leave the caches warm for later sections

        x = np.asarray(t.stages["input"].values)
        params = t.parameters
        core = attend(x, vars(params), cfg)

        def numpy_core() -> Any:
            return attend(x, vars(params), cfg)

        row: dict[str, Any] = {"trace_warm_s": warm, "trace_cold_s": cold_t}
        core_np = torch_t = None
        if torch is not None and not w.causal:
            mha = torch_compare.TorchMHA(params)
            d_out, d_w = mha.check(x, core)
            checks.append(f"{w.name}: output {d_out:.1e}, weights {d_w:.1e}")
            xt = mha.prepare(x)
            core_np, torch_t = interleaved([numpy_core, lambda: mha(xt)], repeats * 2, budget_s=budget_s)
            row.update(core_numpy_s=core_np, core_torch_s=torch_t, torch_max_abs_diff=max(d_out, d_w))
        else:
            core_np = interleaved([numpy_core], repeats * 2, budget_s=budget_s)[0]
            row.update(core_numpy_s=core_np)
        results[w.name] = row
        table.add(w.name, w.shape, fmt_time(warm), fmt_time(cold_t), fmt_ratio(cold_t / warm),
                  fmt_time(core_np), fmt_time(torch_t),
                  fmt_ratio(core_np / torch_t) if torch_t else "–")
    if torch is None:
        table.notes.append(f"torch column skipped: {why_not}")
    else:
        table.notes.append(f"torch {torch_compare.version()}; `nn.MultiheadAttention(bias=False)` float64, "
                           "need_weights=True, average_attn_weights=False, the engine's W_Q/W_K/W_V stacked "
                           "into in_proj_weight and W_O as out_proj.weight")
        table.notes.append("agreement checked before timing (max |torch − engine|, tolerance 1e-12): "
                           + "; ".join(checks))
    table.notes.append("trace = engine.trace() for the sentence: tokens, embeddings, positional encoding, "
                       "attention core, parameters digest, entropy and max weight; cold = cache_clear() first on "
                       + ", ".join(f.__qualname__ for f in engine_caches()))
    return table
