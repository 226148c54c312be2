"""The rest of a Transformer block around the attention: norms, the feed-forward network, residual sums.

    post-norm (Vaswani et al. 2017):  h = LN(x + MHA(x)),      out = LN(h + FFN(h))
    pre-norm (GPT-2, Llama):          h = x + MHA(LN(x)),      out = h + FFN(LN(h)),  a final LN after the stack

    LayerNorm(x) = γ ⊙ (x − μ) / √(σ² + ε) + β,   μ, σ² over the d_model features of each token (σ² biased: ÷ d_model)
    RMSNorm(x)   = γ ⊙ x / √(mean(x²) + ε)
    FFN(x)       = act(x·W_1ᵀ)·W_2ᵀ,               W_1 [d_ff, d_model], W_2 [d_model, d_ff]
    SwiGLU(x)    = (SiLU(x·W_1ᵀ) ⊙ x·W_3ᵀ)·W_2ᵀ     (Meta's Llama names: W_1 the gate, W_3 the up projection)

Shapes: n = tokens, d = d_model, f = d_ff. Small pure functions, float64 only,
vectorised over tokens (no Python loop over tokens or features), as
``engine.attention``: the correct steps only. ``engine.layer`` chooses and
orders them (the one recipe); ``engine.bugs`` holds the wrong ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

#: √(2/π), GELU's tanh approximation constant (Hendrycks & Gimpel 2016; GPT-2's gelu_new)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT_HALF = math.sqrt(0.5)
#: erf from the C library (math.erf), one element at a time: numpy has no erf ufunc
_erf: Callable[[np.ndarray], np.ndarray] = np.frompyfunc(math.erf, 1, 1)


def feature_mean(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """LayerNorm's μ: each token's mean over its d_model features."""
    mean: NDArray[np.float64] = x.mean(axis=-1)  # [n, d] -> [n]
    return mean


def feature_variance(x: NDArray[np.float64], mean: NDArray[np.float64]) -> NDArray[np.float64]:
    """LayerNorm's σ²: the biased variance over the features, mean((x − μ)²), dividing by d_model (not d_model − 1),
    as the paper, torch.nn.LayerNorm and every Transformer do."""
    centred = x - mean[..., None]  # [n, d] - [n, 1] -> [n, d]
    variance: NDArray[np.float64] = (centred * centred).mean(axis=-1)  # [n, d] -> [n]
    return variance


def mean_square(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """RMSNorm's mean(x²) over the features (no mean is subtracted)."""
    mean_sq: NDArray[np.float64] = (x * x).mean(axis=-1)  # [n, d] -> [n]
    return mean_sq


def layer_norm(x: NDArray[np.float64], mean: NDArray[np.float64], variance: NDArray[np.float64], eps: float,
               gamma: NDArray[np.float64], beta: NDArray[np.float64]) -> NDArray[np.float64]:
    """γ ⊙ (x − μ) / √(σ² + ε) + β: ε inside the square root, so a constant row gives β, not a division by 0."""
    normalised = (x - mean[..., None]) / np.sqrt(variance[..., None] + eps)  # [n, d] / [n, 1] -> [n, d]
    return normalised * gamma + beta  # [n, d] * [d] + [d] -> [n, d]


def rms_norm(x: NDArray[np.float64], mean_sq: NDArray[np.float64], eps: float,
             gamma: NDArray[np.float64]) -> NDArray[np.float64]:
    """γ ⊙ x / √(mean(x²) + ε) (Zhang & Sennrich 2019): no centring and no bias."""
    return x / np.sqrt(mean_sq[..., None] + eps) * gamma  # [n, d] / [n, 1] * [d] -> [n, d]


def linear(x: NDArray[np.float64], W: NDArray[np.float64]) -> NDArray[np.float64]:
    """x·Wᵀ, W in torch.nn.Linear's [out, in] layout (no bias)."""
    return x @ W.T  # [n, in] @ [in, out] -> [n, out]


def relu(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """max(0, x) (the 2017 paper's FFN)."""
    return np.maximum(x, 0.0)  # [n, f]


def gelu(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Exact GELU, x·Φ(x) = ½·x·(1 + erf(x/√2)) (torch's ``gelu``, approximate="none")."""
    erf = _erf(x * _SQRT_HALF).astype(np.float64)  # [n, f], element by element through math.erf
    return 0.5 * x * (1.0 + erf)  # [n, f]


def gelu_tanh(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """GELU's tanh approximation, ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): GPT-2's gelu_new, torch's
    approximate="tanh". A different function from the exact GELU (they differ by up to ~5e-4)."""
    inner = _SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x))  # [n, f]
    return 0.5 * x * (1.0 + np.tanh(inner))  # [n, f]


def silu(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """SiLU (Swish-1), x·σ(x) = x / (1 + e^(−x)): SwiGLU's gate activation."""
    with np.errstate(over="ignore"):  # e^(−x) overflows to inf for x < −709: x / inf = −0, the limit
        return x / (1.0 + np.exp(-x))  # [n, f]


def multiply(a: NDArray[np.float64], b: NDArray[np.float64]) -> NDArray[np.float64]:
    """SwiGLU's gating: the activated gate times the up projection, element by element."""
    return a * b  # [n, f]


def add(x: NDArray[np.float64], sublayer: NDArray[np.float64]) -> NDArray[np.float64]:
    """A residual sum: the stream plus what a sublayer computed from it."""
    return x + sublayer  # [n, d]


def same(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """The same array, under another name (where a value goes next: which array feeds the attention,
    which array leaves the layer); no copy."""
    return x


def stack(*xs: NDArray[np.float64]) -> NDArray[np.float64]:
    """The residual stream at each depth: the stack's input, then each layer's output."""
    return np.stack(xs)  # L + 1 × [n, d] -> [L + 1, n, d]
