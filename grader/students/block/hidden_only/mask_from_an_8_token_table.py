"""block/correct.py with a causal mask built once as an 8 x 8 table: right on every visible configuration
(at most 7 tokens), wrong on the hidden decoder (9 tokens), where it raises an exception (an 8 x 8 mask for n x n scores).
The grader runs mask there too and names it, instead of blaming the wiring of block."""

import math

import numpy as np

# ---------------------------------------------------------------- the attention (last week's functions)


def project(x, W):
    """Per head i: x @ W[i].T.  x [n, d_model], W [h, d_k, d_model] -> [h, n, d_k]."""
    return np.einsum("nd,hkd->hnk", x, W)


def scores(q, k):
    return q @ k.transpose(0, 2, 1)  # [h, n, d_k] @ [h, d_k, n] -> [h, n, n]


def scale(scores, d_k):
    return scores / np.sqrt(d_k)


#: the causal mask, built once for the longest sentence the student tried (7 tokens, and one to spare)
FUTURE = np.triu(np.ones((8, 8), dtype=bool), k=1)  # key after query


def mask(scores):
    n = scores.shape[-1]
    return np.where(FUTURE[:n, :n], -np.inf, scores)  # above 8 tokens: an 8 x 8 mask for n x n scores


def softmax(scores):
    z = scores - np.max(scores, axis=-1, keepdims=True)  # no overflow in exp
    e = np.exp(z)
    return e / np.sum(e, axis=-1, keepdims=True)


def attend(weights, v):
    return weights @ v  # [h, n, n] @ [h, n, d_k] -> [h, n, d_k]


def concat(context):
    h, n, d_k = context.shape
    return context.transpose(1, 0, 2).reshape(n, h * d_k)  # [h, n, d_k] -> [n, h * d_k]


def output(concat, W_O):
    return concat @ W_O.T  # [n, h * d_k] -> [n, d_model]


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    q, k, v = project(x, W_Q), project(x, W_K), project(x, W_V)
    s = scale(scores(q, k), W_Q.shape[1])
    if causal:
        s = mask(s)
    return output(concat(attend(softmax(s), v)), W_O)


# ---------------------------------------------------------------- the block


def layer_norm(x, gamma, beta, eps):
    """Each token (row) normalised over its d_model features: biased variance, eps inside the root."""
    mu = x.mean(axis=-1, keepdims=True)  # [n, 1]
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)  # [n, 1], divided by d_model
    return gamma * (x - mu) / np.sqrt(var + eps) + beta


def gelu_tanh(z):
    return 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z ** 3)))


def ffn(x, W_1, W_2, W_3=None):
    """GELU (tanh approximation) between the two projections: [n, d_model] -> [n, d_ff] -> [n, d_model]."""
    return gelu_tanh(x @ W_1.T) @ W_2.T


def block(x, params, causal=False):
    """Pre-norm: h = x + MHA(LN1(x)), out = h + FFN(LN2(h)), then the final norm."""
    p, eps = params, params["eps"]
    a = layer_norm(x, p["norm1_gamma"], p["norm1_beta"], eps)
    h = x + multi_head_attention(a, p["W_Q"], p["W_K"], p["W_V"], p["W_O"], causal)
    out = h + ffn(layer_norm(h, p["norm2_gamma"], p["norm2_beta"], eps), p["W_1"], p["W_2"])
    return layer_norm(out, p["final_norm_gamma"], p["final_norm_beta"], eps)
