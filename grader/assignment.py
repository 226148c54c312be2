"""The functions students write, what each is given and what it is graded as.

Every stage function is called on the reference's OWN inputs for that stage
(from a reference trace with ``include_parameters: true``), so a mistake in one
function costs that function's points and no other's. Shapes: n tokens, h
heads, d_k = d_model / h.

==========================  ==============================  =========================  ================
function                    given                           returns                    graded as
==========================  ==============================  =========================  ================
add_positional_encoding(e)  token embeddings [n, d_model]   x = e + PE [n, d_model]    input
project(x, W)               x, one of W_Q/W_K/W_V           [h, n, d_k]                q, k and v
                            [h, d_k, d_model]
scores(q, k)                [h, n, d_k] each                q kᵀ per head [h, n, n]     scores
scale(scores, d_k)          [h, n, n], an int               scores / √d_k              scaled_scores
mask(scores)                scaled scores [h, n, n]         causal: key > query        masked_scores
                                                            set to -inf                (causal only)
softmax(scores)             (masked) scaled scores;         softmax over keys          weights
                            -inf at masked keys
attend(weights, v)          [h, n, n], [h, n, d_k]          weights · v [h, n, d_k]    context
concat(context)             [h, n, d_k]                     [n, h·d_k], head 0 first   concat
output(concat, W_O)         [n, h·d_k], [d_model, h·d_k]    concat · W_Oᵀ [n, d_model] output
multi_head_attention(x,     x and the four matrices;        output [n, d_model] (or a  output (or the
  W_Q, W_K, W_V, W_O,       causal a bool                   dict of stages)            stages it
  causal=False)                                                                        returns)
==========================  ==============================  =========================  ================

The grader calls them in this table's order (``CALL_ORDER``: for every
configuration of one function before the next), because the answer to a call is
an input of a later one (x is project's input, q is scores', ...): it is sent only
after the call that answers it. The whole layer, multi_head_attention, is called
in a process of its own (``core.Grader.plan``): every stage input after x
determines its output (concat and W_O are output's inputs, and concat · W_Oᵀ *is*
the layer's output), so a process that had been given them could answer the
layer from memory.

A block course (``[block]`` in the course file, ASSIGNMENT-block.md) adds the
Transformer block around the attention, one block per configuration:

==========================  ==============================  =========================  ================
function                    given                           returns                    graded as
==========================  ==============================  =========================  ================
layer_norm(x, gamma, beta,  [n, d_model], [d_model] twice,  γ ⊙ (x − μ)/√(σ² + ε) + β  norm1, norm2 and
  eps)                      a float                         [n, d_model]               (pre-norm)
rms_norm(x, gamma, eps)     the same without beta           γ ⊙ x/√(mean(x²) + ε)      final_norm
ffn(x, W_1, W_2, W_3=None)  [n, d_model], [d_ff, d_model],  act(x·W_1ᵀ)·W_2ᵀ (SwiGLU:  ffn_output
                            [d_model, d_ff] (SwiGLU: W_3)   (SiLU(x·W_1ᵀ)⊙x·W_3ᵀ)·W_2ᵀ)
block(x, params,            x [n, d_model], a dict of the   the block's output         block_output
  causal=False)             block's weights and eps         [n, d_model] (pre-norm:
                                                            after the final norm)
lm_head(h, W_U)             the last hidden state [n,       h·W_Uᵀ [n, vocab]          logits
                            d_model], W_U [vocab, d_model]
next_token_probs(logits,    [n, vocab], a float             softmax(logits[n−1] / T)   next_token_probs
  temperature)                                              [vocab]
==========================  ==============================  =========================  ================

lm_head and next_token_probs are graded in a course whose [block] sets lm_head (course-block-lm.toml).

The attention's functions are graded in a block course too, on the block's own
attention (its input is the normalised x in pre-norm). Every call is made on the
reference's own inputs, in the order the block computes them (``Reference.order``:
in pre-norm the norm of x comes before the attention, whose input it is; in post-norm
the FFN comes before the second norm, whose input holds the FFN's answer). ``block``
runs in a process of its own, as the layer does: layer_norm's inputs determine its
output (in post-norm the block's output is the second norm's, of the input it was given).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: stage ids the service checks, in walkthrough order (what multi_head_attention may return)
STAGES_OF_CONFIG = ("input", "q", "k", "v", "scores", "scaled_scores", "masked_scores", "weights", "context",
                    "concat", "output")
#: a block course's stages (besides the attention's), in the order a block computes them (post-norm's order;
#: pre-norm computes norm2 before the FFN and ends with final_norm)
BLOCK_STAGES = ("norm1", "ffn_output", "norm2", "final_norm", "block_output", "logits", "next_token_probs")
AXES = {**dict.fromkeys(BLOCK_STAGES, "token, d_model"), "logits": "token, vocab", "next_token_probs": "vocab",
        "input": "token, d_model", "q": "head, token, d_k", "k": "head, token, d_k", "v": "head, token, d_k",
        "scores": "head, query, key", "scaled_scores": "head, query, key", "masked_scores": "head, query, key",
        "weights": "head, query, key", "context": "head, token, d_k", "concat": "token, h·d_k",
        "output": "token, d_model"}


@dataclass(frozen=True)
class Part:
    """One call of a function on one configuration: which arrays go in, and which stage comes out."""

    stage: str
    args: tuple[str, ...]  # reference array names, or "d_k"
    kwargs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Function:
    name: str
    signature: str
    parts: tuple[Part, ...]
    causal_only: bool = False
    what: str = ""
    norm: str | None = None  # layer_norm or rms_norm: graded in a block course of that norm only

    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(p.stage for p in self.parts)


FUNCTIONS: dict[str, Function] = {f.name: f for f in (
    Function("add_positional_encoding", "add_positional_encoding(embeddings)",
             (Part("input", ("token_embedding",)),), what="x = embeddings + sinusoidal positional encoding"),
    Function("project", "project(x, W)",
             (Part("q", ("input", "W_Q")), Part("k", ("input", "W_K")), Part("v", ("input", "W_V"))),
             what="per head, x · W[i]ᵀ (graded as Q, K and V)"),
    Function("scores", "scores(q, k)", (Part("scores", ("q", "k")),), what="q · kᵀ per head"),
    Function("scale", "scale(scores, d_k)", (Part("scaled_scores", ("scores", "d_k")),), what="scores / √d_k"),
    Function("mask", "mask(scores)", (Part("masked_scores", ("scaled_scores",)),), causal_only=True,
             what="the causal mask: every key after its query set to -inf"),
    Function("softmax", "softmax(scores)", (Part("weights", ("softmax_input",)),),
             what="softmax over the keys (masked keys get weight 0)"),
    Function("attend", "attend(weights, v)", (Part("context", ("weights", "v")),), what="weights · v per head"),
    Function("concat", "concat(context)", (Part("concat", ("context",)),), what="the heads side by side"),
    Function("output", "output(concat, W_O)", (Part("output", ("concat", "W_O")),), what="concat · W_Oᵀ"),
    Function("multi_head_attention", "multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False)",
             (Part("output", ("input", "W_Q", "W_K", "W_V", "W_O"), (("causal", "causal"),)),),
             what="the whole layer, end to end"),
)}


#: the block assignment's functions (a course with [block]); each norm's parts that a block does not have
#: (final_norm in post-norm) are not called
BLOCK_FUNCTIONS: dict[str, Function] = {f.name: f for f in (
    Function("layer_norm", "layer_norm(x, gamma, beta, eps)",
             tuple(Part(s, (f"{s}_input", f"{s}_gamma", f"{s}_beta", "eps")) for s in ("norm1", "norm2", "final_norm")),
             what="γ ⊙ (x − μ)/√(σ² + ε) + β over each token's features (graded as every norm of the block)",
             norm="layer_norm"),
    Function("rms_norm", "rms_norm(x, gamma, eps)",
             tuple(Part(s, (f"{s}_input", f"{s}_gamma", "eps")) for s in ("norm1", "norm2", "final_norm")),
             what="γ ⊙ x/√(mean(x²) + ε) over each token's features (graded as every norm of the block)",
             norm="rms_norm"),
    Function("ffn", "ffn(x, W_1, W_2, W_3=None)", (Part("ffn_output", ("ffn_input", "W_1", "W_2"), (("W_3", "W_3"),)),),
             what="the feed-forward network: act(x·W_1ᵀ)·W_2ᵀ, SwiGLU (SiLU(x·W_1ᵀ) ⊙ x·W_3ᵀ)·W_2ᵀ"),
    Function("block", "block(x, params, causal=False)",
             (Part("block_output", ("block_input", "block_params"), (("causal", "causal"),)),),
             what="the whole block, end to end"),
    Function("lm_head", "lm_head(h, W_U)", (Part("logits", ("lm_input", "unembedding")),),
             what="the logits of every position: the last hidden state times W_Uᵀ (W_U: the token embeddings)"),
    Function("next_token_probs", "next_token_probs(logits, temperature)",
             (Part("next_token_probs", ("logits", "temperature")),),
             what="softmax(logits[n − 1] / temperature) over the vocabulary: the next token's distribution"),
)}
#: every function a course may grade
ALL_FUNCTIONS: dict[str, Function] = {**FUNCTIONS, **BLOCK_FUNCTIONS}

#: the order the grader calls the functions in (module docstring): walkthrough order
CALL_ORDER: tuple[str, ...] = tuple(ALL_FUNCTIONS)
#: the whole layer: called in a process of its own, never one that was given a stage function's inputs
LAYER = "multi_head_attention"
#: the functions that each run in a process of their own (and that process's name: visible-layer, ...)
WHOLE: dict[str, str] = {LAYER: "layer", "block": "block"}
#: the functions a whole function calls: when they all pass and it fails, its wiring is wrong
CALLEES: dict[str, tuple[str, ...]] = {
    LAYER: ("project", "scores", "scale", "mask", "softmax", "attend", "concat", "output"),
    "block": ("layer_norm", "rms_norm", "ffn", LAYER),
}


@dataclass
class Reference:
    """The reference's arrays for one configuration (one trace with include_parameters)."""

    arrays: dict[str, np.ndarray]  # stage id -> float64 array; masked_scores has NaN where masked
    causal: bool
    d_k: int
    n: int
    raw_config: dict[str, Any]
    trace: Any = None  # the engine's Trace, when the engine made it (its diagnosis recomputes from it)
    #: a block configuration: the engine's trace of the one-block stack (``trace`` is then its attention alone,
    #: traced on the attention's own input with the layer's weights)
    stack: Any = None
    values: dict[str, Any] = field(default_factory=dict)  # a block's non-array arguments: eps, the params dict
    order: dict[str, int] = field(default_factory=dict)  # stage -> its place in the block's walkthrough

    def get(self, name: str) -> Any:
        if name == "d_k":
            return self.d_k
        if name == "causal":
            return self.causal
        if name in self.values:
            return self.values[name]
        if name == "softmax_input":  # what the student's mask produces: -inf where masked
            if self.causal:
                return np.where(np.isnan(self.arrays["masked_scores"]), -np.inf, self.arrays["masked_scores"])
            return self.arrays["scaled_scores"]
        return self.arrays[name]

    def has(self, name: str) -> bool:
        return name in self.values or name in self.arrays

    def expected_shape(self, stage: str) -> tuple[int, ...]:
        return tuple(self.arrays[stage].shape)


def reference_from_trace(trace: Any) -> Reference:
    """From the client's Trace (include_parameters: true, every stage)."""
    arrays = {sid: trace.array(sid) for sid in trace.stages if sid != "tokens"}
    p = trace.parameters
    arrays.update(W_Q=p.W_Q, W_K=p.W_K, W_V=p.W_V, W_O=p.W_O)
    cfg = trace.config
    return Reference(arrays, bool(cfg.causal), int(cfg.d_k), int(cfg.n_tokens), dict(trace.raw["config"]))


def reference_from_engine(t: Any) -> Reference:
    """From the engine's Trace (every stage, the parameters): the same arrays as a /trace answer's."""
    arrays = {}
    for sid, st in t.stages.items():
        if sid in ("tokens", "context_tokens"):
            continue
        a = np.array(st.values, dtype=np.float64)
        if st.mask is not None:
            a[np.broadcast_to(st.mask, a.shape)] = np.nan  # masked: NaN, as the client reads a null
        arrays[sid] = a
    p = t.parameters
    arrays.update(W_Q=p.W_Q, W_K=p.W_K, W_V=p.W_V, W_O=p.W_O)
    cfg = t.config
    return Reference(arrays, bool(cfg.causal), int(cfg.d_k), int(t.n_tokens), {}, trace=t)


def call_arguments(part: Part, ref: Reference) -> tuple[dict[str, np.ndarray], list[dict], dict[str, dict]]:
    """The arrays and the argument specs (for the harness) of one call."""
    arrays: dict[str, np.ndarray] = {}

    def spec(value: Any) -> dict[str, Any]:
        if isinstance(value, np.ndarray):
            key = f"a{len(arrays)}"
            arrays[key] = np.array(value, dtype=np.float64)
            return {"array": key}
        if isinstance(value, dict):  # block's params: a dict of arrays (and eps)
            return {"dict": {k: spec(v) for k, v in value.items()}}
        return {"value": value}

    args = [spec(ref.get(a)) for a in part.args]
    # an optional keyword this configuration has no value for (W_3 outside SwiGLU) is not passed
    kwargs = {k: spec(ref.get(v)) for k, v in part.kwargs if v in ("causal", "d_k") or ref.has(v)}
    return arrays, args, kwargs


def parts_of(fn: Function, ref: Reference) -> tuple[Part, ...]:
    """The parts of ``fn`` this configuration has: a norm the block does not have (final_norm in post-norm) is
    not called."""
    return tuple(p for p in fn.parts if p.stage in ref.arrays)


def stages_of_answer(arrays: dict[str, np.ndarray], part: Part) -> dict[str, np.ndarray]:
    """The stages a call answered: a returned array is the part's stage; a returned dict (only
    multi_head_attention is asked for one) is its stages as they are."""
    if "result" in arrays:
        return {part.stage: arrays["result"]}
    return dict(arrays)


__all__ = ["ALL_FUNCTIONS", "AXES", "BLOCK_FUNCTIONS", "BLOCK_STAGES", "CALLEES", "CALL_ORDER", "FUNCTIONS", "LAYER",
           "WHOLE", "Function", "Part", "Reference", "STAGES_OF_CONFIG", "call_arguments", "parts_of",
           "reference_from_engine", "reference_from_trace", "stages_of_answer"]
