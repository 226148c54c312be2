"""The language-model head: from a stack's last hidden state to next-token probabilities.

    W_U                [vocab, d_model]  the unembedding: the vocabulary's token embeddings (tied, as GPT-2 ties
                                         them), or seeded per token text
    logits = h·W_Uᵀ    [token, vocab]    h the stack's last hidden state: the final norm's output in pre-norm, the
                                         last layer's output in post-norm (it ends with a norm)
    next_token_probs   [vocab]           softmax(logits[n − 1] / T): the distribution of the token after the sentence

**The vocabulary** is explicit and bounded: embeddings are seeded per token text, so there is no fixed
vocabulary to score. It is the sentence's distinct tokens in the order they first appear, then the request's
``candidates`` that are not among them, in the order given (``vocabulary``), at most ``MAX_VOCABULARY``
texts. Column j of ``logits`` and entry j of ``next_token_probs`` are ``vocabulary[j]``.

**Decoding** (``choose``): greedy takes the most probable token (the first in vocabulary order on a tie);
sampling keeps the ``top_k`` most probable tokens and then the smallest set of the most probable whose
probabilities sum to at least ``top_p`` (the tokens before a token in that order sum to less than top_p:
transformers' TopPLogitsWarper), renormalises, and draws with a uniform number from SHAKE-256 (``sample_key``),
so a seed draws the same tokens on every machine.

Small pure functions, float64 only; the rules of the fields (``lm_conflicts``, the ``check_*``) live here too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import attention as A
from .errors import EmptyInputError, EngineError, InvalidSizeError, VariantConflictError
from .params import _readonly, _scaled, byte_bounded_cache, stream_key, uniform_stream

#: lm_head: the unembedding tied to the token embeddings (GPT-2, and Llama-style tie_word_embeddings), or its own
#: seeded rows
LM_HEADS: tuple[str, ...] = ("tied", "seeded")
#: the most tokens a vocabulary (the sentence's distinct tokens and the candidates) may hold
MAX_VOCABULARY = 1024
#: temperature's bounds: softmax(logits / T) for T in [1e-3, 1e3]
TEMPERATURE_MIN, TEMPERATURE_MAX = 1e-3, 1e3
#: the most tokens one request may generate
MAX_GENERATE = 64
#: how many candidates a generation step lists (the most probable of the kept set)
SHOWN_CANDIDATES = 10


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))


def _int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def check_temperature(value: Any) -> None:
    if not _number(value) or not math.isfinite(value) or not TEMPERATURE_MIN <= value <= TEMPERATURE_MAX:
        raise InvalidSizeError(
            f"temperature must be a finite number from {TEMPERATURE_MIN:g} to {TEMPERATURE_MAX:g} "
            f"(1 leaves the logits as they are; below 1 sharpens, above 1 flattens), got "
            f"{str(value)[:64]}",
            field="temperature",
        )


def check_candidates(candidates: Sequence[str] | None) -> None:
    """Each candidate token a text that is not blank; at most MAX_VOCABULARY of them."""
    if candidates is None:
        return
    if len(candidates) > MAX_VOCABULARY:
        raise InvalidSizeError(
            f"{len(candidates)} candidates is more than the vocabulary's limit of {MAX_VOCABULARY}", field="candidates"
        )
    for i, text in enumerate(candidates):
        if not isinstance(text, str) or not text or text.isspace():
            raise EmptyInputError(
                f"candidates[{i}] is {'only whitespace' if text else 'empty'}",
                field=f"candidates/{i}",
                code="blank_token",
            )


def check_top_k(value: Any) -> None:
    if value is not None and (not _int(value) or not 1 <= value <= MAX_VOCABULARY):
        raise InvalidSizeError(
            f"top_k must be an integer from 1 to {MAX_VOCABULARY} (or null: no top-k filter), got {str(value)[:64]}",
            field="top_k",
        )


def check_top_p(value: Any) -> None:
    if value is not None and (not _number(value) or not math.isfinite(value) or not 0 < value <= 1):
        raise InvalidSizeError(
            f"top_p must be a number greater than 0 and at most 1 (or null: no top-p filter), got {str(value)[:64]}",
            field="top_p",
        )


def check_generate(value: Any) -> None:
    if value is not None and (not _int(value) or not 1 <= value <= MAX_GENERATE):
        raise InvalidSizeError(
            f"generate must be an integer from 1 to {MAX_GENERATE} (how many tokens to generate), "
            f"got {str(value)[:64]}",
            field="generate",
        )


def lm_conflicts(
    *, lm_head: str | None, block: bool, temperature_given: bool = False, candidates_given: bool = False
) -> list[EngineError]:
    """The head reads a stack's last hidden state; temperature and candidates belong to the head."""
    out: list[EngineError] = []
    if lm_head is not None and not block:
        out.append(
            VariantConflictError(
                "lm_head turns a stack's last hidden state into logits, and this trace is one attention layer: give "
                'block ("gpt2", "llama" or "vaswani2017") or another block field',
                field="lm_head",
                code="lm_head_needs_block",
            )
        )
    for name, given in (("temperature", temperature_given), ("candidates", candidates_given)):
        if given and lm_head is None:
            out.append(
                VariantConflictError(
                    f'{name} belongs to the language-model head: add lm_head ("tied" or "seeded") or drop {name}',
                    field=name,
                    code="needs_lm_head",
                )
            )
    return out


def generate_conflicts(
    *, lm_head: str | None, causal: bool, n: int, generate: int, max_tokens: int
) -> list[EngineError]:
    """Generation predicts each token from the ones before it: a head, a causal mask and room for the tokens."""
    out: list[EngineError] = []
    if lm_head is None:
        out.append(
            VariantConflictError(
                'generate needs the language-model head: add lm_head ("tied" or "seeded") and a block',
                field="generate",
                code="generate_needs_lm_head",
            )
        )
    if not causal:
        out.append(
            VariantConflictError(
                "generate needs causal: true: a token is predicted from the tokens before "
                "it, and the KV cache holds only those",
                field="generate",
                code="generate_needs_causal",
            )
        )
    if n + generate > max_tokens:
        out.append(
            VariantConflictError(
                f"{n} tokens and {generate} generated would be {n + generate}, above the "
                f"limit of {max_tokens} tokens; generate fewer",
                field="generate",
                code="generate_too_long",
            )
        )
    return out


def vocabulary(texts: Sequence[str], candidates: Sequence[str] | None = None) -> list[str]:
    """The sentence's distinct tokens in the order they first appear, then the candidates not among them, in
    the order given: the columns of the logits."""
    return list(dict.fromkeys([*texts, *(candidates or ())]))


def check_vocabulary_size(size: int, field: str = "candidates") -> None:
    if size > MAX_VOCABULARY:
        raise InvalidSizeError(
            f"the vocabulary (the sentence's distinct tokens and the candidates) would hold "
            f"{size} tokens, above the limit of {MAX_VOCABULARY}; give fewer candidates",
            field=field,
            code="vocabulary_too_large",
        )


@byte_bounded_cache(8 * 1024 * 1024, lambda a: a.nbytes)
def _seeded_row(seed: int, d_model: int, text: str) -> np.ndarray:
    return _readonly(_scaled(stream_key("lm_head", seed=seed, d_model=d_model, text=text), d_model, 1.0 / d_model))


def seeded_unembedding(seed: int, d_model: int, vocab: list[str]) -> np.ndarray:
    """An untied head: row j drawn from ``attention-trace:v1:lm_head:seed=<seed>:d_model=<d_model>:text=<text>``,
    variance 1/d_model (one over its inputs, as W_O's), so a token's row does not depend on the vocabulary."""
    out = np.empty((len(vocab), d_model))  # [vocab, d_model]
    for j, text in enumerate(vocab):
        out[j] = _seeded_row(seed, d_model, text)
    return out


def logits(h: np.ndarray, W_U: np.ndarray) -> np.ndarray:
    """h·W_Uᵀ: each position's score for every vocabulary token."""
    out: np.ndarray = h @ W_U.T  # [n, d_model] @ [d_model, vocab] -> [n, vocab]
    return out


def next_token_probs(logits_: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits[n − 1] / T) over the vocabulary: the last position predicts the token after the sentence
    (stable: the largest scaled logit is subtracted first)."""
    probs: np.ndarray = A.softmax(logits_[-1] / temperature)  # [n, vocab] -> [vocab]
    return probs


# ------------------------------------------------------------------ choosing the next token


def kept(probs: np.ndarray, top_k: int | None, top_p: float | None) -> np.ndarray:
    """The token indices sampling may draw, most probable first (ties in vocabulary order): the top_k most
    probable, then the fewest of those whose probabilities reach top_p."""
    order = np.argsort(-probs, kind="stable")  # [vocab]: most probable first
    if top_k is not None:
        order = order[:top_k]
    if top_p is not None:
        before = np.cumsum(probs[order]) - probs[order]  # what the tokens before each one sum to
        order = order[before < top_p]
    return order


def sample_key(sample_seed: int, step: int) -> str:
    """The SHAKE-256 stream of step ``step``'s uniform draw."""
    return stream_key("sample", seed=sample_seed, step=step)


def choose(
    probs: np.ndarray,
    *,
    top_k: int | None = None,
    top_p: float | None = None,
    sample_seed: int | None = None,
    step: int = 0,
) -> tuple[int, np.ndarray, np.ndarray]:
    """(the chosen index, the kept indices most probable first, their renormalised probabilities).

    Greedy without ``sample_seed``: the most probable token (the first kept). Sampled: u in (0, 1) from
    SHAKE-256, the first kept token whose cumulative renormalised probability exceeds u."""
    keep = kept(probs, top_k, top_p)
    renormalised = probs[keep] / probs[keep].sum()  # [kept]
    if sample_seed is None:
        return int(keep[0]), keep, renormalised
    u = (float(uniform_stream(sample_key(sample_seed, step), 1)[0]) + 1.0) / 2.0  # (−1, 1) -> (0, 1)
    at = int(np.searchsorted(np.cumsum(renormalised), u, side="right"))
    return int(keep[min(at, len(keep) - 1)]), keep, renormalised


def generate_input_conflicts(*, input_given: bool, bug: str | None) -> list[EngineError]:
    """Generation embeds each new token and runs the correct stack."""
    out: list[EngineError] = []
    if input_given:
        out.append(
            VariantConflictError(
                "generate embeds each new token, so it needs the generated embeddings: drop input",
                field="generate",
                code="generate_needs_embeddings",
            )
        )
    if bug is not None:
        out.append(
            VariantConflictError(
                "generate runs the correct stack: drop inject_bug", field="generate", code="generate_with_bug"
            )
        )
    return out
