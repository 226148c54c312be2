"""Typed errors for invalid configurations and inputs.

Every error the engine raises on purpose derives from :class:`EngineError`; its
message says what to fix, ``code`` is a stable machine-readable type and
``field`` the request field at fault. The service turns every one of them into
the same 422 problem (one handler), and its pydantic models call the engine's
checks (``engine.checks``) instead of re-implementing them, so each rule has
one definition.
"""

from __future__ import annotations

from collections.abc import Sequence


class EngineError(ValueError):
    """Base class: the request cannot be traced as given."""

    #: the request field at fault, as a JSON pointer without the leading "/"
    #: (e.g. "num_heads", "parameters/W_Q"); None for the request as a whole
    field: str | None = None
    #: machine-readable error type (the ``type`` of a 422's error entry)
    code: str = "invalid_request"

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        if field is not None:
            self.field = field
        if code is not None:
            self.code = code

    #: the other problems found with this one (engine.errors.raise_all), in the order they were found
    also: tuple[EngineError, ...] = ()

    @property
    def message(self) -> str:
        return str(self.args[0])

    @property
    def errors(self) -> tuple[EngineError, ...]:
        """This problem and every other one found with it."""
        return (self, *self.also)

    @property
    def pointer(self) -> str:
        """RFC 6901 pointer to the field ("" for the whole request)."""
        return "/" + self.field if self.field else ""


def raise_all(problems: Sequence[EngineError]) -> None:
    """Raise the first of ``problems`` carrying the others (``also``), so that a request hears of every
    conflict at once instead of one per attempt; nothing when the list is empty."""
    if problems:
        first = problems[0]
        first.also = tuple(problems[1:])
        raise first


class HeadDivisionError(EngineError):
    """d_model is not an exact multiple of num_heads, so d_k would be fractional."""

    field = "num_heads"
    code = "head_division"


class InvalidSizeError(EngineError):
    """A size or setting (d_model, num_heads, seed, ...) is out of its range or of the wrong type."""

    code = "invalid_size"


class EmptyInputError(EngineError):
    """Neither or both of sentence and tokens, or input that yields no tokens."""

    code = "empty_input"


class TooManyTokensError(EngineError):
    """More tokens than the configured limit."""

    code = "too_many_tokens"


class ShapeError(EngineError):
    """An explicitly supplied array has the wrong shape (or is ragged)."""

    code = "array_shape"


class NonFiniteInputError(EngineError):
    """An explicitly supplied array holds NaN or ±inf."""

    code = "non_finite_input"


class NumericOverflowError(EngineError):
    """Explicit values so large that a stage overflows float64."""

    field = "input"
    code = "numeric_overflow"


class TraceTooLargeError(EngineError):
    """The trace would hold more numbers than the configured limit."""

    code = "trace_too_large"


class StageUnavailableError(EngineError):
    """A stage that this configuration does not compute was asked for."""

    code = "stage_unavailable"


class UnknownBugError(EngineError):
    """An injected bug name that is not in ``engine.bugs.BUGS``."""

    field = "inject_bug"
    code = "unknown_bug"


class BugNotApplicableError(EngineError):
    """A known bug that would change no number of this trace (so it cannot be shown or diagnosed)."""

    field = "inject_bug"
    code = "bug_not_applicable"


class KVHeadDivisionError(EngineError):
    """num_heads is not an exact multiple of num_kv_heads, so the query heads cannot share K/V heads evenly."""

    field = "num_kv_heads"
    code = "kv_head_division"


class RotaryDimensionError(EngineError):
    """RoPE rotates pairs of coordinates, so it needs an even d_k."""

    field = "positional_encoding"
    code = "rope_odd_d_k"


class VariantConflictError(EngineError):
    """Two settings that cannot go together (a window without the causal mask, RoPE in cross-attention, ...)."""

    code = "variant_conflict"


class DecodeUnavailableError(EngineError):
    """KV-cache decoding was asked of a trace it cannot re-run (not causal, cross-attention, a bug)."""

    field = "decode"
    code = "decode_unavailable"
