"""A gaming attempt: every stage function is right; multi_head_attention raises an exception that carries its
inputs out in every piece of text the grader might repeat: the exception's type name, its message, the file
name and the function name of the frame that raised it, and the line number. On a hidden configuration none of
them may reach the student (PrairieLearn's and Gradescope's results alike)."""

import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def _code(a):
    """The first values of an array as text that is a valid identifier: 0.1234567891 -> 'p0_1234567891'."""
    out = []
    for v in np.asarray(a, dtype=np.float64).ravel()[:3]:
        out.append(("n" if v < 0 else "p") + f"{abs(float(v)):.10f}".replace(".", "_"))
    return "_".join(out)


def _raise_with(x, W_Q):
    code = _code(x) + "__" + _code(W_Q)
    kind = type("Leak_" + code, (Exception,), {})  # the type name
    line = 1 + int(abs(float(np.asarray(x).ravel()[0])) * 1e4) % 5000  # the line number
    source = "\n" * (line - 1) + f"def fn_{code}(kind, message):\n    raise kind(message)\n"  # the function name
    namespace = {}
    exec(compile(source, os.path.join(HERE, f"file_{code}.py"), "exec"), namespace)  # the file name
    namespace[f"fn_{code}"](kind, f"x={np.asarray(x).ravel()[:3].tolist()!r} W_Q={np.asarray(W_Q).ravel()[:3].tolist()!r}")




def add_positional_encoding(embeddings):
    """x = embeddings + PE, with PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(same)."""
    n, d_model = embeddings.shape
    pos = np.arange(n)[:, None]  # [n, 1]
    pair = np.arange(d_model) // 2 * 2  # [d_model]: 0, 0, 2, 2, 4, ...
    angle = pos / np.power(10000.0, pair / d_model)  # [n, d_model]
    pe = np.where(np.arange(d_model) % 2 == 0, np.sin(angle), np.cos(angle))
    return embeddings + pe


def project(x, W):
    """Per head i: x @ W[i].T.  x [n, d_model], W [h, d_k, d_model] -> [h, n, d_k]."""
    return np.einsum("nd,hkd->hnk", x, W)


def scores(q, k):
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
    _raise_with(x, W_Q)
