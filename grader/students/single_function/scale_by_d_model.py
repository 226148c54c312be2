"""Multi-head self-attention in numpy, with a bug: scaled by the model width, not the head width."""

import numpy as np


def softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def attention_head(x, Wq, Wk, Wv, causal):
    q, k, v = x @ Wq.T, x @ Wk.T, x @ Wv.T  # [n, d_k] each
    d_model = x.shape[1]
    s = q @ k.T
    # BUG: divides by sqrt(d_model); each head's dot products have only d_k terms.
    s_scaled = s / np.sqrt(d_model)
    s_masked = s_scaled.copy()
    if causal:
        s_masked[np.triu_indices(len(x), k=1)] = -np.inf
    w = softmax(s_masked)
    return s, s_scaled, s_masked, w, w @ v


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    parts = [attention_head(x, W_Q[i], W_K[i], W_V[i], causal) for i in range(W_Q.shape[0])]
    scores, scaled, masked, weights, context = (np.array(p) for p in zip(*parts))
    concat = np.hstack(list(context))
    out = {"scores": scores, "scaled_scores": scaled, "weights": weights, "context": context,
           "concat": concat, "output": concat @ W_O.T}
    if causal:
        out["masked_scores"] = masked
    return out
