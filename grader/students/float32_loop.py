"""A correct submission in float32 with plain loops: one head, one row at a time."""

import math

import numpy as np

f32 = np.float32


def add_positional_encoding(embeddings):
    n, d_model = embeddings.shape
    x = embeddings.astype(f32).copy()
    for pos in range(n):
        for i in range(0, d_model, 2):
            angle = pos / (10000.0 ** (i / d_model))
            x[pos, i] += f32(math.sin(angle))
            if i + 1 < d_model:
                x[pos, i + 1] += f32(math.cos(angle))
    return x


def project(x, W):
    x = x.astype(f32)
    return np.stack([x @ W[i].astype(f32).T for i in range(W.shape[0])])


def scores(q, k):
    q, k = q.astype(f32), k.astype(f32)
    return np.stack([q[i] @ k[i].T for i in range(q.shape[0])])


def scale(scores, d_k):
    return scores.astype(f32) / f32(math.sqrt(d_k))


def mask(scores):
    out = scores.astype(f32).copy()
    h, n, _ = out.shape
    for i in range(h):
        for query in range(n):
            out[i, query, query + 1:] = -np.inf
    return out


def softmax(scores):
    s = scores.astype(f32)
    out = np.empty_like(s)
    for i in range(s.shape[0]):
        for row in range(s.shape[1]):
            z = s[i, row] - s[i, row].max()
            e = np.exp(z)
            out[i, row] = e / e.sum()
    return out


def attend(weights, v):
    w, v = weights.astype(f32), v.astype(f32)
    return np.stack([w[i] @ v[i] for i in range(w.shape[0])])


def concat(context):
    return np.concatenate([context[i].astype(f32) for i in range(context.shape[0])], axis=1)


def output(concat, W_O):
    return concat.astype(f32) @ W_O.astype(f32).T


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    q, k, v = project(x, W_Q), project(x, W_K), project(x, W_V)
    s = scale(scores(q, k), W_Q.shape[1])
    if causal:
        s = mask(s)
    return output(concat(attend(softmax(s), v)), W_O)
