"""Invalid configurations and inputs: the right EngineError subclass, a message that says
what to fix, and the request field to blame (the service turns these into 422s)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import engine
from engine import (
    EmptyInputError,
    EngineError,
    HeadDivisionError,
    InvalidSizeError,
    ShapeError,
    TooManyTokensError,
    TraceConfig,
    explicit_parameters,
    generate_parameters,
)


def test_every_error_is_an_engine_error_and_a_value_error():
    for cls in (EmptyInputError, HeadDivisionError, InvalidSizeError, ShapeError, TooManyTokensError,
                engine.UnknownBugError, engine.BugNotApplicableError, engine.NonFiniteInputError,
                engine.NumericOverflowError, engine.StageUnavailableError, engine.TraceTooLargeError):
        assert issubclass(cls, EngineError)
        assert cls.code != EngineError.code, f"{cls.__name__} needs its own code"
    assert issubclass(EngineError, ValueError)


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------

def test_head_count_that_does_not_divide_d_model():
    with pytest.raises(HeadDivisionError) as exc:
        TraceConfig(d_model=24, num_heads=5)
    assert "d_model 24 is not divisible by num_heads 5 (d_k would be 4.8)" in exc.value.message
    # ...and it suggests valid head counts.
    assert exc.value.message.endswith("divisors of d_model: 1, 2, 3, 4, 6, 8, 12, 24")
    assert exc.value.field == "num_heads"


def test_more_heads_than_dimensions():
    with pytest.raises(HeadDivisionError, match=r"d_model 6 is not divisible by num_heads 7 \(d_k would be 0.857143\)"):
        TraceConfig(d_model=6, num_heads=7)


@pytest.mark.parametrize(
    "kwargs, field, message",
    [
        (dict(d_model=0), "d_model", "d_model must be a positive integer, got 0"),
        (dict(d_model=-24), "d_model", "d_model must be a positive integer, got -24"),
        (dict(num_heads=0), "num_heads", "num_heads must be a positive integer, got 0"),
        (dict(num_heads=-1), "num_heads", "num_heads must be a positive integer, got -1"),
        (dict(d_model=24.0), "d_model", "d_model must be a positive integer, got 24.0"),
        (dict(d_model=True), "d_model", "d_model must be a positive integer, got True"),  # bool is not a size
        (dict(seed=-1), "seed", "seed must be an integer from 0 to 2^32 - 1, got -1"),
        (dict(seed=2**32), "seed", "seed must be an integer from 0 to 2^32 - 1, got 4294967296"),
        (dict(positional_encoding="learned"), "positional_encoding", "positional_encoding must be"),
        (dict(max_tokens=0), "max_tokens", "max_tokens must be at least 1, got 0"),
    ],
)
def test_invalid_sizes(kwargs, field, message):
    with pytest.raises(InvalidSizeError) as exc:
        TraceConfig(**kwargs)
    assert message in exc.value.message
    assert exc.value.field == field


def test_largest_seed_is_accepted():
    assert TraceConfig(seed=2**32 - 1).seed == 2**32 - 1


# ---------------------------------------------------------------------------
# Tokens
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("sentence, what", [("", "empty"), ("   ", "only whitespace"),
                                            ("\t\n\u3000", "only whitespace")])
def test_sentence_without_tokens(sentence, what):
    with pytest.raises(EmptyInputError, match=f"the sentence is {what}: give at least one word") as exc:
        engine.trace(TraceConfig(), sentence=sentence)
    assert exc.value.field == "sentence" and exc.value.code == "empty_sentence"


def test_empty_token_list():
    with pytest.raises(EmptyInputError, match="the token list is empty") as exc:
        engine.trace(TraceConfig(), tokens=[])
    assert exc.value.field == "tokens"


@pytest.mark.parametrize("bad, what", [("", "empty"), ("  ", "only whitespace")])
def test_token_list_with_an_empty_or_blank_string(bad, what):
    with pytest.raises(EmptyInputError, match=rf"tokens\[1\] is {what}") as exc:
        engine.trace(TraceConfig(), tokens=["the", bad, "cat"])
    assert exc.value.field == "tokens/1"


@pytest.mark.parametrize("kwargs", [{}, {"sentence": "a", "tokens": ["a"]}])
def test_exactly_one_of_sentence_or_tokens(kwargs):
    with pytest.raises(EmptyInputError, match="give exactly one of `sentence` .* or `tokens`") as exc:
        engine.trace(TraceConfig(), **kwargs)
    assert exc.value.pointer == "" and exc.value.code == "sentence_xor_tokens"


def test_sentence_over_the_token_limit():
    config = TraceConfig(max_tokens=3)
    assert engine.trace(config, sentence="the cat sat").n_tokens == 3  # exactly at the limit is fine
    with pytest.raises(TooManyTokensError, match="more than 3 tokens") as exc:
        engine.trace(config, sentence="the cat sat .")
    assert exc.value.field == "sentence"


def test_token_list_over_the_token_limit():
    with pytest.raises(TooManyTokensError, match="4 tokens is more than the limit of 3") as exc:
        engine.trace(TraceConfig(max_tokens=3), tokens=["a", "b", "c", "d"])
    assert exc.value.field == "tokens"


def test_default_token_limit_is_256():
    engine.trace(TraceConfig(d_model=2), sentence="a " * 256)
    with pytest.raises(TooManyTokensError):
        engine.trace(TraceConfig(d_model=2), sentence="a " * 257)


# ---------------------------------------------------------------------------
# Explicit arrays
# ---------------------------------------------------------------------------

def weights_for(d_model: int, num_heads: int) -> dict[str, np.ndarray]:
    p = generate_parameters(0, d_model, num_heads)
    return {"W_Q": p.W_Q, "W_K": p.W_K, "W_V": p.W_V, "W_O": p.W_O}


@pytest.mark.parametrize("shape", [(2, 24), (3, 12), (3,), (1, 3, 24)])
def test_explicit_input_with_wrong_shape(shape):
    with pytest.raises(ShapeError, match=r"input has shape .* but must be \[3, 24\] \[token, d_model\]") as exc:
        engine.trace(TraceConfig(), sentence="the cat sat", input=np.zeros(shape))
    assert exc.value.field == "input"


@pytest.mark.parametrize(
    "name, shape, expected",
    [("W_Q", (4, 6, 12), "[4, 6, 24]"), ("W_K", (6, 24), "[4, 6, 24]"), ("W_V", (1, 24, 24), "[4, 6, 24]"),
     ("W_O", (24, 6), "[24, 24]")],
)
def test_explicit_parameters_with_wrong_shape(name, shape, expected):
    W = weights_for(24, 4)
    W[name] = np.zeros(shape)
    with pytest.raises(ShapeError) as exc:
        explicit_parameters(**W, d_model=24, num_heads=4)
    axes = "[d_model, num_heads·d_k]" if name == "W_O" else "[head, d_k, d_model]"
    assert exc.value.message == f"parameters.{name} has shape {list(shape)} but must be {expected} {axes}"
    assert exc.value.field == f"parameters/{name}"


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_explicit_parameters_with_non_finite_values(bad):
    W = weights_for(24, 1)
    W["W_V"] = W["W_V"].copy()
    W["W_V"][0, 3, 5] = bad
    with pytest.raises(engine.NonFiniteInputError, match="parameters.W_V contains a non-finite value"):
        explicit_parameters(**W, d_model=24, num_heads=1)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_explicit_input_with_non_finite_values_is_rejected(bad):
    # The engine promises no NaN/inf in a trace (found while writing this suite: NaN got through).
    x = np.zeros((3, 24))
    x[1, 2] = bad
    with pytest.raises(engine.NonFiniteInputError, match="input contains a non-finite value") as exc:
        engine.trace(TraceConfig(), sentence="the cat sat", input=x)
    assert exc.value.field == "input"


@pytest.mark.parametrize(
    "d_model, num_heads",
    [(24, 4), (12, 1)],  # another head count (would silently run 4 heads scaled by √24), another d_model
)
def test_parameters_that_do_not_fit_the_config_are_rejected(d_model, num_heads):
    params = explicit_parameters(**weights_for(d_model, num_heads), d_model=d_model, num_heads=num_heads)
    with pytest.raises(ShapeError, match=r"parameters.W_Q has shape \[.*\] but must be \[1, 24, 24\]") as exc:
        engine.trace(TraceConfig(d_model=24, num_heads=1), sentence="the cat sat", parameters=params)
    assert exc.value.field == "parameters/W_Q"


# --- Overflow of huge but finite explicit values ----------------------------------------

def test_finite_but_huge_explicit_input_is_rejected_cleanly():
    # 1e160 is finite, but q·k overflows float64. The engine must reject it with an error
    # and without numpy RuntimeWarnings on the way (found while writing this suite: first it
    # returned NaN, then it raised only after numpy had warned).
    x = np.full((3, 24), 1e160)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(engine.NumericOverflowError, match="overflow float64") as exc:
            engine.trace(TraceConfig(), sentence="the cat sat", input=x)
    assert exc.value.field == "input"


def test_no_stage_keeps_an_infinity_when_the_weights_stay_finite():
    # Engine bug, FAILS at 631ca77: the overflow check looks only at weights and output.
    # Here q0·k1 and q1·k0 overflow to -inf while each row's maximum (0) is finite, so the
    # weights ([[1, 0], [0, 1]]) and output are finite but scores and scaled_scores store
    # -inf, although docs/engine.md says no NaN or ±inf is ever stored in a trace.
    # (Not reachable through the service, which bounds explicit values to |v| ≤ 1e6.)
    eye, swap = np.eye(2), np.array([[0.0, 1.0], [1.0, 0.0]])
    params = explicit_parameters(eye[None], swap[None], eye[None], eye, d_model=2, num_heads=1)
    x = np.array([[1e200, 0.0], [0.0, -1e200]])
    try:
        tr = engine.trace(TraceConfig(d_model=2, num_heads=1, scale=False), tokens=["a", "b"], input=x,
                          parameters=params)
    except engine.NumericOverflowError:
        return  # rejecting the request is one correct answer
    for stage_id, stage in tr.stages.items():
        if stage_id != "tokens":
            assert np.isfinite(stage.values).all(), f"{stage_id} stores a non-finite value"


@pytest.mark.parametrize("num_heads, error", [(0, InvalidSizeError), (5, HeadDivisionError)])
def test_explicit_parameters_validate_sizes_like_trace_config(num_heads, error):
    # explicit_parameters is public API and checks sizes like TraceConfig (found while writing
    # this suite: num_heads 0 raised a bare ZeroDivisionError, num_heads 5 floored d_k to 4).
    d_k = 24 // max(num_heads, 1)
    W = {n: np.zeros((num_heads, d_k, 24)) for n in ("W_Q", "W_K", "W_V")}
    W["W_O"] = np.zeros((24, num_heads * d_k))
    with pytest.raises(error) as exc:
        explicit_parameters(**W, d_model=24, num_heads=num_heads)
    assert exc.value.field == "num_heads"
