"""Stages 3–12: one multi-head self-attention layer, a small pure function per step.

    MultiHead(X) = Concat(head₁, …, head_h) · W_Oᵀ
    headᵢ        = softmax(Qᵢ Kᵢᵀ / √d_k) Vᵢ,   Qᵢ = X W_Qᵢᵀ, Kᵢ = X W_Kᵢᵀ, Vᵢ = X W_Vᵢᵀ

Shapes use n = tokens (the queries), m = keys (m = n in self-attention; the
context's tokens in cross-attention), h = num_heads, g = K/V heads (g = h
unless grouped-query attention shares them), d_k = d_model / h. Every function
is vectorised over heads and tokens (no Python loop over either), float64
only, and never produces NaN or ±inf: masked entries are carried as a boolean
mask.

These are the correct steps only. ``engine.layer`` chooses among them by
configuration and runs them in order; ``engine.bugs`` holds the wrong ones.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

POSITIONAL_BASE = 10000.0


def sinusoidal_positional_encoding(n: int, d_model: int) -> np.ndarray:
    """Stage 3: PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(same angle).

    Dimension j uses the frequency of its pair 2·⌊j/2⌋, so an odd d_model just
    ends on a sin column with no partner.
    """
    pos = np.arange(n, dtype=np.float64)[:, None]  # [n, 1]
    pair = (np.arange(d_model) // 2 * 2).astype(np.float64)  # [d_model]: 0,0,2,2,4,…
    angle = pos / np.power(POSITIONAL_BASE, pair / d_model)  # [n, 1] / [d_model] -> [n, d_model]
    even = (np.arange(d_model) % 2 == 0)  # [d_model]
    return np.where(even, np.sin(angle), np.cos(angle))  # [n, d_model]


def no_positional_encoding(n: int, d_model: int) -> np.ndarray:
    """Stage 3 with positional_encoding = "none": zeros, so input = embedding."""
    return np.zeros((n, d_model))  # [n, d_model]


def embedding_as_input(token_embedding: np.ndarray) -> np.ndarray:
    """Stage 4 with RoPE: x = E, no additive encoding (position enters by rotating q and k)."""
    return token_embedding.copy()  # [n, d_model]


def add_positional_encoding(token_embedding: NDArray[np.float64],
                            positional_encoding: NDArray[np.float64]) -> NDArray[np.float64]:
    """Stage 4: x = token_embedding + positional_encoding."""
    return token_embedding + positional_encoding  # [n, d_model]


def project(x: NDArray[np.float64], W: NDArray[np.float64]) -> NDArray[np.float64]:
    """Stage 5: per head i, x · Wᵢᵀ, for all heads in one matrix product.

    Stacking the heads' [d_k, d_model] matrices gives one [h·d_k, d_model]
    matrix; one GEMM then splits back into heads (nanoGPT's reshape/transpose).
    """
    h, d_k, d_model = W.shape
    y = x @ W.reshape(h * d_k, d_model).T  # [n, d_model] @ [d_model, h·d_k] -> [n, h·d_k]
    return y.reshape(x.shape[0], h, d_k).transpose(1, 0, 2)  # [n, h·d_k] -> [h, n, d_k]


def rope_angles(positions: np.ndarray, d_k: int, base: float) -> np.ndarray:
    """RoPE's rotation angles: θ[p, i] = p · (1 / base^(2i/d_k)) for position p and pair i < d_k/2.

    RoFormer's θᵢ = base^(−2(i−1)/d) with i from 1; computed as the Llama and
    GPT-NeoX code does (``inv_freq = 1 / base ** (arange(0, d_k, 2) / d_k)``,
    then an outer product with the positions), in float64.
    """
    inv_freq = 1.0 / np.power(float(base), np.arange(0, d_k, 2, dtype=np.float64) / d_k)  # [d_k/2]
    return np.asarray(positions, dtype=np.float64)[:, None] * inv_freq  # [n, 1] * [d_k/2] -> [n, d_k/2]


def rotate_half(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """RoPE, GPT-NeoX/Llama pairing: coordinate j turns with coordinate j + d_k/2 by angle θ[pos, j].

    (x₁, x₂) -> (x₁·cos θ − x₂·sin θ, x₂·cos θ + x₁·sin θ), Hugging Face's
    ``q·cos + rotate_half(q)·sin`` term by term.
    """
    half = x.shape[-1] // 2
    cos, sin = np.cos(angles), np.sin(angles)  # [n, d_k/2] each
    x1, x2 = x[..., :half], x[..., half:]  # [h, n, d_k] -> 2 × [h, n, d_k/2]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)  # 2 × [h, n, d_k/2] -> [h, n, d_k]


def rotate_interleaved(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """RoPE, RoFormer pairing: coordinates 2i and 2i + 1 turn together by angle θ[pos, i]."""
    cos, sin = np.cos(angles), np.sin(angles)  # [n, d_k/2] each
    x1, x2 = x[..., 0::2], x[..., 1::2]  # [h, n, d_k] -> 2 × [h, n, d_k/2]
    pairs = np.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)  # -> [h, n, d_k/2, 2]
    return pairs.reshape(x.shape)  # [h, n, d_k/2, 2] -> [h, n, d_k]


def share_kv_heads(kv: np.ndarray, group: int) -> np.ndarray:
    """Grouped-query attention: K/V head j serves query heads j·group … j·group + group − 1.

    Query head i reads K/V head ⌊i / group⌋, as torch's ``repeat_interleave``
    and ``scaled_dot_product_attention(..., enable_gqa=True)`` do.
    """
    return np.repeat(kv, group, axis=0)  # [g, m, d_k] -> [g·group, m, d_k] = [h, m, d_k]


def attention_scores(q: NDArray[np.float64], k: NDArray[np.float64]) -> NDArray[np.float64]:
    """Stage 6: raw scores = q · kᵀ for every query and key, per head."""
    return q @ k.transpose(0, 2, 1)  # [h, n, d_k] @ [h, d_k, m] -> [h, n, m]


def scale_factor(d_k: int, scale: bool) -> float:
    """√d_k when scaling is on, 1 when it is off."""
    return math.sqrt(d_k) if scale else 1.0  # correctly rounded, as np.sqrt: the same float, without numpy's call


def scale_scores(scores: np.ndarray, factor: float) -> np.ndarray:
    """Stage 7: scaled_scores = scores / factor."""
    return scores / factor  # [h, n, m]


def causal_mask(n: int) -> np.ndarray:
    """True where a key comes after its query (j > i): those keys are excluded."""
    return np.triu(np.ones((n, n), dtype=bool), k=1)  # [n, n]


def sliding_window_mask(n: int, window: int) -> np.ndarray:
    """True where a key comes after its query, or window or more positions before it (i − j ≥ window).

    Each query sees at most ``window`` keys, its own included: j in [i − window + 1, i]
    (Mistral's and Longformer's local attention; window ≥ n is the causal mask).
    """
    offset = np.arange(n)[:, None] - np.arange(n)[None, :]  # [n, 1] - [1, n] -> [n, n]: query − key
    return (offset < 0) | (offset >= window)  # [n, n]


def no_mask(n: int) -> None:
    """Encoder-style attention: every query sees every key."""
    return None


def apply_mask(scores: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Stage 8: the masked scores, and which entries are excluded ([h, n, n] booleans, or None).

    Excluded entries hold 0.0 in the values, but they are carried by the mask:
    JSON shows them as null and the softmax drops them; no fill value takes part.
    """
    if mask is None:
        return scores, None
    excluded = np.broadcast_to(mask, scores.shape)  # [n, n] -> [h, n, n]
    return np.where(excluded, 0.0, scores), excluded  # [h, n, n]  (masks are self-attention only: m = n)


def softmax_parts(scores: NDArray[np.float64], mask: NDArray[np.bool_] | None = None
                  ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """The softmax's inner numbers over the last axis (keys): each row's max, the exponentials
    exp(score − max), and each row's sum of them. ``softmax`` divides the two; ``engine.explain``
    shows them for one cell (the very same arrays, so the very same bits).

    Subtracting each row's max makes the largest exponent exp(0) = 1, so scores
    of ±1e6 cannot overflow. Masked keys drop out of the max and get an
    exponential of exactly 0 (exp(−inf)), never a finite fill value. A row whose
    every key is masked (only a wrong mask does that) keeps a max of 0, not −inf.
    """
    if mask is None:
        peak = scores.max(axis=-1, keepdims=True)  # [h, n, m] -> [h, n, 1]
        e = np.exp(scores - peak)  # [h, n, m], max entry exp(0) = 1
        return peak, e, e.sum(axis=-1, keepdims=True)  # ..., [h, n, 1]
    scores = np.where(mask, -np.inf, scores)  # masked keys drop out of the max
    peak = scores.max(axis=-1, keepdims=True)  # [h, n, m] -> [h, n, 1]
    peak = np.where(peak == -np.inf, 0.0, peak)  # an all-masked row: exp(-inf - 0) = 0, not NaN
    e = np.exp(scores - peak)  # [h, n, m]; exp(-inf) = 0 exactly for masked keys
    return peak, e, e.sum(axis=-1, keepdims=True)  # ..., [h, n, 1]


def softmax(scores: NDArray[np.float64], mask: NDArray[np.bool_] | None = None) -> NDArray[np.float64]:
    """Stage 9: a numerically stable softmax over the last axis (keys), from ``softmax_parts``.

    Masked keys get a weight of exactly 0; a row whose every key is masked
    attends to nothing: all its weights are 0, never NaN.
    """
    _, e, total = softmax_parts(scores, mask)
    if mask is None:
        return e / total  # [h, n, m], rows sum to 1
    return e / np.where(total > 0, total, 1.0)  # [h, n, m], rows sum to 1 (0 for an all-masked row)


def weighted_values(weights: NDArray[np.float64], v: NDArray[np.float64]) -> NDArray[np.float64]:
    """Stage 10: context = weights · v, a convex blend of value rows per query."""
    return weights @ v  # [h, n, m] @ [h, m, d_k] -> [h, n, d_k]


def concat_heads(context: np.ndarray) -> np.ndarray:
    """Stage 11: lay the heads side by side per token (concat, not average)."""
    h, n, d_k = context.shape
    return context.transpose(1, 0, 2).reshape(n, h * d_k)  # [h, n, d_k] -> [n, h·d_k]


def output_projection(concat: NDArray[np.float64], W_O: NDArray[np.float64]) -> NDArray[np.float64]:
    """Stage 12: output = concat · W_Oᵀ, mixing the heads back into d_model."""
    return concat @ W_O.T  # [n, h·d_k] @ [h·d_k, d_model] -> [n, d_model]


def append_to_cache(cache: np.ndarray, new: np.ndarray) -> np.ndarray:
    """KV-cache decoding: the cache after this step holds every earlier position's row and the new one."""
    return np.concatenate([cache, new], axis=-2)  # [g, c, d_k] + [g, 1, d_k] -> [g, c + 1, d_k]


def append_to_window_cache(cache: np.ndarray, new: np.ndarray, window: int) -> np.ndarray:
    """Sliding-window decoding (Mistral's rolling buffer): only the last ``window`` positions stay."""
    grown = np.concatenate([cache, new], axis=-2)  # [g, c, d_k] + [g, 1, d_k] -> [g, c + 1, d_k]
    return grown[..., -window:, :]  # [g, c + 1, d_k] -> [g, min(c + 1, window), d_k]


def entropy(weights: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each row's entropy in nats, −Σ w·ln w with 0·ln 0 = 0."""
    safe = np.where(weights > 0, weights, 1.0)  # ln 1 = 0 where w = 0, no warnings
    # [h, n, m] -> [h, n]; 0 - x avoids -0.0
    entropies: NDArray[np.float64] = 0.0 - (weights * np.log(safe)).sum(axis=-1)
    return entropies


def max_weight(weights: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each row's largest weight: near 1 means softmax has saturated."""
    peak: NDArray[np.float64] = weights.max(axis=-1)  # [h, n, m] -> [h, n]
    return peak
