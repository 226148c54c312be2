"""The contract's shared pieces, as pydantic v2 models: what every route's request and answer is built of.

* ``TraceSpec``: one sentence (or pre-split tokens) and the layer's
  configuration, every variant's field included; each endpoint's request
  extends it (``TraceRequest`` in ``service/routes/trace.py``, ``CheckRequest``
  in ``service/routes/check.py``, and /explain's and /export's on /trace's),
  and ``run_trace`` gives its engine trace;
* ``engine_rules``: the engine's own checks at the edge, each refusal a 422
  entry at its field;
* the answers' shared parts (``ConfigOut``, ``TokenOut``, ``InjectedBug``,
  ``Problem``) and ``omitted``, how an output field that is left out where it
  does not apply is published.

The models are the single source of truth for request validation and for
``components.schemas`` in openapi.yaml (``scripts/gen-openapi`` writes them
there from each route module's models; a test fails on any drift).

Limits that operators configure (max tokens, d_model, heads, total values) are
checked here too, from the validation context, so every problem, static or
configured, comes back in one ``errors`` list with a JSON pointer.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache, partial
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo,
                      ValidatorFunctionWrapHandler, WrapValidator, field_validator, model_validator)
from pydantic_core import PydanticCustomError

import engine
from engine import BUG_NAMES, EngineError, Token, TraceConfig
from engine.bugs import BLOCK_BUG_NAMES, LM_BUG_NAMES
from engine.decoding import decode_value_count, generate_value_count, generate_work
from engine import lm as LM
from engine import interventions as IV
from engine.checks import (
    D_FF_MAX,
    MAX_EXPLICIT_VALUE,
    MAX_LAYERS,
    ROPE_BASE_MAX,
    SEED_MAX,
    check_block_cost,
    check_choice,
    check_d_ff,
    check_input_shape,
    check_kv_heads_value,
    check_norm_eps,
    check_num_layers,
    check_one_context,
    check_one_source,
    check_optional_choice,
    check_parameter_shapes,
    check_rope_base,
    check_sentence,
    check_token_list,
    check_token_text,
    check_trace_size,
    check_variants,
    check_window_size,
    head_dim,
    kv_heads,
    split_context,
    split_tokens,
)
from engine.layer import (
    ALL_STAGE_IDS,
    BLOCK_FIELDS,
    BLOCK_PRESETS,
    BLOCK_STAGE_IDS,
    DEFAULT_ROPE_BASE,
    LM_STAGE_IDS,
    FFN_KINDS,
    NORM_KINDS,
    NORM_POSITIONS,
    NORM_WEIGHTS,
    POSITIONAL_ENCODING_CHOICES,
    ROPE_PAIRINGS,
    preset_fields,
    trace_value_count,
)
from engine.params import explicit_parameters
from engine import constructed
from engine.errors import raise_all

from .problems import problem_entry
from .settings import Settings

#: a stage id a request may name: engine 1.0's and its variants' (ALL_STAGE_IDS), then a stack of blocks' own
#: (BLOCK_STAGE_IDS, which only a trace with a block field computes)
STAGE_ID_CHOICES: tuple[str, ...] = (*ALL_STAGE_IDS, *BLOCK_STAGE_IDS, *LM_STAGE_IDS)


def _quoted(choices: tuple[str, ...]) -> str:
    """Choices as pydantic's literal_error lists them: 'a', 'b' or 'c'."""
    names = [repr(c) for c in choices]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def has_block_field(info: ValidationInfo) -> bool:
    """Whether the request being validated gave a block field (TraceSpec's, validated before what names stages)."""
    data = info.data or {}
    return any(data.get(name) is not None for name in BLOCK_FIELDS)


def _names_of_the_requests_kind(one_layer: tuple[str, ...], stack: tuple[str, ...]) -> WrapValidator:
    """An unknown name's literal_error lists the names of the request's kind: a request without a block field
    is answered as before the block existed, word for word; a stack's adds the block's names."""
    one_layer_text, stack_text = _quoted(one_layer), _quoted(stack)

    def known(v: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> str:
        try:
            return handler(v)
        except ValidationError:
            expected = stack_text if has_block_field(info) else one_layer_text
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected}) from None

    return WrapValidator(known)


StageId = Annotated[Literal[STAGE_ID_CHOICES],  # type: ignore[valid-type]
                    _names_of_the_requests_kind(ALL_STAGE_IDS, STAGE_ID_CHOICES)]

_SENTENCE_HARD_MAX = 1_000_000  # schema ceiling; the configured max_sentence_chars is lower
_TOKENS_HARD_MAX = 100_000  # schema ceilings of a token list and of one token; the configured max_tokens is lower
_TOKEN_HARD_MAX = 1024


# Unicode's Cc (C0 and C1 controls, but tab, newline and carriage return are fine) and Cs (lone
# surrogates): fixed ranges, found with one C scan instead of a category lookup per character.
_BAD_CHARACTER = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def _bad_characters(text: str) -> str | None:
    """Describe the first character no tokenizer should see, or None."""
    found = _BAD_CHARACTER.search(text)
    if found is None:
        return None
    i, ch = found.start(), found.group()
    if unicodedata.category(ch) == "Cs":
        return f"a lone surrogate U+{ord(ch):04X} at character {i}; send valid Unicode"
    return f"a control character U+{ord(ch):04X} at character {i}; remove it"


BugName = Literal[BUG_NAMES]  # type: ignore[valid-type]
#: a name /check's diagnosis may give: the attention's known bugs, then a stack of blocks' own (BLOCK_BUGS)
AnyBugName = Literal[BUG_NAMES + BLOCK_BUG_NAMES + LM_BUG_NAMES]  # type: ignore[valid-type]

#: inject_bug's names: the attention's known bugs, and a stack of blocks' own (which the engine's refusal rule
#: refuses without a block field, saying to add one), and the language-model head's (refused without lm_head); an
#: unknown one's message lists the request's kind's (a stack's: the attention's and the block's, as before the head)
InjectableBugName = Annotated[AnyBugName, _names_of_the_requests_kind(BUG_NAMES, BUG_NAMES + BLOCK_BUG_NAMES)]

PositionalEncodingName = Literal[POSITIONAL_ENCODING_CHOICES]  # type: ignore[valid-type]
RopePairingName = Literal[tuple(ROPE_PAIRINGS)]  # type: ignore[valid-type]
HeadKindName = Literal[constructed.HEAD_KINDS]  # type: ignore[valid-type]

#: a number of an explicit input or weight: bounded, so that products of them stay within float64
BoundedNumber = Annotated[float, Field(ge=-MAX_EXPLICIT_VALUE, le=MAX_EXPLICIT_VALUE)]


class _EngineRules:
    """``with engine_rules():`` (a class, not @contextmanager: a generator per use cost ~1.5 µs, 3–4 per request)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> bool:
        if isinstance(error, EngineError):
            ctx: dict[str, Any] = {"message": error.message, "pointer": error.pointer}
            if error.also:  # every other problem found with it: problems.validation_problem lists them too
                ctx["also"] = [problem_entry(e) for e in error.also]
            raise PydanticCustomError(error.code, "{message}", ctx) from None
        return False


_ENGINE_RULES = _EngineRules()


def engine_rules() -> _EngineRules:
    """Run the engine's own checks at the edge: an EngineError becomes this field's 422 entry."""
    return _ENGINE_RULES


_Matrix3 = list[list[list[BoundedNumber]]]


class ParametersIn(BaseModel):
    """Caller-supplied weights of one multi-head attention layer."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    W_Q: _Matrix3 = Field(description="[head, d_k, d_model]")
    W_K: _Matrix3 = Field(description="[kv head, d_k, d_model]: kv heads = num_kv_heads, or num_heads")
    W_V: _Matrix3 = Field(description="[kv head, d_k, d_model]: kv heads = num_kv_heads, or num_heads")
    W_O: list[list[BoundedNumber]] = Field(description="[d_model, num_heads·d_k]")



class InterventionIn(BaseModel):
    """One intervention (docs/engine.md, "Interventions"): which activation, where, and what replaces it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    target: Literal[IV.TARGETS] = Field(  # type: ignore[valid-type]
        description="head_output: a head's context (before W_O) [token, d_k]; head_pattern: its attention weights "
        "[query, key]; mlp_output: the feed-forward network's output; residual: the residual stream at depth "
        "`layer` (layer l's input; num_layers is the last layer's output). The last two need a block.")
    layer: int = Field(ge=0, le=MAX_LAYERS, description="The layer (the depth, for residual), from 0.")
    kind: Literal[IV.KINDS] = Field(  # type: ignore[valid-type]
        default="zero", description="zero; mean (the mean over the sentence's positions; for head_pattern, uniform "
        "over the keys each query may attend to: a pattern is not zeroed); patch (the same activation of "
        "patch_sentence's clean run).")
    head: int | None = Field(default=None, ge=0, description="The head, for head_output and head_pattern.")
    positions: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, min_length=1, max_length=_TOKENS_HARD_MAX,
        description="The token positions (query rows, for head_pattern) replaced; null: every position.")


#: the block fields that name a choice, and their choices (checked by the engine's rule)
_BLOCK_CHOICES: dict[str, tuple[str, ...]] = {"block": tuple(BLOCK_PRESETS), "norm": NORM_KINDS,
                                              "norm_position": NORM_POSITIONS, "ffn": FFN_KINDS,
                                              "norm_weights": NORM_WEIGHTS}


#: the engine's rule for each field it checks itself, run before the schema's checks (TraceSpec._engine_rule)
_FIELD_RULES: dict[str, Callable[[Any], object]] = {
    "num_kv_heads": check_kv_heads_value,
    "rope_base": check_rope_base,
    "rope_pairing": lambda v: check_choice("rope_pairing", v, tuple(ROPE_PAIRINGS)),
    "window": check_window_size,
    "num_layers": check_num_layers,
    **{name: partial(check_optional_choice, name, choices=choices) for name, choices in _BLOCK_CHOICES.items()},
    "d_ff": check_d_ff,
    "norm_eps": check_norm_eps,
    "head_weights": lambda v: raise_all(constructed.kind_problems(v)),
    "sharpness": lambda v: raise_all(constructed.sharpness_problems(v)),
    # the language-model head's
    "lm_head": partial(check_optional_choice, "lm_head", choices=LM.LM_HEADS),
    "temperature": LM.check_temperature,
    "candidates": lambda v: LM.check_candidates(v) if isinstance(v, list) and all(isinstance(t, str) for t in v)
    else None,
}

class TraceSpec(BaseModel):
    """One sentence (or pre-split tokens) and the layer's configuration: shared by /trace and /check."""

    # allow_inf_nan=False: the JSON parser accepts NaN and Infinity literals,
    # which no float here may be.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    #: numbers the trace will hold, known once validated (bounds batches too)
    _value_count: int = PrivateAttr(default=0)
    #: the engine's configuration and token count, known once validated
    _config: TraceConfig | None = PrivateAttr(default=None)
    _tokens: list[Token] = PrivateAttr(default_factory=list)
    _context: list[Token] | None = PrivateAttr(default=None)
    _patch: list[Token] | None = PrivateAttr(default=None)

    sentence: Annotated[str, Field(min_length=1, max_length=_SENTENCE_HARD_MAX)] | None = Field(
        default=None,
        description="Text to split into tokens: a word is a token, each punctuation mark is its own token. "
        "Give exactly one of `sentence` or `tokens`.",
    )
    tokens: list[Annotated[str, Field(min_length=1, max_length=_TOKEN_HARD_MAX)]] | None = Field(
        default=None,
        min_length=1,
        max_length=_TOKENS_HARD_MAX,
        description="Pre-split tokens, used as given. Give exactly one of `sentence` or `tokens`.",
    )
    d_model: int = Field(default=24, ge=1, description="Model width; must be divisible by num_heads.")
    num_heads: int = Field(default=1, ge=1, description="Number of heads h; d_k = d_model / h exactly.")
    seed: int = Field(default=0, ge=0, le=SEED_MAX, description="Seed for embeddings and weights.")
    scale: bool = Field(default=True, description="Divide scores by √d_k (true) or by 1 (false).")
    causal: bool = Field(default=False, description="Mask keys after each query (decoder-style).")
    positional_encoding: PositionalEncodingName = Field(
        default="sinusoidal",
        description="Sinusoidal encodings added to the embeddings; none; or rope: nothing added to x, and q and k "
        "rotated per head by their position (the q_rotated and k_rotated stages; d_k must be even).",
    )
    rope_base: float = Field(
        default=DEFAULT_ROPE_BASE, gt=1, le=ROPE_BASE_MAX,
        description="RoPE's frequency base (10000 in RoFormer and Llama 2, 500000 in Llama 3); used with "
        "positional_encoding rope, and checked with any encoding (a wrong value is a 422 `invalid_size` even "
        "where it would not be used).",
    )
    rope_pairing: RopePairingName = Field(
        default="rotate_half",
        description="Which coordinates RoPE rotates together: rotate_half pairs j and j + d_k/2 (GPT-NeoX, Llama, "
        "Hugging Face's rotate_half); interleaved pairs 2j and 2j + 1 (RoFormer, the paper). Used with "
        "positional_encoding rope, and checked with any encoding (`invalid_size`).",
    )
    num_kv_heads: int | None = Field(
        default=None, ge=1,
        description="Grouped-query attention: how many K/V heads the num_heads query heads share (a divisor of "
        "num_heads; 1 is multi-query attention); null means num_heads (multi-head attention).",
    )
    window: int | None = Field(
        default=None, ge=1,
        description="Sliding-window attention (Mistral, Longformer), with causal: true: each query sees at most "
        "`window` keys, its own and the window − 1 before it.",
    )
    # Constructed heads (docs/engine.md, "Constructed heads"): checked by the engine's rules, as the variants'.
    head_weights: list[HeadKindName] | None = Field(
        default=None, max_length=_TOKENS_HARD_MAX,
        description="Each head's weights, one kind per head: seeded (the default), or a head built by hand with a "
        "known job: previous_token, same_token (earlier copies of the query's token, with causal), first_token, "
        "induction (num_layers 2 or more). Any constructed head lays x out in subspaces (token, previous token, "
        "0, a position code, 1). Null: every head seeded.",
    )
    sharpness: float = Field(
        default=constructed.DEFAULT_SHARPNESS, gt=0, le=constructed.SHARPNESS_MAX,
        description="The constructed heads' scores are sharpness × their closed form: how peaked their patterns are.",
    )

    context_sentence: Annotated[str, Field(min_length=1, max_length=_SENTENCE_HARD_MAX)] | None = Field(
        default=None,
        description="Cross-attention: the queries come from the sentence, the keys and values from this context "
        "(an encoder's sentence), with its own embeddings and positions. No causal mask, window or RoPE.",
    )
    context_tokens: list[Annotated[str, Field(min_length=1, max_length=_TOKEN_HARD_MAX)]] | None = Field(
        default=None, min_length=1, max_length=_TOKENS_HARD_MAX,
        description="Cross-attention's context, pre-split. Give at most one of context_sentence or context_tokens.",
    )
    context_input: list[list[BoundedNumber]] | None = Field(
        default=None,
        description="Cross-attention with your own x: the context's x [context token, d_model], given together "
        "with input.",
    )
    input: list[list[BoundedNumber]] | None = Field(
        default=None,
        description="Bring your own input x [token, d_model] instead of the seeded embeddings plus positional "
        "encodings (the token_embedding and positional_encoding stages are then absent). The tokens still "
        "label the rows.",
    )
    parameters: ParametersIn | None = Field(
        default=None,
        description="Bring your own weights instead of the seeded ones: W_Q [head, d_k, d_model], W_K and W_V "
        "[kv head, d_k, d_model] (kv heads = num_kv_heads, or num_heads) and W_O [d_model, num_heads·d_k].",
    )

    # A stack of Transformer blocks around the attention (docs/engine.md, "The Transformer block"): any of
    # these fields but num_layers asks for one. With none of them the answer is the single attention layer's,
    # exactly as before. Checked by the engine's rules before the schema's (type invalid_size), as the
    # variants' own fields are.
    num_layers: int = Field(
        default=1, ge=1, le=MAX_LAYERS,
        description="How many Transformer blocks are stacked; more than 1 needs a block field (`layers_need_block` "
        "otherwise). Every per-layer stage gains a leading `layer` axis; `residual_stream` [depth, token, d_model] "
        "holds the stack's input and each layer's output. The size limits count every layer's numbers and weights.",
    )
    block: Literal[tuple(BLOCK_PRESETS)] | None = Field(  # type: ignore[valid-type]
        default=None,
        description="Trace a stack of blocks of this preset: `vaswani2017` (post-norm LayerNorm, ReLU, d_ff "
        "4·d_model), `gpt2` (pre-norm LayerNorm, GELU's tanh approximation, a final norm; sets causal: true unless "
        "given), `llama` (pre-norm RMSNorm, SwiGLU with Llama's d_ff rounding, a final norm; sets "
        "positional_encoding rope and causal: true unless given; GQA with num_kv_heads). The block fields below "
        "override the preset's choices; without a preset they override vaswani2017's.",
    )
    norm: Literal[NORM_KINDS] | None = Field(  # type: ignore[valid-type]
        default=None, description="The block's norms: layer_norm (mean and biased variance over the features, ε "
        "inside the square root) or rms_norm (mean square); null: the preset's (layer_norm without one).")
    norm_position: Literal[NORM_POSITIONS] | None = Field(  # type: ignore[valid-type]
        default=None, description="post (2017: x = Norm(x + Sublayer(x))) or pre (GPT-2, Llama: x = x + "
        "Sublayer(Norm(x)), and a final norm); null: the preset's (post without one).")
    ffn: Literal[FFN_KINDS] | None = Field(  # type: ignore[valid-type]
        default=None, description="The feed-forward network's activation: relu, gelu (exact, erf), gelu_tanh (the "
        "tanh approximation) or swiglu (SiLU of the gate W_1 times the up projection W_3); null: the preset's.")
    d_ff: int | None = Field(
        default=None, ge=1, le=D_FF_MAX, description="The feed-forward network's inner width; null: 4·d_model, and "
        "for swiglu Llama's ⌊8·d_model/3⌋ rounded up to a multiple of 256.")
    norm_eps: float | None = Field(
        default=None, gt=0, le=1, description="The norms' ε; null: the preset's (1e-5; llama 1e-6).")
    norm_weights: Literal[NORM_WEIGHTS] | None = Field(  # type: ignore[valid-type]
        default=None, description="The norms' γ and β: unit (γ = 1, β = 0, the default, as torch initialises a "
        "norm) or seeded (drawn from the seed).")

    # The language-model head (docs/engine.md, "The language-model head"): a stack's last step, opt-in. These three
    # fields, and /trace's generate, top_k, top_p and sample_seed, are its whole request.
    lm_head: Literal[LM.LM_HEADS] | None = Field(  # type: ignore[valid-type]
        default=None,
        description="End the stack with a language-model head (a block field is needed): tied (W_U = the "
        "vocabulary's token embeddings, as GPT-2 ties them) or seeded (its own rows, seeded per token). Adds the "
        "stages unembedding [vocab, d_model], logits [token, vocab] and next_token_probs [vocab] (the token after "
        "the sentence), and `vocabulary`, the token of each column. Null: no head.")
    temperature: float = Field(
        default=1.0, ge=LM.TEMPERATURE_MIN, le=LM.TEMPERATURE_MAX,
        description="next_token_probs = softmax(logits[n − 1] / temperature); with lm_head only.")
    candidates: list[Annotated[str, Field(min_length=1, max_length=_TOKEN_HARD_MAX)]] | None = Field(
        default=None, min_length=1, max_length=LM.MAX_VOCABULARY,
        description="Tokens the vocabulary holds besides the sentence's own: the vocabulary is the sentence's "
        f"distinct tokens in order of first appearance, then these (those not already in it), in order; at most "
        f"{LM.MAX_VOCABULARY} in all. With lm_head only.")

    # Interventions (docs/engine.md, "Interventions"): these three fields, kept together.
    interventions: list[InterventionIn] | None = Field(
        default=None, min_length=1, max_length=IV.MAX_INTERVENTIONS,
        description="Take the model apart: each entry replaces one activation (zero, mean, or patched from "
        "patch_sentence) and every later stage is computed from the replaced value, as a PyTorch forward hook "
        "would. The answer is the intervened trace, with `intervention`: the baseline request and its digest, "
        "the baseline's key stage, each stage's largest change per layer, and with lm_head the target token's "
        "logit and probability before and after. Not with inject_bug, decode or generate.")
    patch_sentence: Annotated[str, Field(min_length=1, max_length=_SENTENCE_HARD_MAX)] | None = Field(
        default=None,
        description="With an intervention of kind patch: the second input (a clean or corrupted sentence with "
        "as many tokens as the sentence), run clean with the same weights; patched activations come from it.")
    target_token: Annotated[str, Field(min_length=1, max_length=_TOKEN_HARD_MAX)] | None = Field(
        default=None,
        description="With interventions and lm_head: the vocabulary token whose logit and probability "
        "`intervention.target` follows; null: the baseline's most probable next token.")

    # The variants', the block's and the constructed heads' own fields are checked by the engine's rules
    # (_FIELD_RULES) before the schema's, so that HTTP and the engine refuse them alike: the engine's type
    # and message (docs/engine.md, "Errors of the variants"). The schema keeps its bounds, which document
    # the same ranges.
    @field_validator(*_FIELD_RULES, mode="before")
    @classmethod
    def _engine_rule(cls, v: Any, info: ValidationInfo) -> Any:
        with engine_rules():
            _FIELD_RULES[info.field_name](v)
        return v

    # Before the schema's own checks, so that an empty or blank text gets the engine's type and message
    # (empty_sentence, empty_tokens, blank_token), as the engine gives them; text the schema refuses
    # anyway (not a string, over the schema's ceilings) is left to it.
    @field_validator("sentence", "context_sentence", "patch_sentence", mode="before")
    @classmethod
    def _sentence_text(cls, v: Any, info: ValidationInfo) -> Any:
        if not isinstance(v, str) or len(v) > _SENTENCE_HARD_MAX:
            return v
        field = info.field_name
        what = field.replace("_", " ")
        limit = settings_of(info).max_sentence_chars
        if len(v) > limit:
            raise PydanticCustomError(
                "sentence_too_long",
                "the {what} has {length} characters; the limit is {limit}",
                {"what": what, "length": len(v), "limit": limit},
            )
        bad = _bad_characters(v)
        if bad:
            raise PydanticCustomError("bad_character", "the {field} contains {what}", {"field": what, "what": bad})
        with engine_rules():
            check_sentence(v, field=field)
        return v

    @field_validator("candidates", mode="before")
    @classmethod
    def _candidate_texts(cls, v: Any) -> Any:
        for i, t in enumerate(v if isinstance(v, list) else []):
            bad = _bad_characters(t) if isinstance(t, str) else None
            if bad:
                raise PydanticCustomError("bad_character", "candidates[{i}] contains {what}", {"i": i, "what": bad})
        return v

    @field_validator("tokens", "context_tokens", mode="before")
    @classmethod
    def _token_texts(cls, v: Any, info: ValidationInfo) -> Any:
        if not isinstance(v, list) or len(v) > _TOKENS_HARD_MAX or not all(
                isinstance(t, str) and len(t) <= _TOKEN_HARD_MAX for t in v):
            return v
        field = info.field_name
        with engine_rules():
            check_token_list(v, settings_of(info).max_tokens, field=field)
        for i, t in enumerate(v):
            bad = _bad_characters(t)
            if bad:
                raise PydanticCustomError("bad_character", "{field}[{i}] contains {what}",
                                          {"field": field, "i": i, "what": bad})
            with engine_rules():
                check_token_text(i, t, field=field)
        return v

    @field_validator("d_model")
    @classmethod
    def _d_model_limit(cls, v: int, info: ValidationInfo) -> int:
        limit = settings_of(info).max_d_model
        if v > limit:
            raise PydanticCustomError(
                "d_model_too_large", "d_model {value} is above the limit of {limit}", {"value": v, "limit": limit}
            )
        return v

    @field_validator("num_heads")
    @classmethod
    def _heads_limit(cls, v: int, info: ValidationInfo) -> int:
        limit = settings_of(info).max_heads
        if v > limit:
            raise PydanticCustomError(
                "num_heads_too_large", "num_heads {value} is above the limit of {limit}", {"value": v, "limit": limit}
            )
        return v

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> TraceSpec:
        settings = settings_of(info)
        cross = self.context_sentence is not None or self.context_tokens is not None
        with engine_rules():
            check_one_source(self.sentence, self.tokens)
            check_one_context(self.context_sentence, self.context_tokens)
            # What a block's preset sets outside it (llama's RoPE, gpt2's and llama's causal mask), for the
            # fields the request leaves out.
            preset = preset_fields(self.block, self.model_fields_set)
            config = _checked_config(
                d_model=self.d_model, num_heads=self.num_heads, seed=self.seed, scale=self.scale,
                causal=preset.get("causal", self.causal),
                positional_encoding=preset.get("positional_encoding", self.positional_encoding),
                max_tokens=settings.max_tokens, num_kv_heads=self.num_kv_heads, window=self.window,
                rope_base=self.rope_base, rope_pairing=self.rope_pairing, num_layers=self.num_layers,
                block=self.block, norm=self.norm, norm_position=self.norm_position, ffn=self.ffn, d_ff=self.d_ff,
                norm_eps=self.norm_eps, norm_weights=self.norm_weights,
                head_weights=None if self.head_weights is None else tuple(self.head_weights),
                sharpness=self.sharpness, lm_head=self.lm_head, temperature=self.temperature,
                candidates=None if self.candidates is None else tuple(self.candidates),
                cross=cross, input_given=self.input is not None,
                context_input_given=self.context_input is not None, parameters_given=self.parameters is not None,
                decode=getattr(self, "decode", False), bug=getattr(self, "inject_bug", None))
            # Count tokens now (the tokenizer stops at limit + 1), so the size of
            # the whole trace is known, and bounded, before any array exists.
            tokens = split_tokens(sentence=self.sentence, tokens=self.tokens, max_tokens=settings.max_tokens)
            context = split_context(context_sentence=self.context_sentence, context_tokens=self.context_tokens,
                                    max_tokens=settings.max_tokens)
            n, m = len(tokens), None if context is None else len(context)
            if self.input is not None:
                check_input_shape(self.input, n, self.d_model)
            if self.context_input is not None and m is not None:
                check_input_shape(self.context_input, m, self.d_model, "context_input")
            if self.parameters is not None:
                check_parameter_shapes(dict(self.parameters), self.d_model, self.num_heads, self.num_kv_heads)
            n_vocab = None
            if config.has_lm_head:
                n_vocab = len(LM.vocabulary([t.text for t in tokens], config.candidates))
                LM.check_vocabulary_size(n_vocab)
            patch = self._check_interventions(config, tokens, m, settings.max_tokens)
            count = trace_value_count(config, n, with_parameters=getattr(self, "include_parameters", False),
                                      n_context=m, n_vocab=n_vocab)
            decoding = decode_value_count(config, n) if getattr(self, "decode", False) else 0
            generating = getattr(self, "generate", None)
            if generating is not None:
                raise_all([*LM.generate_conflicts(lm_head=config.lm_head, causal=config.causal, n=n,
                                                  generate=generating, max_tokens=settings.max_tokens),
                           *LM.generate_input_conflicts(input_given=self.input is not None,
                                                        bug=getattr(self, "inject_bug", None))])
                decoding += generate_value_count(config, n, n_vocab or 0, generating)
            count += decoding
            check_trace_size(count, settings.max_trace_values, n=n, d_model=self.d_model, num_heads=self.num_heads,
                             n_context=m, decode_values=decoding)
            if self.interventions is not None:  # the baseline's trace too, and the patch's second input's
                count += count * (1 + (patch is not None))
            if config.has_block:  # and every layer's weights, generated before anything is computed (and generation)
                work = 0 if generating is None else generate_work(config, n, n_vocab or 0, generating)
                check_block_cost(count + work, config.n_parameters, settings.max_request_cost,
                                 num_layers=config.num_layers)
        # One update of the private values: each assignment through pydantic's __setattr__ costs ~0.3 µs.
        self.__pydantic_private__.update(_config=config, _tokens=tokens, _context=context, _value_count=count,
                                         _patch=patch)
        return self

    def _check_interventions(self, config: TraceConfig, tokens: list[Token], m: int | None, max_tokens: int
                             ) -> list[Token] | None:
        """The interventions' rules (engine.interventions), under engine_rules; the patch's tokens, split."""
        ivs = self.engine_interventions()
        raise_all(IV.intervention_conflicts(
            interventions=bool(ivs), patch_given=self.patch_sentence is not None,
            target_given=self.target_token is not None, explicit_input=self.input is not None,
            bug=getattr(self, "inject_bug", None) is not None, decode=getattr(self, "decode", False),
            generate=getattr(self, "generate", None) is not None, lm_head=config.has_lm_head))
        if not ivs:
            return None
        patch = None
        if self.patch_sentence is not None:
            try:
                patch = split_tokens(sentence=self.patch_sentence, tokens=None, max_tokens=max_tokens)
            except EngineError as e:
                e.field = "patch_sentence"
                raise
        IV.check_interventions(ivs, config, len(tokens), patch_n=None if patch is None else len(patch), cross=m is not None)
        if config.has_lm_head:
            IV.check_target_token(self.target_token, LM.vocabulary([t.text for t in tokens],
                                                                   config.candidates))
        return patch

    def engine_interventions(self) -> tuple[IV.Intervention, ...]:
        """The request's interventions as the engine's."""
        return tuple(IV.Intervention(target=i.target, layer=i.layer, kind=i.kind, head=i.head,
                                     positions=None if i.positions is None else tuple(i.positions))
                     for i in self.interventions or ())

    # Read from __pydantic_private__ itself: pydantic's __getattr__ for a private attribute costs ~1.2 µs
    # (it probes the attribute for __get__ through an AttributeError), and a request reads these several times.
    @property
    def trace_config(self) -> TraceConfig:
        """The engine's configuration, built (and checked) by the engine during validation."""
        config = self.__pydantic_private__["_config"]
        assert config is not None, "validate the request first"
        return config

    @property
    def split(self) -> list[Token]:
        """The tokens, split (and checked) once during validation."""
        return self.__pydantic_private__["_tokens"]

    @property
    def context_split(self) -> list[Token] | None:
        """Cross-attention's context tokens, split once during validation (None for self-attention)."""
        return self.__pydantic_private__["_context"]

    @property
    def patch_split(self) -> list[Token] | None:
        """patch_sentence's tokens, split once during validation (None without it)."""
        return self.__pydantic_private__["_patch"]

    @property
    def value_count(self) -> int:
        """How many numbers the trace holds (what max_trace_values bounds), counted once during validation."""
        return self.__pydantic_private__["_value_count"]

    def run_trace(self, bug: str | None = None) -> engine.Trace:
        """The engine's trace of this validated request, with its explicit arrays if given.

        An EngineError that escapes (only an explicit input that overflows float64
        can, after validation) becomes a 422 in the one handler, problems.engine_problem.
        """
        params = None
        if self.parameters is not None:
            p = self.parameters
            params = explicit_parameters(p.W_Q, p.W_K, p.W_V, p.W_O, d_model=self.d_model,
                                         num_heads=self.num_heads, num_kv_heads=self.num_kv_heads)
        t = engine.trace(self.trace_config, split=self.split, input=self.input, parameters=params, bug=bug,
                         context_split=self.context_split, context_input=self.context_input)
        return t if not self.interventions else self.intervened(t)

    def run_traces(self, bug: str | None = None) -> tuple[engine.Trace, engine.Trace | None]:
        """(the trace, intervened when asked; its baseline, or None without interventions)."""
        t = self.run_trace(bug)
        return t, t.baseline

    def intervened(self, baseline: engine.Trace) -> engine.Trace:
        """The baseline with the request's interventions made (engine.interventions.intervene); the patch's
        second input (patch_sentence) is traced clean with the same configuration first."""
        patch = self.patch_split
        source = None if patch is None else engine.trace(self.trace_config, split=patch)
        return IV.intervene(baseline, self.engine_interventions(), source)


@lru_cache(maxsize=1024, typed=True)  # a handful of configurations recur: each checked and built once
def _checked_config(*, d_model: int, num_heads: int, seed: int, scale: bool, causal: bool, positional_encoding: str,
                    max_tokens: int, num_kv_heads: int | None, window: int | None, rope_base: float,
                    rope_pairing: str, num_layers: int, block: str | None, norm: str | None,
                    norm_position: str | None, ffn: str | None, d_ff: int | None, norm_eps: float | None,
                    norm_weights: str | None, head_weights: tuple[str, ...] | None, sharpness: float,
                    lm_head: str | None, temperature: float, candidates: tuple[str, ...] | None, cross: bool,
                    input_given: bool, context_input_given: bool, parameters_given: bool, decode: bool,
                    bug: str | None) -> TraceConfig:
    """A request's TraceConfig, its sizes and every conflict between its settings checked by the engine (an
    EngineError: call it under ``engine_rules``), the token-independent part of ``TraceSpec._consistent``.

    A function of the settings alone, so it is cached: a configuration that recurs is the very same
    TraceConfig, whose derived values (d_k, the steps, the stage layout) are then computed once. ``typed``
    keeps values of different types apart (true and 1, 1 and 1.0), as the answers echo them."""
    head_dim(d_model, num_heads)
    kv_heads(num_heads, num_kv_heads)
    has_block = any(v is not None for v in (block, norm, norm_position, ffn, d_ff, norm_eps, norm_weights))
    # Every conflict between the variants' settings at once (then the configuration builds).
    check_variants(d_model=d_model, num_heads=num_heads, causal=causal, window=window,
                   positional_encoding=positional_encoding, cross=cross, input_given=input_given,
                   context_input_given=context_input_given, decode=decode, bug=bug, block=has_block,
                   num_layers=num_layers, parameters_given=parameters_given)
    config = TraceConfig(d_model=d_model, num_heads=num_heads, seed=seed, scale=scale, causal=causal,
                         positional_encoding=positional_encoding, max_tokens=max_tokens, num_kv_heads=num_kv_heads,
                         window=window, rope_base=rope_base, rope_pairing=rope_pairing, num_layers=num_layers,
                         block=block, norm=norm, norm_position=norm_position, ffn=ffn, d_ff=d_ff, norm_eps=norm_eps,
                         norm_weights=norm_weights, lm_head=lm_head, temperature=temperature, candidates=candidates)
    if head_weights is not None:  # constructed heads: their own x and weights (engine.constructed)
        config = replace(config, head_weights=head_weights, sharpness=sharpness)
        raise_all(constructed.trace_conflicts(constructed=config.constructed, input_given=input_given,
                                              parameters_given=parameters_given, cross=cross))
    return config


def settings_of(info: ValidationInfo) -> Settings:
    """The limits in force, from the validation context (the defaults without one)."""
    ctx = info.context or {}
    return ctx.get("settings") or Settings()


# ----------------------------------------------------------------- responses


def omitted(description: str, *, nullable: bool = False) -> Any:
    """An output field the service leaves out of an answer where it does not apply: not required, and
    no ``default`` in the schema (generated clients, openapi-typescript's for one, read a default as
    "always present"); null only when ``nullable`` (sent as null in some answers)."""

    def schema(s: dict[str, Any]) -> None:
        s.pop("default", None)
        if not nullable and "anyOf" in s:
            branches = [b for b in s.pop("anyOf") if b != {"type": "null"}]
            if len(branches) == 1:
                s.update(branches[0])
            else:
                s["anyOf"] = branches

    return Field(default=None, description=description, json_schema_extra=schema)


class TokenOut(BaseModel):
    index: int = Field(description="Position in the sequence, from 0.")
    text: str
    start: int = Field(description="Offset of the first character in the sentence (Unicode code points).")
    end: int = Field(description="Offset just past the last character: sentence[start:end] == text.")


class KVCacheBytes(BaseModel):
    float16: int
    float32: int
    float64: int


class ConfigOut(BaseModel):
    d_model: int
    num_heads: int
    seed: int
    scale: bool
    causal: bool
    positional_encoding: PositionalEncodingName
    include_parameters: bool
    stages: list[StageId] | None = Field(description="The stages asked for; null means all.")
    precision: int | None = Field(description="Decimal places numbers were rounded to; null means exact.")
    d_k: int = Field(description="d_model / num_heads.")
    scale_factor: float = Field(description="√d_k when scale is on, else 1.")
    n_tokens: int
    n_parameters: int = Field(description="Weights in W_Q, W_K, W_V and W_O together: 4·d_model² "
                                            "(2·d_model² + 2·num_kv_heads·d_k·d_model with shared K/V heads).")
    n_matrices: int = Field(description="3·num_heads + 1 (num_heads + 2·num_kv_heads + 1 with shared K/V heads).")
    # The variants' settings appear only when the variant is used, so engine 1.0 answers keep their shape.
    rope_base: float | None = omitted("positional_encoding rope only.")
    rope_pairing: RopePairingName | None = omitted("positional_encoding rope only.")
    num_kv_heads: int | None = omitted("Only when num_kv_heads was given.")
    query_heads_of_kv_head: list[list[int]] | None = omitted(
        "Only with num_kv_heads: for each K/V head, the query heads that share it.")
    kv_cache_bytes_per_token: KVCacheBytes | None = omitted(
        "Only with num_kv_heads: a KV cache's bytes per token for this layer, 2·num_kv_heads·d_k numbers at "
        "each float width.")
    window: int | None = omitted("Sliding window only.")
    n_context_tokens: int | None = omitted("Cross-attention only.")
    decode: bool | None = omitted("Only when decode was asked for (then true).")
    parameters_layout: Literal["torch"] | None = omitted("Only when not per_head.")
    # A stack of blocks only: its settings as resolved (a preset's choices and the defaults filled in).
    num_layers: int | None = omitted("A stack of blocks only.")
    block: Literal[tuple(BLOCK_PRESETS)] | None = omitted(  # type: ignore[valid-type]
        "A stack of blocks only: the preset asked for, or null.", nullable=True)
    norm: Literal[NORM_KINDS] | None = omitted("A stack of blocks only.")  # type: ignore[valid-type]
    norm_position: Literal[NORM_POSITIONS] | None = omitted("A stack of blocks only.")  # type: ignore[valid-type]
    ffn: Literal[FFN_KINDS] | None = omitted("A stack of blocks only.")  # type: ignore[valid-type]
    d_ff: int | None = omitted("A stack of blocks only: the feed-forward network's width in use.")
    norm_eps: float | None = omitted("A stack of blocks only: the norms' ε in use.")
    norm_weights: Literal[NORM_WEIGHTS] | None = omitted("A stack of blocks only.")  # type: ignore[valid-type]
    head_weights: list[HeadKindName] | None = omitted("Only with a constructed head: each head's kind.")
    sharpness: float | None = omitted("Only with a constructed head.")
    # The language-model head only.
    lm_head: Literal[LM.LM_HEADS] | None = omitted("Only with lm_head.")  # type: ignore[valid-type]
    temperature: float | None = omitted("Only with lm_head.")
    n_vocabulary: int | None = omitted("Only with lm_head: how many tokens the vocabulary holds.")
    generate: int | None = omitted("Only with generate: how many tokens were generated.")
    top_k: int | None = omitted("Only with generate and top_k.")
    top_p: float | None = omitted("Only with generate and top_p.")
    sample_seed: int | None = omitted("Only with generate: the sampling seed, null for greedy.", nullable=True)


class InjectedBug(BaseModel):
    name: AnyBugName
    summary: str
    warning: str = Field(description="Always says that these numbers are deliberately wrong.")


class ValidationErrorItem(BaseModel):
    pointer: str = Field(description="JSON pointer (RFC 6901) to the offending field; empty for the whole body.")
    message: str
    type: str = Field(description="Machine-readable error type.")


class Problem(BaseModel):
    """RFC 9457 problem details."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    instance: str = Field(description="The request's path.")
    errors: list[ValidationErrorItem] | None = omitted("422 only: every problem with the request.")
