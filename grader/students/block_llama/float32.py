"""The Llama style block of block_llama/correct.py computed in float32 throughout (every array cast on the way
in): a correct submission that course-block-llama.toml's tolerance must pass.

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


def rms_norm(x, gamma, eps):
    """Each token (row) divided by the root of its mean square over the d_model features, eps inside the root."""
    x = np.asarray(x, dtype=f32)
    gamma = np.asarray(gamma, dtype=f32)
    ms = (x * x).mean(axis=-1, keepdims=True)  # [n, 1]
    return gamma * x / np.sqrt(ms + f32(eps))


def silu(z):
    return z / (f32(1.0) + np.exp(-z))


def ffn(x, W_1, W_2, W_3=None):
    """SwiGLU: the gate x @ W_1.T through SiLU, times the up projection x @ W_3.T, then W_2."""
    x = np.asarray(x, dtype=f32)
    W_1, W_2, W_3 = (np.asarray(W, dtype=f32) for W in (W_1, W_2, W_3))
    return (silu(x @ W_1.T) * (x @ W_3.T)) @ W_2.T  # [n, d_ff] -> [n, d_model]


def block(x, params, causal=False):
    """Pre-norm: h = x + MHA(RMSNorm1(x)), out = h + FFN(RMSNorm2(h)), then the final norm."""
    x = np.asarray(x, dtype=f32)
    p, eps = {k: np.asarray(v, dtype=f32) for k, v in params.items()}, f32(params["eps"])
    a = rms_norm(x, p["norm1_gamma"], eps)
    h = x + multi_head_attention(a, p["W_Q"], p["W_K"], p["W_V"], p["W_O"], causal)
    out = h + ffn(rms_norm(h, p["norm2_gamma"], eps), p["W_1"], p["W_2"], p["W_3"])
    return rms_norm(out, p["final_norm_gamma"], eps)
