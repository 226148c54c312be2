"""The language-model head of correct.py computed in float32 (every array cast on the way in): a correct
submission of course-block-lm.toml that its tolerance must pass (grader/README.md, "Fair on every seed")."""

import numpy as np

f32 = np.float32


def lm_head(h, W_U):
    """Every position's logits: h [n, d_model] times W_U [vocab, d_model] transposed -> [n, vocab]."""
    h = np.asarray(h, dtype=f32)
    W_U = np.asarray(W_U, dtype=f32)
    return h @ W_U.T


def next_token_probs(logits, temperature):
    """The last position's logits divided by the temperature, through a stable softmax over the vocabulary."""
    z = np.asarray(logits, dtype=f32)[-1] / f32(temperature)  # [n, vocab] -> [vocab]
    e = np.exp(z - z.max())
    return e / e.sum()
