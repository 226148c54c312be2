"""The rules a request must meet, each defined once.

The engine calls these before it computes anything, and the service's
pydantic models call the very same functions at the edge (turning the
``EngineError`` into a 422 entry), so a rule and its message live here only.
Bounds that the API schema also publishes (``SEED_MAX``,
``MAX_EXPLICIT_VALUE``) are constants here that the models reuse.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import (
    EmptyInputError,
    HeadDivisionError,
    InvalidSizeError,
    NonFiniteInputError,
    ShapeError,
    TooManyTokensError,
    TraceTooLargeError,
)
from .tokenize import Token, tokenize, tokens_from_list

SEED_MAX = 2**32 - 1

# Explicit values are bounded so that no stage can overflow float64:
# |x|, |W| ≤ 1e6 and d_model ≤ 512 keep every score below about 1e32.
MAX_EXPLICIT_VALUE = 1e6


def _is_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def divisors(n: int, limit: int | None = None) -> list[int]:
    """Divisors of n in increasing order (for error messages and frontends)."""
    small = [i for i in range(1, int(n**0.5) + 1) if n % i == 0]
    out = sorted(set(small + [n // i for i in small]))
    return out[:limit] if limit else out


def head_dim(d_model: int, num_heads: int) -> int:
    """d_k = d_model / h, which must divide exactly."""
    for name, value in (("d_model", d_model), ("num_heads", num_heads)):
        if not _is_int(value) or value < 1:
            raise InvalidSizeError(f"{name} must be a positive integer, got {value!r}", field=name)
    if d_model % num_heads:
        raise HeadDivisionError(
            f"d_model {d_model} is not divisible by num_heads {num_heads} "
            f"(d_k would be {d_model / num_heads:g}); choose num_heads among the divisors of d_model: "
            f"{', '.join(str(h) for h in divisors(d_model, limit=12))}"
        )
    return d_model // num_heads


def check_seed(seed: int) -> None:
    if not _is_int(seed) or not 0 <= seed <= SEED_MAX:
        raise InvalidSizeError(f"seed must be an integer from 0 to 2^32 - 1, got {seed!r}", field="seed")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        options = " or ".join(f'"{c}"' for c in choices)
        raise InvalidSizeError(f"{name} must be {options}, got {value!r}", field=name)


def check_token_count(count: int, limit: int) -> None:
    """A token list may hold at most ``limit`` tokens."""
    if count > limit:
        raise TooManyTokensError(f"{count} tokens is more than the limit of {limit}", field="tokens")


def check_token_text(index: int, text: str) -> None:
    """A given token must hold something other than whitespace."""
    if not text or text.isspace():
        raise EmptyInputError(f"tokens[{index}] is only whitespace", field=f"tokens/{index}", code="blank_token")


def check_sentence(sentence: str) -> None:
    """A sentence must hold at least one token: something other than whitespace."""
    if not sentence or sentence.isspace():
        what = "only whitespace" if sentence else "empty"
        raise EmptyInputError(f"the sentence is {what}: give at least one word or punctuation mark",
                              field="sentence", code="empty_sentence")


def check_one_source(sentence: str | None, tokens: list[str] | None) -> None:
    if (sentence is None) == (tokens is None):
        raise EmptyInputError(
            "give exactly one of `sentence` (a string) or `tokens` (a list of strings), not "
            + ("both" if sentence is not None else "neither"),
            code="sentence_xor_tokens",
        )


def split_tokens(*, sentence: str | None, tokens: list[str] | None, max_tokens: int) -> list[Token]:
    """Stage 1 with every token rule: exactly one source, at least one and at most ``max_tokens`` tokens."""
    check_one_source(sentence, tokens)
    if tokens is not None:
        if not tokens:
            raise EmptyInputError("the token list is empty: give at least one token", field="tokens",
                                  code="empty_tokens")
        check_token_count(len(tokens), max_tokens)
        for i, t in enumerate(tokens):
            check_token_text(i, t)
        return tokens_from_list(tokens)
    assert sentence is not None
    check_sentence(sentence)
    out = tokenize(sentence, limit=max_tokens + 1)  # stops counting just past the limit
    if len(out) > max_tokens:
        raise TooManyTokensError(
            f"the sentence has more than {max_tokens} tokens (the limit); shorten it", field="sentence"
        )
    return out


def shape_of(value: Any) -> tuple[int, ...] | None:
    """The shape of an array or nested list, or None if the list is ragged."""
    return value.shape if isinstance(value, np.ndarray) else _list_shape(value)


def _list_shape(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list):
        return ()
    if not value:
        return (0,)
    inner = [_list_shape(v) for v in value]
    if any(s is None or s != inner[0] for s in inner):
        return None
    return (len(value), *inner[0])


def check_shape(name: str, value: Any, expected: tuple[int, ...], axes: str) -> None:
    """``value`` (array or nested list) must have exactly the ``expected`` shape."""
    shape = shape_of(value)
    if shape != tuple(expected):
        got = "a ragged array" if shape is None else f"shape {list(shape)}"
        raise ShapeError(f"{name} has {got} but must be {list(expected)} {axes}", field=name.replace(".", "/"))


def explicit_array(name: str, value: Any, expected: tuple[int, ...], axes: str) -> np.ndarray:
    """A caller-supplied array: the right shape, finite, as a read-only float64 copy."""
    check_shape(name, value, expected, axes)
    a = np.array(value, dtype=np.float64)  # [expected]
    if not np.isfinite(a).all():
        raise NonFiniteInputError(f"{name} contains a non-finite value", field=name.replace(".", "/"))
    a.setflags(write=False)
    return a


def parameter_shapes(d_model: int, num_heads: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """The shape, and axis names, of each of the layer's weight matrices."""
    d_k = head_dim(d_model, num_heads)
    per_head = ((num_heads, d_k, d_model), "[head, d_k, d_model]")
    return {"W_Q": per_head, "W_K": per_head, "W_V": per_head,
            "W_O": ((d_model, num_heads * d_k), "[d_model, num_heads·d_k]")}


def check_parameter_shapes(parameters: dict[str, Any], d_model: int, num_heads: int) -> None:
    for name, (expected, axes) in parameter_shapes(d_model, num_heads).items():
        check_shape(f"parameters.{name}", parameters[name], expected, axes)


def check_input_shape(x: Any, n: int, d_model: int) -> None:
    check_shape("input", x, (n, d_model), "[token, d_model]")


def check_trace_size(count: int, limit: int, *, n: int, d_model: int, num_heads: int) -> None:
    """A trace may hold at most ``limit`` numbers: checked before any array exists."""
    if count > limit:
        raise TraceTooLargeError(
            f"this trace would return {count} numbers ({n} tokens, d_model {d_model}, {num_heads} heads), above "
            f"the limit of {limit}; use fewer tokens, a smaller d_model or fewer heads"
        )
