"""One cell of a trace, number by number: the classic 'the cat sat' worked example, for head h, query i, key j.

The seed walks "cat" in "the cat sat" through q·k, ÷√d_k, exp and ÷Σ. For one
head h, query i and key j of a finished :class:`~engine.tracing.Trace`,
:func:`explain_cell` returns every intermediate number of that walk, in
order, each with its formula and the stage it comes from::

    products     q_i[m]·k_j[m], m = 0 … d_k − 1        stage q (q_rotated under RoPE)
    score        Σₘ q_i[m]·k_j[m] = scores[h, i, j]     stage scores
    scaled       score / scale_factor                   stage scaled_scores
    row_max      max over the row's unmasked keys       stage masked_scores (scaled_scores without a mask)
    exp          exp(scaled − row_max)                  inside the softmax (stage weights)
    denominator  Σⱼ exp(scaled_j − row_max)             inside the softmax (stage weights)
    weight       exp / denominator = weights[h, i, j]   stage weights
    contributions weight_j·v_j for every key j, Σ = context[h, i]   stage context

**Where the numbers come from.** Every number that is an entry of a stage is
read from the trace's own arrays (bit-equal by construction): q, k, scores,
scaled_scores, the row maximum (a max is exact), weights, v, context. exp and
the denominator live inside the softmax and are no stage: they are
recomputed over the whole [head, query, key] array with the very operations
of ``engine.attention.softmax`` (same shapes, same ufuncs), so they are the
numbers the engine divided. What is computed *here* from the shown numbers
(the products' sum added in key order, score / divisor, exp / denominator,
the contributions' sum) is given as ``recomputed``, with ``exact`` saying
whether it equals the trace's number bit for bit. The products are exact
IEEE products of q and k; their in-order sum need not equal the trace's
score in the last bit: BLAS's matrix product may fuse each multiply–add
(FMA) and accumulate in another order. Likewise the contributions' in-order
sum against the BLAS product ``weights·V``. The tests measure both.

Variants: under RoPE the dotted vectors are ``q_rotated`` and ``k_rotated``;
under grouped-query attention query head h reads K/V head ⌊h / (num_heads /
num_kv_heads)⌋; a causal or sliding-window mask gives a masked cell a score
and a scaled score (the stages hold them), an exponential and a weight of
exactly 0, and a reason; in cross-attention the keys (and values) are the
context's tokens; with scaling off the divisor is 1; a decoded trace's KV-cache
step for the query (``engine.decode``) is compared with the cell.

Pure numpy, no framework. Shapes: h = num_heads, g = K/V heads, n = queries,
m = keys, d_k = d_model / h.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from .attention import softmax_parts
from .errors import InvalidSizeError, VariantConflictError
from .layer import TraceConfig
from .tracing import Trace

#: the steps of one cell's explanation, in order
STEP_IDS: tuple[str, ...] = ("products", "score", "scaled", "row_max", "exp", "denominator", "weight",
                             "contributions")


# ------------------------------------------------------------------ rules


def _range_text(name: str, count: int, what: str) -> str:
    return f"{name} must be 0 … {count - 1} ({count} {what})" if count > 1 else f"{name} must be 0 (1 {what[:-1]})"


def _check_index(name: str, value: int, count: int, what: str, extra: str = "") -> None:
    """0 ≤ value < count, or an InvalidSizeError naming the field and its range (code ``<name>_out_of_range``)."""
    if not 0 <= value < count:
        raise InvalidSizeError(f"{name} {value} is out of range: {_range_text(name, count, what)}{extra}",
                               field=name, code=f"{name}_out_of_range")


def check_cell(config: TraceConfig, n_queries: int, n_keys: int, head: int, query: int, key: int, *,
               cross: bool = False) -> None:
    """head, query and key must index the trace: 0 ≤ head < num_heads, 0 ≤ query < n, 0 ≤ key < m
    (m = the context's tokens in cross-attention). Raises InvalidSizeError naming the field."""
    keys = "context tokens" if cross else "tokens"
    _check_index("head", head, config.num_heads, "heads")
    _check_index("query", query, n_queries, "tokens")
    _check_index("key", key, n_keys, keys, " (keys index the context's tokens in cross-attention)" if cross else "")


def check_explainable(bug: str | None) -> None:
    """Only a correct trace is explained: an injected bug's numbers do not follow these formulas."""
    if bug is not None:
        raise VariantConflictError(f"an explanation follows the correct layer's formulas, which the injected bug "
                                   f"{bug!r} breaks; drop inject_bug (use /trace to see the bug's numbers)",
                                   field="inject_bug", code="explain_with_bug")


# ------------------------------------------------------------------ pure steps


def products(q: NDArray[np.float64], k: NDArray[np.float64]) -> NDArray[np.float64]:
    """q_i[m]·k_j[m] for every m: exact IEEE products."""
    return q * k  # [d_k] * [d_k] -> [d_k]


def sum_in_order(terms: np.ndarray) -> np.ndarray | float:
    """Σ terms[0] + terms[1] + …, one IEEE addition at a time in index order (no pairwise or fused sum)."""
    total: np.ndarray | float = terms[0]  # [...]
    for t in terms[1:]:
        total = total + t  # [...]
    return total


def contributions(weights: NDArray[np.float64], v: NDArray[np.float64]) -> NDArray[np.float64]:
    """weight_j · v_j for every key j of one query row."""
    return weights[:, None] * v  # [m, 1] * [m, d_k] -> [m, d_k]


def mask_reason(config: TraceConfig, query: int, key: int, query_text: str, key_text: str) -> str:
    """Why key j is hidden from query i (for a masked cell)."""
    if key > query:
        return (f"causal mask: key {key} {key_text!r} comes after query {query} {query_text!r} (key > query), "
                "and a token may not attend to later tokens")
    w, back = config.window, query - key
    assert w is not None  # not a later key, so the window hid it
    return (f"sliding window of {w}: key {key} {key_text!r} is {back} position{'s' if back != 1 else ''} before "
            f"query {query} {query_text!r}, and a query sees only its own key and the {w - 1} before it "
            "(query − key ≥ window)")


# ------------------------------------------------------------------ the cell


def _f(x: Any) -> float:
    return float(x)


def _vec(a: np.ndarray) -> list[float]:
    return [float(x) for x in a]


def check_layer(trace: Trace, layer: int) -> None:
    """``layer`` must index the trace's layers (0 for a single attention layer)."""
    _check_index("layer", layer, trace.num_layers, "layers")


class _LayerState(dict[str, Any]):
    """One layer's values of a stack under their base names (``q`` for ``q@2``), as a single layer's state."""

    def __init__(self, state: dict[str, Any], layer: int) -> None:
        super().__init__(state)
        self.update({name.partition("@")[0]: v for name, v in state.items() if name.endswith(f"@{layer}")})


def explain_cell(trace: Trace, head: int, query: int, key: int, *, decode: Sequence[Any] | None = None,
                 layer: int = 0) -> dict[str, Any]:
    """Every number of the seed's worked example for one cell, from the trace's own arrays.

    ``decode``: ``engine.decode(trace)``, to compare the query's KV-cache step with the cell.
    ``layer``: in a stack of blocks, the layer whose attention the cell is in.
    Returns a JSON-ready dict of Python numbers (see the module's docstring).
    """
    check_explainable(trace.bug)
    check_layer(trace, layer)
    cfg = trace.config
    st = _LayerState(trace.state, layer) if cfg.has_block else trace.state
    key_tokens = trace.context_tokens if trace.context_tokens is not None else trace.tokens  # trace.cross
    n, m = trace.n_tokens, len(key_tokens)
    check_cell(cfg, n, m, head, query, key, cross=trace.cross)

    kv_head = head // cfg.kv_group_size  # query head h reads K/V head ⌊h / G⌋
    q_stage, k_stage = ("q_rotated", "k_rotated") if cfg.rope else ("q", "k")
    q_label, k_label = ("RoPE(q)", "RoPE(k)") if cfg.rope else ("q", "k")
    qt, kt = trace.tokens[query].text, key_tokens[key].text
    key_texts = [t.text for t in key_tokens]
    d_k = cfg.d_k

    q_vec = st[q_stage][head, query]  # [h, n, d_k] -> [d_k]
    k_vec = st[k_stage][kv_head, key]  # [g, m, d_k] -> [d_k]
    prods = products(q_vec, k_vec)  # [d_k]
    prod_sum = _f(sum_in_order(prods))
    score = _f(st["scores"][head, query, key])
    divisor = _f(st["scale_factor"])
    scaled = _f(st["scaled_scores"][head, query, key])

    excluded = st.get("excluded")  # [h, n, m] booleans, or None without a mask
    row_mask = np.zeros(m, dtype=bool) if excluded is None else np.asarray(excluded[head, query])  # [m]
    masked = bool(row_mask[key])
    peak, e, total = softmax_parts(st["masked_scores"], excluded)
    row_max = _f(peak[head, query, 0])
    scaled_row = st["scaled_scores"][head, query]  # [h, n, m] -> [m]
    max_key = int(np.flatnonzero(~row_mask & (scaled_row == row_max))[0])  # the first key holding the max
    terms = e[head, query]  # [h, n, m] -> [m]
    exp_value = _f(terms[key])
    denominator = _f(total[head, query, 0])
    weight = _f(st["weights"][head, query, key])
    weights_row = st["weights"][head, query]  # [h, n, m] -> [m]

    v_rows = st["v"][kv_head]  # [g, m, d_k] -> [m, d_k]
    contrib = contributions(weights_row, v_rows)  # [m, d_k]
    visible = ~row_mask  # [m]
    contrib_sum = cast(np.ndarray, sum_in_order(contrib[visible]))  # [visible, d_k] -> [d_k]
    context = st["context"][head, query]  # [h, n, d_k] -> [d_k]
    exponent = None if masked else scaled - row_max
    exp_recomputed = None if exponent is None else _f(np.exp(np.float64(exponent)))
    denom_recomputed = _f(sum_in_order(terms[visible]))
    weight_recomputed = exp_value / denominator

    kv_note = (f"; query head {head} reads K/V head {kv_head} = ⌊{head} / {cfg.kv_group_size}⌋ "
               f"({cfg.kv_heads} K/V heads shared by {cfg.num_heads} query heads)") if cfg.grouped else ""
    rope_note = "; under RoPE the rotated q and k are dotted" if cfg.rope else ""
    cross_note = "; the key is a context token (cross-attention)" if trace.cross else ""
    if cfg.scale:
        divisor_text, scale_note = "√d_k", f"divided by the trace's scale factor √d_k = √{d_k} = {divisor!r}"
    else:
        divisor_text, scale_note = "1 (scaling off)", "scaling is off: divided by 1, the score is unchanged"
    mask_stage = "masked_scores" if excluded is not None else "scaled_scores"
    masked_keys = [int(j) for j in np.flatnonzero(row_mask)]
    reason = mask_reason(cfg, query, key, qt, kt) if masked else None
    masked_note = f"masked ({reason}): excluded from the softmax, exp(−∞) = 0" if masked else None

    steps: list[dict[str, Any]] = [
        {"id": "products", "stage": q_stage,
         "formula": f"{q_label}_{qt}[m] · {k_label}_{kt}[m] for m = 0 … {d_k - 1}",
         "value": None, "values": _vec(prods), "index": [head, query],
         "q": _vec(q_vec), "k": _vec(k_vec), "k_stage": k_stage, "k_index": [kv_head, key],
         "note": f"d_k = {d_k} products of the query's and the key's coordinates{kv_note}{rope_note}{cross_note}"},
        {"id": "score", "stage": "scores",
         "formula": f"scores[{head}, {query}, {key}] = Σₘ {q_label}_{qt}[m]·{k_label}_{kt}[m]",
         "value": score, "index": [head, query, key], "recomputed": prod_sum, "exact": prod_sum == score,
         "note": "recomputed: the products added one by one in order; the trace's score is BLAS's matrix "
                 "product, which may fuse multiply–adds and sum in another order, so the last bits can differ"
                 + ("; masked cells keep their score (the mask acts in the softmax)" if masked else "")},
        {"id": "scaled", "stage": "scaled_scores",
         "formula": f"scaled = score / {divisor_text}",
         "value": scaled, "index": [head, query, key], "divisor": divisor,
         "recomputed": score / divisor, "exact": score / divisor == scaled, "note": scale_note},
        {"id": "row_max", "stage": mask_stage,
         "formula": f"max over the {'unmasked ' if excluded is not None else ''}keys of row {query} "
                    f"({qt!r}) of the scaled scores",
         "value": row_max, "index": [head, query, max_key], "key": max_key, "key_token": key_texts[max_key],
         "note": f"subtracted before exp so that the largest exponent is exp(0) = 1; key {max_key} "
                 f"{key_texts[max_key]!r} holds it" + (f"; masked keys {masked_keys} do not count"
                                                          if masked_keys else "")},
        {"id": "exp", "stage": "weights",
         "formula": "exp(scaled − row_max)",
         "value": exp_value, "index": [head, query, key], "exponent": exponent, "recomputed": exp_recomputed,
         "exact": None if exp_recomputed is None else exp_recomputed == exp_value,
         "note": masked_note or "inside the softmax (step 9); recomputed: numpy's exp of this one number, "
                                "which may differ in the last bit from the vectorised exp over the array"},
        {"id": "denominator", "stage": "weights",
         "formula": f"Σⱼ exp(scaled_j − row_max) over the {m} key{'s' if m != 1 else ''} of row {query}",
         "value": denominator, "values": _vec(terms), "index": [head, query],
         "recomputed": denom_recomputed, "exact": denom_recomputed == denominator,
         "note": "values: every key's exponential (0 for a masked key); value: numpy's sum of the row, "
                 "recomputed: the same terms added in key order"},
        {"id": "weight", "stage": "weights",
         "formula": f"weights[{head}, {query}, {key}] = exp / denominator",
         "value": weight, "index": [head, query, key], "recomputed": weight_recomputed,
         "exact": weight_recomputed == weight,
         "note": (masked_note or f"the share of key {kt!r} in the attention of query {qt!r}; "
                  "the row's weights sum to 1")},
        {"id": "contributions", "stage": "context",
         "formula": f"weight_j · v_j for every key j; context[{head}, {query}] = Σⱼ weight_j · v_j",
         "value": None,
         "values": [None if row_mask[j] else _vec(contrib[j]) for j in range(m)],
         "index": [head, query], "weights": _vec(weights_row),
         "v": [_vec(v_rows[j]) for j in range(m)], "v_stage": "v", "v_index": [kv_head],
         "vector": _vec(context), "recomputed": _vec(contrib_sum),
         "exact": bool(np.array_equal(contrib_sum, context)),
         "max_abs_difference": _f(np.max(np.abs(contrib_sum - context))),
         "note": "vector: the trace's context row (BLAS's weights·V); recomputed: the contributions added in key "
                 "order" + (f"; masked keys {masked_keys} contribute nothing (null)" if masked_keys else "")},
    ]
    out: dict[str, Any] = {
        "head": head, "kv_head": kv_head, "query": query, "key": key,
        "query_token": qt, "key_token": kt, "key_tokens": key_texts,
        "key_source": "context_tokens" if trace.cross else "tokens",
        "d_k": d_k, "scale": cfg.scale, "scale_factor": divisor,
        "masked": masked, "mask_reason": reason, "masked_keys": masked_keys,
        "steps": steps,
    }
    if cfg.has_block:
        out["layer"] = layer
    if decode is not None:
        out["decode"] = decode_cell(decode, head, query, key, score=score, weight=weight)
    return out


# ------------------------------------------------------------------ a norm's cell and an FFN's cell

NORMS: tuple[str, ...] = ("norm1", "norm2", "final_norm")


def _source(trace: Trace, step_name: str) -> tuple[np.ndarray, str, list[int]]:
    """What a norm or the FFN reads, as the trace shows it: its array [n, d_model], the stage, and the index of
    that array in the stage (the residual stream's depth, or the layer)."""
    step = next(s for s in trace.steps if s.name == step_name)
    name = step.inputs[0]
    base, _, at = name.partition("@")
    L = trace.num_layers
    if base in ("input", "stack_output", "layer_output", "attention_input"):
        # the residual stream: the stack's input, a layer's output, or (post-norm) the stream a layer reads
        depth = 0 if base == "input" else L if base == "stack_output" else int(at) + (base == "layer_output")
        return trace.stages["residual_stream"].array[depth], "residual_stream", [depth]
    return trace.state[name], base, [int(at)]


def check_norm_cell(trace: Trace, which: str, layer: int, token: int, feature: int) -> None:
    """The norm must be one this trace has, and layer, token and feature must index it."""
    if not trace.config.has_block:
        raise VariantConflictError("this trace is one attention layer, without norms: give a block field",
                                   field="norm", code="explain_needs_block")
    if which not in NORMS or (which == "final_norm" and not trace.config.final_norm):
        has = ", ".join(NORMS if trace.config.final_norm else NORMS[:2])
        raise InvalidSizeError(f"norm must be one of this stack's norms ({has}), got {which!r}", field="norm",
                               code="norm_not_in_block")
    check_layer(trace, layer)
    _check_index("token", token, trace.n_tokens, "tokens")
    _check_index("feature", feature, trace.config.d_model, "features")


def explain_norm_cell(trace: Trace, which: str, token: int, feature: int, *, layer: int = 0) -> dict[str, Any]:
    """One value of a norm (``norm1``, ``norm2`` or ``final_norm``): its token's statistics over the features,
    the normalised value, then the gain and bias. Each step's number is the trace's own; ``recomputed`` is the
    step redone from the numbers shown (sums in feature order), ``exact`` whether the two agree bit for bit."""
    check_explainable(trace.bug)
    check_norm_cell(trace, which, layer, token, feature)
    cfg = trace.config
    at = "" if which == "final_norm" else f"@{layer}"
    index = [token] if which == "final_norm" else [layer, token]
    row, source, source_index = _source(trace, f"{which}{at}")
    x = row[token]  # [n, d_model] -> [d_model]
    d = cfg.d_model
    eps = float(trace.state["norm_eps"])
    gamma = trace.state[f"{which}_gamma{at}"]
    value = _f(trace.stages[which].array[(*index, feature)])
    text = trace.tokens[token].text
    steps: list[dict[str, Any]] = []
    if cfg.norm_kind == "layer_norm":
        mean = _f(trace.stages[f"{which}_mean"].array[tuple(index)])
        variance = _f(trace.stages[f"{which}_variance"].array[tuple(index)])
        mean_re = _f(sum_in_order(x)) / d
        centred = x - mean  # [d_model]
        squares = centred * centred  # [d_model]
        var_re = _f(sum_in_order(squares)) / d
        normalised = (float(x[feature]) - mean) / float(np.sqrt(variance + eps))
        beta = trace.state[f"{which}_beta{at}"]
        scaled_re = normalised * float(gamma[feature]) + float(beta[feature])
        steps += [
            {"id": "mean", "stage": f"{which}_mean", "index": index, "formula": f"μ = Σⱼ x[j] / {d}",
             "value": mean, "values": _vec(x), "recomputed": mean_re, "exact": mean_re == mean,
             "note": f"values: token {text!r}'s {d} features, x = {source}{source_index}[{token}]; recomputed: "
                     "added in feature order (numpy sums pairwise, so the last bits can differ)"},
            {"id": "variance", "stage": f"{which}_variance", "index": index, "formula": f"σ² = Σⱼ (x[j] − μ)² / {d}",
             "value": variance, "values": _vec(squares), "recomputed": var_re, "exact": var_re == variance,
             "note": f"values: each (x[j] − μ)²; biased: divided by d_model = {d}, not d_model − 1"},
            {"id": "normalised", "stage": which, "index": [*index, feature], "formula": "x̂ = (x[f] − μ) / √(σ² + ε)",
             "value": normalised, "x": float(x[feature]), "epsilon": eps,
             "note": f"ε = {eps!r} inside the square root, so a constant row gives 0, not a division by 0"},
            {"id": "scaled", "stage": which, "index": [*index, feature], "formula": "γ[f]·x̂ + β[f]", "value": value,
             "gamma": float(gamma[feature]), "beta": float(beta[feature]), "recomputed": scaled_re,
             "exact": scaled_re == value,
             "note": f"{which}[{', '.join(map(str, [*index, feature]))}]; γ = 1 and β = 0 unless norm_weights is "
                     "seeded"},
        ]
    else:
        ms = _f(trace.stages[f"{which}_mean_square"].array[tuple(index)])
        squares = x * x  # [d_model]
        ms_re = _f(sum_in_order(squares)) / d
        normalised = float(x[feature]) / float(np.sqrt(ms + eps))
        scaled_re = normalised * float(gamma[feature])
        steps += [
            {"id": "mean_square", "stage": f"{which}_mean_square", "index": index, "formula": f"Σⱼ x[j]² / {d}",
             "value": ms, "values": _vec(squares), "recomputed": ms_re, "exact": ms_re == ms,
             "note": f"values: each x[j]² of token {text!r}, x = {source}{source_index}[{token}]; no mean is "
                     "subtracted (RMSNorm)"},
            {"id": "normalised", "stage": which, "index": [*index, feature], "formula": "x̂ = x[f] / √(mean(x²) + ε)",
             "value": normalised, "x": float(x[feature]), "epsilon": eps,
             "note": f"ε = {eps!r} inside the square root"},
            {"id": "scaled", "stage": which, "index": [*index, feature], "formula": "γ[f]·x̂", "value": value,
             "gamma": float(gamma[feature]), "recomputed": scaled_re, "exact": scaled_re == value,
             "note": "RMSNorm has a gain and no bias"},
        ]
    out: dict[str, Any] = {"norm": which, "norm_kind": cfg.norm_kind, "token": token, "token_text": text,
                           "feature": feature, "source_stage": source, "source_index": [*source_index, token],
                           "steps": steps}
    if which != "final_norm":
        out["layer"] = layer
    return out


_ACTIVATION_NAME = {"relu": "ReLU", "gelu": "GELU", "gelu_tanh": "GELU_tanh", "swiglu": "SiLU"}
_ACTIVATION_FORMULA = {"relu": "max(0, a)", "gelu": "½·a·(1 + erf(a/√2))",
                       "gelu_tanh": "½·a·(1 + tanh(√(2/π)·(a + 0.044715·a³)))", "swiglu": "a / (1 + e^(−a))"}


def _activation(kind: str, a: float) -> float:
    """The activation of one number, written out (not the engine's vectorised step)."""
    if kind == "relu":
        return max(0.0, a)
    if kind == "gelu":
        return 0.5 * a * (1.0 + math.erf(a / math.sqrt(2.0)))
    if kind == "gelu_tanh":
        return 0.5 * a * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * (a * a * a))))
    return a / (1.0 + math.exp(-a)) if a > -709 else -0.0


def check_ffn_cell(trace: Trace, layer: int, token: int, unit: int) -> None:
    if not trace.config.has_block:
        raise VariantConflictError("this trace is one attention layer, without a feed-forward network: give a "
                                   "block field", field="unit", code="explain_needs_block")
    check_layer(trace, layer)
    _check_index("token", token, trace.n_tokens, "tokens")
    _check_index("unit", unit, trace.config.ff_width, "units")


def explain_ffn_cell(trace: Trace, token: int, unit: int, *, layer: int = 0) -> dict[str, Any]:
    """One hidden unit of a layer's feed-forward network for one token: the products with its row of W_1, their
    sum (the pre-activation), SwiGLU's up projection, the activation (and gating), and what the unit adds to the
    output, ``h[u]·W_2[:, u]``."""
    check_explainable(trace.bug)
    check_ffn_cell(trace, layer, token, unit)
    cfg, st = trace.config, trace.state
    kind = cfg.ffn_kind
    row, source, source_index = _source(trace, f"ffn_pre_activation@{layer}")
    x = row[token]  # [n, d_model] -> [d_model]
    at = f"@{layer}"
    cell = [layer, token, unit]
    W_1, W_2 = st[f"W_1{at}"], st[f"W_2{at}"]
    prods = products(x, W_1[unit])  # [d_model]
    pre = _f(trace.stages["ffn_pre_activation"].array[tuple(cell)])
    pre_re = _f(sum_in_order(prods))
    act = _f(trace.stages["ffn_activation"].array[tuple(cell)])
    act_re = _activation(kind, pre)
    steps: list[dict[str, Any]] = [
        {"id": "products", "stage": "ffn_pre_activation", "index": cell, "value": None, "values": _vec(prods),
         "formula": f"x[j]·W_1[{unit}, j] for j = 0 … {cfg.d_model - 1}", "x": _vec(x), "w": _vec(W_1[unit]),
         "note": f"x = {source}{[*source_index, token]}, the FFN's input (the normalised stream)"},
        {"id": "pre_activation", "stage": "ffn_pre_activation", "index": cell, "formula": "a = Σⱼ x[j]·W_1[u, j]",
         "value": pre, "recomputed": pre_re, "exact": pre_re == pre,
         "note": "recomputed: the products added in order; the trace's value is BLAS's matrix product"},
    ]
    hidden = act
    if kind == "swiglu":
        W_3 = st[f"W_3{at}"]
        up = _f(trace.stages["ffn_up"].array[tuple(cell)])
        up_re = _f(sum_in_order(products(x, W_3[unit])))
        gated = _f(trace.stages["ffn_gated"].array[tuple(cell)])
        steps.append({"id": "up", "stage": "ffn_up", "index": cell, "formula": "b = Σⱼ x[j]·W_3[u, j]", "value": up,
                      "recomputed": up_re, "exact": up_re == up, "note": "SwiGLU's up projection (Llama's up_proj)"})
    steps.append({"id": "activation", "stage": "ffn_activation", "index": cell,
                  "formula": f"{_ACTIVATION_NAME[kind]}(a) = {_ACTIVATION_FORMULA[kind]}",
                  "value": act, "recomputed": act_re, "exact": act_re == act,
                  "note": "recomputed: the formula on this one number with Python's math module"})
    if kind == "swiglu":
        gated_re = act * up
        steps.append({"id": "gated", "stage": "ffn_gated", "index": cell, "formula": "SiLU(a)·b", "value": gated,
                      "recomputed": gated_re, "exact": gated_re == gated,
                      "note": "the gate (the activated W_1 projection) times the up projection"})
        hidden = gated
    contribution = hidden * W_2[:, unit]  # [d_model]: this unit's share of the FFN's output row
    output = trace.stages["ffn_output"].array[layer, token]  # [d_model]
    steps.append({"id": "contribution", "stage": "ffn_output", "index": [layer, token], "value": None,
                  "formula": f"h[{unit}]·W_2[:, {unit}]; ffn_output[{layer}, {token}] = Σᵤ h[u]·W_2[:, u]",
                  "values": _vec(contribution), "vector": _vec(output),
                  "note": f"what unit {unit} adds to token {trace.tokens[token].text!r}'s output; the other "
                          f"{cfg.ff_width - 1} units add the rest"})
    return {"layer": layer, "token": token, "token_text": trace.tokens[token].text, "unit": unit, "ffn": kind,
            "d_ff": cfg.ff_width, "source_stage": source, "steps": steps}


def decode_cell(steps: Sequence[Any], head: int, query: int, key: int, *, score: float, weight: float
                ) -> dict[str, Any]:
    """The query's KV-cache decoding step (``engine.decode``) against the cell: the same score and weight
    when the key is cached, to about 1e-15 (one row through BLAS's matrix–vector kernel)."""
    s = steps[query]
    cached = list(s.cache_positions)
    doc: dict[str, Any] = {"position": query, "cache_positions": cached, "in_cache": key in cached}
    if key in cached:
        c = cached.index(key)
        d_score, d_weight = _f(s.scores[head, c]), _f(s.weights[head, c])
        doc |= {"cache_index": c, "score": d_score, "scaled": _f(s.scaled_scores[head, c]), "weight": d_weight,
                "score_difference": abs(d_score - score), "weight_difference": abs(d_weight - weight),
                "note": f"step {query} scores its new query against the {len(cached)} cached keys; key {key} is "
                        f"entry {c} of the cache"}
    else:
        why = "is not generated yet" if key > query else "has left the sliding window's cache"
        doc |= {"cache_index": None, "score": None, "scaled": None, "weight": None, "score_difference": None,
                "weight_difference": None,
                "note": f"key {key} {why} at step {query}: the cache holds positions {cached[0]} … {cached[-1]}, "
                        "so no mask is needed"}
    return doc


# ------------------------------------------------------------------ one logit of the language-model head


def check_logit_cell(trace: Trace, token: int, column: int) -> None:
    if not trace.config.has_lm_head:
        raise VariantConflictError("this trace has no language-model head: add lm_head (\"tied\" or \"seeded\") to "
                                   "a stack of blocks", field="cell", code="explain_needs_lm_head")
    _check_index("token", token, trace.n_tokens, "tokens")
    _check_index("column", column, len(trace.vocabulary or ()), "vocabulary tokens")


def explain_logit_cell(trace: Trace, token: int, column: int) -> dict[str, Any]:
    """One logit, ``logits[token, column]``: the last hidden state's products with the column's row of W_U (its
    token embedding, with the tied head), their sum, and at the last position its next-token probability."""
    check_explainable(trace.bug)
    check_logit_cell(trace, token, column)
    cfg, st = trace.config, trace.state
    vocab = trace.vocabulary or []
    h_row, source, source_index = _hidden_source(trace)
    h = h_row[token]  # [d_model]
    W_U = st["unembedding"][column]  # [d_model]
    prods = products(h, W_U)  # [d_model]
    logits_ = np.asarray(trace.stages["logits"].values)  # [n, vocab]
    probs = np.asarray(trace.stages["next_token_probs"].values)  # [vocab]
    logit = _f(logits_[token, column])
    logit_re = _f(sum_in_order(prods))
    tied = cfg.lm_head == "tied"
    steps: list[dict[str, Any]] = [
        {"id": "products", "stage": "logits", "index": [token, column], "value": None, "values": _vec(prods),
         "formula": f"h[j]·W_U[{column}, j] for j = 0 … {cfg.d_model - 1}", "x": _vec(h), "w": _vec(W_U),
         "note": f"h = {source}{[*source_index, token]}, the last hidden state of {trace.tokens[token].text!r}; "
                 f"W_U[{column}] is {'the token embedding of' if tied else 'the seeded row of'} "
                 f"{vocab[column]!r}"},
        {"id": "logit", "stage": "logits", "index": [token, column], "formula": "logit = Σⱼ h[j]·W_U[v, j]",
         "value": logit, "recomputed": logit_re, "exact": logit_re == logit,
         "note": "recomputed: the products added in order; the trace's value is BLAS's matrix product"},
    ]
    if token == trace.n_tokens - 1:  # the last position's logits give the next token's probabilities
        row = logits_[token] / cfg.temperature  # [vocab]
        peak = float(row.max())
        e = np.exp(row - peak)  # [vocab]
        total = _f(sum_in_order(e))
        p = _f(probs[column])
        p_re = _f(e[column]) / total
        steps.append({"id": "probability", "stage": "next_token_probs", "index": [column],
                      "formula": "p = exp((logit − max)/T) / Σᵥ exp((logitᵥ − max)/T)", "value": p,
                      "recomputed": p_re, "exact": p_re == p, "temperature": cfg.temperature,
                      "row_max": peak * cfg.temperature, "exponent": _f(e[column]), "denominator": total,
                      "note": f"the last position predicts the token after the sentence; {vocab[column]!r} has "
                              f"rank {int((probs > p).sum()) + 1} of {len(vocab)}"})
    return {"token": token, "token_text": trace.tokens[token].text, "column": column, "column_token": vocab[column],
            "lm_head": cfg.lm_head, "source_stage": source, "steps": steps}


def _hidden_source(trace: Trace) -> tuple[np.ndarray, str, list[int]]:
    """What the head reads: the final norm's output (pre-norm), or the last residual stream (post-norm)."""
    if trace.config.final_norm:
        return np.asarray(trace.stages["final_norm"].values), "final_norm", []
    depth = trace.num_layers
    return np.asarray(trace.stages["residual_stream"].values)[depth], "residual_stream", [depth]
