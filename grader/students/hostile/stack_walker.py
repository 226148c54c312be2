"""Hostile: walks the call stack (and the garbage collector) for the grader's client and asks it for
the answers (the trick that got 7/7 from the in-process grader). In the sandbox there is no client."""

import gc
import inspect
import sys

import numpy as np

FOUND = []


def _find_client():
    candidates = []
    for frame_info in inspect.stack():
        candidates += list(frame_info.frame.f_locals.values()) + list(frame_info.frame.f_globals.values())
    for frame in sys._current_frames().values():
        while frame is not None:
            candidates += list(frame.f_locals.values())
            frame = frame.f_back
    candidates += gc.get_objects()
    for obj in candidates:
        if type(obj).__name__.endswith("Client") and hasattr(obj, "trace"):  # attention_trace's Client, LocalClient
            return obj
    return None


def _oracle(stage, x, W_Q, W_K, W_V, W_O, causal):
    client = _find_client()
    if client is None:
        FOUND.append("no client")
        return None
    n, d_model = x.shape
    t = client.trace(tokens=[f"t{i}" for i in range(n)], d_model=d_model, num_heads=W_Q.shape[0], causal=causal,
                     input=x.tolist(), parameters={"W_Q": W_Q.tolist(), "W_K": W_K.tolist(), "W_V": W_V.tolist(),
                                                   "W_O": W_O.tolist()})
    return t.array(stage)


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    answer = _oracle("output", x, W_Q, W_K, W_V, W_O, causal)
    print("stack walk:", "found a client" if answer is not None else "no client anywhere")
    return answer if answer is not None else np.zeros((x.shape[0], W_O.shape[0]))


def _nothing(*args):
    if _find_client() is None:
        return np.zeros(1)
    return np.zeros(1)


add_positional_encoding = project = scores = scale = mask = softmax = attend = concat = output = _nothing
