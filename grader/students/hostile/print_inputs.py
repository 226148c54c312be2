"""A correct submission that prints every input it is given: what it prints during the visible tests
is shown back to it; what it prints during hidden tests must never be."""

import numpy as np

np.set_printoptions(threshold=1_000_000, precision=17)


def _show(name, *arrays):
    for a in arrays:
        print(name, repr(np.asarray(a)))


def add_positional_encoding(embeddings):
    _show("add_positional_encoding", embeddings)
    n, d_model = embeddings.shape
    pos = np.arange(n)[:, None]
    pair = np.arange(d_model) // 2 * 2
    angle = pos / np.power(10000.0, pair / d_model)
    return embeddings + np.where(np.arange(d_model) % 2 == 0, np.sin(angle), np.cos(angle))


def project(x, W):
    _show("project", x, W)
    return np.einsum("nd,hkd->hnk", x, W)


def scores(q, k):
    return q @ k.transpose(0, 2, 1)


def scale(scores, d_k):
    return scores / np.sqrt(d_k)


def mask(scores):
    n = scores.shape[-1]
    return np.where(np.triu(np.ones((n, n), dtype=bool), k=1), -np.inf, scores)


def softmax(scores):
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attend(weights, v):
    return weights @ v


def concat(context):
    h, n, d_k = context.shape
    return context.transpose(1, 0, 2).reshape(n, h * d_k)


def output(concat, W_O):
    return concat @ W_O.T


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    _show("multi_head_attention", x, W_Q, W_K, W_V, W_O)
    s = scale(scores(project(x, W_Q), project(x, W_K)), W_Q.shape[1])
    return output(concat(attend(softmax(mask(s) if causal else s), project(x, W_V))), W_O)
