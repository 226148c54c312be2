"""The rules a request must meet, each defined once.

The engine calls these before it computes anything, and the service's
pydantic models call the very same functions at the edge (turning the
``EngineError`` into a 422 entry), so a rule and its message live here only.
Bounds that the API schema also publishes (``SEED_MAX``,
``MAX_EXPLICIT_VALUE``) are constants here that the models reuse.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .errors import (
    DecodeUnavailableError,
    EmptyInputError,
    HeadDivisionError,
    InvalidSizeError,
    KVHeadDivisionError,
    NonFiniteInputError,
    RotaryDimensionError,
    ShapeError,
    TooManyTokensError,
    TraceTooLargeError,
    VariantConflictError,
    raise_all,
)
from .tokenize import Token, tokenize, tokens_from_list

SEED_MAX = 2**32 - 1

# Explicit values are bounded so that no stage can overflow float64:
# |x|, |W| ≤ 1e6 and d_model ≤ 512 keep every score below about 1e32.
MAX_EXPLICIT_VALUE = 1e6


#: the largest rope_base: far above any model's (Llama 3's is 500000), and low enough that every angle
#: pos·rope_base^(−2i/d_k) stays an ordinary float64
ROPE_BASE_MAX = 1e12

#: longest representation of a refused value that a message repeats
_SHOWN_CHARS = 64


def _is_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def _shown(value: Any) -> str:
    """``repr(value)`` for a message, cut short: a refused value may be as large as the request."""
    text = repr(value) if not isinstance(value, (int, np.integer)) or abs(value) < 10**_SHOWN_CHARS \
        else f"an integer of {len(str(abs(int(value))))} digits"
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"


def divisors(n: int, limit: int | None = None) -> list[int]:
    """Divisors of n in increasing order (for error messages and frontends)."""
    small = [i for i in range(1, int(n**0.5) + 1) if n % i == 0]
    out = sorted(set(small + [n // i for i in small]))
    return out[:limit] if limit else out


def head_dim(d_model: int, num_heads: int) -> int:
    """d_k = d_model / h, which must divide exactly."""
    for name, value in (("d_model", d_model), ("num_heads", num_heads)):
        if not _is_int(value) or value < 1:
            raise InvalidSizeError(f"{name} must be a positive integer, got {_shown(value)}", field=name)
    if d_model % num_heads:
        raise HeadDivisionError(
            f"d_model {d_model} is not divisible by num_heads {num_heads} "
            f"(d_k would be {d_model / num_heads:g}); choose num_heads among the divisors of d_model: "
            f"{', '.join(str(h) for h in divisors(d_model, limit=12))}"
        )
    return d_model // num_heads


def kv_heads(num_heads: int, num_kv_heads: int | None) -> int:
    """The number of K/V heads (GQA; 1 is MQA): num_heads when None, else a divisor of num_heads."""
    if num_kv_heads is None:
        return num_heads
    check_kv_heads_value(num_kv_heads)
    if num_heads % num_kv_heads:
        raise KVHeadDivisionError(
            f"num_heads {num_heads} is not divisible by num_kv_heads {num_kv_heads}, so the query heads cannot "
            f"share the K/V heads evenly; choose num_kv_heads among the divisors of num_heads: "
            f"{', '.join(str(g) for g in divisors(num_heads))}"
        )
    return num_kv_heads


def check_kv_heads_value(num_kv_heads: Any) -> None:
    """num_kv_heads on its own: a positive integer, or None for num_heads."""
    if num_kv_heads is not None and (not _is_int(num_kv_heads) or num_kv_heads < 1):
        raise InvalidSizeError(f"num_kv_heads must be a positive integer (or null for num_heads), got "
                               f"{_shown(num_kv_heads)}", field="num_kv_heads")


def rope_conflicts(d_model: int, num_heads: int) -> list[RotaryDimensionError]:
    """RoPE rotates coordinates in pairs, so d_k must be even."""
    d_k = d_model // num_heads
    if not d_k % 2:
        return []
    even = [h for h in divisors(d_model) if (d_model // h) % 2 == 0]
    fix = (f"choose num_heads among {', '.join(str(h) for h in even[:12])} (d_k even)" if even
           else "choose an even d_model")
    return [RotaryDimensionError(
        f"RoPE rotates the coordinates of each head in pairs, so d_k must be even, but d_k = d_model / num_heads "
        f"= {d_model} / {num_heads} = {d_k}; {fix}, or use positional_encoding \"sinusoidal\""
    )]


def check_rope(d_model: int, num_heads: int) -> None:
    raise_all(rope_conflicts(d_model, num_heads))


def check_rope_base(base: Any) -> None:
    """rope_base: the RoPE frequency base, a finite number above 1 and at most ROPE_BASE_MAX (checked
    whatever the positional encoding, like every setting)."""
    number = not isinstance(base, bool) and isinstance(base, (int, float, np.integer, np.floating))
    # The comparisons first: an integer too large for a float has no isfinite.
    if not number or not 1 < base <= ROPE_BASE_MAX or not math.isfinite(base):
        raise InvalidSizeError(f"rope_base must be a finite number greater than 1 and at most {ROPE_BASE_MAX:g} "
                               f"(10000 in RoFormer and Llama 2, 500000 in Llama 3), got {_shown(base)}",
                               field="rope_base")


def check_window_size(window: Any) -> None:
    """window on its own: a positive number of keys, each query's own included, or None for no window."""
    if window is not None and (not _is_int(window) or window < 1):
        raise InvalidSizeError(f"window must be a positive integer (how many keys a query sees, its own included) "
                               f"or null, got {_shown(window)}", field="window")


def window_conflicts(window: Any, causal: bool) -> list[VariantConflictError]:
    """A sliding window limits a query's look back under the causal mask, so it needs one."""
    if window is None or causal:
        return []
    return [VariantConflictError(
        "a sliding window limits how far back a query looks under the causal mask, so it needs causal: true; "
        "set causal: true or drop window", field="window", code="window_needs_causal")]


def check_window(window: Any, causal: bool) -> None:
    """A sliding window: a positive number of keys, each query's own included, and only with the causal mask."""
    check_window_size(window)
    raise_all(window_conflicts(window, causal))


#: the most layers a stack may have (the trace-size limit usually binds long before)
MAX_LAYERS = 96
#: the widest feed-forward layer (d_ff) a request may ask for
D_FF_MAX = 65_536


def check_num_layers(num_layers: Any) -> None:
    """num_layers: how many blocks are stacked, a positive integer (1, the default, with no block field: engine
    1.0's single attention layer)."""
    if not _is_int(num_layers) or not 1 <= num_layers <= MAX_LAYERS:
        raise InvalidSizeError(f"num_layers must be an integer from 1 to {MAX_LAYERS}, got {_shown(num_layers)}",
                               field="num_layers")


def check_d_ff(d_ff: Any) -> None:
    """d_ff: the feed-forward network's inner width, a positive integer, or None for the default."""
    if d_ff is not None and (not _is_int(d_ff) or not 1 <= d_ff <= D_FF_MAX):
        raise InvalidSizeError(f"d_ff must be an integer from 1 to {D_FF_MAX} (or null for the default: 4·d_model, "
                               f"and Llama's rounding of 8·d_model/3 for swiglu), got {_shown(d_ff)}", field="d_ff")


def check_norm_eps(eps: Any) -> None:
    """norm_eps: the ε added to the variance (or mean square) inside the square root, a finite number in (0, 1]."""
    number = not isinstance(eps, bool) and isinstance(eps, (int, float, np.integer, np.floating))
    if eps is not None and (not number or not 0 < eps <= 1 or not math.isfinite(eps)):
        raise InvalidSizeError(f"norm_eps must be a finite number greater than 0 and at most 1 (1e-05 in "
                               f"torch.nn.LayerNorm and GPT-2, 1e-06 in Llama), or null for the block's default, got "
                               f"{_shown(eps)}", field="norm_eps")


def check_optional_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    """A block setting: one of ``choices``, or None for the preset's."""
    if value is not None:
        check_choice(name, value, choices)


def layer_conflicts(num_layers: int, block: bool) -> list[VariantConflictError]:
    """A stack is a stack of blocks: more than one layer needs a block (attention alone is one layer)."""
    if num_layers == 1 or block:
        return []
    return [VariantConflictError(
        f"num_layers {num_layers} stacks Transformer blocks, and no block is asked for: give block (\"vaswani2017\", "
        "\"gpt2\" or \"llama\") or a block setting (norm, norm_position, ffn, d_ff, norm_eps, norm_weights), or "
        "drop num_layers for the single attention layer", field="num_layers", code="layers_need_block")]


def block_parameter_conflicts(*, block: bool, parameters_given: bool) -> list[VariantConflictError]:
    """A request's own weights are one attention layer's (W_Q, W_K, W_V, W_O): a stack's come from the seed."""
    if not (block and parameters_given):
        return []
    return [VariantConflictError(
        "parameters are one attention layer's W_Q, W_K, W_V and W_O; a stack of blocks also has norms and a "
        "feed-forward network per layer, which come from the seed here: drop parameters, or the block fields",
        field="parameters", code="block_parameters")]


def block_context_conflicts(*, block: bool, cross: bool) -> list[VariantConflictError]:
    """The block is an encoder or decoder-only block: its attention is self-attention."""
    if not (block and cross):
        return []
    return [VariantConflictError(
        "a block here is an encoder's or a decoder-only model's (Vaswani's encoder, GPT-2, Llama): its attention is "
        "self-attention, and an encoder–decoder block's cross-attention sublayer is not traced; drop the context, "
        "or drop the block fields to trace cross-attention alone", field="context_sentence",
        code="block_cross_attention")]


def cross_attention_conflicts(*, causal: bool, window: int | None,
                              positional_encoding: str) -> list[VariantConflictError]:
    """Cross-attention (keys and values from a context) has no causal mask and no RoPE."""
    out = []
    if causal:
        drop = "set causal: false and drop window" if window is not None else "set causal: false"
        out.append(VariantConflictError(
            "cross-attention has no causal mask: its keys are the context's tokens, not earlier tokens of the "
            "sentence, so every query sees the whole context (as in the Transformer decoder's cross-attention); "
            + drop, field="causal", code="cross_attention_causal"))
    if positional_encoding == "rope":
        out.append(VariantConflictError(
            "RoPE encodes the offset between a query and a key of one sequence, but the sentence and the context "
            "are two sequences, each with its own positions; cross-attention adds each one's own encoding instead: "
            "use positional_encoding \"sinusoidal\" or \"none\"", field="positional_encoding",
            code="cross_attention_rope"))
    return out


def check_cross_attention(*, causal: bool, window: int | None, positional_encoding: str) -> None:
    raise_all(cross_attention_conflicts(causal=causal, window=window, positional_encoding=positional_encoding))


def explicit_context_conflicts(*, input_given: bool, context_input_given: bool,
                               cross: bool) -> list[VariantConflictError]:
    """Your own x comes for both sides of cross-attention or for neither."""
    if context_input_given and not cross:
        return [VariantConflictError(
            "context_input is the context's x, used only in cross-attention: give context_sentence or "
            "context_tokens, or drop context_input", field="context_input", code="context_input_without_context")]
    if cross and input_given != context_input_given:
        missing = "context_input" if input_given else "input"
        axes = INPUT_AXES[missing]
        return [VariantConflictError(
            f"in cross-attention give your own x for both the sentence and the context, or for neither: "
            f"add {missing} {axes}", field=missing, code="explicit_input_pair")]
    return []


def check_explicit_context(*, input_given: bool, context_input_given: bool, cross: bool) -> None:
    raise_all(explicit_context_conflicts(input_given=input_given, context_input_given=context_input_given,
                                         cross=cross))


def decode_conflicts(*, causal: bool, cross: bool, bug: str | None, block: bool = False
                     ) -> list[DecodeUnavailableError]:
    """KV-cache decoding re-runs causal self-attention, one token at a time, without a mistake, in one layer."""
    out = []
    if cross:
        out.append(DecodeUnavailableError(
            "KV-cache decoding generates the sentence one token at a time from its own cached keys and values, "
            "but in cross-attention the keys and values come from the context; drop the context to decode",
            code="decode_cross_attention"))
    elif not causal:  # in cross-attention causal is refused already: asking for it too would contradict that
        out.append(DecodeUnavailableError(
            "KV-cache decoding generates one token at a time, so each query sees only the tokens before it: "
            "it needs causal: true", code="decode_needs_causal"))
    if bug is not None:
        out.append(DecodeUnavailableError(
            "decoding re-runs the correct layer step by step; trace without inject_bug to decode",
            code="decode_with_bug"))
    if block:
        out.append(DecodeUnavailableError(
            "KV-cache decoding re-runs one attention layer token by token; a stack of blocks keeps a cache per layer, "
            "which is not traced: drop decode, or the block fields", code="decode_block"))
    return out


def check_decodable(*, causal: bool, cross: bool, bug: str | None, block: bool = False) -> None:
    raise_all(decode_conflicts(causal=causal, cross=cross, bug=bug, block=block))


def check_variants(*, d_model: int, num_heads: int, causal: bool, window: int | None, positional_encoding: str,
                   cross: bool, input_given: bool = False, context_input_given: bool = False,
                   decode: bool = False, bug: str | None = None, block: bool = False,
                   num_layers: int = 1, parameters_given: bool = False) -> None:
    """Every conflict between the variants' settings, all reported at once (the first raised, carrying the
    others), in the order of docs/engine.md's table; the sizes must have been checked (``head_dim``)."""
    raise_all([
        *(rope_conflicts(d_model, num_heads) if positional_encoding == "rope" else []),
        *window_conflicts(window, causal),
        *(cross_attention_conflicts(causal=causal, window=window, positional_encoding=positional_encoding)
          if cross else []),
        *explicit_context_conflicts(input_given=input_given, context_input_given=context_input_given, cross=cross),
        *(decode_conflicts(causal=causal, cross=cross, bug=bug, block=block) if decode else []),
        *layer_conflicts(num_layers, block),
        *block_context_conflicts(block=block, cross=cross),
        *block_parameter_conflicts(block=block, parameters_given=parameters_given),
    ])


def check_seed(seed: int) -> None:
    if not _is_int(seed) or not 0 <= seed <= SEED_MAX:
        raise InvalidSizeError(f"seed must be an integer from 0 to 2^32 - 1, got {_shown(seed)}", field="seed")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        options = " or ".join(f'"{c}"' for c in choices)
        raise InvalidSizeError(f"{name} must be {options}, got {_shown(value)}", field=name)


def check_token_count(count: int, limit: int, *, field: str = "tokens") -> None:
    """A token list may hold at most ``limit`` tokens."""
    if count > limit:
        raise TooManyTokensError(f"{count} tokens is more than the limit of {limit}", field=field)


def check_token_list(tokens: list[str], limit: int, *, field: str = "tokens") -> None:
    """A given token list holds at least one and at most ``limit`` tokens."""
    if not tokens:
        what = field.removesuffix("tokens").replace("_", " ")  # "" or "context "
        raise EmptyInputError(f"the {what}token list is empty: give at least one token", field=field,
                              code="empty_tokens")
    check_token_count(len(tokens), limit, field=field)


def check_token_text(index: int, text: str, *, field: str = "tokens") -> None:
    """A given token must hold something other than whitespace."""
    if not text or text.isspace():
        raise EmptyInputError(f"{field}[{index}] is {'only whitespace' if text else 'empty'}", field=f"{field}/{index}",
                              code="blank_token")


def check_sentence(sentence: str, *, field: str = "sentence") -> None:
    """A sentence must hold at least one token: something other than whitespace."""
    if not sentence or sentence.isspace():
        what = "only whitespace" if sentence else "empty"
        raise EmptyInputError(f"the {field.replace('_', ' ')} is {what}: give at least one word or punctuation mark",
                              field=field, code="empty_sentence")


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
    return _split(sentence, tokens, max_tokens, "sentence", "tokens")


def check_one_context(context_sentence: str | None, context_tokens: list[str] | None) -> None:
    if context_sentence is not None and context_tokens is not None:
        raise EmptyInputError("give at most one of `context_sentence` (a string) or `context_tokens` (a list of "
                              "strings), not both", code="context_sentence_xor_tokens")


def split_context(*, context_sentence: str | None, context_tokens: list[str] | None,
                  max_tokens: int) -> list[Token] | None:
    """The context of cross-attention (its stage ``context_tokens``), under the same token rules; None without one."""
    check_one_context(context_sentence, context_tokens)
    if context_sentence is None and context_tokens is None:
        return None
    return _split(context_sentence, context_tokens, max_tokens, "context_sentence", "context_tokens")


def _split(sentence: str | None, tokens: list[str] | None, max_tokens: int, sentence_field: str,
           tokens_field: str) -> list[Token]:
    if tokens is not None:
        check_token_list(tokens, max_tokens, field=tokens_field)
        for i, t in enumerate(tokens):
            check_token_text(i, t, field=tokens_field)
        return tokens_from_list(tokens)
    assert sentence is not None
    check_sentence(sentence, field=sentence_field)
    out = tokenize(sentence, limit=max_tokens + 1)  # stops counting just past the limit
    if len(out) > max_tokens:
        raise TooManyTokensError(
            f"the {sentence_field.replace('_', ' ')} has more than {max_tokens} tokens (the limit); shorten it",
            field=sentence_field
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
    first = inner[0]
    if first is None or any(s != first for s in inner):
        return None
    return (len(value), *first)


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


def parameter_shapes(d_model: int, num_heads: int,
                     num_kv_heads: int | None = None) -> dict[str, tuple[tuple[int, ...], str]]:
    """The shape, and axis names, of each of the layer's weight matrices (W_K, W_V per K/V head under GQA)."""
    d_k = head_dim(d_model, num_heads)
    g = kv_heads(num_heads, num_kv_heads)
    per_head = ((num_heads, d_k, d_model), "[head, d_k, d_model]")
    per_kv_head = per_head if g == num_heads else ((g, d_k, d_model), "[kv_head, d_k, d_model]")
    return {"W_Q": per_head, "W_K": per_kv_head, "W_V": per_kv_head,
            "W_O": ((d_model, num_heads * d_k), "[d_model, num_heads·d_k]")}


def check_parameter_shapes(parameters: dict[str, Any], d_model: int, num_heads: int,
                           num_kv_heads: int | None = None) -> None:
    for name, (expected, axes) in parameter_shapes(d_model, num_heads, num_kv_heads).items():
        check_shape(f"parameters.{name}", parameters[name], expected, axes)


#: a given x's axes: the sentence's, or (cross-attention) the context's
INPUT_AXES = {"input": "[token, d_model]", "context_input": "[context token, d_model]"}


def check_input_shape(x: Any, n: int, d_model: int, name: str = "input") -> None:
    check_shape(name, x, (n, d_model), INPUT_AXES[name])


def given_input(x: Any, n: int, d_model: int, name: str = "input") -> np.ndarray:
    """A given x (``input`` or ``context_input``): [n, d_model], finite, as a read-only float64 copy."""
    return explicit_array(name, x, (n, d_model), INPUT_AXES[name])


def check_block_cost(values: int, weights: int, limit: int, *, num_layers: int) -> None:
    """A stack generates every layer's weights: its numbers and weights together may cost at most ``limit``
    units (the request-cost budget, one unit a number or weight), checked before anything is generated."""
    if values + weights > limit:
        raise TraceTooLargeError(
            f"this stack of {num_layers} block(s) would compute {values} numbers and generate {weights} weights, "
            f"{values + weights} in all, above the request-cost limit of {limit}; use fewer layers, a smaller "
            "d_model or d_ff, or fewer tokens")


def check_trace_size(count: int, limit: int, *, n: int, d_model: int, num_heads: int,
                     n_context: int | None = None, decode_values: int = 0, generate_values: int = 0) -> None:
    """A trace may hold at most ``limit`` numbers: checked before any array exists. ``count`` includes the
    ``decode_values`` numbers of KV-cache decoding's steps and the ``generate_values`` of generation's, which the
    message then names."""
    if count > limit:
        tokens = f"{n} tokens" if n_context is None else f"{n} tokens, {n_context} context tokens"
        decoding = f"; {decode_values} of them in the decoding steps" if decode_values else ""
        generating = f"; {generate_values} of them in the generated tokens" if generate_values else ""
        raise TraceTooLargeError(
            f"this trace would return {count} numbers ({tokens}, d_model {d_model}, {num_heads} heads{decoding}"
            f"{generating}), above the limit of {limit}; use fewer tokens, a smaller d_model or fewer heads"
            + (", or drop decode" if decode_values else "") + (", or generate fewer tokens" if generate_values else "")
        )
