"""Assemble the full per-stage trace of one multi-head self-attention layer.

Walkthrough order (stage ids are a public contract)::

     1 tokens               sentence -> words and punctuation
     2 token_embedding      E[token]                         [token, d_model]
     3 positional_encoding  PE(pos)                          [token, d_model]
     4 input                x = E + PE                       [token, d_model]
     5 q, k, v              x·W_Qᵢᵀ, x·W_Kᵢᵀ, x·W_Vᵢᵀ        [head, token, d_k]
     6 scores               QKᵀ                              [head, query, key]
     7 scaled_scores        QKᵀ/√d_k  (or /1)                [head, query, key]
     8 masked_scores        causal mask (only when causal)   [head, query, key]
     9 weights              softmax(·) per row               [head, query, key]
    10 context              weights·V                        [head, token, d_k]
    11 concat               Concat(head₁…head_h)             [token, h·d_k]
    12 output               concat·W_Oᵀ                      [token, d_model]
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np

from . import attention as A
from .bugs import BUGS
from .errors import EmptyInputError, InvalidSizeError, ShapeError, TooManyTokensError, UnknownBugError
from .params import (
    Parameters,
    generate_parameters,
    generated_parameters_digest,
    parameters_digest,
    token_embeddings,
)
from .tokenize import Token, tokenize, tokens_from_list
from .version import ENGINE_VERSION

PositionalEncoding = Literal["sinusoidal", "none"]

DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class TraceConfig:
    d_model: int = 24
    num_heads: int = 1
    seed: int = 0
    scale: bool = True
    causal: bool = False
    positional_encoding: PositionalEncoding = "sinusoidal"
    max_tokens: int = DEFAULT_MAX_TOKENS

    def __post_init__(self) -> None:
        A.head_dim(self.d_model, self.num_heads)  # raises on bad sizes or fractional d_k
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or not 0 <= self.seed < 2**32:
            raise InvalidSizeError(f"seed must be an integer from 0 to 2^32 - 1, got {self.seed!r}", field="seed")
        if self.positional_encoding not in ("sinusoidal", "none"):
            raise InvalidSizeError(
                f'positional_encoding must be "sinusoidal" or "none", got {self.positional_encoding!r}',
                field="positional_encoding",
            )
        if self.max_tokens < 1:
            raise InvalidSizeError(f"max_tokens must be at least 1, got {self.max_tokens}", field="max_tokens")

    @property
    def d_k(self) -> int:
        return self.d_model // self.num_heads

    @property
    def scale_factor(self) -> float:
        return A.scale_factor(self.d_k, self.scale)


@dataclass(frozen=True)
class StageInfo:
    id: str
    step: int
    title: str
    axes: tuple[str, ...]


STAGES: tuple[StageInfo, ...] = (
    StageInfo("tokens", 1, "Tokens", ("token",)),
    StageInfo("token_embedding", 2, "Token embedding", ("token", "d_model")),
    StageInfo("positional_encoding", 3, "Positional encoding", ("token", "d_model")),
    StageInfo("input", 4, "Input: embedding + position", ("token", "d_model")),
    StageInfo("q", 5, "Queries", ("head", "token", "d_k")),
    StageInfo("k", 5, "Keys", ("head", "token", "d_k")),
    StageInfo("v", 5, "Values", ("head", "token", "d_k")),
    StageInfo("scores", 6, "Raw scores", ("head", "query", "key")),
    StageInfo("scaled_scores", 7, "Scaled scores", ("head", "query", "key")),
    StageInfo("masked_scores", 8, "Causally masked scores", ("head", "query", "key")),
    StageInfo("weights", 9, "Attention weights", ("head", "query", "key")),
    StageInfo("context", 10, "Per-head context", ("head", "token", "d_k")),
    StageInfo("concat", 11, "Concatenated heads", ("token", "concat")),
    StageInfo("output", 12, "Output projection", ("token", "d_model")),
)
STAGE_IDS: tuple[str, ...] = tuple(s.id for s in STAGES)
STAGE_INFO: dict[str, StageInfo] = {s.id: s for s in STAGES}


def stage_formulas(config: TraceConfig, bug: str | None = None) -> dict[str, str]:
    """Human-readable formula per stage, reflecting the toggles and any injected bug."""
    div = {"scale_after_softmax": "", "scale_by_d_model": "/√d_model", "double_scale": "/d_k",
           "no_scale": ""}.get(bug or "", "/√d_k" if config.scale else "/1")
    mask = "fill0" if bug == "finite_mask_fill" else "mask"
    pre = f"{mask}(QKᵀ{div})" if config.causal else f"QKᵀ{div}"
    soft = {"softmax_wrong_axis": f"softmax_over_queries({pre})",
            "scale_after_softmax": f"softmax({pre})/√d_k"}.get(bug or "", f"softmax({pre})")
    pe = (
        "PE(pos, 2i) = sin(pos/10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos/10000^(2i/d_model))"
        if config.positional_encoding == "sinusoidal"
        else "PE = 0 (positional encoding off)"
    )
    return {
        "tokens": "split into words and punctuation",
        "token_embedding": "E[token] (seeded, context-free)",
        "positional_encoding": pe,
        "input": "x = E + PE",
        "q": "Qᵢ = x·W_Qᵢᵀ",
        "k": "Kᵢ = x·W_Kᵢᵀ",
        "v": "Vᵢ = x·W_Vᵢᵀ",
        "scores": "QKᵀ",
        "scaled_scores": f"QKᵀ{div}",
        "masked_scores": "fill0(QKᵀ): keys after the query are set to 0, not excluded"
        if bug == "finite_mask_fill" else f"mask(QKᵀ{div}): keys after the query are excluded",
        "weights": soft,
        "context": f"{soft}V",
        "concat": "Mean(head₁, …, head_h)" if bug == "average_heads" else "Concat(head₁, …, head_h)",
        "output": "Tile(Mean(head₁, …, head_h))·W_Oᵀ" if bug == "average_heads" else "Concat(head₁, …, head_h)·W_Oᵀ",
    }


@dataclass(frozen=True)
class Stage:
    info: StageInfo
    formula: str
    values: np.ndarray | list[str]
    mask: np.ndarray | None = None  # True = masked (null in JSON); same shape as values

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.values),) if isinstance(self.values, list) else self.values.shape


@dataclass(frozen=True)
class Trace:
    config: TraceConfig
    tokens: list[Token]
    parameters: Parameters
    parameters_digest: str
    stages: dict[str, Stage]
    entropy: np.ndarray  # [head, query]
    max_weight: np.ndarray  # [head, query]
    engine_version: str = ENGINE_VERSION
    parameters_source: Literal["generated", "explicit"] = "generated"
    input_source: Literal["generated", "explicit"] = "generated"
    bug: str | None = None  # the injected bug's name, if any

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def split_tokens(config: TraceConfig, *, sentence: str | None = None, tokens: list[str] | None = None) -> list[Token]:
    """Stage 1, with the token-count checks."""
    if (sentence is None) == (tokens is None):
        raise EmptyInputError("give exactly one of sentence or tokens", field="sentence")
    if tokens is not None:
        if len(tokens) > config.max_tokens:
            raise TooManyTokensError(
                f"{len(tokens)} tokens is more than the limit of {config.max_tokens}", field="tokens"
            )
        for i, t in enumerate(tokens):
            if not t or t.isspace():
                raise EmptyInputError(f"tokens[{i}] is empty or only whitespace", field=f"tokens/{i}")
        out = tokens_from_list(tokens)
        where = "tokens"
    else:
        out = tokenize(sentence, limit=config.max_tokens + 1)
        if len(out) > config.max_tokens:
            raise TooManyTokensError(
                f"the sentence has more than {config.max_tokens} tokens (the limit); shorten it", field="sentence"
            )
        where = "sentence"
    if not out:
        raise EmptyInputError(
            "the sentence has no tokens: give at least one word or punctuation mark", field=where
        )
    return out


def trace(
    config: TraceConfig,
    *,
    sentence: str | None = None,
    tokens: list[str] | None = None,
    input: np.ndarray | None = None,
    parameters: Parameters | None = None,
    bug: str | None = None,
) -> Trace:
    """Run every stage for one sentence (or pre-split tokens) and return them all.

    ``input`` [token, d_model] and ``parameters`` replace the generated ones;
    ``bug`` injects one of ``engine.bugs.BUGS`` (the result is labelled).
    """
    if bug is not None and bug not in BUGS:
        raise UnknownBugError(f"unknown bug {bug!r}; known bugs: {', '.join(BUGS)}", field="inject_bug")
    if bug == "finite_mask_fill" and not config.causal:
        raise UnknownBugError("the finite_mask_fill bug needs causal: true (there is no mask without it)",
                              field="inject_bug")
    toks = split_tokens(config, sentence=sentence, tokens=tokens)
    n, d_model = len(toks), config.d_model

    if parameters is None:
        params = generate_parameters(config.seed, d_model, config.num_heads)
    else:
        if parameters.W_Q.shape != (config.num_heads, config.d_k, d_model):
            raise ShapeError(
                f"parameters are for d_model {parameters.d_model} and num_heads {parameters.num_heads}, "
                f"but the configuration has d_model {d_model} and num_heads {config.num_heads}",
                field="parameters",
            )
        params = parameters
    if input is None:
        E = token_embeddings(config.seed, d_model, [t.text for t in toks])  # [n, d_model]
        if config.positional_encoding == "sinusoidal":
            PE = _positional_encoding(n, d_model)  # [n, d_model], cached, read-only
        else:
            PE = A.no_positional_encoding(n, d_model)  # [n, d_model]
        x = A.add_positional_encoding(E, PE)  # [n, d_model]
    else:
        x = np.asarray(input, dtype=np.float64)
        if x.shape != (n, d_model):
            raise ShapeError(
                f"input has shape {list(x.shape)} but must be [{n}, {d_model}] ([token, d_model])", field="input"
            )
        E, PE = None, None

    # Generated values are bounded (|E| ≤ √1.5, |PE| ≤ 1, |W| ≤ √(3/d_model)), so
    # no stage can overflow; only caller-supplied arrays need the finite checks.
    explicit = input is not None or parameters is not None
    if explicit and not np.isfinite(x).all():
        raise ShapeError("input contains a non-finite value", field="input")
    with np.errstate(over="ignore", invalid="ignore"):  # huge explicit values: checked just below
        core = attend(x, params, scale_factor=config.scale_factor, causal=config.causal, bug=bug)
    formulas = stage_formulas(config, bug)
    values: dict[str, np.ndarray | list[str] | None] = {
        "tokens": [t.text for t in toks],
        "token_embedding": E,
        "positional_encoding": PE,
        "input": x,
        **core,
    }
    stages = {}
    for info in STAGES:
        v = values.get(info.id)
        if v is None:
            continue  # masked_scores without causal; E and PE with explicit input
        mask = core["mask"] if info.id == "masked_scores" else None
        stages[info.id] = Stage(info, formulas[info.id], v, mask)
    if explicit and not all(np.isfinite(a).all() for a in core.values() if a.dtype != bool):
        # Only explicit inputs this large (|x|·|W| beyond ~1e150) can overflow float64.
        raise ShapeError("the explicit input and parameters overflow float64; use smaller values", field="input")

    return Trace(
        config=config,
        tokens=toks,
        parameters=params,
        parameters_digest=(generated_parameters_digest(config.seed, d_model, config.num_heads)
                           if parameters is None else parameters_digest(params)),
        stages=stages,
        entropy=A.entropy(core["weights"]),
        max_weight=A.max_weight(core["weights"]),
        parameters_source="generated" if parameters is None else "explicit",
        input_source="generated" if input is None else "explicit",
        bug=bug,
    )


@lru_cache(maxsize=32)
def _positional_encoding(n: int, d_model: int) -> np.ndarray:
    """Stage 3 for (n, d_model), computed once: it depends on nothing else (≤ 1 MiB each)."""
    pe = A.sinusoidal_positional_encoding(n, d_model)  # [n, d_model]
    pe.setflags(write=False)
    return pe


def attend(
    x: np.ndarray, params: Parameters, *, scale_factor: float, causal: bool, bug: str | None = None
) -> dict[str, np.ndarray]:
    """Stages 5–12 on an input x [n, d_model]; returns each stage's array.

    ``bug`` injects one of the documented mistakes in ``engine.bugs`` instead
    of the correct step; every other step stays correct.
    """
    n = x.shape[0]
    h, d_k, d_model = params.W_Q.shape
    q = A.project(x, params.W_Q)  # [n, d_model] -> [h, n, d_k]
    k = A.project(x, params.W_K)  # [n, d_model] -> [h, n, d_k]
    v = A.project(x, params.W_V)  # [n, d_model] -> [h, n, d_k]
    scores = A.attention_scores(q, k)  # [h, n, n]

    factor = {
        "scale_after_softmax": 1.0,
        "scale_by_d_model": float(np.sqrt(d_model)),
        "double_scale": scale_factor * scale_factor,
        "no_scale": 1.0,
    }.get(bug or "", scale_factor)
    scaled = A.scale_scores(scores, factor)  # [h, n, n]

    mask = np.broadcast_to(A.causal_mask(n), scaled.shape) if causal else None  # [n, n] -> [h, n, n]
    if bug == "finite_mask_fill" and mask is not None:
        filled = np.where(mask, 0.0, scaled)  # a finite fill: the key still takes part
        weights = A.softmax(filled)  # [h, n, n]
    elif bug == "softmax_wrong_axis":
        weights = A.softmax(scaled.swapaxes(-1, -2), None if mask is None else mask.swapaxes(-1, -2))
        weights = weights.swapaxes(-1, -2)  # normalised over queries: columns sum to 1
    else:
        weights = A.softmax(scaled, mask)  # [h, n, n]
    if bug == "scale_after_softmax":
        weights = weights / scale_factor  # rows now sum to 1/√d_k

    context = A.weighted_values(weights, v)  # [h, n, d_k]
    if bug == "average_heads":
        concat = context.mean(axis=0)  # [h, n, d_k] -> [n, d_k]: the heads' signals blur together
        tiled = np.tile(concat, (1, h))  # [n, d_k] -> [n, h·d_k]: every head slot holds the mean
        output = A.output_projection(tiled, params.W_O)  # [n, h·d_k] -> [n, d_model]
    else:
        concat = A.concat_heads(context)  # [h, n, d_k] -> [n, h·d_k]
        output = A.output_projection(concat, params.W_O)  # [n, h·d_k] -> [n, d_model]
    out = {
        "q": q, "k": k, "v": v,
        "scores": scores, "scaled_scores": scaled,
        "weights": weights, "context": context, "concat": concat, "output": output,
    }
    if causal:
        if bug == "finite_mask_fill":
            out["masked_scores"] = np.where(mask, 0.0, scaled)
            out["mask"] = np.zeros_like(mask)  # the bug: nothing is excluded, the zeros are real values
        else:
            out["masked_scores"] = np.where(mask, 0.0, scaled)  # masked entries carried by "mask", not values
            out["mask"] = mask
    return out
