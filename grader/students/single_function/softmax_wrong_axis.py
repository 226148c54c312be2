"""Multi-head self-attention in numpy, with a bug: the softmax normalises the wrong axis."""

import numpy as np


def softmax(z, axis):
    z = z - np.max(z, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    h, d_k, _ = W_Q.shape
    n = x.shape[0]
    Q = np.einsum("nd,hkd->hnk", x, W_Q)
    K = np.einsum("nd,hkd->hnk", x, W_K)
    V = np.einsum("nd,hkd->hnk", x, W_V)

    scores = Q @ K.transpose(0, 2, 1)  # [head, query, key]
    scaled_scores = scores / np.sqrt(d_k)
    result = {"scores": scores, "scaled_scores": scaled_scores}
    if causal:
        scaled_scores = np.where(np.triu(np.ones((n, n), dtype=bool), k=1), -np.inf, scaled_scores)
        result["masked_scores"] = scaled_scores

    # BUG: axis 1 is the query axis; each query's weights over the keys (axis -1) should sum to 1.
    weights = softmax(scaled_scores, axis=1)
    context = weights @ V
    concat = np.concatenate([context[i] for i in range(h)], axis=-1)
    result.update(weights=weights, context=context, concat=concat, output=concat @ W_O.T)
    return result
