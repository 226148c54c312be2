"""Multi-head self-attention in numpy, with a bug: the causal mask multiplies by 0 instead of excluding keys."""

import numpy as np


def softmax(z, axis=-1):
    z = z - np.max(z, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def multi_head_attention(x, W_Q, W_K, W_V, W_O, causal=False):
    h, d_k, _ = W_Q.shape
    n = x.shape[0]
    Q = np.einsum("nd,hkd->hnk", x, W_Q)
    K = np.einsum("nd,hkd->hnk", x, W_K)
    V = np.einsum("nd,hkd->hnk", x, W_V)

    scores = Q @ K.transpose(0, 2, 1)
    scaled_scores = scores / np.sqrt(d_k)

    result = {"scores": scores, "scaled_scores": scaled_scores}
    logits = scaled_scores
    if causal:
        # BUG: zeroing the future scores leaves them in the softmax: exp(0) = 1 is still weight.
        lower = np.tril(np.ones((n, n)))
        logits = scaled_scores * lower
        result["masked_scores"] = logits
    weights = softmax(logits)
    context = weights @ V
    concat = np.concatenate([context[i] for i in range(h)], axis=-1)
    result.update(weights=weights, context=context, concat=concat, output=concat @ W_O.T)
    return result
