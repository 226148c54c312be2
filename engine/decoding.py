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
from typing import Any

import numpy as np

from . import lm as LM
from .checks import check_decodable
from .errors import raise_all
from .layer import TraceConfig, decode_steps, initial_state, input_rows, run, stack_decode_steps
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


# ------------------------------------------------------------------ generation with the language-model head


@dataclass(frozen=True)
class GenerationStep:
    """One generated token: how it was chosen from the distribution before it, and its own decoding step."""

    position: int  # the new token's index in the sequence
    token: str  # its text: vocabulary[index]
    index: int  # its column in the vocabulary
    probability: float  # its probability in ``probs`` (at the temperature, before top-k/top-p)
    kept: np.ndarray  # the indices sampling could draw, most probable first (top-k, then top-p)
    kept_probs: np.ndarray  # their probabilities renormalised over the kept set
    logits: np.ndarray  # [vocab]: the logits of the position before it
    probs: np.ndarray  # [vocab]: softmax(logits / temperature)
    cache_positions: tuple[int, ...]  # the positions cached after its step (each layer caches the same)
    weights: np.ndarray  # [layer, head, cached]: the new token's row of attention in each layer


def generate(t: Trace, count: int, *, top_k: int | None = None, top_p: float | None = None,
             sample_seed: int | None = None) -> list[GenerationStep]:
    """Generate ``count`` tokens after ``t``'s sentence with its stack and language-model head: every token of
    the sentence, then each new one, goes through ``engine.layer.stack_decode_steps`` with a KV cache per layer
    (the prompt's last step gives the first distribution). Greedy without ``sample_seed``, else sampled
    (``engine.lm.choose``). The vocabulary is the trace's: a generated token is one of its columns."""
    config = t.config
    raise_all([*LM.generate_conflicts(lm_head=config.lm_head, causal=config.causal, n=t.n_tokens, generate=count,
                                      max_tokens=config.max_tokens),
               *LM.generate_input_conflicts(input_given=t.input_source == "explicit", bug=t.bug)])
    steps = stack_decode_steps(config)
    made = {out for s in steps for out in s.writes}
    base = {name: t.state[name] for s in steps for name in s.inputs if name not in made and name in t.state}
    g, d_k, L = config.kv_heads, config.d_k, config.num_layers
    caches = {f"{c}@{layer}": np.zeros((g, 0, d_k)) for c in ("k_cache", "v_cache") for layer in range(L)}
    texts = [tok.text for tok in t.tokens]
    vocab = t.state["vocabulary"]

    def step(pos: int) -> dict[str, Any]:
        state = {**base, **caches, "input": input_rows(config, texts[:pos + 1])[pos:], "position": pos}
        run(steps, state)
        caches.update({name: state[name] for name in caches})
        return state

    for pos in range(len(texts)):  # the sentence, one token at a time: its last step predicts the first new token
        state = step(pos)
    out: list[GenerationStep] = []
    for i in range(count):
        probs, row = state["next_token_probs"], state["logits"][-1]  # [vocab], [vocab]
        index, keep, renormalised = LM.choose(probs, top_k=top_k, top_p=top_p, sample_seed=sample_seed, step=i)
        texts.append(vocab[index])
        pos = len(texts) - 1
        state = step(pos)
        cached = caches["k_cache@0"].shape[1]
        out.append(GenerationStep(
            position=pos, token=vocab[index], index=index, probability=float(probs[index]), kept=keep,
            kept_probs=renormalised, logits=row, probs=probs,
            cache_positions=tuple(range(pos + 1 - cached, pos + 1)),
            weights=np.stack([state[f"weights@{layer}"][:, 0] for layer in range(L)])))  # L × [h, c] -> [L, h, c]
    return out


def generate_value_count(config: TraceConfig, n: int, n_vocab: int, count: int) -> int:
    """How many numbers ``generate`` returns: per step its logits and probabilities over the vocabulary, its kept
    set's probabilities (at most the vocabulary) and each layer's row of attention."""
    total = 0
    for i in range(count):
        pos = n + i
        cached = pos + 1 if config.window is None else min(pos + 1, config.window)
        total += 3 * n_vocab + config.num_layers * config.num_heads * cached
    return total


#: the work of one step of generation's recipe in the request budget's units (service/budget.py: one unit is one
#: number of a trace, ~42 ns): a step's Python overhead (~15 µs) dominates its arithmetic at teaching sizes
GENERATE_STEP_UNITS = 350
#: weights a row's matrix-vector products read per unit (BLAS reads ~8 in the ~42 ns of one unit)
GENERATE_WEIGHTS_PER_UNIT = 8


def generate_work(config: TraceConfig, n: int, n_vocab: int, count: int) -> int:
    """What ``generate`` costs in the budget's units: every token of the sentence and each new one runs the
    stack's decoding steps (each step's overhead, every weight once, the head's rows) and re-embeds the tokens
    so far. Measured (2 shared cores): 40 tokens and 20 generated by a gpt2 stack of d_model 64 took 139–164 ms
    with 4 layers (estimated 169 ms) and 405–540 ms with 12 (estimated 484 ms)."""
    per_token = (len(stack_decode_steps(config)) * GENERATE_STEP_UNITS
                 + (config.n_parameters + n_vocab * config.d_model) // GENERATE_WEIGHTS_PER_UNIT)
    return sum(per_token + (pos + 1) * config.d_model for pos in range(n + count))
