"""Multi-head self-attention in numpy, with a bug: the scores are divided by d_k, not sqrt(d_k)."""

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

    scores = np.einsum("hqk,hsk->hqs", Q, K)
    scale = np.sqrt(d_k)
    # BUG: divides by sqrt(d_k) twice, i.e. by d_k.
    scaled_scores = scores / scale / scale

    result = {"scores": scores, "scaled_scores": scaled_scores}
    if causal:
        scaled_scores = np.where(np.triu(np.ones((n, n), dtype=bool), 1), -np.inf, scaled_scores)
        result["masked_scores"] = scaled_scores
    weights = softmax(scaled_scores)
    context = weights @ V
    concat = context.transpose(1, 0, 2).reshape(n, h * d_k)
    result.update(weights=weights, context=context, concat=concat, output=concat @ W_O.T)
    return result
