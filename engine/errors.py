"""Typed errors for invalid configurations and inputs.

Every error the engine raises on purpose derives from :class:`EngineError`, and
its message says what to fix. The service maps them to 422 problem responses,
using ``field`` as the JSON pointer to blame.
"""

from __future__ import annotations


class EngineError(ValueError):
    """Base class: the request cannot be traced as given."""

    #: the request field at fault, when there is one (e.g. "num_heads")
    field: str | None = None

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        if field is not None:
            self.field = field

    @property
    def message(self) -> str:
        return str(self.args[0])


class HeadDivisionError(EngineError):
    """d_model is not an exact multiple of num_heads, so d_k would be fractional."""

    field = "num_heads"


class InvalidSizeError(EngineError):
    """A size (d_model, num_heads, ...) is zero, negative or not an integer."""


class EmptyInputError(EngineError):
    """The sentence or token list yields no tokens."""


class TooManyTokensError(EngineError):
    """More tokens than the configured limit."""


class ShapeError(EngineError):
    """An explicitly supplied array has the wrong shape or non-finite values."""


class UnknownBugError(EngineError):
    """An injected bug that does not exist or does not apply to the configuration."""

    field = "inject_bug"
