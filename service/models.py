"""The API contract as pydantic v2 models.

These models are the single source of truth for request validation and for
``components.schemas`` in openapi.yaml (``scripts/gen-openapi`` writes them
there; a test fails on any drift).

Limits that operators configure (max tokens, d_model, heads, total values) are
checked here too, from the validation context, so every problem, static or
configured, comes back in one ``errors`` list with a JSON pointer.
"""

from __future__ import annotations

import math
import unicodedata
from contextlib import contextmanager
from typing import Annotated, Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from engine import BUG_NAMES, BUGS, STAGE_IDS, EngineError, Token, TraceConfig, check_bug
from engine.checks import (
    MAX_EXPLICIT_VALUE,
    SEED_MAX,
    check_input_shape,
    check_one_source,
    check_parameter_shapes,
    check_sentence,
    check_token_count,
    check_token_text,
    check_trace_size,
    split_tokens,
)
from engine.layer import POSITIONAL_ENCODINGS, check_stages, trace_value_count

from .settings import Settings

StageId = Literal[STAGE_IDS]  # type: ignore[valid-type]

_SENTENCE_HARD_MAX = 1_000_000  # schema ceiling; the configured max_sentence_chars is lower


def _bad_characters(text: str) -> str | None:
    """Describe the first character no tokenizer should see, or None."""
    for i, ch in enumerate(text):
        cat = unicodedata.category(ch)
        if cat == "Cs":
            return f"a lone surrogate U+{ord(ch):04X} at character {i}; send valid Unicode"
        if cat == "Cc" and ch not in "\t\n\r":
            return f"a control character U+{ord(ch):04X} at character {i}; remove it"
    return None


BugName = Literal[BUG_NAMES]  # type: ignore[valid-type]

PositionalEncodingName = Literal[tuple(POSITIONAL_ENCODINGS)]  # type: ignore[valid-type]

_Num = Annotated[float, Field(ge=-MAX_EXPLICIT_VALUE, le=MAX_EXPLICIT_VALUE)]


@contextmanager
def engine_rules() -> Iterator[None]:
    """Run the engine's own checks at the edge: an EngineError becomes this field's 422 entry."""
    try:
        yield
    except EngineError as e:
        raise PydanticCustomError(e.code, "{message}", {"message": e.message, "pointer": e.pointer}) from None
_Matrix3 = list[list[list[_Num]]]


class ParametersIn(BaseModel):
    """Caller-supplied weights of one multi-head attention layer."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    W_Q: _Matrix3 = Field(description="[head, d_k, d_model]")
    W_K: _Matrix3 = Field(description="[head, d_k, d_model]")
    W_V: _Matrix3 = Field(description="[head, d_k, d_model]")
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

    sentence: Annotated[str, Field(min_length=1, max_length=_SENTENCE_HARD_MAX)] | None = Field(
        default=None,
        description="Text to split into tokens: a word is a token, each punctuation mark is its own token. "
        "Give exactly one of `sentence` or `tokens`.",
    )
    tokens: list[Annotated[str, Field(min_length=1, max_length=1024)]] | None = Field(
        default=None,
        min_length=1,
        max_length=100_000,
        description="Pre-split tokens, used as given. Give exactly one of `sentence` or `tokens`.",
    )
    d_model: int = Field(default=24, ge=1, description="Model width; must be divisible by num_heads.")
    num_heads: int = Field(default=1, ge=1, description="Number of heads h; d_k = d_model / h exactly.")
    seed: int = Field(default=0, ge=0, le=SEED_MAX, description="Seed for embeddings and weights.")
    scale: bool = Field(default=True, description="Divide scores by √d_k (true) or by 1 (false).")
    causal: bool = Field(default=False, description="Mask keys after each query (decoder-style).")
    positional_encoding: PositionalEncodingName = Field(
        default="sinusoidal", description="Sinusoidal encodings added to the embeddings, or none."
    )
    input: list[list[_Num]] | None = Field(
        default=None,
        description="Bring your own input x [token, d_model] instead of the seeded embeddings plus positional "
        "encodings (the token_embedding and positional_encoding stages are then absent). The tokens still "
        "label the rows.",
    )
    parameters: ParametersIn | None = Field(
        default=None,
        description="Bring your own weights instead of the seeded ones: W_Q, W_K, W_V [head, d_k, d_model] and "
        "W_O [d_model, num_heads·d_k].",
    )

    @field_validator("sentence")
    @classmethod
    def _sentence_text(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        limit = _settings(info).max_sentence_chars
        if len(v) > limit:
            raise PydanticCustomError(
                "sentence_too_long",
                "the sentence has {length} characters; the limit is {limit}",
                {"length": len(v), "limit": limit},
            )
        bad = _bad_characters(v)
        if bad:
            raise PydanticCustomError("bad_character", "the sentence contains {what}", {"what": bad})
        with engine_rules():
            check_sentence(v)
        return v

    @field_validator("tokens")
    @classmethod
    def _token_texts(cls, v: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if v is None:
            return v
        with engine_rules():
            check_token_count(len(v), _settings(info).max_tokens)
        for i, t in enumerate(v):
            bad = _bad_characters(t)
            if bad:
                raise PydanticCustomError("bad_character", "tokens[{i}] contains {what}", {"i": i, "what": bad})
            with engine_rules():
                check_token_text(i, t)
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
        with engine_rules():
            check_one_source(self.sentence, self.tokens)
            config = TraceConfig(d_model=self.d_model, num_heads=self.num_heads, seed=self.seed, scale=self.scale,
                                 causal=self.causal, positional_encoding=self.positional_encoding,
                                 max_tokens=settings.max_tokens)
            # Count tokens now (the tokenizer stops at limit + 1), so the size of
            # the whole trace is known, and bounded, before any array exists.
            tokens = split_tokens(sentence=self.sentence, tokens=self.tokens, max_tokens=settings.max_tokens)
            n = len(tokens)
            if self.input is not None:
                check_input_shape(self.input, n, self.d_model)
            if self.parameters is not None:
                check_parameter_shapes(dict(self.parameters), self.d_model, self.num_heads)
            count = trace_value_count(config, n, with_parameters=getattr(self, "include_parameters", False))
            check_trace_size(count, settings.max_trace_values, n=n, d_model=self.d_model, num_heads=self.num_heads)
        self._config, self._tokens, self._value_count = config, tokens, count
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
        default=False, description="Also return W_Q, W_K, W_V [head, d_k, d_model] and W_O [d_model, h·d_k]."
    )
    stages: list[StageId] | None = Field(
        default=None,
        min_length=1,
        max_length=len(STAGE_IDS),
        description="Return only these stages (by id); default: every stage. A grader that only needs "
        "`weights` gets only `weights`. `masked_scores` exists only with `causal: true`.",
    )
    precision: int | None = Field(
        default=None,
        ge=0,
        le=17,
        description="Round every returned number to this many decimal places (numpy round-half-even); "
        "default: no rounding, every float64 exact.",
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
        with engine_rules():
            if self.stages is not None:
                # A filter: stages that an explicit input skips are just absent from the answer.
                check_stages(self.stages, self.trace_config, explicit_input=False, field="stages")
            if self.inject_bug is not None:
                check_bug(self.inject_bug, self.trace_config, len(self._tokens), explicit_input=self.input is not None)
        return self


DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-8


class CheckRequest(TraceSpec):
    """A trace request plus a student's numbers for any subset of the stages."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"sentence": "the cat sat", "d_model": 4, "num_heads": 1,
                 "submission": {"weights": [[[0.3, 0.4, 0.3], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4]]]}},
            ]
        },
    )

    submission: dict[StageId, list[Any]] = Field(
        min_length=1,
        description="A student's values per stage id, as nested arrays in the stage's axes (see /trace). "
        "Masked entries of masked_scores are null; the tokens stage is a list of strings.",
    )
    rtol: float = Field(default=DEFAULT_RTOL, ge=0, le=1,
                        description="Relative tolerance: a value passes when |received − expected| ≤ atol + "
                                    "rtol·|expected| (numpy.isclose's rule; numpy's defaults).")
    atol: float = Field(default=DEFAULT_ATOL, ge=0, le=1e6, description="Absolute tolerance (see rtol).")

    @field_validator("submission")
    @classmethod
    def _submission_values(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for sid, values in v.items():
            if sid == "tokens":
                if not all(isinstance(t, str) for t in values):
                    raise PydanticCustomError("submission_type", "submission.tokens must be a list of strings")
                continue
            problem = _leaf_problem(values, depth=1)
            if problem:
                raise PydanticCustomError(
                    "submission_type", "submission.{sid}: {problem}",
                    {"sid": sid, "problem": problem, "pointer": f"/submission/{sid}"},
                )
        return v

    @model_validator(mode="after")
    def _stages_exist(self) -> CheckRequest:
        with engine_rules():
            check_stages(list(self.submission), self.trace_config, explicit_input=self.input is not None,
                         field="submission", keyed=True)
        return self


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


def _leaf_problem(values: Any, depth: int) -> str | None:
    """Check a nested list holds only numbers (or null), at most 3 levels deep."""
    if depth > 3:
        return "nested deeper than any stage (3 levels)"
    for item in values:
        if isinstance(item, list):
            problem = _leaf_problem(item, depth + 1)
            if problem:
                return problem
        elif item is not None:
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                return f"{str(item)[:40]!r} is not a number or null"
            try:
                finite = math.isfinite(item)
            except OverflowError:  # an integer too large for a float
                finite = False
            if not finite or abs(item) > 1e300:
                return f"{str(item)[:40]} is not a finite number of a sensible size"
    return None


def _settings(info: ValidationInfo) -> Settings:
    ctx = info.context or {}
    return ctx.get("settings") or Settings()


# ----------------------------------------------------------------- responses


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
    n_parameters: int = Field(description="Weights in W_Q, W_K, W_V and W_O together: 4·d_model².")
    n_matrices: int = Field(description="3·num_heads + 1.")


class StatsOut(BaseModel):
    axes: list[str] = Field(description='Always ["head", "query"].')
    entropy: list[list[float]] = Field(description="Entropy of each weights row, in nats.")
    max_weight: list[list[float]] = Field(description="Largest weight in each row; near 1 means saturated.")


class ParametersOut(BaseModel):
    W_Q: list[list[list[float]]] = Field(description="[head, d_k, d_model]")
    W_K: list[list[list[float]]] = Field(description="[head, d_k, d_model]")
    W_V: list[list[list[float]]] = Field(description="[head, d_k, d_model]")
    W_O: list[list[_Num]] = Field(description="[d_model, num_heads·d_k]")


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
    parameters: ParametersOut | None = Field(default=None, description="Only when include_parameters is true.")
    injected_bug: InjectedBug | None = Field(
        default=None, description="Only with inject_bug: the numbers are deliberately wrong in this way."
    )


class Mismatch(BaseModel):
    index: list[int] = Field(description="Index of the first mismatching value, in the stage's axes.")
    expected: float | str | None
    received: float | str | None


class StageCheck(BaseModel):
    step: int
    passed: bool
    shape_ok: bool
    expected_shape: list[int]
    received_shape: list[int] | None = Field(description="null when the submission is a ragged array.")
    n_values: int
    mismatches: int = Field(description="How many values are outside the tolerance (or null where a number "
                                        "belongs, or a number where null belongs).")
    max_abs_error: float | None = Field(description="Largest |received − expected| over numeric pairs.")
    max_rel_error: float | None = Field(description="Largest |received − expected| / |expected| where "
                                                    "expected ≠ 0.")
    first_mismatch: Mismatch | None
    message: str


class Diagnosis(BaseModel):
    bug: BugName | None = Field(description="The first known bug (in the documented order) that reproduces "
                                            "every submitted stage within tolerance; null if none does.")
    summary: str | None
    matches: list[BugName] = Field(description="Every known bug that reproduces the submission.")
    message: str


class Tolerance(BaseModel):
    rtol: float
    atol: float
    rule: str


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
    instance: str | None = None
    errors: list[ValidationErrorItem] | None = None


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
