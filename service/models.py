"""The API contract as pydantic v2 models.

These models are the single source of truth for request validation and for
``components.schemas`` in openapi.yaml (``scripts/gen-openapi`` writes them
there; a test fails on any drift).

Limits that operators configure (max tokens, d_model, heads, total values) are
checked here too, from the validation context, so every problem, static or
configured, comes back in one ``errors`` list with a JSON pointer.
"""

from __future__ import annotations

import unicodedata
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from engine import STAGE_IDS
from engine.attention import head_dim
from engine.errors import EngineError
from engine.tokenize import tokenize

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


class TraceRequest(BaseModel):
    """What to trace: one sentence (or pre-split tokens) and the layer's configuration."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {"sentence": "the cat sat", "d_model": 24, "num_heads": 4},
                {"tokens": ["the", "cat", "sat"], "d_model": 24, "num_heads": 1, "scale": False, "causal": True},
            ]
        },
    )

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
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="Seed for embeddings and weights.")
    scale: bool = Field(default=True, description="Divide scores by √d_k (true) or by 1 (false).")
    causal: bool = Field(default=False, description="Mask keys after each query (decoder-style).")
    positional_encoding: Literal["sinusoidal", "none"] = Field(
        default="sinusoidal", description="Sinusoidal encodings added to the embeddings, or none."
    )
    include_parameters: bool = Field(
        default=False, description="Also return W_Q, W_K, W_V [head, d_k, d_model] and W_O [d_model, h·d_k]."
    )
    stages: list[StageId] | None = Field(
        default=None,
        min_length=1,
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
        if v.isspace():
            raise PydanticCustomError(
                "empty_sentence", "the sentence is only whitespace: give at least one word or punctuation mark"
            )
        return v

    @field_validator("tokens")
    @classmethod
    def _token_texts(cls, v: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if v is None:
            return v
        limit = _settings(info).max_tokens
        if len(v) > limit:
            raise PydanticCustomError(
                "too_many_tokens", "{count} tokens is more than the limit of {limit}", {"count": len(v), "limit": limit}
            )
        for i, t in enumerate(v):
            bad = _bad_characters(t)
            if bad:
                raise PydanticCustomError("bad_character", "tokens[{i}] contains {what}", {"i": i, "what": bad})
            if t.isspace():
                raise PydanticCustomError("blank_token", "tokens[{i}] is only whitespace", {"i": i})
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
    def _consistent(self, info: ValidationInfo) -> TraceRequest:
        if (self.sentence is None) == (self.tokens is None):
            raise PydanticCustomError(
                "sentence_xor_tokens",
                "give exactly one of `sentence` (a string) or `tokens` (a list of strings), not "
                + ("both" if self.sentence is not None else "neither"),
            )
        if self.stages is not None and "masked_scores" in self.stages and not self.causal:
            raise PydanticCustomError(
                "stage_needs_causal", "the masked_scores stage exists only with causal: true; add it or drop the stage"
            )
        try:
            d_k = head_dim(self.d_model, self.num_heads)
        except EngineError as e:
            raise PydanticCustomError("head_division", str(e)) from None
        # Count tokens now (the tokenizer stops at limit + 1), so the size of
        # the whole trace is known, and bounded, before any array exists.
        settings = _settings(info)
        if self.sentence is not None:
            n = len(tokenize(self.sentence, limit=settings.max_tokens + 1))
            if n > settings.max_tokens:
                raise PydanticCustomError(
                    "too_many_tokens",
                    "the sentence has more than {limit} tokens (the limit); shorten it",
                    {"limit": settings.max_tokens},
                )
        else:
            n = len(self.tokens or ())
        count = trace_value_count(n, self.d_model, self.num_heads, d_k, self.causal, self.include_parameters)
        if count > settings.max_trace_values:
            raise PydanticCustomError(
                "trace_too_large",
                "this trace would return {count} numbers ({n} tokens, d_model {d_model}, {h} heads), above the "
                "limit of {limit}; use fewer tokens, a smaller d_model or fewer heads",
                {"count": count, "n": n, "d_model": self.d_model, "h": self.num_heads, "limit": settings.max_trace_values},
            )
        return self


def trace_value_count(n: int, d_model: int, h: int, d_k: int, causal: bool, with_params: bool) -> int:
    """How many numbers a trace returns: the bound checked before computing it."""
    per_token = 5 * d_model + 4 * h * d_k  # E, PE, x, concat, output; q, k, v, context
    per_pair = (4 if causal else 3) * h  # scores, scaled, (masked), weights
    params = 4 * h * d_k * d_model if with_params else 0
    return n * per_token + n * n * per_pair + 2 * h * n + params


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
    positional_encoding: Literal["sinusoidal", "none"]
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
    W_O: list[list[float]] = Field(description="[d_model, num_heads·d_k]")


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


class VersionInfo(BaseModel):
    service: str
    service_version: str
    schema_version: str
    engine_version: str
    libraries: dict[str, str]
    limits: dict[str, Any]
    stage_ids: list[str]


#: what scripts/gen-openapi puts in components.schemas
SCHEMA_MODELS: tuple[type[BaseModel], ...] = (
    TraceRequest,
    TraceResponse,
    Problem,
    Health,
    VersionInfo,
)
