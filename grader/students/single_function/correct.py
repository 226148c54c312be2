"""Multi-head self-attention in numpy: a correct submission."""

import numpy as np


def softmax(z, axis=-1):
    """Numerically stable softmax along `axis`; -inf entries get weight 0."""
    z = z - np.max(z, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    h, d_k, d_model = W_Q.shape
    n = x.shape[0]

    # Project: one set of matrices per head. Q[i] = x @ W_Q[i].T -> [h, n, d_k]
    Q = np.einsum("nd,hkd->hnk", x, W_Q)
    K = np.einsum("nd,hkd->hnk", x, W_K)
    V = np.einsum("nd,hkd->hnk", x, W_V)

    # Score every query against every key, then scale by sqrt(d_k).
    scores = Q @ K.transpose(0, 2, 1)  # [h, n, n]
    scaled_scores = scores / np.sqrt(d_k)

    result = {"scores": scores, "scaled_scores": scaled_scores}
    if causal:
        future = np.triu(np.ones((n, n), dtype=bool), k=1)  # key after query
        scaled_scores = np.where(future, -np.inf, scaled_scores)
        result["masked_scores"] = scaled_scores

    weights = softmax(scaled_scores, axis=-1)  # each query's row sums to 1
    context = weights @ V  # [h, n, d_k]

    # Put the heads side by side: [n, h * d_k].
    concat = np.concatenate([context[i] for i in range(h)], axis=-1)
    output = concat @ W_O.T  # [n, d_model]

    result.update(weights=weights, context=context, concat=concat, output=output)
    return result
