"""Multi-head self-attention in numpy, with a bug: the scores are never scaled."""

import numpy as np


def softmax(z, axis=-1):
    z = z - np.max(z, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    h, d_k, _ = W_Q.shape
    n = x.shape[0]
    Q = np.einsum("nd,hkd->hnk", x, W_Q)
    K = np.einsum("nd,hkd->hnk", x, W_K)
    V = np.einsum("nd,hkd->hnk", x, W_V)

    scores = Q @ K.transpose(0, 2, 1)
    # BUG: forgot to divide by sqrt(d_k); the softmax saturates as d_k grows.
    scaled_scores = scores.copy()

    result = {"scores": scores, "scaled_scores": scaled_scores}
    logits = scaled_scores
    if causal:
        logits = np.where(np.tri(n, dtype=bool), scaled_scores, -np.inf)
        result["masked_scores"] = logits
    weights = softmax(logits)
    context = weights @ V
    concat = np.concatenate([context[i] for i in range(h)], axis=-1)
    result.update(weights=weights, context=context, concat=concat, output=concat @ W_O.T)
    return result
