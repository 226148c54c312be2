"""Multi-head self-attention in numpy, with a bug: the scaling comes after the softmax."""

import numpy as np


def softmax(z, axis=-1):
    z = z - np.max(z, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    h, d_k, d_model = W_Q.shape
    n = x.shape[0]
    Q = np.stack([x @ W_Q[i].T for i in range(h)])  # [h, n, d_k]
    K = np.stack([x @ W_K[i].T for i in range(h)])
    V = np.stack([x @ W_V[i].T for i in range(h)])

    scores = Q @ np.swapaxes(K, 1, 2)
    scaled_scores = scores  # we scale the attention weights below instead

    masked_scores = scaled_scores
    if causal:
        mask = np.tril(np.ones((n, n))) == 0
        masked_scores = np.where(mask, -np.inf, scaled_scores)

    # BUG: softmax(QK^T) / sqrt(d_k) instead of softmax(QK^T / sqrt(d_k)).
    weights = softmax(masked_scores) / np.sqrt(d_k)
    context = weights @ V

    concat = np.concatenate(list(context), axis=1)
    output = concat @ W_O.T

    out = {"scores": scores, "scaled_scores": scaled_scores, "weights": weights,
           "context": context, "concat": concat, "output": output}
    if causal:
        out["masked_scores"] = masked_scores
    return out
