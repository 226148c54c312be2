"""The 2017 paper's block of block_vaswani/correct.py computed in float32 throughout (every array cast on the
way in): a correct submission that course-block-vaswani.toml's tolerance must pass.

Shapes: n tokens, h heads, d_k = d_model / h, d_ff the feed-forward width.
"""

import numpy as np

f32 = np.float32

# ---------------------------------------------------------------- the attention (last week's functions)


def project(x, W):
    """Per head i: x @ W[i].T.  x [n, d_model], W [h, d_k, d_model] -> [h, n, d_k]."""
    x = np.asarray(x, dtype=f32)
    W = np.asarray(W, dtype=f32)
    return np.einsum("nd,hkd->hnk", x, W)


def scores(q, k):
    q = np.asarray(q, dtype=f32)
    k = np.asarray(k, dtype=f32)
    return q @ k.transpose(0, 2, 1)  # [h, n, d_k] @ [h, d_k, n] -> [h, n, n]


def scale(scores, d_k):
    scores = np.asarray(scores, dtype=f32)
    return scores / np.sqrt(d_k)


def mask(scores):
    scores = np.asarray(scores, dtype=f32)
    n = scores.shape[-1]
    future = np.triu(np.ones((n, n), dtype=bool), k=1)  # key after query
    return np.where(future, -np.inf, scores)


def softmax(scores):
    scores = np.asarray(scores, dtype=f32)
    z = scores - np.max(scores, axis=-1, keepdims=True)  # no overflow in exp
    e = np.exp(z)
    return e / np.sum(e, axis=-1, keepdims=True)


def attend(weights, v):
    weights = np.asarray(weights, dtype=f32)
    v = np.asarray(v, dtype=f32)
    return weights @ v  # [h, n, n] @ [h, n, d_k] -> [h, n, d_k]


def concat(context):
    context = np.asarray(context, dtype=f32)
    h, n, d_k = context.shape
    return context.transpose(1, 0, 2).reshape(n, h * d_k)  # [h, n, d_k] -> [n, h * d_k]


def output(concat, W_O):
    concat = np.asarray(concat, dtype=f32)
    W_O = np.asarray(W_O, dtype=f32)
    return concat @ W_O.T  # [n, h * d_k] -> [n, d_model]


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    x = np.asarray(x, dtype=f32)
    W_Q = np.asarray(W_Q, dtype=f32)
    W_K = np.asarray(W_K, dtype=f32)
    W_V = np.asarray(W_V, dtype=f32)
    W_O = np.asarray(W_O, dtype=f32)
    q, k, v = project(x, W_Q), project(x, W_K), project(x, W_V)
    s = scale(scores(q, k), W_Q.shape[1])
    if causal:
        s = mask(s)
    return output(concat(attend(softmax(s), v)), W_O)


# ---------------------------------------------------------------- the block


def layer_norm(x, gamma, beta, eps):
    """Each token (row) normalised over its d_model features: biased variance, eps inside the root."""
    x = np.asarray(x, dtype=f32)
    gamma = np.asarray(gamma, dtype=f32)
    beta = np.asarray(beta, dtype=f32)
    mu = x.mean(axis=-1, keepdims=True)  # [n, 1]
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)  # [n, 1], divided by d_model
    return gamma * (x - mu) / np.sqrt(var + f32(eps)) + beta


def ffn(x, W_1, W_2, W_3=None):
    """ReLU between the two projections: [n, d_model] -> [n, d_ff] -> [n, d_model]."""
    x = np.asarray(x, dtype=f32)
    return np.maximum(x @ np.asarray(W_1, dtype=f32).T, f32(0.0)) @ np.asarray(W_2, dtype=f32).T


def block(x, params, causal=False):
    """Post-norm: h = LN1(x + MHA(x)), out = LN2(h + FFN(h))."""
    x = np.asarray(x, dtype=f32)
    p, eps = {k: np.asarray(v, dtype=f32) for k, v in params.items()}, f32(params["eps"])
    h = layer_norm(x + multi_head_attention(x, p["W_Q"], p["W_K"], p["W_V"], p["W_O"], causal),
                   p["norm1_gamma"], p["norm1_beta"], eps)
    return layer_norm(h + ffn(h, p["W_1"], p["W_2"]), p["norm2_gamma"], p["norm2_beta"], eps)
