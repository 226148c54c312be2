"""One attention layer as data: the configuration chooses an ordered list of steps.

A :class:`Step` computes one named value from named values, ``state[name] =
fn(*state[inputs])``, with a pure function of ``engine.attention``. The state
starts with the tokens, the sizes and the weights; each step adds its output.
So:

* a **variant** is a choice of steps (``positional_encoding`` picks the
  encoding step, ``causal`` the mask step), made in :func:`layer_steps` and
  nowhere else;
* a **known mistake** (``engine.bugs``) is a step swapped for a wrong one;
* a trace can be **recomputed from any step on** (:func:`rerun`), reusing the
  arrays computed before it: that is how a mistake is shown or diagnosed.

Each step also carries its formula. ``{name}`` in it stands for the formula of
that input, so ``"softmax({masked_scores})"`` reads ``softmax(mask(QKᵀ/√d_k))``
and a swapped step rewrites every formula downstream of it (:func:`formulas`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Callable, Literal

import numpy as np

from . import attention as A
from .checks import check_choice, check_seed, head_dim
from .errors import InvalidSizeError, StageUnavailableError
from .params import token_embeddings

PositionalEncoding = Literal["sinusoidal", "none"]

DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: each step is made once
class Step:
    """``writes = fn(*inputs)``, read from and written to the state by name."""

    name: str  # what it computes; a stage id when the trace shows it
    fn: Callable[..., Any]
    inputs: tuple[str, ...]
    formula: str = ""  # "{input}" stands for that input's formula
    note: str = ""  # said after the formula of this stage only, not downstream
    outputs: tuple[str, ...] = ()  # when fn returns a tuple: the names of its parts

    @property
    def writes(self) -> tuple[str, ...]:
        return self.outputs or (self.name,)


@lru_cache(maxsize=32)
def _sinusoidal(n: int, d_model: int) -> np.ndarray:
    """Stage 3 for (n, d_model), computed once: it depends on nothing else (≤ 1 MiB each)."""
    pe = A.sinusoidal_positional_encoding(n, d_model)  # [n, d_model]
    pe.setflags(write=False)
    return pe


#: positional_encoding -> the step that computes stage 3
POSITIONAL_ENCODINGS: dict[str, Step] = {
    "sinusoidal": Step("positional_encoding", _sinusoidal, ("n", "d_model"),
                       "PE(pos, 2i) = sin(pos/10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos/10000^(2i/d_model))"),
    "none": Step("positional_encoding", A.no_positional_encoding, ("n", "d_model"), "PE = 0 (positional encoding off)"),
}

#: mask -> the steps that build the mask and apply it (stage 8, shown only when something is masked)
MASKS: dict[str, tuple[Step, Step]] = {
    "none": (Step("mask", A.no_mask, ("n",)),
             Step("masked_scores", A.apply_mask, ("scaled_scores", "mask"), "{scaled_scores}",
                  outputs=("masked_scores", "excluded"))),
    "causal": (Step("mask", A.causal_mask, ("n",)),
               Step("masked_scores", A.apply_mask, ("scaled_scores", "mask"), "mask({scaled_scores})",
                    note=": keys after the query are excluded", outputs=("masked_scores", "excluded"))),
}


@dataclass(frozen=True)
class TraceConfig:
    """What to compute. Constructing one checks every size and choice (``engine.checks``)."""

    d_model: int = 24
    num_heads: int = 1
    seed: int = 0
    scale: bool = True
    causal: bool = False
    positional_encoding: PositionalEncoding = "sinusoidal"
    max_tokens: int = DEFAULT_MAX_TOKENS

    def __post_init__(self) -> None:
        head_dim(self.d_model, self.num_heads)  # raises on bad sizes or fractional d_k
        check_seed(self.seed)
        check_choice("positional_encoding", self.positional_encoding, tuple(POSITIONAL_ENCODINGS))
        if self.max_tokens < 1:
            raise InvalidSizeError(f"max_tokens must be at least 1, got {self.max_tokens}", field="max_tokens")

    @property
    def d_k(self) -> int:
        return self.d_model // self.num_heads

    @property
    def scale_factor(self) -> float:
        return A.scale_factor(self.d_k, self.scale)

    @property
    def mask(self) -> str:
        return "causal" if self.causal else "none"


def layer_steps(config: TraceConfig, *, explicit_input: bool = False) -> tuple[Step, ...]:
    """The steps of this configuration, in walkthrough order (stages 2–12).

    With an explicit input x, stages 2–4 are not computed: x is in the state.
    """
    return _steps(config.positional_encoding, config.mask, config.scale, explicit_input)


@lru_cache(maxsize=64)  # one tuple per choice of variants, built once
def _steps(positional_encoding: str, mask: str, scale: bool, explicit_input: bool) -> tuple[Step, ...]:
    embed = (
        Step("token_embedding", token_embeddings, ("seed", "d_model", "tokens"), "E[token] (seeded, context-free)"),
        POSITIONAL_ENCODINGS[positional_encoding],
        Step("input", A.add_positional_encoding, ("token_embedding", "positional_encoding"), "x = E + PE"),
    )
    return (*(() if explicit_input else embed),
            Step("q", A.project, ("input", "W_Q"), "Qᵢ = x·W_Qᵢᵀ"),
            Step("k", A.project, ("input", "W_K"), "Kᵢ = x·W_Kᵢᵀ"),
            Step("v", A.project, ("input", "W_V"), "Vᵢ = x·W_Vᵢᵀ"),
            Step("scores", A.attention_scores, ("q", "k"), "QKᵀ"),
            # A parameter is a step too, so a mistake can swap it; its formula is the divisor.
            Step("scale_factor", A.scale_factor, ("d_k", "scale"), "/√d_k" if scale else "/1"),
            Step("scaled_scores", A.scale_scores, ("scores", "scale_factor"), "{scores}{scale_factor}"),
            *MASKS[mask],
            Step("weights", A.softmax, ("masked_scores", "excluded"), "softmax({masked_scores})"),
            Step("context", A.weighted_values, ("weights", "v"), "{weights}V"),
            Step("concat", A.concat_heads, ("context",), "Concat(head₁, …, head_h)"),
            Step("output", A.output_projection, ("concat", "W_O"), "{concat}·W_Oᵀ"))


def initial_state(config: TraceConfig, texts: list[str], weights: dict[str, np.ndarray],
                  x: np.ndarray | None = None) -> dict[str, Any]:
    """What the steps start from: tokens, sizes, settings, weights, and x when it is given."""
    state: dict[str, Any] = {"tokens": texts, "n": len(texts), "seed": config.seed, "d_model": config.d_model,
                             "num_heads": config.num_heads, "d_k": config.d_k, "scale": config.scale, **weights}
    if x is not None:
        state["input"] = x
    return state


def run(steps: tuple[Step, ...], state: dict[str, Any], start: int = 0) -> None:
    """Run ``steps[start:]`` in order, adding each output to ``state``."""
    for step in steps[start:]:
        out = step.fn(*[state[name] for name in step.inputs])
        if step.outputs:
            state.update(zip(step.outputs, out))
        else:
            state[step.name] = out


@lru_cache(maxsize=256)
def formulas(steps: tuple[Step, ...]) -> MappingProxyType[str, str]:
    """Each value's formula as shown, a function of the steps alone (so computed once per choice of steps)."""
    expr = {"tokens": "split into words and punctuation", "input": "x = E + PE"}  # also when x is given
    shown = dict(expr)
    for step in steps:
        expr[step.name] = step.formula.format_map(expr)
        shown[step.name] = expr[step.name] + step.note
    return MappingProxyType(shown)


def attend(x: np.ndarray, weights: dict[str, np.ndarray], config: TraceConfig) -> dict[str, Any]:
    """Stages 5–12 alone, on an input x [n, d_model]: every named value the steps computed."""
    state = initial_state(config, [""] * len(x), weights, x)
    run(layer_steps(config, explicit_input=True), state)
    return state


def rerun(steps: tuple[Step, ...], state: dict[str, Any],
          replacements: tuple[Step, ...]) -> tuple[tuple[Step, ...], dict[str, Any]]:
    """Swap steps (by name) and recompute from the first swapped one on, reusing everything before it."""
    swap = {s.name: s for s in replacements}
    names = [s.name for s in steps]
    missing = set(swap) - set(names)
    if missing:
        raise ValueError(f"these steps are not part of the layer: {sorted(missing)}")
    new_steps = tuple(swap.get(s.name, s) for s in steps)
    start = min(names.index(name) for name in swap)
    new_state = dict(state)  # the entries from `start` on are all overwritten
    run(new_steps, new_state, start)
    return new_steps, new_state


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

_NOT_CAUSAL = "the masked_scores stage exists only with causal: true; add it or drop the stage"
_NOT_COMPUTED = ("token_embedding and positional_encoding are not computed when you give your own input; "
                 "drop them from the submission")


def stage_ids(config: TraceConfig, *, explicit_input: bool = False) -> tuple[str, ...]:
    """The stages a trace of this configuration shows, in walkthrough order."""
    absent = set() if config.causal else {"masked_scores"}  # nothing is masked: no step 8
    if explicit_input:
        absent |= {"token_embedding", "positional_encoding"}
    return tuple(sid for sid in STAGE_IDS if sid not in absent)


def check_stages(wanted: list[str], config: TraceConfig, *, explicit_input: bool, field: str,
                 keyed: bool = False) -> None:
    """Every wanted stage must be one this configuration computes.

    ``field`` is where they were asked for; ``keyed`` when it is an object keyed
    by stage id (a /check submission), so the pointer can name the stage.
    """
    if "masked_scores" in wanted and not config.causal:
        raise StageUnavailableError(_NOT_CAUSAL, field=f"{field}/masked_scores" if keyed else field,
                                    code="stage_needs_causal")
    if explicit_input and {"token_embedding", "positional_encoding"} & set(wanted):
        raise StageUnavailableError(_NOT_COMPUTED, field=field, code="stage_not_computed")


def trace_value_count(config: TraceConfig, n: int, *, with_parameters: bool) -> int:
    """How many numbers a trace returns (its generated stages, the stats, the weights if asked):
    the bound checked before computing it."""
    per_token, per_pair = _value_rates(config.d_model, config.num_heads, config.causal)
    return per_pair * n * n + per_token * n + (4 * config.d_model * config.d_model if with_parameters else 0)


@lru_cache(maxsize=256)
def _value_rates(d_model: int, num_heads: int, causal: bool) -> tuple[int, int]:
    """Numbers per token and per (query, key) pair, summed over the stages (and the stats)."""
    config = TraceConfig(d_model=d_model, num_heads=num_heads, causal=causal)
    size = {"d_model": d_model, "head": num_heads, "d_k": config.d_k, "concat": d_model}
    per_token = 2 * num_heads  # the stats: entropy and max_weight, [head, query]
    per_pair = 0
    for sid in stage_ids(config)[1:]:
        axes = STAGE_INFO[sid].axes
        tokens = sum(a in ("token", "query", "key") for a in axes)  # each such axis has length n
        rest = math.prod(size[a] for a in axes if a not in ("token", "query", "key"))
        if tokens == 1:
            per_token += rest
        else:
            per_pair += rest
    return per_token, per_pair
