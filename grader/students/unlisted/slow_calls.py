"""A correct submission whose every call takes three seconds: each call is well within the time limit per call,
but together they exceed a short total budget. What stops it must say that the total ran out."""

import time

import numpy as np


def _slow():
    time.sleep(3.0)


def add_positional_encoding(embeddings):
    _slow()
    """x = embeddings + PE, with PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(same)."""
    n, d_model = embeddings.shape
    pos = np.arange(n)[:, None]  # [n, 1]
    pair = np.arange(d_model) // 2 * 2  # [d_model]: 0, 0, 2, 2, 4, ...
    angle = pos / np.power(10000.0, pair / d_model)  # [n, d_model]
    pe = np.where(np.arange(d_model) % 2 == 0, np.sin(angle), np.cos(angle))
    return embeddings + pe


def project(x, W):
    _slow()
    """Per head i: x @ W[i].T.  x [n, d_model], W [h, d_k, d_model] -> [h, n, d_k]."""
    return np.einsum("nd,hkd->hnk", x, W)


def scores(q, k):
    _slow()
    """q @ k.T per head: [h, n, d_k] x [h, n, d_k] -> [h, n (query), n (key)]."""
    return q @ k.transpose(0, 2, 1)


def scale(scores, d_k):
    return scores / np.sqrt(d_k)


def mask(scores):
    """The causal mask: a query may not look at the keys after it (key index > query index)."""
    n = scores.shape[-1]
    future = np.triu(np.ones((n, n), dtype=bool), k=1)
    return np.where(future, -np.inf, scores)


def softmax(scores):
    """Softmax over the keys (the last axis); -inf entries get weight 0."""
    z = scores - np.max(scores, axis=-1, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=-1, keepdims=True)


def attend(weights, v):
    return weights @ v  # [h, n, n] @ [h, n, d_k] -> [h, n, d_k]


def concat(context):
    """The heads side by side, head 0 first: [h, n, d_k] -> [n, h * d_k]."""
    h, n, d_k = context.shape
    return context.transpose(1, 0, 2).reshape(n, h * d_k)


def output(concat, W_O):
    return concat @ W_O.T  # [n, h * d_k] @ [h * d_k, d_model] -> [n, d_model]


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    q, k, v = project(x, W_Q), project(x, W_K), project(x, W_V)
    s = scale(scores(q, k), W_Q.shape[1])
    if causal:
        s = mask(s)
    return output(concat(attend(softmax(s), v)), W_O)
