"""One attention layer as data: the configuration chooses an ordered list of steps.

A :class:`Step` computes one named value from named values, ``state[name] =
fn(*state[inputs])``, with a pure function of ``engine.attention``. The state
starts with the tokens, the sizes and the weights; each step adds its output.
So:

* a **variant** is a choice of steps, made in :func:`layer_steps` and nowhere
  else, from registries: ``POSITIONAL_ENCODINGS`` (the additive encoding of
  stage 3), ``ROPE_PAIRINGS`` (with ``positional_encoding: "rope"``: no stage
  3, q and k rotated instead), ``MASKS`` (none, causal, sliding window), and
  for grouped-query attention a step that shares each K/V head among its
  query heads; cross-attention projects k and v from the context's own input;
* a **known mistake** (``engine.bugs``) is a step swapped for a wrong one;
* a trace can be **recomputed from any step on** (:func:`rerun`), reusing the
  arrays computed before it: that is how a mistake is shown or diagnosed;
* **KV-cache decoding** (``engine.decoding``) runs :func:`decode_steps` once
  per token, with the cache in the state.

Each step also carries its formula. ``{name}`` in it stands for the formula of
that input, so ``"softmax({masked_scores})"`` reads ``softmax(mask(QKᵀ/√d_k))``
and a swapped step rewrites every formula downstream of it (:func:`formulas`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from types import MappingProxyType
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Literal

import numpy as np

from . import attention as A
from .checks import (
    check_choice,
    check_rope_base,
    check_seed,
    check_window_size,
    head_dim,
    kv_heads,
    rope_conflicts,
    window_conflicts,
)
from .errors import EngineError, InvalidSizeError, StageUnavailableError, raise_all
from .params import token_embeddings

PositionalEncoding = Literal["sinusoidal", "none", "rope"]
RopePairing = Literal["rotate_half", "interleaved"]

DEFAULT_MAX_TOKENS = 256
DEFAULT_ROPE_BASE = 10000.0


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


@lru_cache(maxsize=32)
def _rope_table(n: int, d_k: int, base: float) -> np.ndarray:
    """RoPE's angles θ[pos, i] for positions 0 … n − 1, computed once per (n, d_k, base)."""
    angles = A.rope_angles(np.arange(n), d_k, base)  # [n, d_k/2]
    angles.setflags(write=False)
    return angles


@lru_cache(maxsize=32)
def _causal_mask(n: int) -> np.ndarray:
    """Stage 8's causal mask for n tokens, built once per n (≤ 64 KiB each): /check rebuilds it per known bug."""
    mask = A.causal_mask(n)  # [n, n]
    mask.setflags(write=False)
    return mask


@lru_cache(maxsize=32)
def _sliding_window_mask(n: int, window: int) -> np.ndarray:
    """The sliding-window mask, built once per (n, window)."""
    mask = A.sliding_window_mask(n, window)  # [n, n]
    mask.setflags(write=False)
    return mask


def _rope_position(position: int, d_k: int, base: float) -> np.ndarray:
    """RoPE's angles for one position (decoding): the same numbers as that row of the table."""
    return A.rope_angles(np.array([position]), d_k, base)  # [1, d_k/2]


#: positional_encoding -> the step that computes stage 3, an encoding added to the embeddings
POSITIONAL_ENCODINGS: dict[str, Step] = {
    "sinusoidal": Step("positional_encoding", _sinusoidal, ("n", "d_model"),
                       "PE(pos, 2i) = sin(pos/10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos/10000^(2i/d_model))"),
    "none": Step("positional_encoding", A.no_positional_encoding, ("n", "d_model"), "PE = 0 (positional encoding off)"),
}

_ROPE_NOTE = {
    "rotate_half": ": rotate-half pairs (j, j + d_k/2) turn by θⱼ = pos·rope_base^(−2j/d_k), j < d_k/2",
    "interleaved": ": interleaved pairs (2j, 2j + 1) turn by θⱼ = pos·rope_base^(−2j/d_k), j < d_k/2",
}
_ROTATE = {"rotate_half": A.rotate_half, "interleaved": A.rotate_interleaved}

#: rope_pairing -> the steps that rotate q and k (positional_encoding "rope": there is no stage 3 then)
ROPE_PAIRINGS: dict[str, tuple[Step, Step]] = {
    pairing: (Step("q_rotated", _ROTATE[pairing], ("q", "rope_angles"), "RoPE(Qᵢ, pos)", note=_ROPE_NOTE[pairing]),
              Step("k_rotated", _ROTATE[pairing], ("k", "rope_angles"), "RoPE(Kᵢ, pos)", note=_ROPE_NOTE[pairing]))
    for pairing in ("rotate_half", "interleaved")
}

#: every value of positional_encoding: an additive encoding, or RoPE
POSITIONAL_ENCODING_CHOICES: tuple[str, ...] = (*POSITIONAL_ENCODINGS, "rope")

#: mask -> the steps that build the mask and apply it (stage 8, shown only when something is masked)
MASKS: dict[str, tuple[Step, Step]] = {
    "none": (Step("mask", A.no_mask, ("n",)),
             Step("masked_scores", A.apply_mask, ("scaled_scores", "mask"), "{scaled_scores}",
                  outputs=("masked_scores", "excluded"))),
    "causal": (Step("mask", _causal_mask, ("n",)),
               Step("masked_scores", A.apply_mask, ("scaled_scores", "mask"), "mask({scaled_scores})",
                    note=": keys after the query are excluded", outputs=("masked_scores", "excluded"))),
    "sliding_window": (Step("mask", _sliding_window_mask, ("n", "window")),
                       Step("masked_scores", A.apply_mask, ("scaled_scores", "mask"), "mask_window({scaled_scores})",
                            note=": keys after the query, and keys window or more positions before it, are excluded",
                            outputs=("masked_scores", "excluded"))),
}

#: mask -> how decoding keeps its K/V cache (a sliding window keeps only the last window positions)
DECODE_CACHES: dict[str, Callable[[str, str], Step]] = {
    "causal": lambda cache, new: Step(cache, A.append_to_cache, (cache, new)),
    "sliding_window": lambda cache, new: Step(cache, A.append_to_window_cache, (cache, new, "window")),
}


@dataclass(frozen=True)
class TraceConfig:
    """What to compute. Constructing one checks every size and choice (``engine.checks``).

    Variants (each None/default is engine 1.0's multi-head self-attention, step for step):

    * ``positional_encoding="rope"`` with ``rope_base`` and ``rope_pairing``:
      no additive encoding; q and k rotated per head after the projection;
    * ``num_kv_heads``: grouped-query attention (1 is multi-query); None is num_heads;
    * ``window``: with ``causal``, a key window or more positions before its query is masked too.

    Cross-attention is chosen by giving ``trace`` a context, not here.
    """

    d_model: int = 24
    num_heads: int = 1
    seed: int = 0
    scale: bool = True
    causal: bool = False
    positional_encoding: PositionalEncoding = "sinusoidal"
    max_tokens: int = DEFAULT_MAX_TOKENS
    num_kv_heads: int | None = None
    window: int | None = None
    rope_base: float = DEFAULT_ROPE_BASE
    rope_pairing: RopePairing = "rotate_half"

    def __post_init__(self) -> None:
        head_dim(self.d_model, self.num_heads)  # raises on bad sizes or fractional d_k
        kv_heads(self.num_heads, self.num_kv_heads)  # raises unless it divides num_heads
        check_seed(self.seed)
        check_choice("positional_encoding", self.positional_encoding, POSITIONAL_ENCODING_CHOICES)
        check_choice("rope_pairing", self.rope_pairing, tuple(ROPE_PAIRINGS))
        check_rope_base(self.rope_base)
        check_window_size(self.window)
        # Both conflicts a configuration can have on its own, reported together (a context's come in trace()).
        raise_all([*(rope_conflicts(self.d_model, self.num_heads) if self.positional_encoding == "rope" else []),
                   *window_conflicts(self.window, self.causal)])
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
        if not self.causal:
            return "none"
        return "causal" if self.window is None else "sliding_window"

    @property
    def rope(self) -> bool:
        return self.positional_encoding == "rope"

    # ------------------------------------------------------- grouped-query attention

    @property
    def kv_heads(self) -> int:
        """How many K/V heads there are: num_kv_heads, or num_heads when it is None."""
        return kv_heads(self.num_heads, self.num_kv_heads)

    @property
    def kv_group_size(self) -> int:
        """How many query heads share each K/V head (1: multi-head, num_heads: multi-query)."""
        return self.num_heads // self.kv_heads

    @property
    def grouped(self) -> bool:
        """Whether K/V heads are shared (GQA or MQA): fewer K/V heads than query heads."""
        return self.kv_heads != self.num_heads

    @property
    def kv_head_of_query_head(self) -> tuple[int, ...]:
        """For each query head i, the K/V head it reads: ⌊i / kv_group_size⌋."""
        return tuple(i // self.kv_group_size for i in range(self.num_heads))

    @property
    def query_heads_of_kv_head(self) -> tuple[tuple[int, ...], ...]:
        """For each K/V head j, the query heads that share it: j·G … j·G + G − 1 (G = kv_group_size)."""
        group = self.kv_group_size
        return tuple(tuple(range(j * group, (j + 1) * group)) for j in range(self.kv_heads))

    @property
    def kv_cache_values_per_token(self) -> int:
        """Numbers a KV cache keeps per token for this layer: a key and a value row per K/V head, 2·g·d_k."""
        return 2 * self.kv_heads * self.d_k

    @property
    def kv_cache_bytes_per_token(self) -> dict[str, int]:
        """The KV cache per token and layer, in bytes, at each float width."""
        return {dtype: size * self.kv_cache_values_per_token
                for dtype, size in (("float16", 2), ("float32", 4), ("float64", 8))}

    @property
    def n_matrices(self) -> int:
        """W_Qᵢ per query head, W_Kⱼ and W_Vⱼ per K/V head, and W_O: h + 2·g + 1."""
        return self.num_heads + 2 * self.kv_heads + 1

    @property
    def n_parameters(self) -> int:
        """2·d_model² (W_Q, W_O) + 2·g·d_k·d_model (W_K, W_V): 4·d_model² without shared K/V heads."""
        return 2 * self.d_model * self.d_model + 2 * self.kv_heads * self.d_k * self.d_model


def layer_steps(config: TraceConfig, *, explicit_input: bool = False, cross: bool = False,
                decode: bool = False) -> tuple[Step, ...]:
    """The steps of this configuration, in walkthrough order (stages 2–12): the one recipe.

    With an explicit input x, stages 2–4 are not computed: x is in the state
    (with cross-attention, the context's x too). ``cross``: keys and values
    come from the context (``context_input``) instead of the sentence.
    ``decode``: one step of KV-cache decoding (:func:`decode_steps`).
    """
    return _steps(config.positional_encoding, config.mask, config.scale, explicit_input or decode,
                  config.rope_pairing if config.rope else None, config.grouped, cross, decode)


def decode_steps(config: TraceConfig) -> tuple[Step, ...]:
    """One step of KV-cache decoding, for causal self-attention: the new token's x (``input``, [1, d_model])
    at ``position`` is projected, rotated under RoPE, appended to the cache, and attends to every cached key.

    The same recipe as the full trace (:func:`layer_steps`), with two differences: RoPE's angles are those
    of ``position``, and k and v go through the cache (``DECODE_CACHES``) before the scores. The cache holds
    exactly the keys the new query may see (the last ``window`` with a sliding window), so nothing is masked.
    """
    return layer_steps(config, decode=True)


_CONTEXT_EMBEDDING = Step("context_token_embedding", token_embeddings, ("seed", "d_model", "context_tokens"),
                          "E[context token] (seeded, context-free)")
_KV_NOTE = ": one per K/V head j; query head i reads K/V head ⌊i·num_kv_heads/num_heads⌋"


def _embedding_steps(positional_encoding: str, rope: bool, cross: bool) -> tuple[Step, ...]:
    """Stages 2–4: x from the tokens (and, in cross-attention, the context's x from its tokens)."""
    if not rope:  # an additive encoding, stage 3
        embed: tuple[Step, ...] = (
            Step("token_embedding", token_embeddings, ("seed", "d_model", "tokens"), "E[token] (seeded, context-free)"),
            POSITIONAL_ENCODINGS[positional_encoding],
            Step("input", A.add_positional_encoding, ("token_embedding", "positional_encoding"), "x = E + PE"),
        )
    else:  # RoPE: x is the embedding alone, position enters by rotating q and k
        embed = (Step("token_embedding", token_embeddings, ("seed", "d_model", "tokens"),
                      "E[token] (seeded, context-free)"),
                 Step("input", A.embedding_as_input, ("token_embedding",), "x = E",
                      note=" (RoPE: no positional encoding is added; q and k are rotated instead)"))
    if cross:  # the context's own embeddings and positions 0 … m − 1, with the same encoding
        encoding = POSITIONAL_ENCODINGS[positional_encoding]
        embed += (_CONTEXT_EMBEDDING,
                  replace(encoding, name="context_positional_encoding", inputs=("m", "d_model"),
                          formula=re.sub(r"\bpos\b", "pos_ctx", encoding.formula)),
                  Step("context_input", A.add_positional_encoding,
                       ("context_token_embedding", "context_positional_encoding"), "x_ctx = E + PE"))
    return embed


@lru_cache(maxsize=64)  # one tuple per choice of variants, built once
def _steps(positional_encoding: str, mask: str, scale: bool, explicit_input: bool, rope_pairing: str | None = None,
           grouped: bool = False, cross: bool = False, decode: bool = False) -> tuple[Step, ...]:
    embed = () if explicit_input else _embedding_steps(positional_encoding, rope_pairing is not None, cross)
    kv_source, kv_name = ("context_input", "x_ctx") if cross else ("input", "x")
    kv_note = _KV_NOTE if grouped else ""
    j = "ⱼ" if grouped else "ᵢ"
    projections = (Step("q", A.project, ("input", "W_Q"), "Qᵢ = x·W_Qᵢᵀ"),
                   Step("k", A.project, (kv_source, "W_K"), f"K{j} = {kv_name}·W_K{j}ᵀ", note=kv_note),
                   Step("v", A.project, (kv_source, "W_V"), f"V{j} = {kv_name}·W_V{j}ᵀ", note=kv_note))
    q, k, v = "q", "k", "v"
    rotation: tuple[Step, ...] = ()
    if rope_pairing is not None:  # the angles of every position, or of the one being decoded
        angles = (Step("rope_angles", _rope_position, ("position", "d_k", "rope_base")) if decode
                  else Step("rope_angles", _rope_table, ("n", "d_k", "rope_base")))
        rotation = (angles, *ROPE_PAIRINGS[rope_pairing])
        q, k = "q_rotated", "k_rotated"
    caching: tuple[Step, ...] = ()
    if decode:  # the new k and v join the cache; the query attends to everything cached
        caching = (DECODE_CACHES[mask]("k_cache", k), DECODE_CACHES[mask]("v_cache", v))
        k, v = "k_cache", "v_cache"
    sharing: tuple[Step, ...] = ()
    if grouped:  # each query head reads its group's K/V head
        sharing = (Step("k_shared", A.share_kv_heads, (k, "kv_group")),
                   Step("v_shared", A.share_kv_heads, (v, "kv_group")))
        k, v = "k_shared", "v_shared"
    return (*embed,
            *projections,
            *rotation,
            *caching,
            *sharing,
            Step("scores", A.attention_scores, (q, k), "QKᵀ" if rope_pairing is None else "RoPE(Q)RoPE(K)ᵀ"),
            # A parameter is a step too, so a mistake can swap it; its formula is the divisor.
            Step("scale_factor", A.scale_factor, ("d_k", "scale"), "/√d_k" if scale else "/1"),
            Step("scaled_scores", A.scale_scores, ("scores", "scale_factor"), "{scores}{scale_factor}"),
            *MASKS["none" if decode else mask],  # the cache holds only the keys a decoded query may see
            Step("weights", A.softmax, ("masked_scores", "excluded"), "softmax({masked_scores})"),
            Step("context", A.weighted_values, ("weights", v), "{weights}V"),
            Step("concat", A.concat_heads, ("context",), "Concat(head₁, …, head_h)"),
            Step("output", A.output_projection, ("concat", "W_O"), "{concat}·W_Oᵀ"))


def initial_state(config: TraceConfig, texts: list[str], weights: dict[str, np.ndarray],
                  x: np.ndarray | None = None, *, context_texts: list[str] | None = None,
                  context_x: np.ndarray | None = None) -> dict[str, Any]:
    """What the steps start from: tokens, sizes, settings, weights, and x when it is given."""
    state: dict[str, Any] = {"tokens": texts, "n": len(texts), "seed": config.seed, "d_model": config.d_model,
                             "num_heads": config.num_heads, "d_k": config.d_k, "scale": config.scale, **weights,
                             "kv_group": config.kv_group_size, "window": config.window,
                             "rope_base": config.rope_base}
    if x is not None:
        state["input"] = x
    if context_texts is not None:
        state["context_tokens"] = context_texts
        state["m"] = len(context_texts)
    if context_x is not None:
        state["context_input"] = context_x
    return state


def run(steps: tuple[Step, ...], state: dict[str, Any], start: int = 0, stop: int | None = None) -> None:
    """Run ``steps[start:stop]`` in order, adding each output to ``state``."""
    for step in steps[start:stop]:
        out = step.fn(*[state[name] for name in step.inputs])
        if step.outputs:
            state.update(zip(step.outputs, out))
        else:
            state[step.name] = out


@lru_cache(maxsize=256)
def formulas(steps: tuple[Step, ...]) -> MappingProxyType[str, str]:
    """Each value's formula as shown, a function of the steps alone (so computed once per choice of steps)."""
    expr = {"tokens": "split into words and punctuation", "input": "x = E + PE",  # also when x is given
            "context_tokens": "split into words and punctuation", "context_input": "x_ctx = E + PE"}
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


class Rerun(Mapping[str, Any]):
    """The named values after swapping steps (by name), computed on demand: everything before the first
    swapped step is reused, and the steps from it on run, in order, only as far as the values read need.

    /check's diagnosis reads the first wrong stage of each known bug's rerun first; most bugs differ
    there, and then the steps after it never run. :meth:`finish` runs the rest.
    """

    def __init__(self, steps: tuple[Step, ...], state: dict[str, Any], replacements: tuple[Step, ...]) -> None:
        self.steps, self._next, stale = swapped(steps, replacements)
        self._state = dict(state)  # the entries from the first swapped step on are all overwritten
        self._stale = set(stale)

    def needs_run(self, key: str) -> bool:
        """Whether reading ``key`` runs steps (it is computed at or after the first swapped step)."""
        return key in self._stale

    def __getitem__(self, key: str) -> Any:
        while key in self._stale:  # run the steps up to the one that makes it
            step = self.steps[self._next]
            run(self.steps, self._state, self._next, self._next + 1)
            self._stale.difference_update(step.writes)
            self._next += 1
        return self._state[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)

    def finish(self) -> dict[str, Any]:
        """Every value, the remaining steps run."""
        run(self.steps, self._state, self._next)
        self._next, self._stale = len(self.steps), set()
        return self._state


@lru_cache(maxsize=1024)  # a function of two tuples of steps (each made once): /check asks per bug, per request
def swapped(steps: tuple[Step, ...], replacements: tuple[Step, ...]) -> tuple[tuple[Step, ...], int, frozenset[str]]:
    """``steps`` with the replacements swapped in (by name), the index of the first swapped step, and
    the values it and the steps after it write (the ones a rerun recomputes)."""
    swap = {s.name: s for s in replacements}
    names = [s.name for s in steps]
    missing = set(swap) - set(names)
    if missing:
        raise ValueError(f"these steps are not part of the layer: {sorted(missing)}")
    new = tuple(swap.get(s.name, s) for s in steps)
    start = min(names.index(name) for name in swap)
    return new, start, frozenset(out for s in new[start:] for out in s.writes)


def rerun(steps: tuple[Step, ...], state: dict[str, Any],
          replacements: tuple[Step, ...]) -> tuple[tuple[Step, ...], dict[str, Any]]:
    """Swap steps (by name) and recompute from the first swapped one on, reusing everything before it."""
    r = Rerun(steps, state, replacements)
    return r.steps, r.finish()


@dataclass(frozen=True)
class StageInfo:
    id: str
    step: int
    title: str
    axes: tuple[str, ...]
    #: on the key/value side: its token axis indexes the keys' tokens (the context's in cross-attention),
    #: and its head axis is a K/V head ("kv_head") under grouped-query attention
    kv: bool = False


STAGES: tuple[StageInfo, ...] = (
    StageInfo("tokens", 1, "Tokens", ("token",)),
    StageInfo("token_embedding", 2, "Token embedding", ("token", "d_model")),
    StageInfo("positional_encoding", 3, "Positional encoding", ("token", "d_model")),
    StageInfo("input", 4, "Input: embedding + position", ("token", "d_model")),
    StageInfo("context_tokens", 1, "Context tokens", ("token",), kv=True),
    StageInfo("context_token_embedding", 2, "Context token embedding", ("token", "d_model"), kv=True),
    StageInfo("context_positional_encoding", 3, "Context positional encoding", ("token", "d_model"), kv=True),
    StageInfo("context_input", 4, "Context input: embedding + position", ("token", "d_model"), kv=True),
    StageInfo("q", 5, "Queries", ("head", "token", "d_k")),
    StageInfo("k", 5, "Keys", ("head", "token", "d_k"), kv=True),
    StageInfo("v", 5, "Values", ("head", "token", "d_k"), kv=True),
    StageInfo("q_rotated", 5, "Queries rotated by position (RoPE)", ("head", "token", "d_k")),
    StageInfo("k_rotated", 5, "Keys rotated by position (RoPE)", ("head", "token", "d_k"), kv=True),
    StageInfo("scores", 6, "Raw scores", ("head", "query", "key")),
    StageInfo("scaled_scores", 7, "Scaled scores", ("head", "query", "key")),
    StageInfo("masked_scores", 8, "Causally masked scores", ("head", "query", "key")),
    StageInfo("weights", 9, "Attention weights", ("head", "query", "key")),
    StageInfo("context", 10, "Per-head context", ("head", "token", "d_k")),
    StageInfo("concat", 11, "Concatenated heads", ("token", "concat")),
    StageInfo("output", 12, "Output projection", ("token", "d_model")),
)
#: every stage any configuration shows, in walkthrough order
ALL_STAGE_IDS: tuple[str, ...] = tuple(s.id for s in STAGES)
#: the stages whose values are token texts, not numbers (the queries' tokens, and the context's)
TOKEN_STAGE_IDS: frozenset[str] = frozenset({"tokens", "context_tokens"})
_ROPE_STAGES = ("q_rotated", "k_rotated")
_CONTEXT_STAGES = ("context_tokens", "context_token_embedding", "context_positional_encoding", "context_input")
#: the stages of multi-head self-attention without RoPE or a context: engine 1.0's list, which the API publishes
STAGE_IDS: tuple[str, ...] = tuple(sid for sid in ALL_STAGE_IDS if sid not in _ROPE_STAGES + _CONTEXT_STAGES)
#: the stages only a variant shows (RoPE's rotations, cross-attention's context)
VARIANT_STAGE_IDS: tuple[str, ...] = tuple(sid for sid in ALL_STAGE_IDS if sid not in STAGE_IDS)
STAGE_INFO: dict[str, StageInfo] = {s.id: s for s in STAGES}

_NOT_CAUSAL = "the masked_scores stage exists only with causal: true; add it or drop the stage"
_NOT_ROPE = ("the q_rotated and k_rotated stages exist only with positional_encoding: \"rope\"; use RoPE or drop "
             "them")
_ROPE_HAS_NO_PE = ("with positional_encoding: \"rope\" no positional encoding is added to x (q and k are rotated "
                   "instead), so there is no positional_encoding stage; drop it")
_NOT_CROSS = ("the context stages exist only in cross-attention, with context_sentence or context_tokens; give a "
              "context or drop them")
#: the stages your own x (input, context_input) replaces: what makes x is not computed then
_GIVEN_INPUT_SKIPS = {"token_embedding": "input", "positional_encoding": "input",
                      "context_token_embedding": "context_input", "context_positional_encoding": "context_input"}


def _not_computed(sid: str, field: str) -> str:
    given = _GIVEN_INPUT_SKIPS[sid]
    return (f"{sid} is not computed when you give your own {given}: x is taken as given, not made from "
            f"embeddings and positional encodings; drop it from {field}")


def stage_ids(config: TraceConfig, *, explicit_input: bool = False, cross: bool = False) -> tuple[str, ...]:
    """The stages a trace of this configuration shows, in walkthrough order (``cross``: with a context)."""
    return _stage_ids(config.mask, config.rope, explicit_input, cross)


@lru_cache(maxsize=64)  # one tuple per choice of variants
def _stage_ids(mask: str, rope: bool, explicit_input: bool, cross: bool) -> tuple[str, ...]:
    absent = _absent(mask, rope, explicit_input, cross)
    return tuple(sid for sid in ALL_STAGE_IDS if sid not in absent)


def _absent(mask: str, rope: bool, explicit_input: bool, cross: bool) -> set[str]:
    absent = set() if mask != "none" else {"masked_scores"}  # nothing is masked: no step 8
    absent |= {"positional_encoding", "context_positional_encoding"} if rope else set(_ROPE_STAGES)
    if not cross:
        absent |= set(_CONTEXT_STAGES)
    if explicit_input:
        absent |= {"token_embedding", "positional_encoding", "context_token_embedding", "context_positional_encoding"}
    return absent


def check_stages(wanted: list[str], config: TraceConfig, *, explicit_input: bool, field: str,
                 keyed: bool = False, cross: bool = False) -> None:
    """Every wanted stage must be one this configuration computes.

    ``field`` is where they were asked for; ``keyed`` when it is an object keyed
    by stage id (a /check submission), so the pointer can name the stage.
    """
    at = (lambda sid: f"{field}/{sid}") if keyed else (lambda sid: field)
    asked = set(wanted)
    problems: list[EngineError] = []  # every stage this configuration does not compute, in walkthrough order
    for sid in ALL_STAGE_IDS:
        if sid not in asked:
            continue
        if sid == "masked_scores" and not config.causal:
            problems.append(StageUnavailableError(_NOT_CAUSAL, field=at(sid), code="stage_needs_causal"))
        elif sid in _ROPE_STAGES and not config.rope:
            problems.append(StageUnavailableError(_NOT_ROPE, field=at(sid), code="stage_needs_rope"))
        elif sid in _CONTEXT_STAGES and not cross:
            problems.append(StageUnavailableError(_NOT_CROSS, field=at(sid), code="stage_needs_context"))
        elif sid in ("positional_encoding", "context_positional_encoding") and config.rope:
            problems.append(StageUnavailableError(_ROPE_HAS_NO_PE, field=at(sid), code="stage_not_computed"))
        elif sid in _GIVEN_INPUT_SKIPS and explicit_input:
            problems.append(StageUnavailableError(_not_computed(sid, field), field=at(sid),
                                                  code="stage_not_computed"))
    raise_all(problems)


def stage_axes(sid: str, config: TraceConfig, *, cross: bool = False) -> tuple[tuple[str, ...], tuple[str | None, ...]]:
    """A stage's axis names, and for each axis the token list it indexes ("tokens", "context_tokens" or None).

    Self-attention without shared K/V heads gives ``STAGE_INFO[sid].axes``
    unchanged. Under GQA/MQA the head axis of k, v and k_rotated is "kv_head"
    (num_kv_heads long). In cross-attention the "key" axis, and the token axis
    of k, v and the context stages, index the context's tokens.
    """
    return _stage_axes(sid, config.grouped, cross)


@lru_cache(maxsize=256)  # a function of the stage and two choices: computed once each
def _stage_axes(sid: str, grouped: bool, cross: bool) -> tuple[tuple[str, ...], tuple[str | None, ...]]:
    info = STAGE_INFO[sid]
    keys = "context_tokens" if cross else "tokens"
    own = keys if info.kv else "tokens"
    names = tuple("kv_head" if a == "head" and info.kv and grouped else a for a in info.axes)
    lists = tuple({"token": own, "query": "tokens", "key": keys}.get(a) for a in info.axes)
    return names, lists


@lru_cache(maxsize=4096)  # asked for every stage of every request: a handful of configurations and sizes recur
def stage_shape(sid: str, config: TraceConfig, n: int, n_context: int | None = None) -> tuple[int, ...]:
    """The shape of a stage for n tokens (and n_context context tokens in cross-attention)."""
    names, lists = stage_axes(sid, config, cross=n_context is not None)
    length = {"tokens": n, "context_tokens": n if n_context is None else n_context}
    size = {"head": config.num_heads, "kv_head": config.kv_heads, "d_k": config.d_k, "d_model": config.d_model,
            "concat": config.num_heads * config.d_k}
    return tuple(length[t] if t else size[a] for a, t in zip(names, lists))


@lru_cache(maxsize=1024)  # the bound every request checks: cached per configuration and size (all hashable)
def trace_value_count(config: TraceConfig, n: int, *, with_parameters: bool, n_context: int | None = None,
                      explicit_input: bool = False) -> int:
    """How many numbers a trace returns (its generated stages, the stats, the weights if asked):
    the bound checked before computing it.

    ``n_context`` is the context's token count in cross-attention. With
    ``explicit_input`` the embedding and encoding stages are left out; without
    it they are counted, which bounds either case.
    """
    count = 2 * config.num_heads * n  # the stats: entropy and max_weight, [head, query]
    for sid in stage_ids(config, explicit_input=explicit_input, cross=n_context is not None):
        if sid not in ("tokens", "context_tokens"):  # strings, not numbers
            count += math.prod(stage_shape(sid, config, n, n_context))
    return count + (config.n_parameters if with_parameters else 0)
