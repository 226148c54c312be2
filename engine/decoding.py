"""KV-cache decoding: a causal self-attention trace re-run one token at a time.

A model that generates text does not recompute the whole sequence for every
new token. At step t it projects only token t: its query q_t attends to the
keys and values of tokens 0 … t, and k_t and v_t are appended to a cache that
the next step reuses. ``decode(trace)`` re-runs the trace's layer this way,
with the steps of ``engine.layer.decode_steps`` (the same pure functions of
``engine.attention`` as the full trace), and returns what each step computed:

* under RoPE, q_t and k_t are rotated by their absolute position t before
  k_t enters the cache (the cache holds rotated keys, as Llama's does);
* under grouped-query attention the cache holds num_kv_heads heads, and each
  query head reads its group's K/V head;
* with a sliding window the cache keeps only the last ``window`` positions
  (Mistral's rolling buffer), so it stops growing.

Row t of the full causal trace (scores, weights, context, output) equals
step t's rows; the tests check it to 1e-12. The numbers are not always
bit-identical: one row is multiplied by BLAS as a vector, the full trace as
a matrix, and those kernels may sum in different orders.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .checks import check_decodable
from .layer import TraceConfig, decode_steps, initial_state, run
from .params import Parameters
from .tokenize import Token
from .tracing import Trace


@dataclass(frozen=True)
class DecodeStep:
    """What generating token ``position`` computed; "cached" = the positions in the cache after it."""

    position: int
    token: Token
    cache_positions: tuple[int, ...]  # the positions whose keys and values are cached, oldest first
    q: np.ndarray  # [head, d_k]: x_t·W_Qᵢᵀ
    k: np.ndarray  # [kv_head, d_k]: x_t·W_Kⱼᵀ
    v: np.ndarray  # [kv_head, d_k]: x_t·W_Vⱼᵀ
    q_rotated: np.ndarray | None  # [head, d_k]: RoPE(q_t, t), None without RoPE
    k_rotated: np.ndarray | None  # [kv_head, d_k]: RoPE(k_t, t), the row appended to the key cache
    k_cache: np.ndarray  # [kv_head, cached, d_k]: the key cache after this step
    v_cache: np.ndarray  # [kv_head, cached, d_k]: the value cache after this step
    scores: np.ndarray  # [head, cached]: q_t·kᵀ for every cached key
    scaled_scores: np.ndarray  # [head, cached]
    weights: np.ndarray  # [head, cached]: softmax over the cached keys (the others get 0)
    context: np.ndarray  # [head, d_k]
    output: np.ndarray  # [d_model]


def decode(t: Trace) -> list[DecodeStep]:
    """Re-run ``t`` (causal self-attention, no injected bug) token by token with a growing K/V cache."""
    config = t.config
    check_decodable(causal=config.causal, cross=t.cross, bug=t.bug, block=config.has_block)
    steps = decode_steps(config)
    x = t.state["input"]  # [n, d_model], generated or given
    base = initial_state(config, [], vars(t.parameters))
    assert isinstance(t.parameters, Parameters)  # check_decodable refused a stack of blocks
    g, d_k = t.parameters.num_kv_heads, config.d_k
    k_cache = v_cache = np.zeros((g, 0, d_k))  # [kv_head, 0, d_k]: nothing cached yet
    out: list[DecodeStep] = []
    for pos, token in enumerate(t.tokens):
        state = {**base, "input": x[pos:pos + 1], "position": pos, "k_cache": k_cache, "v_cache": v_cache}
        run(steps, state)
        k_cache, v_cache = state["k_cache"], state["v_cache"]
        cached = k_cache.shape[1]
        rotated = "q_rotated" in state
        out.append(DecodeStep(
            position=pos,
            token=token,
            cache_positions=tuple(range(pos + 1 - cached, pos + 1)),
            q=state["q"][:, 0],  # [head, 1, d_k] -> [head, d_k]
            k=state["k"][:, 0],  # [kv_head, 1, d_k] -> [kv_head, d_k]
            v=state["v"][:, 0],  # [kv_head, 1, d_k] -> [kv_head, d_k]
            q_rotated=state["q_rotated"][:, 0] if rotated else None,  # [head, 1, d_k] -> [head, d_k]
            k_rotated=state["k_rotated"][:, 0] if rotated else None,  # [kv_head, 1, d_k] -> [kv_head, d_k]
            k_cache=k_cache,
            v_cache=v_cache,
            scores=state["scores"][:, 0],  # [head, 1, cached] -> [head, cached]
            scaled_scores=state["scaled_scores"][:, 0],  # [head, 1, cached] -> [head, cached]
            weights=state["weights"][:, 0],  # [head, 1, cached] -> [head, cached]
            context=state["context"][:, 0],  # [head, 1, d_k] -> [head, d_k]
            output=state["output"][0],  # [1, d_model] -> [d_model]
        ))
    return out


def decode_value_count(config: TraceConfig, n: int) -> int:
    """How many numbers ``decode`` returns for n tokens (every array of every step): the bound to check first."""
    h, g, d_k = config.num_heads, config.kv_heads, config.d_k
    # q, k, v; q_rotated, k_rotated under RoPE; context; output
    per_step = (h + 2 * g) * d_k + (h + g) * d_k * config.rope + h * d_k + config.d_model
    total = 0
    for pos in range(n):
        cached = pos + 1 if config.window is None else min(pos + 1, config.window)
        total += per_step + 2 * g * cached * d_k + 3 * h * cached  # the caches; scores, scaled, weights
    return total
