"""A correct submission that never builds the concat for the output: each head's context times
its own block of W_O, summed (the same numbers: concat · W_Oᵀ = Σᵢ headᵢ · W_O[:, block i]ᵀ)."""

import numpy as np


def add_positional_encoding(embeddings):
    n, d_model = embeddings.shape
    pe = np.zeros((n, d_model))
    for pos in range(n):
        for j in range(d_model):
            angle = pos / 10000 ** ((j - j % 2) / d_model)
            pe[pos, j] = np.sin(angle) if j % 2 == 0 else np.cos(angle)
    return embeddings + pe


def project(x, W):
    return np.stack([x @ Wi.T for Wi in W])


def scores(q, k):
    return np.matmul(q, np.swapaxes(k, -1, -2))


def scale(scores, d_k):
    return scores / d_k ** 0.5


def mask(scores):
    n = scores.shape[-1]
    out = scores.copy()
    out[:, np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] = -np.inf
    return out


def softmax(scores):
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attend(weights, v):
    return np.matmul(weights, v)


def concat(context):
    return np.hstack(list(context))


def output(concat, W_O):
    """Σ over the concat's columns c of concat[:, c] ⊗ W_O[:, c]: the same sum as concat · W_Oᵀ."""
    return sum(np.outer(concat[:, c], W_O[:, c]) for c in range(concat.shape[1]))


def output_from_heads(context, W_O):
    """What multi_head_attention uses: Σᵢ context[i] · W_O[:, i·d_k:(i+1)·d_k]ᵀ."""
    h, n, d_k = context.shape
    return sum(context[i] @ W_O[:, i * d_k:(i + 1) * d_k].T for i in range(h))


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    q, k, v = project(x, W_Q), project(x, W_K), project(x, W_V)
    s = scale(scores(q, k), W_Q.shape[1])
    if causal:
        s = mask(s)
    return output_from_heads(attend(softmax(s), v), W_O)
