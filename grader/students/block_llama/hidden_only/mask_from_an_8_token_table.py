"""block_llama/correct.py with a causal mask built once as an 8 x 8 table: right on every visible configuration
(at most 7 tokens), wrong on the hidden decoder (9 tokens), where it masks no key after the 8th (wrong numbers, no exception).
The grader runs mask there too and names it, instead of blaming the wiring of block."""

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
    future = np.zeros((n, n), dtype=bool)
    k = min(n, 8)
    future[:k, :k] = FUTURE[:k, :k]  # above 8 tokens the keys after the 8th are never masked
    return np.where(future, -np.inf, scores)


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


def rms_norm(x, gamma, eps):
    """Each token (row) divided by the root of its mean square over the d_model features, eps inside the root."""
    ms = (x * x).mean(axis=-1, keepdims=True)  # [n, 1]
    return gamma * x / np.sqrt(ms + eps)


def silu(z):
    return z / (1.0 + np.exp(-z))


def ffn(x, W_1, W_2, W_3=None):
    """SwiGLU: the gate x @ W_1.T through SiLU, times the up projection x @ W_3.T, then W_2."""
    gate = silu(x @ W_1.T)  # [n, d_ff]
    up = x @ W_3.T  # [n, d_ff]
    return (gate * up) @ W_2.T  # [n, d_ff] -> [n, d_model]


def block(x, params, causal=False):
    """Pre-norm: h = x + MHA(RMSNorm1(x)), out = h + FFN(RMSNorm2(h)), then the final norm."""
    p, eps = params, params["eps"]
    a = rms_norm(x, p["norm1_gamma"], eps)
    h = x + multi_head_attention(a, p["W_Q"], p["W_K"], p["W_V"], p["W_O"], causal)
    out = h + ffn(rms_norm(h, p["norm2_gamma"], eps), p["W_1"], p["W_2"], p["W_3"])
    return rms_norm(out, p["final_norm_gamma"], eps)
