"""A correct submission that computes in float32 throughout, with einsum (as a GPU-minded student would)."""

import numpy as np

f32 = np.float32


def add_positional_encoding(embeddings):
    e = embeddings.astype(f32)
    n, d_model = e.shape
    pos = np.arange(n, dtype=f32)[:, None]
    pair = (np.arange(d_model) // 2 * 2).astype(f32)
    angle = pos / np.power(f32(10000.0), pair / f32(d_model))
    pe = np.where(np.arange(d_model) % 2 == 0, np.sin(angle), np.cos(angle)).astype(f32)
    return e + pe


def project(x, W):
    return np.einsum("nd,hkd->hnk", x.astype(f32), W.astype(f32))


def scores(q, k):
    return np.einsum("hqd,hkd->hqk", q.astype(f32), k.astype(f32))


def scale(scores, d_k):
    return scores.astype(f32) / np.sqrt(f32(d_k))


def mask(scores):
    n = scores.shape[-1]
    return np.where(np.triu(np.ones((n, n), dtype=bool), 1), f32(-np.inf), scores.astype(f32))


def softmax(scores):
    s = scores.astype(f32)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attend(weights, v):
    return np.einsum("hqk,hkd->hqd", weights.astype(f32), v.astype(f32))


def concat(context):
    h, n, d_k = context.shape
    return np.einsum("hnd->nhd", context.astype(f32)).reshape(n, h * d_k)


def output(concat, W_O):
    return np.einsum("nc,dc->nd", concat.astype(f32), W_O.astype(f32))


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    q, k, v = project(x, W_Q), project(x, W_K), project(x, W_V)
    s = scale(scores(q, k), W_Q.shape[1])
    if causal:
        s = mask(s)
    return output(concat(attend(softmax(s), v)), W_O)
