"""The API contract as pydantic v2 models.

These models are the single source of truth for request validation and for
``components.schemas`` in openapi.yaml (``scripts/gen-openapi`` writes them
there; a test fails on any drift).

Limits that operators configure (max tokens, d_model, heads, total values) are
checked here too, from the validation context, so every problem, static or
configured, comes back in one ``errors`` list with a JSON pointer.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from engine import BUG_NAMES, BUGS, EngineError, Token, TraceConfig, check_bug
from engine.decoding import decode_value_count
from engine.checks import (
    MAX_EXPLICIT_VALUE,
    ROPE_BASE_MAX,
    SEED_MAX,
    check_choice,
    check_input_shape,
    check_kv_heads_value,
    check_one_context,
    check_one_source,
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
    DEFAULT_ROPE_BASE,
    POSITIONAL_ENCODING_CHOICES,
    ROPE_PAIRINGS,
    TOKEN_STAGE_IDS,
    check_stages,
    trace_value_count,
)

from engine.checking import compare
from engine.checking.hints import HINT_CODES
from .problems import problem_entry
from .settings import Settings

StageId = Literal[ALL_STAGE_IDS]  # type: ignore[valid-type]

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

PositionalEncodingName = Literal[POSITIONAL_ENCODING_CHOICES]  # type: ignore[valid-type]
RopePairingName = Literal[tuple(ROPE_PAIRINGS)]  # type: ignore[valid-type]

_Num = Annotated[float, Field(ge=-MAX_EXPLICIT_VALUE, le=MAX_EXPLICIT_VALUE)]


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
_Matrix3 = list[list[list[_Num]]]


class ParametersIn(BaseModel):
    """Caller-supplied weights of one multi-head attention layer."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    W_Q: _Matrix3 = Field(description="[head, d_k, d_model]")
    W_K: _Matrix3 = Field(description="[kv head, d_k, d_model]: kv heads = num_kv_heads, or num_heads")
    W_V: _Matrix3 = Field(description="[kv head, d_k, d_model]: kv heads = num_kv_heads, or num_heads")
    W_O: list[list[_Num]] = Field(description="[d_model, num_heads·d_k]")


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
    context_sentence: Annotated[str, Field(min_length=1, max_length=_SENTENCE_HARD_MAX)] | None = Field(
        default=None,
        description="Cross-attention: the queries come from the sentence, the keys and values from this context "
        "(an encoder's sentence), with its own embeddings and positions. No causal mask, window or RoPE.",
    )
    context_tokens: list[Annotated[str, Field(min_length=1, max_length=_TOKEN_HARD_MAX)]] | None = Field(
        default=None, min_length=1, max_length=_TOKENS_HARD_MAX,
        description="Cross-attention's context, pre-split. Give at most one of context_sentence or context_tokens.",
    )
    context_input: list[list[_Num]] | None = Field(
        default=None,
        description="Cross-attention with your own x: the context's x [context token, d_model], given together "
        "with input.",
    )
    input: list[list[_Num]] | None = Field(
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

    # The variants' own fields are checked by the engine's rules before the schema's, so that HTTP and
    # the engine refuse them alike: type invalid_size, the engine's message (docs/engine.md, "Errors of
    # the variants"). The schema keeps its bounds, which document the same ranges.
    @field_validator("num_kv_heads", mode="before")
    @classmethod
    def _kv_heads_value(cls, v: Any) -> Any:
        with engine_rules():
            check_kv_heads_value(v)
        return v

    @field_validator("rope_base", mode="before")
    @classmethod
    def _rope_base_value(cls, v: Any) -> Any:
        with engine_rules():
            check_rope_base(v)
        return v

    @field_validator("rope_pairing", mode="before")
    @classmethod
    def _rope_pairing_value(cls, v: Any) -> Any:
        with engine_rules():
            check_choice("rope_pairing", v, tuple(ROPE_PAIRINGS))
        return v

    @field_validator("window", mode="before")
    @classmethod
    def _window_value(cls, v: Any) -> Any:
        with engine_rules():
            check_window_size(v)
        return v

    # Before the schema's own checks, so that an empty or blank text gets the engine's type and message
    # (empty_sentence, empty_tokens, blank_token), as the engine gives them; text the schema refuses
    # anyway (not a string, over the schema's ceilings) is left to it.
    @field_validator("sentence", "context_sentence", mode="before")
    @classmethod
    def _sentence_text(cls, v: Any, info: ValidationInfo) -> Any:
        if not isinstance(v, str) or len(v) > _SENTENCE_HARD_MAX:
            return v
        field = info.field_name
        what = field.replace("_", " ")
        limit = _settings(info).max_sentence_chars
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

    @field_validator("tokens", "context_tokens", mode="before")
    @classmethod
    def _token_texts(cls, v: Any, info: ValidationInfo) -> Any:
        if not isinstance(v, list) or len(v) > _TOKENS_HARD_MAX or not all(
                isinstance(t, str) and len(t) <= _TOKEN_HARD_MAX for t in v):
            return v
        field = info.field_name
        with engine_rules():
            check_token_list(v, _settings(info).max_tokens, field=field)
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
        limit = _settings(info).max_d_model
        if v > limit:
            raise PydanticCustomError(
                "d_model_too_large", "d_model {value} is above the limit of {limit}", {"value": v, "limit": limit}
            )
        return v

    @field_validator("num_heads")
    @classmethod
    def _heads_limit(cls, v: int, info: ValidationInfo) -> int:
        limit = _settings(info).max_heads
        if v > limit:
            raise PydanticCustomError(
                "num_heads_too_large", "num_heads {value} is above the limit of {limit}", {"value": v, "limit": limit}
            )
        return v

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> TraceSpec:
        settings = _settings(info)
        cross = self.context_sentence is not None or self.context_tokens is not None
        with engine_rules():
            check_one_source(self.sentence, self.tokens)
            check_one_context(self.context_sentence, self.context_tokens)
            head_dim(self.d_model, self.num_heads)
            kv_heads(self.num_heads, self.num_kv_heads)
            # Every conflict between the variants' settings at once (then the configuration builds).
            check_variants(d_model=self.d_model, num_heads=self.num_heads, causal=self.causal, window=self.window,
                           positional_encoding=self.positional_encoding, cross=cross,
                           input_given=self.input is not None, context_input_given=self.context_input is not None,
                           decode=getattr(self, "decode", False), bug=getattr(self, "inject_bug", None))
            config = TraceConfig(d_model=self.d_model, num_heads=self.num_heads, seed=self.seed, scale=self.scale,
                                 causal=self.causal, positional_encoding=self.positional_encoding,
                                 max_tokens=settings.max_tokens, num_kv_heads=self.num_kv_heads,
                                 window=self.window, rope_base=self.rope_base, rope_pairing=self.rope_pairing)
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
            count = trace_value_count(config, n, with_parameters=getattr(self, "include_parameters", False),
                                      n_context=m)
            decoding = decode_value_count(config, n) if getattr(self, "decode", False) else 0
            count += decoding
            check_trace_size(count, settings.max_trace_values, n=n, d_model=self.d_model, num_heads=self.num_heads,
                             n_context=m, decode_values=decoding)
        self._config, self._tokens, self._context, self._value_count = config, tokens, context, count
        return self

    @property
    def trace_config(self) -> TraceConfig:
        """The engine's configuration, built (and checked) by the engine during validation."""
        assert self._config is not None, "validate the request first"
        return self._config

    @property
    def split(self) -> list[Token]:
        """The tokens, split (and checked) once during validation."""
        return self._tokens

    @property
    def context_split(self) -> list[Token] | None:
        """Cross-attention's context tokens, split once during validation (None for self-attention)."""
        return self._context


class TraceRequest(TraceSpec):
    """What to trace, and how to return it."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"sentence": "the cat sat", "d_model": 24, "num_heads": 4},
                {"tokens": ["the", "cat", "sat"], "d_model": 24, "num_heads": 1, "scale": False, "causal": True},
                {"sentence": "the cat sat", "d_model": 24, "num_heads": 4, "inject_bug": BUG_NAMES[0],
                 "stages": ["weights"], "precision": 4},
            ]
        },
    )

    include_parameters: bool = Field(
        default=False, description="Also return W_Q [head, d_k, d_model], W_K and W_V [kv head, d_k, d_model] "
        "(kv heads = num_kv_heads, or num_heads) and W_O [d_model, h·d_k]."
    )
    parameters_layout: Literal["per_head", "torch"] = Field(
        default="per_head",
        description="With include_parameters: per_head gives W_Q, W_K, W_V, W_O as above; torch gives "
        "`in_proj_weight` [3·d_model, d_model] (W_Q, W_K, W_V stacked, heads in order) and `out_proj.weight` "
        "[d_model, d_model], ready for torch.nn.MultiheadAttention(d_model, num_heads, bias=False)'s "
        "load_state_dict (without shared K/V heads, which that module does not have).",
    )
    stages: list[StageId] | None = Field(
        default=None,
        min_length=1,
        max_length=len(ALL_STAGE_IDS),
        description="Return only these stages (by id); default: every stage. A grader that only needs "
        "`weights` gets only `weights`. A stage this configuration does not compute is a 422, each one listed: "
        "`masked_scores` without `causal: true`, `q_rotated`/`k_rotated` without RoPE, `positional_encoding` "
        "under RoPE, the context stages without a context, `token_embedding` and `positional_encoding` (and the "
        "context's) with your own input. It filters what is returned, not the decoding steps, and not what "
        "max_trace_values counts.",
    )
    precision: int | None = Field(
        default=None,
        ge=0,
        le=17,
        description="Round every returned number to this many decimal places (numpy round-half-even); "
        "default: no rounding, every float64 exact.",
    )

    decode: bool = Field(
        default=False,
        description="Also return `decode`: the layer re-run one token at a time with a KV cache, as a model "
        "generates text (causal self-attention only). Step t's rows equal the full trace's row t. `precision` "
        "rounds it, `stages` does not filter it, and its numbers count towards max_trace_values.",
    )

    inject_bug: BugName | None = Field(
        default=None,
        description="Return the trace with one known bug injected (clearly labelled in `injected_bug`): "
        + "; ".join(f"`{b.name}`: {b.summary}" for b in BUGS.values())
        + ". " + ", ".join(f"`{b.name}`" for b in BUGS.values() if b.needs_causal) + " needs `causal: true`. "
        "A bug that would change no number of this trace (a scaling bug with `scale: false` or d_k = 1, "
        "averaging one head, a softmax or mask bug on one token) is refused with a 422 that says why.",
    )

    @model_validator(mode="after")
    def _options(self) -> TraceRequest:
        if self.parameters_layout == "torch":
            layout = []  # both problems at once, as every conflict
            if not self.include_parameters:
                layout.append({"type": "layout_needs_parameters", "pointer": "/parameters_layout",
                               "message": "parameters_layout chooses how the weights are returned: add "
                                          "include_parameters: true, or drop parameters_layout"})
            if self.trace_config.grouped:
                layout.append({"type": "layout_needs_all_kv_heads", "pointer": "/parameters_layout",
                               "message": "torch.nn.MultiheadAttention has a K and V head per query head; drop "
                                          "num_kv_heads or use parameters_layout per_head"})
            if layout:
                first = layout[0]
                raise PydanticCustomError(first["type"], "{message}", {"message": first["message"],
                                                                       "pointer": first["pointer"],
                                                                       "also": layout[1:]})
        with engine_rules():
            if self.stages is not None:
                # As /check's submission: a stage your own input skips is refused, not silently left out.
                check_stages(self.stages, self.trace_config, explicit_input=self.input is not None, field="stages",
                             cross=self._context is not None)
            if self.inject_bug is not None:
                check_bug(self.inject_bug, self.trace_config, len(self._tokens), explicit_input=self.input is not None,
                          n_context=None if self._context is None else len(self._context))
        return self


_TOLERANCE_DOC = (
    "By default a value passes when |received − expected| ≤ atol + rtol·|expected| + stage_rtol·max|expected|, "
    f"with rtol {compare.DEFAULT_RTOL:g} and atol {compare.DEFAULT_ATOL:g} (numpy.isclose's defaults) and "
    f"stage_rtol {compare.DEFAULT_STAGE_RTOL:g}, max|expected| being the largest magnitude in the stage: wide "
    "enough for correct float32 work at every allowed size, far below what any known bug changes "
    "(docs/checking.md has the measurements)."
)


class CheckRequest(TraceSpec):
    """A trace request plus a student's numbers for any subset of the stages."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"sentence": "the cat sat", "d_model": 4, "num_heads": 1,
                 "submission": {"weights": [[[0.3, 0.4, 0.3], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4]]]}},
                {"sentence": "the cat sat", "d_model": 4, "num_heads": 1, "metric": "rel_error", "threshold": 1e-3,
                 "submission": {"weights": [[[0.3, 0.4, 0.3], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4]]]}},
            ]
        },
    )

    #: the submitted stages' shapes, found while checking their values (None: ragged)
    _shapes: dict[str, tuple[int, ...] | None] = PrivateAttr(default_factory=dict)
    #: the stages an npz body sent as arrays (service/npz.py), read once
    _arrays: dict[str, compare.Received] = PrivateAttr(default_factory=dict)

    submission: dict[StageId, list[Any]] = Field(
        min_length=1,
        description="A student's values per stage id, as nested arrays in the stage's axes (see /trace). "
        "Masked entries of masked_scores are null; -Infinity or any value ≤ -1e9 there counts as masked too. "
        "NaN, Infinity and -Infinity may be sent as the literals NaN, Infinity and -Infinity (what Python's "
        "json writes) or as the strings \"NaN\", \"Infinity\" and \"-Infinity\" (what Jackson, .NET and "
        "protobuf write): such a value fails its stage, and the answer names where. The tokens and context_tokens "
        "stages are lists of strings.",
    )
    metric: Literal[compare.METRICS] | None = Field(  # type: ignore[valid-type]
        default=None,
        description="How values are compared: `allclose` (numpy.isclose's rule, plus the stage term "
        "stage_rtol; the default) or `rel_error` (CS231n's |received − expected| / max(1e-8, |received| + "
        "|expected|) ≤ threshold, value by value). " + _TOLERANCE_DOC,
    )
    rtol: float | None = Field(
        default=None, ge=0, le=1,
        description="allclose: relative tolerance. Giving any of rtol, atol or stage_rtol sets the others to "
        "numpy's defaults (rtol 1e-5, atol 1e-8, stage_rtol 0), so rtol and atol alone mean exactly "
        "numpy.isclose's rule; giving none of them means the default tolerance.",
    )
    atol: float | None = Field(default=None, ge=0, le=1e6, description="allclose: absolute tolerance (see rtol).")
    stage_rtol: float | None = Field(
        default=None, ge=0, le=1,
        description="allclose: a tolerance relative to the stage's largest |expected| value, added to atol "
        "(see rtol). float32 rounding errors scale with the stage's magnitude, not with each value's.",
    )
    threshold: float | None = Field(
        default=None, ge=0, le=1,
        description=f"rel_error: the largest relative error allowed (default {compare.DEFAULT_THRESHOLD:g}).",
    )

    @field_validator("submission")
    @classmethod
    def _token_strings(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for sid in sorted(TOKEN_STAGE_IDS & v.keys(), key=ALL_STAGE_IDS.index):
            if not all(isinstance(t, str) for t in v[sid]):
                raise PydanticCustomError("submission_type", "submission.{sid} must be a list of strings", {"sid": sid})
        return v

    @model_validator(mode="after")
    def _stages_exist(self, info: ValidationInfo) -> CheckRequest:
        with engine_rules():
            check_stages(list(self.submission), self.trace_config, explicit_input=self.input is not None,
                         field="submission", keyed=True, cross=self._context is not None)
        arrays = (info.context or {}).get("npz_submission") or {}  # sid -> (values, mask) from an npz body
        # Every value's type, and each stage's shape, in one pass over the rows (compare.scan).
        for sid, values in self.submission.items():
            if sid in TOKEN_STAGE_IDS:  # token texts: compared as strings (service/core.py)
                continue
            if sid in arrays:
                a, mask = arrays[sid]
                if not 1 <= a.ndim <= compare.MAX_DEPTH:
                    raise PydanticCustomError(
                        "submission_type", "submission.{sid}: {problem}",
                        {"sid": sid, "pointer": f"/submission/{sid}", "problem": (
                            "a single number, not an array" if a.ndim == 0 else
                            f"{a.ndim} dimensions, deeper than any stage ({compare.MAX_DEPTH})")})
                self._arrays[sid] = compare.received_npz(a, mask)
                self._shapes[sid] = a.shape
                continue
            try:
                self._shapes[sid] = compare.scan(values)
            except compare.SubmissionTypeError as e:
                raise PydanticCustomError(
                    "submission_type", "submission.{sid}: {problem}",
                    {"sid": sid, "problem": str(e), "pointer": f"/submission/{sid}"},
                ) from None
        return self

    @model_validator(mode="after")
    def _one_metric(self) -> CheckRequest:
        allclose = [name for name in ("rtol", "atol", "stage_rtol") if getattr(self, name) is not None]
        if self.metric == "rel_error" and allclose:
            raise PydanticCustomError(
                "tolerance_conflict", "{name} belongs to metric \"allclose\"; metric \"rel_error\" takes threshold",
                {"name": allclose[0], "pointer": f"/{allclose[0]}"})
        if self.metric != "rel_error" and self.threshold is not None:
            raise PydanticCustomError(
                "tolerance_conflict", "threshold belongs to metric \"rel_error\"; add \"metric\": \"rel_error\", "
                "or give rtol, atol and stage_rtol for allclose", {"pointer": "/threshold"})
        return self

    @property
    def tolerance(self) -> compare.Tolerance:
        """The tolerance asked for, with defaults filled in (compare.Tolerance.resolve)."""
        return compare.Tolerance.resolve(self.metric, self.rtol, self.atol, self.stage_rtol, self.threshold)

    @property
    def shapes(self) -> dict[str, tuple[int, ...] | None]:
        """Each submitted numeric stage's shape (None when ragged), found during validation."""
        return self._shapes

    @property
    def arrays(self) -> dict[str, compare.Received]:
        """The stages an npz body sent as arrays, already read (service/npz.py)."""
        return self._arrays


class BatchRequest(BaseModel):
    """Several requests answered independently, in order."""

    model_config = ConfigDict(extra="forbid", strict=True)

    items: list[dict[str, Any]] = Field(
        min_length=1,
        description="Each item is a request body of the single endpoint. One bad item gets its own problem "
        "entry and does not fail the rest. The number of items and their total size are limited "
        "(see /version: max_batch_items, max_trace_values).",
    )

    @field_validator("items")
    @classmethod
    def _count(cls, v: list[dict[str, Any]], info: ValidationInfo) -> list[dict[str, Any]]:
        limit = _settings(info).max_batch_items
        if len(v) > limit:
            raise PydanticCustomError(
                "too_many_items", "{count} items is more than the limit of {limit}", {"count": len(v), "limit": limit}
            )
        return v


def _settings(info: ValidationInfo) -> Settings:
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


class StageOut(BaseModel):
    step: int = Field(description="Step number in the walkthrough (q, k and v share step 5).")
    title: str
    formula: str
    axes: list[str] = Field(description="Axis names, outermost first, e.g. [head, query, key].")
    shape: list[int] = Field(description="Length of each axis.")
    values: list[Any] = Field(
        description="Nested arrays in `axes` order. Numbers are float64, written so they round-trip exactly; "
        "masked entries of masked_scores are null. The tokens stage holds strings."
    )
    axis_tokens: list[Literal["tokens", "context_tokens"] | None] | None = omitted(
        "Cross-attention only: for each axis, the token list it indexes (`tokens`, the queries' "
        "sentence, or `context_tokens`, the keys' context), or null for a non-token axis.")


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


class StatsOut(BaseModel):
    axes: list[str] = Field(description='Always ["head", "query"].')
    entropy: list[list[float]] = Field(description="Entropy of each weights row, in nats.")
    max_weight: list[list[float]] = Field(description="Largest weight in each row; near 1 means saturated.")


class ParametersOut(BaseModel):
    W_Q: list[list[list[float]]] = Field(description="[head, d_k, d_model]")
    W_K: list[list[list[float]]] = Field(description="[kv head, d_k, d_model]: kv heads = num_kv_heads, or "
                                                     "num_heads")
    W_V: list[list[list[float]]] = Field(description="[kv head, d_k, d_model]: kv heads = num_kv_heads, or "
                                                     "num_heads")
    W_O: list[list[_Num]] = Field(description="[d_model, num_heads·d_k]")


class TorchParametersOut(BaseModel):
    """parameters_layout "torch": torch.nn.MultiheadAttention(d_model, num_heads, bias=False)'s state_dict."""

    model_config = ConfigDict(populate_by_name=True)

    in_proj_weight: list[list[float]] = Field(description="[3·d_model, d_model]: W_Q, W_K, W_V, each [h·d_k, d_model]")
    out_proj_weight: list[list[float]] = Field(alias="out_proj.weight", description="[d_model, d_model]: W_O")


class DecodeStepOut(BaseModel):
    position: int = Field(description="The token generated at this step (its index in tokens).")
    token: str
    cache_positions: list[int] = Field(description="The positions whose keys and values are cached after this "
                                                   "step, oldest first (the last `window` with a sliding window).")
    q: list[list[float]] = Field(description="[head, d_k]: x_t·W_Qᵀ, unrotated.")
    k: list[list[float]] = Field(description="[kv head, d_k]: x_t·W_Kᵀ, the unrotated key. Without RoPE it is the "
                                             "row appended to the key cache; under RoPE the cache holds k_rotated.")
    v: list[list[float]] = Field(description="[kv head, d_k]: x_t·W_Vᵀ, the row appended to the value cache.")
    q_rotated: list[list[float]] | None = Field(description="[head, d_k]: q turned by position t (RoPE); null "
                                                            "without RoPE.")
    k_rotated: list[list[float]] | None = Field(description="[kv head, d_k]: k turned by position t, the row "
                                                            "appended to the key cache (RoPE); null without RoPE.")
    k_cache: list[list[list[float]]] = Field(description="[kv head, cached, d_k]")
    v_cache: list[list[list[float]]] = Field(description="[kv head, cached, d_k]")
    scores: list[list[float]] = Field(description="[head, cached]")
    scaled_scores: list[list[float]] = Field(description="[head, cached]")
    weights: list[list[float]] = Field(description="[head, cached]")
    context: list[list[float]] = Field(description="[head, d_k]")
    output: list[float] = Field(description="[d_model]")


class InjectedBug(BaseModel):
    name: BugName
    summary: str
    warning: str = Field(description="Always says that these numbers are deliberately wrong.")


class TraceResponse(BaseModel):
    schema_version: str
    engine_version: str
    config: ConfigOut
    tokens: list[TokenOut]
    parameters_digest: str = Field(
        pattern=r"^sha256:[0-9a-f]{64}$", description="SHA-256 of the weights: equal digests mean identical weights."
    )
    stages: dict[StageId, StageOut] = Field(description="Every stage, keyed by stage id, in walkthrough order.")
    stats: StatsOut
    parameters: ParametersOut | TorchParametersOut | None = omitted(
        "Only when include_parameters is true, in parameters_layout.")
    context_tokens: list[TokenOut] | None = omitted(
        "Cross-attention only: the context's tokens (offsets into context_sentence).")
    decode: list[DecodeStepOut] | None = omitted("Only with decode: one entry per token.")
    injected_bug: InjectedBug | None = omitted("Only with inject_bug: the numbers are deliberately wrong in this way.")


class Mismatch(BaseModel):
    index: list[int] = Field(description="Index of the first mismatching value, in the stage's axes.")
    expected: float | str | None = Field(description="null: the reference masks this entry.")
    received: float | str | None = Field(
        description="null: null was sent. A non-finite value is written as the string \"NaN\", \"Infinity\" "
        "or \"-Infinity\" (JSON numbers cannot hold them); in the tokens stage, the token.")


class NonFiniteValue(BaseModel):
    index: list[int] = Field(description="Where, in the stage's axes.")
    value: Literal["NaN", "Infinity", "-Infinity"]


class NonFinite(BaseModel):
    count: int = Field(description="How many received values are NaN or ±Infinity (each fails the stage).")
    first: list[NonFiniteValue] = Field(description=f"The first {compare.MAX_NON_FINITE_SHOWN}, row-major.")


class StageCheck(BaseModel):
    step: int
    passed: bool
    shape_ok: bool
    expected_shape: list[int]
    received_shape: list[int] | None = Field(description="null when the submission is a ragged array.")
    n_values: int
    mismatches: int = Field(description="How many values are outside the tolerance, not finite, or null where a "
                                        "number belongs, or a number where the reference masks.")
    max_abs_error: float | None = Field(description="Largest |received − expected| over pairs of finite numbers.")
    max_rel_error: float | None = Field(description="Largest |received − expected| / |expected| where "
                                                    "expected ≠ 0.")
    rel_error: float | None = Field(
        description="CS231n's relative error, the largest |received − expected| / max(1e-8, |received| + "
        "|expected|) over pairs of finite numbers: what metric rel_error compares with its threshold.")
    abs_tolerance: float | None = Field(
        description="allclose: the absolute part of this stage's bound, atol + stage_rtol·max|expected|; "
        "null for rel_error and where nothing was compared.")
    non_finite: NonFinite | None = Field(description="The NaN and ±Infinity received, if any (the stage fails).")
    treated_as_masked: int = Field(
        description="masked_scores: how many entries the reference masks were sent as -Infinity or a value ≤ "
        "-1e9 and counted as masked (0 elsewhere).")
    first_mismatch: Mismatch | None
    message: str


class Hint(BaseModel):
    code: Literal[HINT_CODES] = Field(description="What the numbers show, for machines.")  # type: ignore[valid-type]
    message: str = Field(description="The same, written to be shown to a student.")


class Diagnosis(BaseModel):
    bug: BugName | None = Field(description="The first known bug (in the documented order) that reproduces "
                                            "every submitted stage within tolerance; null if none does.")
    summary: str | None
    matches: list[BugName] = Field(description="Every known bug that reproduces the submission.")
    message: str
    hints: list[Hint] = Field(
        description="When no known bug matches: what the student's numbers in the first wrong stage show "
        "(rows that do not sum to 1, a masked diagonal, a permutation or a transpose of the expected values, "
        "a constant factor). Empty otherwise.")


class Tolerance(BaseModel):
    metric: Literal[compare.METRICS]  # type: ignore[valid-type]
    rtol: float | None = Field(description="allclose only.")
    atol: float | None = Field(description="allclose only.")
    stage_rtol: float | None = Field(description="allclose only: times the stage's largest |expected|.")
    threshold: float | None = Field(description="rel_error only.")
    rule: str = Field(description="The rule each value must meet.")


class CheckResponse(BaseModel):
    schema_version: str
    engine_version: str
    parameters_digest: str
    config: ConfigOut
    tolerance: Tolerance
    passed: bool
    first_wrong_stage: StageId | None = Field(description="The first failing stage in walkthrough order.")
    stages: dict[StageId, StageCheck] = Field(description="One entry per submitted stage, in walkthrough order.")
    diagnosis: Diagnosis
    message: str = Field(description="A summary fit to show a student.")


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


class Health(BaseModel):
    status: Literal["ok"]


class BatchItemResult(BaseModel):
    index: int
    status: int = Field(description="What the single endpoint would have answered for this item.")
    result: dict[str, Any] | None = Field(description="The single endpoint's body when status is 200.")
    problem: Problem | None = Field(description="The problem document otherwise.")


class BatchResponse(BaseModel):
    results: list[BatchItemResult] = Field(description="One per item, in the same order.")


class VersionInfo(BaseModel):
    service: str
    service_version: str
    schema_version: str
    engine_version: str
    libraries: dict[str, str]
    limits: dict[str, Any]
    stage_ids: list[str]
    bugs: dict[str, str] = Field(description="The known bugs that inject_bug and /check's diagnosis use.")


#: what scripts/gen-openapi puts in components.schemas
SCHEMA_MODELS: tuple[type[BaseModel], ...] = (
    TraceRequest,
    TraceResponse,
    CheckRequest,
    CheckResponse,
    BatchRequest,
    BatchResponse,
    Problem,
    Health,
    VersionInfo,
)
