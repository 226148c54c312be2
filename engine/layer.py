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
from functools import cached_property, lru_cache
from types import MappingProxyType
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Literal

import numpy as np

from . import attention as A
from . import block as B
from . import constructed as C
from . import lm as LM
from .checks import (
    check_choice,
    check_d_ff,
    check_norm_eps,
    check_num_layers,
    check_optional_choice,
    check_rope_base,
    check_seed,
    check_window_size,
    head_dim,
    kv_heads,
    layer_conflicts,
    rope_conflicts,
    window_conflicts,
)
from .errors import EngineError, InvalidSizeError, StageUnavailableError, raise_all
from .params import token_embeddings

PositionalEncoding = Literal["sinusoidal", "none", "rope"]
RopePairing = Literal["rotate_half", "interleaved"]
NormKind = Literal["layer_norm", "rms_norm"]
NormPosition = Literal["post", "pre"]
FFNKind = Literal["relu", "gelu", "gelu_tanh", "swiglu"]
NormWeights = Literal["unit", "seeded"]

NORM_KINDS: tuple[str, ...] = ("layer_norm", "rms_norm")
NORM_POSITIONS: tuple[str, ...] = ("post", "pre")
FFN_KINDS: tuple[str, ...] = ("relu", "gelu", "gelu_tanh", "swiglu")
NORM_WEIGHTS: tuple[str, ...] = ("unit", "seeded")
#: Llama's SwiGLU width rounds ⌊2·(4·d_model)/3⌋ up to a multiple of this (Meta's llama/model.py, multiple_of)
SWIGLU_MULTIPLE_OF = 256


@dataclass(frozen=True)
class BlockPreset:
    """A published block's choices, set together by ``block``; any block field given overrides its own."""

    norm: str
    norm_position: str
    ffn: str
    norm_eps: float
    #: what the preset also sets in the attention, unless the request gives it (``preset_fields``)
    positional_encoding: str
    causal: bool


BLOCK_PRESETS: dict[str, BlockPreset] = {
    # Vaswani et al. 2017's encoder block: post-norm LayerNorm, ReLU, d_ff = 4·d_model, sinusoidal positions
    # (torch.nn.TransformerEncoderLayer's defaults; ε as torch.nn.LayerNorm's).
    "vaswani2017": BlockPreset("layer_norm", "post", "relu", 1e-5, "sinusoidal", False),
    # GPT-2: pre-norm LayerNorm with a final ln_f, GELU's tanh approximation (gelu_new), causal. Its learned
    # position embeddings are not seeded here: the encoding stays the request's (sinusoidal by default).
    "gpt2": BlockPreset("layer_norm", "pre", "gelu_tanh", 1e-5, "sinusoidal", True),
    # Llama: pre-norm RMSNorm with a final norm, SwiGLU, RoPE, causal; GQA with num_kv_heads.
    "llama": BlockPreset("rms_norm", "pre", "swiglu", 1e-6, "rope", True),
}
#: the block of a request that gives block fields but no preset
DEFAULT_BLOCK = "vaswani2017"
#: the TraceConfig fields that ask for a block (any one of them given: a stack of blocks, not attention alone)
BLOCK_FIELDS: tuple[str, ...] = ("block", "norm", "norm_position", "ffn", "d_ff", "norm_eps", "norm_weights")


def preset_fields(block: str | None, given: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """What a preset sets outside the block, for the fields not ``given``: llama's RoPE, gpt2's and llama's
    causal mask. (The block's own choices are resolved by ``TraceConfig`` itself.)"""
    if block not in BLOCK_PRESETS:
        return {}
    p = BLOCK_PRESETS[block]
    return {name: value for name, value in (("positional_encoding", p.positional_encoding), ("causal", p.causal))
            if name not in given}


def swiglu_width(d_model: int, multiple_of: int = SWIGLU_MULTIPLE_OF) -> int:
    """Llama's SwiGLU d_ff: ⌊2·(4·d_model)/3⌋ rounded up to a multiple of ``multiple_of`` (11008 at d_model 4096),
    so that the three matrices hold about as many weights as a 4·d_model FFN's two."""
    hidden = 2 * (4 * d_model) // 3
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)

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
    # The block (any of these given: a stack of Transformer blocks around the attention; all None: attention alone)
    num_layers: int = 1
    block: str | None = None  # a preset: "vaswani2017", "gpt2" or "llama"; the fields below override it
    norm: NormKind | None = None
    norm_position: NormPosition | None = None
    ffn: FFNKind | None = None
    d_ff: int | None = None
    norm_eps: float | None = None
    norm_weights: NormWeights | None = None
    # Constructed heads (engine.constructed): one kind per head ("seeded", "previous_token", …); None is all seeded
    head_weights: tuple[str, ...] | None = None
    sharpness: float = C.DEFAULT_SHARPNESS  # the constructed heads' scores are sharpness × their closed form
    # The language-model head (engine.lm): None is no head (the trace ends with the stack's last hidden state)
    lm_head: str | None = None  # "tied" (W_U = the vocabulary's token embeddings) or "seeded"
    temperature: float = 1.0  # next_token_probs = softmax(logits[n − 1] / temperature)
    candidates: tuple[str, ...] | None = None  # tokens the vocabulary holds besides the sentence's own

    def __post_init__(self) -> None:
        if isinstance(self.head_weights, list):  # hashable, as every field
            object.__setattr__(self, "head_weights", tuple(self.head_weights))
        if isinstance(self.candidates, list):
            object.__setattr__(self, "candidates", tuple(self.candidates))
        head_dim(self.d_model, self.num_heads)  # raises on bad sizes or fractional d_k
        kv_heads(self.num_heads, self.num_kv_heads)  # raises unless it divides num_heads
        check_seed(self.seed)
        check_choice("positional_encoding", self.positional_encoding, POSITIONAL_ENCODING_CHOICES)
        check_choice("rope_pairing", self.rope_pairing, tuple(ROPE_PAIRINGS))
        check_rope_base(self.rope_base)
        check_window_size(self.window)
        # Both conflicts a configuration can have on its own, reported together (a context's come in trace()).
        check_num_layers(self.num_layers)
        check_optional_choice("block", self.block, tuple(BLOCK_PRESETS))
        check_optional_choice("norm", self.norm, NORM_KINDS)
        check_optional_choice("norm_position", self.norm_position, NORM_POSITIONS)
        check_optional_choice("ffn", self.ffn, FFN_KINDS)
        check_d_ff(self.d_ff)
        check_norm_eps(self.norm_eps)
        check_optional_choice("norm_weights", self.norm_weights, NORM_WEIGHTS)
        raise_all([*(rope_conflicts(self.d_model, self.num_heads) if self.positional_encoding == "rope" else []),
                   *window_conflicts(self.window, self.causal), *layer_conflicts(self.num_layers, self.has_block)])
        if self.max_tokens < 1:
            raise InvalidSizeError(f"max_tokens must be at least 1, got {self.max_tokens}", field="max_tokens")
        raise_all(C.head_conflicts(self.head_weights, self.sharpness, d_model=self.d_model, num_heads=self.num_heads,
                                   num_layers=self.num_layers, block=self.has_block, rope=self.rope,
                                   grouped=self.grouped, rope_base=self.rope_base))
        check_optional_choice("lm_head", self.lm_head, LM.LM_HEADS)
        LM.check_temperature(self.temperature)
        LM.check_candidates(self.candidates)
        raise_all(LM.lm_conflicts(lm_head=self.lm_head, block=self.has_block,
                                  temperature_given=self.temperature != 1.0,
                                  candidates_given=self.candidates is not None))

    # The values derived from the fields that every trace reads (several times each) are cached properties:
    # the configuration is immutable, and the service builds one per distinct configuration
    # (service.models), so they are computed once.

    # ------------------------------------------------------- constructed heads

    @cached_property
    def head_kinds(self) -> tuple[str, ...]:
        """Each head's kind: "seeded" unless ``head_weights`` constructs it."""
        return self.head_weights if self.head_weights is not None else (C.SEEDED,) * self.num_heads

    @cached_property
    def constructed(self) -> bool:
        """Whether any head is constructed (then x is laid out in subspaces: engine.constructed)."""
        return any(kind != C.SEEDED for kind in self.head_kinds)

    @property
    def layout(self) -> C.Layout:
        return C.layout(self.d_model, self.head_kinds, (self.rope_pairing, self.rope_base) if self.rope else None)

    @cached_property
    def d_k(self) -> int:
        return self.d_model // self.num_heads

    @cached_property
    def scale_factor(self) -> float:
        return A.scale_factor(self.d_k, self.scale)

    @cached_property
    def mask(self) -> str:
        if not self.causal:
            return "none"
        return "causal" if self.window is None else "sliding_window"

    @cached_property
    def rope(self) -> bool:
        return self.positional_encoding == "rope"

    # ------------------------------------------------------- grouped-query attention

    @cached_property
    def kv_heads(self) -> int:
        """How many K/V heads there are: num_kv_heads, or num_heads when it is None."""
        return kv_heads(self.num_heads, self.num_kv_heads)

    @cached_property
    def kv_group_size(self) -> int:
        """How many query heads share each K/V head (1: multi-head, num_heads: multi-query)."""
        return self.num_heads // self.kv_heads

    @cached_property
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
        """W_Qᵢ per query head, W_Kⱼ and W_Vⱼ per K/V head, and W_O: h + 2·g + 1; a block adds its FFN's 2 (SwiGLU 3)
        matrices, per layer."""
        attention = self.num_heads + 2 * self.kv_heads + 1
        if not self.has_block:
            return attention
        return self.num_layers * (attention + (3 if self.gated else 2))

    @property
    def n_attention_parameters(self) -> int:
        """One attention layer's weights: 2·d_model² (W_Q, W_O) + 2·g·d_k·d_model (W_K, W_V)."""
        return 2 * self.d_model * self.d_model + 2 * self.kv_heads * self.d_k * self.d_model

    @property
    def n_parameters(self) -> int:
        """2·d_model² (W_Q, W_O) + 2·g·d_k·d_model (W_K, W_V): 4·d_model² without shared K/V heads. A stack adds,
        per layer, the FFN's 2·d_ff·d_model (SwiGLU 3·d_ff·d_model) and two norms' γ (and β), then the final norm's."""
        if not self.has_block:
            return self.n_attention_parameters
        norm = self.d_model * (2 if self.norm_kind == "layer_norm" else 1)
        ffn = (3 if self.gated else 2) * self.ff_width * self.d_model
        return self.num_layers * (self.n_attention_parameters + ffn + 2 * norm) + (norm if self.final_norm else 0)

    # ------------------------------------------------------- the block

    @cached_property  # asked for every stage of every trace: computed once per configuration
    def has_block(self) -> bool:
        """Whether this is a stack of Transformer blocks (any block field given), not one attention layer."""
        return any(getattr(self, name) is not None for name in BLOCK_FIELDS)

    @property
    def preset(self) -> BlockPreset:
        """The preset whose choices fill the block fields not given (vaswani2017 without ``block``)."""
        return BLOCK_PRESETS[self.block or DEFAULT_BLOCK]

    @property
    def norm_kind(self) -> str:
        return self.norm or self.preset.norm

    @property
    def pre_norm(self) -> bool:
        """Pre-norm (GPT-2, Llama: x + Sublayer(Norm(x)), and a final norm) rather than post-norm (2017)."""
        return (self.norm_position or self.preset.norm_position) == "pre"

    @property
    def ffn_kind(self) -> str:
        return self.ffn or self.preset.ffn

    @property
    def gated(self) -> bool:
        """SwiGLU: a third matrix, W_3, whose projection the activated gate multiplies."""
        return self.ffn_kind == "swiglu"

    @property
    def ff_width(self) -> int:
        """d_ff: as given, else 4·d_model, or for SwiGLU Llama's ``swiglu_width(d_model)``."""
        if self.d_ff is not None:
            return self.d_ff
        return swiglu_width(self.d_model) if self.gated else 4 * self.d_model

    @property
    def eps(self) -> float:
        return float(self.norm_eps if self.norm_eps is not None else self.preset.norm_eps)

    @property
    def seeded_norm(self) -> bool:
        """Whether the norms' γ and β are seeded (else γ = 1, β = 0)."""
        return self.norm_weights == "seeded"

    @property
    def final_norm(self) -> bool:
        """A pre-norm stack ends with a norm of the last residual stream (GPT-2's ln_f, Llama's norm)."""
        return self.has_block and self.pre_norm

    @property
    def has_lm_head(self) -> bool:
        """Whether the stack ends with the language-model head (logits and next-token probabilities)."""
        return self.lm_head is not None

    @classmethod
    def preset_config(cls, block: str, **fields: Any) -> TraceConfig:
        """A configuration of the preset ``block``, with what it sets outside the block (llama's RoPE, gpt2's and
        llama's causal mask) unless ``fields`` gives it: ``TraceConfig.preset_config("llama", d_model=32,
        num_heads=4, num_kv_heads=2, num_layers=2)``."""
        return cls(block=block, **{**preset_fields(block, set(fields)), **fields})


def layer_steps(config: TraceConfig, *, explicit_input: bool = False, cross: bool = False,
                decode: bool = False) -> tuple[Step, ...]:
    """The steps of this configuration, in walkthrough order (stages 2–12): the one recipe.

    With an explicit input x, stages 2–4 are not computed: x is in the state
    (with cross-attention, the context's x too). ``cross``: keys and values
    come from the context (``context_input``) instead of the sentence.
    ``decode``: one step of KV-cache decoding (:func:`decode_steps`).
    """
    if config.has_block:  # cross-attention and decoding are refused with a block (engine.checks)
        return _stack_steps(config.positional_encoding, config.mask, config.scale, explicit_input,
                            config.rope_pairing if config.rope else None, config.grouped, config.norm_kind,
                            config.pre_norm, config.ffn_kind, config.num_layers, config.constructed,
                            config.lm_head)
    return _steps(config.positional_encoding, config.mask, config.scale, explicit_input or decode,
                  config.rope_pairing if config.rope else None, config.grouped, cross, decode, config.constructed)


def decode_steps(config: TraceConfig) -> tuple[Step, ...]:
    """One step of KV-cache decoding, for causal self-attention: the new token's x (``input``, [1, d_model])
    at ``position`` is projected, rotated under RoPE, appended to the cache, and attends to every cached key.

    The same recipe as the full trace (:func:`layer_steps`), with two differences: RoPE's angles are those
    of ``position``, and k and v go through the cache (``DECODE_CACHES``) before the scores. The cache holds
    exactly the keys the new query may see (the last ``window`` with a sliding window), so nothing is masked.
    """
    return layer_steps(config, decode=True)


@lru_cache(maxsize=32)  # one tuple per configuration
def stack_decode_steps(config: TraceConfig) -> tuple[Step, ...]:
    """One token through a causal stack with a KV cache per layer (``k_cache@l``, ``v_cache@l``), then the
    final norm and the language-model head on its row: generation's step (``engine.decoding.generate``).

    Each layer is the block's template around the attention's decoding steps (:func:`decode_steps`' recipe);
    the unembedding is the trace's own (not recomputed)."""
    rope_pairing = config.rope_pairing if config.rope else None
    attention = _steps("sinusoidal", config.mask, config.scale, True, rope_pairing, config.grouped, False, True)
    before, after = block_wiring(config.norm_kind, config.pre_norm, config.ffn_kind)
    template = (*before, *attention, *after)
    L = config.num_layers
    layers = tuple(in_layer(step, layer) for layer in range(L) for step in template)
    tail: tuple[Step, ...] = ()
    if config.pre_norm:
        tail = (Step("stack_output", B.same, (f"layer_output@{L - 1}",)),
                *norm_steps("final_norm", "stack_output", config.norm_kind, "x_L", "_f"))
    if config.lm_head is not None:
        tail += lm_steps(config.lm_head, config.pre_norm, L, config.constructed, unembedding=False)
    return (*layers, *tail)


def input_rows(config: TraceConfig, texts: list[str]) -> np.ndarray:
    """x for these tokens at positions 0 … n − 1, as the trace's embedding steps make it ([n, d_model])."""
    state = initial_state(config, texts, {})
    run(_embedding_steps(config.positional_encoding, config.rope, False, config.constructed), state)
    return np.asarray(state["input"])


# ------------------------------------------------------------------ the block and the stack
#
# A stack is the embedding steps, then each layer's steps, then the stack's last steps. Every layer runs the
# same *template*: the attention's steps (as ``_steps`` makes them, reading ``input``) and the block's around
# them, with base names. Layer l's copy (``in_layer``) renames each value ``name@l``, except the sizes and
# settings every layer shares (``SHARED``); the template's ``stream`` is the layer's input (``input`` for
# layer 0, else ``layer_output@{l−1}``), and its ``input`` (what the attention reads) is ``attention_input@l``,
# the normalised stream in pre-norm and the stream itself in post-norm. So a mistake swaps a step by its base
# name in every layer (a student's function is wrong wherever it is called), and a stage is its layers' values
# stacked on a leading ``layer`` axis.

#: the state's values every layer shares (sizes, settings): never renamed per layer
SHARED: frozenset[str] = frozenset({"tokens", "n", "m", "seed", "d_model", "num_heads", "d_k", "scale", "kv_group",
                                    "window", "rope_base", "norm_eps", "layout", "position", "vocabulary",
                                    "temperature"})
_PLACEHOLDER = re.compile(r"\{([^{}@]+)\}")


def at_layer(name: str, layer: int) -> str:
    """The state's name of a template value in layer ``layer``."""
    if name in SHARED:
        return name
    if name == "stream":
        return "input" if layer == 0 else f"layer_output@{layer - 1}"
    if name == "input":  # what the attention's steps read
        return f"attention_input@{layer}"
    return f"{name}@{layer}"


def base_name(name: str) -> str:
    """A state name without its layer: ``q@3`` -> ``q``."""
    return name.partition("@")[0]


def layer_of(name: str) -> int | None:
    """The layer a state name belongs to (None for a value of the whole trace)."""
    _, at, layer = name.partition("@")
    return int(layer) if at else None


@lru_cache(maxsize=None)  # a function of a step (made once) and a layer: each copy made once, so identities hold
def in_layer(step: Step, layer: int) -> Step:
    """Layer ``layer``'s copy of a template step: its name, inputs, outputs and formula's references renamed."""
    def rename(m: re.Match[str]) -> str:
        return "{" + at_layer(m.group(1), layer) + "}"
    return Step(at_layer(step.name, layer), step.fn, tuple(at_layer(i, layer) for i in step.inputs),
                _PLACEHOLDER.sub(rename, step.formula), step.note, tuple(at_layer(o, layer) for o in step.outputs))


_NORM_SYMBOL = {"layer_norm": "LN", "rms_norm": "RMSNorm"}


def norm_steps(which: str, source: str, norm_kind: str, of: str, index: str, result: str = "") -> tuple[Step, ...]:
    """One norm of ``source``: its statistics over the d_model features, then the normalised values.

    ``which``: norm1, norm2 or final_norm (the names of its values and weights); ``of``: the formula's symbol
    for its input; ``index``: the subscript of its name and weights (₁, ₂, _f); ``result``: the symbol the
    formulas after it use for its output, if any ("h = ")."""
    name = f"{result}{_NORM_SYMBOL[norm_kind]}{index}({of})"
    over = ": over the d_model features of each token"
    if norm_kind == "layer_norm":
        return (Step(f"{which}_mean", B.feature_mean, (source,), f"μ = mean over j of {of}[j]", note=over),
                Step(f"{which}_variance", B.feature_variance, (source, f"{which}_mean"),
                     f"σ² = mean over j of ({of}[j] − μ)²", note=over + ", biased (÷ d_model, not d_model − 1)"),
                Step(which, B.layer_norm, (source, f"{which}_mean", f"{which}_variance", "norm_eps",
                                           f"{which}_gamma", f"{which}_beta"),
                     f"{name} = γ{index} ⊙ ({of} − μ)/√(σ² + ε) + β{index}"))
    return (Step(f"{which}_mean_square", B.mean_square, (source,), f"mean over j of {of}[j]²", note=over),
            Step(which, B.rms_norm, (source, f"{which}_mean_square", "norm_eps", f"{which}_gamma"),
                 f"{name} = γ{index} ⊙ {of}/√(mean({of}²) + ε)"))


_ACTIVATIONS: dict[str, tuple[Callable[..., Any], str]] = {
    "relu": (B.relu, "ReLU"), "gelu": (B.gelu, "GELU"), "gelu_tanh": (B.gelu_tanh, "GELU_tanh"),
    "swiglu": (B.silu, "SiLU"),
}


def ffn_steps(source: str, of: str, ffn_kind: str) -> tuple[Step, ...]:
    """The feed-forward network on ``source`` (``of`` its symbol): W_1, the activation (SwiGLU: times the up
    projection W_3), W_2."""
    fn, act = _ACTIVATIONS[ffn_kind]
    pre = Step("ffn_pre_activation", B.linear, (source, "W_1"), f"{of}·W_1ᵀ")
    if ffn_kind != "swiglu":
        return (pre, Step("ffn_activation", fn, ("ffn_pre_activation",), f"{act}({{ffn_pre_activation}})"),
                Step("ffn_output", B.linear, ("ffn_activation", "W_2"), "{ffn_activation}·W_2ᵀ"))
    return (pre,
            Step("ffn_up", B.linear, (source, "W_3"), f"{of}·W_3ᵀ"),
            Step("ffn_activation", fn, ("ffn_pre_activation",), "SiLU({ffn_pre_activation})"),
            Step("ffn_gated", B.multiply, ("ffn_activation", "ffn_up"), "{ffn_activation} ⊙ {ffn_up}"),
            Step("ffn_output", B.linear, ("ffn_gated", "W_2"), "({ffn_gated})·W_2ᵀ"))


@lru_cache(maxsize=32)  # one tuple per choice
def block_wiring(norm_kind: str, pre_norm: bool, ffn_kind: str) -> tuple[tuple[Step, ...], tuple[Step, ...]]:
    """The block's own steps around the attention, as a template: (the steps before the attention's, the steps
    after them). Post-norm: x → MHA → h = LN₁(x + MHA(x)) → LN₂(h + FFN(h)). Pre-norm: x → LN₁ → MHA →
    h = x + MHA(LN₁(x)) → h + FFN(LN₂(h))."""
    N = _NORM_SYMBOL[norm_kind]
    if pre_norm:
        *stats, norm1 = norm_steps("norm1", "stream", norm_kind, "x", "₁")
        norm1 = replace(norm1, note=": the attention's input (the x that q, k and v project)")
        before = (*stats, norm1, Step("attention_input", B.same, ("norm1",)))
        after = (Step("residual1", B.add, ("stream", "output"), f"h = x + MHA({N}₁(x))"),
                 *norm_steps("norm2", "residual1", norm_kind, "h", "₂"),
                 *ffn_steps("norm2", f"{N}₂(h)", ffn_kind),
                 Step("residual2", B.add, ("residual1", "ffn_output"), f"h + FFN({N}₂(h))"),
                 Step("layer_output", B.same, ("residual2",)))
        return before, after
    before = (Step("attention_input", B.same, ("stream",)),)
    after = (Step("residual1", B.add, ("stream", "output"), "y = x + MHA(x)"),
             *norm_steps("norm1", "residual1", norm_kind, "y", "₁", "h = "),
             *ffn_steps("norm1", "h", ffn_kind),
             Step("residual2", B.add, ("norm1", "ffn_output"), "z = h + FFN(h)"),
             *norm_steps("norm2", "residual2", norm_kind, "z", "₂"),
             Step("layer_output", B.same, ("norm2",)))
    return before, after


@lru_cache(maxsize=64)  # one tuple per choice of variants
def block_template(mask: str, scale: bool, rope_pairing: str | None, grouped: bool, norm_kind: str, pre_norm: bool,
                   ffn_kind: str) -> tuple[Step, ...]:
    """One layer of the stack with base names: the block's steps around the attention's (``_steps`` with x given)."""
    attention = _steps("sinusoidal", mask, scale, True, rope_pairing, grouped)
    before, after = block_wiring(norm_kind, pre_norm, ffn_kind)
    return (*before, *attention, *after)


@lru_cache(maxsize=64)  # one tuple per choice of variants and depth
def _stack_steps(positional_encoding: str, mask: str, scale: bool, explicit_input: bool, rope_pairing: str | None,
                 grouped: bool, norm_kind: str, pre_norm: bool, ffn_kind: str, num_layers: int,
                 constructed: bool = False, lm_head: str | None = None) -> tuple[Step, ...]:
    embed = () if explicit_input else _embedding_steps(positional_encoding, rope_pairing is not None, False,
                                                       constructed)
    template = block_template(mask, scale, rope_pairing, grouped, norm_kind, pre_norm, ffn_kind)
    layers = tuple(in_layer(step, layer) for layer in range(num_layers) for step in template)
    last = f"layer_output@{num_layers - 1}"
    tail: tuple[Step, ...] = (
        Step("residual_stream", B.stack, ("input", *(f"layer_output@{i}" for i in range(num_layers))),
             "x₀ = x (the stack's input), xₗ₊₁ = layer l's output"),)
    if pre_norm:  # the last residual stream, normalised once more
        tail += (Step("stack_output", B.same, (last,)),
                 *norm_steps("final_norm", "stack_output", norm_kind, "x_L", "_f"))
    if lm_head is not None:
        tail += lm_steps(lm_head, pre_norm, num_layers, constructed)
    return (*embed, *layers, *tail)


def lm_steps(lm_head: str, pre_norm: bool, num_layers: int, constructed: bool, *,
             unembedding: bool = True) -> tuple[Step, ...]:
    """The language-model head after the stack (engine.lm): W_U, the logits of every position from the last
    hidden state (the final norm's output in pre-norm, the last layer's output in post-norm), and the
    next-token probabilities of the last position. ``unembedding``: include W_U's step (decoding reuses it)."""
    hidden, symbol = ("final_norm", "LN_f(x_L)") if pre_norm else (f"layer_output@{num_layers - 1}", "x_L")
    if lm_head == "tied":
        fn, inputs = ((C.layout_token_embeddings, ("seed", "layout", "vocabulary")) if constructed
                      else (token_embeddings, ("seed", "d_model", "vocabulary")))
        W_U = Step("unembedding", fn, inputs, "W_U = E[vocabulary]",
                   note=" (tied: row j is the token embedding of vocabulary[j])")
    else:
        W_U = Step("unembedding", LM.seeded_unembedding, ("seed", "d_model", "vocabulary"),
                   "W_U[vocabulary] (seeded per token, untied)")
    return (*((W_U,) if unembedding else ()),
            Step("logits", LM.logits, (hidden, "unembedding"), f"{symbol}·W_Uᵀ",
                 note=": column j scores vocabulary[j]"),
            Step("next_token_probs", LM.next_token_probs, ("logits", "temperature"),
                 "softmax(({logits})[n−1] / T)", note=": over the vocabulary, the last position's logits"))


_CONTEXT_EMBEDDING = Step("context_token_embedding", token_embeddings, ("seed", "d_model", "context_tokens"),
                          "E[context token] (seeded, context-free)")
_KV_NOTE = ": one per K/V head j; query head i reads K/V head ⌊i·num_kv_heads/num_heads⌋"


#: stages 2–4 when a head is constructed: x laid out in subspaces (engine.constructed; never with RoPE or a context)
_LAYOUT_STEPS: tuple[Step, ...] = (
    Step("token_embedding", C.layout_token_embeddings, ("seed", "layout", "tokens"),
         "E[token] = [ê | 0 | 0 | 0 | 0], ê the seeded vector of width t at unit length (token subspace)"),
    Step("positional_encoding", C.layout_positional_encoding, ("n", "layout"),
         f"PE(pos) = [0 | 0 | 0 | ε_f·(sin(π·pos/2^f), cos(π·pos/2^f)) for f < {C.POSITION_PAIRS} | 1] "
         "(position subspace)"),
    Step("input", A.add_positional_encoding, ("token_embedding", "positional_encoding"), "x = E + PE",
         note=" (the constructed heads' layout: token, previous token, 0, position code, 1)"),
)


#: the same under RoPE: no position code (the rotation carries position), the constant 1 in the embedding
_LAYOUT_ROPE_STEPS: tuple[Step, ...] = (
    Step("token_embedding", C.layout_token_embeddings, ("seed", "layout", "tokens"),
         "E[token] = [ê | 0 | 1], ê the seeded vector of width t at unit length (token subspace), 1 a constant"),
    Step("input", A.embedding_as_input, ("token_embedding",), "x = E",
         note=" (RoPE: no positional encoding is added; q and k are rotated instead)"),
)


def _embedding_steps(positional_encoding: str, rope: bool, cross: bool, constructed: bool = False
                     ) -> tuple[Step, ...]:
    """Stages 2–4: x from the tokens (and, in cross-attention, the context's x from its tokens)."""
    if constructed:
        return _LAYOUT_ROPE_STEPS if rope else _LAYOUT_STEPS
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
           grouped: bool = False, cross: bool = False, decode: bool = False,
           constructed: bool = False) -> tuple[Step, ...]:
    embed = () if explicit_input else _embedding_steps(positional_encoding, rope_pairing is not None, cross,
                                                       constructed)
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


def initial_state(config: TraceConfig, texts: list[str], weights: Mapping[str, np.ndarray | None],
                  x: np.ndarray | None = None, *, context_texts: list[str] | None = None,
                  context_x: np.ndarray | None = None) -> dict[str, Any]:
    """What the steps start from: tokens, sizes, settings, weights, and x when it is given."""
    state: dict[str, Any] = {"tokens": texts, "n": len(texts), "seed": config.seed, "d_model": config.d_model,
                             "num_heads": config.num_heads, "d_k": config.d_k, "scale": config.scale, **weights,
                             "kv_group": config.kv_group_size, "window": config.window,
                             "rope_base": config.rope_base}
    if config.has_block:
        state["norm_eps"] = config.eps
    if config.constructed:
        state["layout"] = config.layout
    if config.has_lm_head:
        state["vocabulary"] = LM.vocabulary(texts, config.candidates)
        state["temperature"] = config.temperature
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


@dataclass(frozen=True, eq=False)  # compared and hashed by identity, as steps
class Rewrite:
    """A wrong step made from the correct one: ``make(correct) -> Step`` (the same name; usually the same inputs
    and a wrong function), for a mistake whose step has several forms (a norm's source differs between
    post-norm and pre-norm, LayerNorm and RMSNorm read different statistics). It replaces every step of that
    name the configuration has (every layer's), and none is an error only if no replacement applies at all."""

    name: str
    make: Callable[[Step], Step]


@lru_cache(maxsize=None)  # per rewrite and step (each made once): the same wrong step each time, so caches hit
def rewritten(rewrite: Rewrite, step: Step) -> Step:
    """``rewrite``'s wrong step for ``step``; in a layer, the base names its formula refers to are that layer's."""
    made = rewrite.make(step)
    layer = layer_of(step.name)
    if layer is None:
        return made
    return replace(made, formula=_PLACEHOLDER.sub(lambda m: "{" + at_layer(m.group(1), layer) + "}", made.formula))


@lru_cache(maxsize=1024)  # a function of two tuples of steps (each made once): /check asks per bug, per request
def swapped(steps: tuple[Step, ...], replacements: tuple[Step | Rewrite, ...]
            ) -> tuple[tuple[Step, ...], int, frozenset[str]]:
    """``steps`` with the replacements swapped in (by name), the index of the first swapped step, and
    the values it and the steps after it write (the ones a rerun recomputes).

    In a stack, a replacement named as a template step (``q``, ``norm1``) replaces that step in every layer
    (``in_layer``); a step of the whole trace (``input``, ``final_norm``) is replaced by its own name. When the
    replacements read a value that a later step makes (a pre-norm block written where post-norm is asked
    normalises before the attention), the steps are put back in an order that computes every value before
    it is read, keeping the original order otherwise."""
    names = {s.name for s in steps}
    layers = sorted({layer for s in steps if (layer := layer_of(s.name)) is not None})
    by_base: dict[str, list[Step]] = {}
    for s in steps:
        by_base.setdefault(base_name(s.name), []).append(s)
    swap: dict[str, Step] = {}
    missing = []
    for r in replacements:
        if isinstance(r, Rewrite):
            swap.update({s.name: rewritten(r, s) for s in by_base.get(r.name, ())})
        elif r.name in names:
            swap[r.name] = r
        elif layers and f"{r.name}@{layers[0]}" in names:
            swap.update({f"{r.name}@{layer}": in_layer(r, layer) for layer in layers})
        else:
            missing.append(r.name)
    if missing or not swap:
        raise ValueError(f"these steps are not part of the layer: {sorted(missing) or [r.name for r in replacements]}")
    new = _computable(tuple(swap.get(s.name, s) for s in steps))
    start = next(i for i, (a, b) in enumerate(zip(steps, new)) if a is not b)
    return new, start, frozenset(out for s in new[start:] for out in s.writes)


def _computable(steps: tuple[Step, ...]) -> tuple[Step, ...]:
    """``steps`` unchanged when each value is made before any step reads it; else the same steps in the order
    that makes every value first, the earliest possible step first (a stable topological order)."""
    made_at = {out: i for i, step in enumerate(steps) for out in step.writes}
    needs = [{made_at[i] for i in step.inputs if i in made_at and made_at[i] != k} for k, step in enumerate(steps)]
    if all(all(j < k for j in need) for k, need in enumerate(needs)):
        return steps
    done: set[int] = set()
    order: list[int] = []
    while len(order) < len(steps):
        k = next(k for k in range(len(steps)) if k not in done and needs[k] <= done)
        done.add(k)
        order.append(k)
    return tuple(steps[k] for k in order)


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
#: the block's stages (a trace with a block field only): not in ALL_STAGE_IDS, engine 1.0's list and its variants'
BLOCK_STAGES: tuple[StageInfo, ...] = (
    StageInfo("norm1_mean", 13, "First norm: mean over the features", ("token",)),
    StageInfo("norm1_variance", 13, "First norm: variance over the features", ("token",)),
    StageInfo("norm1_mean_square", 13, "First norm: mean square over the features", ("token",)),
    StageInfo("norm1", 13, "First norm", ("token", "d_model")),
    StageInfo("residual1", 14, "First residual sum", ("token", "d_model")),
    StageInfo("norm2_mean", 15, "Second norm: mean over the features", ("token",)),
    StageInfo("norm2_variance", 15, "Second norm: variance over the features", ("token",)),
    StageInfo("norm2_mean_square", 15, "Second norm: mean square over the features", ("token",)),
    StageInfo("norm2", 15, "Second norm", ("token", "d_model")),
    StageInfo("ffn_pre_activation", 16, "Feed-forward: first projection", ("token", "d_ff")),
    StageInfo("ffn_up", 16, "Feed-forward: up projection (SwiGLU)", ("token", "d_ff")),
    StageInfo("ffn_activation", 16, "Feed-forward: activation", ("token", "d_ff")),
    StageInfo("ffn_gated", 16, "Feed-forward: gated (SwiGLU)", ("token", "d_ff")),
    StageInfo("ffn_output", 16, "Feed-forward: output projection", ("token", "d_model")),
    StageInfo("residual2", 17, "Second residual sum", ("token", "d_model")),
    StageInfo("residual_stream", 18, "Residual stream at each depth", ("depth", "token", "d_model")),
    StageInfo("final_norm_mean", 19, "Final norm: mean over the features", ("token",)),
    StageInfo("final_norm_variance", 19, "Final norm: variance over the features", ("token",)),
    StageInfo("final_norm_mean_square", 19, "Final norm: mean square over the features", ("token",)),
    StageInfo("final_norm", 19, "Final norm", ("token", "d_model")),
)
BLOCK_STAGE_IDS: tuple[str, ...] = tuple(s.id for s in BLOCK_STAGES)
#: the language-model head's stages (a stack with lm_head only; engine.lm): the columns are the vocabulary's tokens
LM_STAGES: tuple[StageInfo, ...] = (
    StageInfo("unembedding", 20, "Unembedding W_U (the LM head's weights)", ("vocab", "d_model")),
    StageInfo("logits", 21, "Logits: every position's score for each vocabulary token", ("token", "vocab")),
    StageInfo("next_token_probs", 22, "Next-token probabilities", ("vocab",)),
)
LM_STAGE_IDS: tuple[str, ...] = tuple(s.id for s in LM_STAGES)
STAGE_INFO: dict[str, StageInfo] = {s.id: s for s in (*STAGES, *BLOCK_STAGES, *LM_STAGES)}
#: in a stack, the stages computed once per layer (a leading ``layer`` axis); the others are the whole trace's
LAYER_STAGE_IDS: frozenset[str] = frozenset(
    {"q", "k", "v", "q_rotated", "k_rotated", "scores", "scaled_scores", "masked_scores", "weights", "context",
     "concat", "output"} | {sid for sid in BLOCK_STAGE_IDS if not sid.startswith(("final_norm", "residual_stream"))})

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


def _not_in_block(sid: str, config: TraceConfig) -> str:
    """Why a block stage is not part of this trace."""
    if not config.has_block:
        return (f"{sid} is a stage of a Transformer block, and this trace is one attention layer: give block (or "
                "another block field) or drop it")
    why = ("RMSNorm has a mean square, not a mean and a variance" if sid.endswith(("_mean", "_variance"))
           else "LayerNorm has a mean and a variance, not a mean square" if sid.endswith("_mean_square")
           else "only SwiGLU has an up projection and a gated product" if sid in ("ffn_up", "ffn_gated")
           else "only a pre-norm stack ends with a final norm")
    return f"{sid} is not part of this block: {why}; drop it"


def _not_computed(sid: str, field: str) -> str:
    given = _GIVEN_INPUT_SKIPS[sid]
    return (f"{sid} is not computed when you give your own {given}: x is taken as given, not made from "
            f"embeddings and positional encodings; drop it from {field}")


def stage_ids(config: TraceConfig, *, explicit_input: bool = False, cross: bool = False) -> tuple[str, ...]:
    """The stages a trace of this configuration shows, in walkthrough order (``cross``: with a context).

    A stack shows the embedding stages, then one layer's stages in the order its steps compute them (the norms
    before the attention in pre-norm, after each residual sum in post-norm), then ``residual_stream`` and, in
    pre-norm, the final norm's."""
    if config.has_block:
        ids = _block_stage_ids(config.mask, config.rope_pairing if config.rope else None, config.grouped,
                               config.norm_kind, config.pre_norm, config.ffn_kind, explicit_input)
        return (*ids, *LM_STAGE_IDS) if config.has_lm_head else ids
    return _stage_ids(config.mask, config.rope, explicit_input, cross)


@lru_cache(maxsize=64)  # one tuple per choice of variants
def _block_stage_ids(mask: str, rope_pairing: str | None, grouped: bool, norm_kind: str, pre_norm: bool,
                     ffn_kind: str, explicit_input: bool) -> tuple[str, ...]:
    embed = tuple(sid for sid in _stage_ids(mask, rope_pairing is not None, explicit_input, False)
                  if sid in ("tokens", "token_embedding", "positional_encoding", "input"))
    absent = _absent(mask, rope_pairing is not None, explicit_input, False)
    template = block_template(mask, True, rope_pairing, grouped, norm_kind, pre_norm, ffn_kind)
    layer = tuple(s.name for s in template if s.name in STAGE_INFO and s.name not in absent)
    final = tuple(s.name for s in norm_steps("final_norm", "", norm_kind, "", "")) if pre_norm else ()
    return (*embed, *layer, "residual_stream", *final)


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
    at: Callable[[str], str] = (lambda sid: f"{field}/{sid}") if keyed else (lambda sid: field)
    asked = set(wanted)
    problems: list[EngineError] = []  # every stage this configuration does not compute, in walkthrough order
    computed = stage_ids(config, explicit_input=explicit_input, cross=cross) if config.has_block else ()
    for sid in BLOCK_STAGE_IDS:
        if sid in asked and sid not in computed:
            problems.append(StageUnavailableError(_not_in_block(sid, config), field=at(sid), code="stage_needs_block"))
    for sid in LM_STAGE_IDS:
        if sid in asked and not config.has_lm_head:
            problems.append(StageUnavailableError(
                f"{sid} is a stage of the language-model head: add lm_head (\"tied\" or \"seeded\") to a stack of "
                "blocks, or drop it", field=at(sid), code="stage_needs_lm_head"))
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
    return _stage_axes(sid, config.grouped, cross, config.has_block and sid in LAYER_STAGE_IDS)


@lru_cache(maxsize=256)  # a function of the stage and three choices: computed once each
def _stage_axes(sid: str, grouped: bool, cross: bool, layered: bool = False
                ) -> tuple[tuple[str, ...], tuple[str | None, ...]]:
    info = STAGE_INFO[sid]
    keys = "context_tokens" if cross else "tokens"
    own = keys if info.kv else "tokens"
    names = tuple("kv_head" if a == "head" and info.kv and grouped else a for a in info.axes)
    lists = tuple({"token": own, "query": "tokens", "key": keys}.get(a) for a in info.axes)
    if layered:  # a stack's per-layer stage: its layers' values stacked
        return ("layer", *names), (None, *lists)
    return names, lists


@lru_cache(maxsize=4096)  # asked for every stage of every request: a handful of configurations and sizes recur
def stage_shape(sid: str, config: TraceConfig, n: int, n_context: int | None = None,
                n_vocab: int | None = None) -> tuple[int, ...]:
    """The shape of a stage for n tokens (and n_context context tokens in cross-attention; n_vocab vocabulary
    tokens with the language-model head, at most n plus the candidates when not given)."""
    names, lists = stage_axes(sid, config, cross=n_context is not None)
    length = {"tokens": n, "context_tokens": n if n_context is None else n_context}
    size = {"head": config.num_heads, "kv_head": config.kv_heads, "d_k": config.d_k, "d_model": config.d_model,
            "concat": config.num_heads * config.d_k}
    if config.has_block:
        size |= {"layer": config.num_layers, "depth": config.num_layers + 1, "d_ff": config.ff_width}
    if config.has_lm_head:
        size["vocab"] = n_vocab if n_vocab is not None else n + len(config.candidates or ())
    return tuple(length[t] if t else size[a] for a, t in zip(names, lists))


@lru_cache(maxsize=1024)  # the bound every request checks: cached per configuration and size (all hashable)
def trace_value_count(config: TraceConfig, n: int, *, with_parameters: bool, n_context: int | None = None,
                      explicit_input: bool = False, n_vocab: int | None = None) -> int:
    """How many numbers a trace returns (its generated stages, the stats, the weights if asked):
    the bound checked before computing it.

    ``n_context`` is the context's token count in cross-attention. With
    ``explicit_input`` the embedding and encoding stages are left out; without
    it they are counted, which bounds either case.
    """
    count = 2 * config.num_heads * n * config.num_layers  # the stats: entropy and max_weight, [(layer,) head, query]
    for sid in stage_ids(config, explicit_input=explicit_input, cross=n_context is not None):
        if sid not in ("tokens", "context_tokens"):  # strings, not numbers
            count += math.prod(stage_shape(sid, config, n, n_context, n_vocab))
    return count + (config.n_parameters if with_parameters else 0)
