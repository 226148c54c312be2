"""Hostile: everything is correct except softmax, which cancels any alarm (signal.alarm(0)),
ignores the usual signals and loops forever, swallowing every exception.

Only softmax and multi_head_attention (which calls it) may lose points: the rest is right."""

import signal

import numpy as np


def add_positional_encoding(embeddings):
    n, d_model = embeddings.shape
    pos = np.arange(n)[:, None]
    pair = np.arange(d_model) // 2 * 2
    angle = pos / np.power(10000.0, pair / d_model)
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
    signal.alarm(0)  # cancel the grader's alarm, if it had one in here
    for sig in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT, signal.SIGXCPU, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:
            signal.alarm(0)
        except:  # noqa: E722
            pass


def attend(weights, v):
    return weights @ v


def concat(context):
    h, n, d_k = context.shape
    return context.transpose(1, 0, 2).reshape(n, h * d_k)


def output(concat, W_O):
    return concat @ W_O.T


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    q, k, v = project(x, W_Q), project(x, W_K), project(x, W_V)
    s = scale(scores(q, k), W_Q.shape[1])
    if causal:
        s = mask(s)
    return output(concat(attend(softmax(s), v)), W_O)
