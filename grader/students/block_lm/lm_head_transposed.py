"""The head with one mistake: W_U reshaped to [d_model, vocab] instead of transposed."""

import numpy as np


def lm_head(h, W_U):
    return h @ W_U.reshape(W_U.shape[1], W_U.shape[0])


def next_token_probs(logits, temperature):
    z = logits[-1] / temperature
    e = np.exp(z - z.max())
    return e / e.sum()
