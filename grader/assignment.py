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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: stage ids the service checks, in walkthrough order (what multi_head_attention may return)
STAGES_OF_CONFIG = ("input", "q", "k", "v", "scores", "scaled_scores", "masked_scores", "weights", "context",
                    "concat", "output")
AXES = {"input": "token, d_model", "q": "head, token, d_k", "k": "head, token, d_k", "v": "head, token, d_k",
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


#: the order the grader calls the functions in (module docstring): walkthrough order
CALL_ORDER: tuple[str, ...] = tuple(FUNCTIONS)
#: the whole layer: called in a process of its own, never one that was given a stage function's inputs
LAYER = "multi_head_attention"


@dataclass
class Reference:
    """The reference's arrays for one configuration (one trace with include_parameters)."""

    arrays: dict[str, np.ndarray]  # stage id -> float64 array; masked_scores has NaN where masked
    causal: bool
    d_k: int
    n: int
    raw_config: dict[str, Any]
    trace: Any = None  # the engine's Trace, when the engine made it (its diagnosis recomputes from it)

    def get(self, name: str) -> Any:
        if name == "d_k":
            return self.d_k
        if name == "causal":
            return self.causal
        if name == "softmax_input":  # what the student's mask produces: -inf where masked
            if self.causal:
                return np.where(np.isnan(self.arrays["masked_scores"]), -np.inf, self.arrays["masked_scores"])
            return self.arrays["scaled_scores"]
        return self.arrays[name]

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

    def spec(name: str) -> dict[str, Any]:
        value = ref.get(name)
        if isinstance(value, np.ndarray):
            key = f"a{len(arrays)}"
            arrays[key] = np.array(value, dtype=np.float64)
            return {"array": key}
        return {"value": value}

    args = [spec(a) for a in part.args]
    kwargs = {k: spec(v) for k, v in part.kwargs}
    return arrays, args, kwargs


def stages_of_answer(arrays: dict[str, np.ndarray], part: Part) -> dict[str, np.ndarray]:
    """The stages a call answered: a returned array is the part's stage; a returned dict (only
    multi_head_attention is asked for one) is its stages as they are."""
    if "result" in arrays:
        return {part.stage: arrays["result"]}
    return dict(arrays)


__all__ = ["AXES", "CALL_ORDER", "FUNCTIONS", "LAYER", "Function", "Part", "Reference", "STAGES_OF_CONFIG", "call_arguments",
           "reference_from_engine", "reference_from_trace", "stages_of_answer"]
