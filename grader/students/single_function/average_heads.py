"""Multi-head self-attention in numpy, with a bug: the heads are averaged, not concatenated."""

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
    scaled_scores = scores / np.sqrt(d_k)
    result = {"scores": scores, "scaled_scores": scaled_scores}
    if causal:
        scaled_scores = np.where(np.triu(np.ones((n, n), dtype=bool), k=1), -np.inf, scaled_scores)
        result["masked_scores"] = scaled_scores
    weights = softmax(scaled_scores)
    context = weights @ V  # [h, n, d_k]

    # BUG: "combine the heads" by averaging them: [n, d_k] instead of [n, h * d_k].
    concat = context.mean(axis=0)
    # W_O expects h * d_k inputs, so the average is repeated once per head to fit.
    output = np.tile(concat, (1, h)) @ W_O.T

    result.update(weights=weights, context=context, concat=concat, output=output)
    return result
