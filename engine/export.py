"""A trace in the input formats of the attention viewers people already use.

Each format is a small pure function of a :class:`~engine.tracing.Trace`; the
numbers are the trace's own, never recomputed: ``A`` is the weights stage
softmax(mask(QKᵀ/√d_k)), [h, n, m] (h query heads, n queries, m keys: m = n in
self-attention, the context's tokens in cross-attention). Under grouped-query
attention the K/V heads are shared, but ``A`` still has one [n, m] matrix per
*query* head, so every format has h heads.

* **bertviz** (github.com/jessevig/bertviz, ``bertviz/head_view.py``):
  ``head_view(attention=…, tokens=…)`` and ``model_view`` take one array
  [batch=1, h, n, n] per layer: one for an attention layer, one per layer for a
  stack of blocks (``model_view`` then draws every layer's heads). Cross-attention uses head_view's
  encoder-decoder form instead: ``cross_attention`` [1, h, n, m] per layer,
  ``encoder_tokens`` (the context, the keys) and ``decoder_tokens`` (the
  sentence, the queries).
* **CircuitsVis** (github.com/TransformerLensOrg/CircuitsVis,
  ``react/src/attention/AttentionHeads.tsx``): the ``AttentionHeads`` React
  props, ``attention`` [heads, dest, src], ``tokens``, ``attentionHeadNames``
  and ``maskUpperTri``. The component *defaults* maskUpperTri to true, so it is
  always sent: true exactly when the trace is causal. It draws square
  self-attention only (one token list for both axes): cross-attention is refused.
* **Transformer Explainer** (github.com/poloclub/transformer-explainer at
  6e2ec37, ``src/utils/model/model.py`` lines 84–100 and
  ``src/utils/model/export_to_onnx.py`` lines 121–125): its ``modelData.outputs``,
  keys ``block_{i}_attn_head_{j}_{attn|attn_scaled|attn_masked|attn_softmax|attn_dropout}``
  (i the block, j the head, both from 0), each ``{data, dims, size}``
  (``src/types/global.d.ts`` line 53; ``src/utils/data.ts`` drops the batch
  axis, so ``dims`` is [n, n]). ``attn`` = QKᵀ, ``attn_scaled`` = QKᵀ/√d_k,
  ``attn_masked`` = the masked scores, ``attn_softmax`` = the weights, and
  ``attn_dropout`` = the weights again: dropout is the identity at inference,
  and it is the key Transformer Explainer draws its softmax matrix from
  (``src/components/AttentionMatrix.svelte`` line 42). Its model fills masked
  cells with −inf, which JSON cannot hold (its own example data,
  ``src/constants/examples/ex0.js``, has null there): masked cells are None.
  Without a mask nothing is masked and ``attn_masked`` equals ``attn_scaled``.
  It draws GPT-2's causal self-attention, one token list for both axes:
  cross-attention is refused.

The bertviz and CircuitsVis layouts are built here and only here, from the
weights and the token texts (:func:`bertviz_layout`, :func:`circuitsvis_props`):
``attention_trace.export`` reshapes a client's trace with the same two
functions for a notebook.

Every function returns JSON-ready values: float64 numpy arrays (C-contiguous,
finite since the trace's are) and nested lists of floats and None; head
numbering is 0-based, as in the trace's JSON. ``decimals`` rounds every number
(numpy's round-half-even, as a trace's ``precision`` does).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .errors import VariantConflictError
from .layer import TraceConfig
from .tracing import Trace

#: the formats, by the name a request gives
EXPORT_FORMATS: tuple[str, ...] = ("bertviz", "circuitsvis", "transformer-explainer")
#: the formats that draw square self-attention only (one token list for queries and keys)
SELF_ATTENTION_ONLY: tuple[str, ...] = ("circuitsvis", "transformer-explainer")
#: Transformer Explainer's suffixes, in the order its export writes them (export_to_onnx.py line 124)
TE_SUFFIXES: tuple[str, ...] = ("attn", "attn_scaled", "attn_masked", "attn_softmax", "attn_dropout")

_CROSS_REFUSED = {
    "circuitsvis": "CircuitsVis' attention_heads draws square self-attention, one token list for both the "
                   "destination and the source axis, so it cannot show cross-attention's context keys",
    "transformer-explainer": "Transformer Explainer draws GPT-2's causal self-attention, one token list for both "
                             "axes, so it cannot show cross-attention's context keys",
}


def check_export(fmt: str, *, cross: bool, num_layers: int = 1) -> None:
    """The format must be known, and able to show this trace: raises VariantConflictError (field "format")."""
    if fmt not in EXPORT_FORMATS:
        raise VariantConflictError(f"format {fmt!r} is not one of {', '.join(EXPORT_FORMATS)}", field="format",
                                   code="unknown_export_format")
    if fmt == "circuitsvis" and num_layers > 1:
        raise VariantConflictError(f"CircuitsVis' attention_heads draws the heads of one layer, and this stack has "
                                   f"{num_layers}; export it with format \"bertviz\" (model_view takes every layer) "
                                   "or \"transformer-explainer\" (one block per layer)", field="format",
                                   code="export_needs_one_layer")
    if cross and fmt in SELF_ATTENTION_ONLY:
        raise VariantConflictError(f"{_CROSS_REFUSED[fmt]}; export this trace with format \"bertviz\" (its "
                                   "cross_attention view), or drop context_sentence/context_tokens",
                                   field="format", code="export_needs_self_attention")


def export_value_count(fmt: str, config: TraceConfig, n: int, n_context: int | None = None) -> int:
    """How many numbers the export holds: h·n·m for bertviz and CircuitsVis, 5·h·n·n for Transformer Explainer."""
    m = n if n_context is None else n_context
    return config.num_layers * config.num_heads * n * m * (len(TE_SUFFIXES) if fmt == "transformer-explainer" else 1)


def _exact(a: np.ndarray, decimals: int | None) -> np.ndarray:
    """The trace's float64 values, rounded when asked, as one contiguous block (what orjson writes natively)."""
    if decimals is not None:
        a = np.round(a, decimals)
    return np.ascontiguousarray(a, dtype=np.float64)


def _texts(tokens: list[Any] | None) -> list[str]:
    return [t.text for t in tokens or []]


def bertviz_layout(weights: np.ndarray, queries: list[str], context: list[str] | None = None,
                   decimals: int | None = None) -> dict[str, Any]:
    """bertviz head_view's (and model_view's) keyword arguments for weights [h, n, m], one layer, or [L, h, n, m],
    a stack of L layers.

    Self-attention (``context`` None): ``attention`` (a list of one [1, h, n, n] array per layer) and ``tokens``.
    Cross-attention: ``cross_attention`` (a list of one [1, h, n, m] array),
    ``encoder_tokens`` (the context: the keys) and ``decoder_tokens`` (the sentence: the queries).
    """
    A = _exact(weights, decimals)  # [h, n, m] or [L, h, n, m]
    layers = [A[np.newaxis]] if A.ndim == 3 else [a[np.newaxis] for a in A]  # each [h, n, m] -> [1, h, n, m]
    if context is not None:
        return {"cross_attention": layers, "encoder_tokens": context, "decoder_tokens": queries}
    return {"attention": layers, "tokens": queries}


def circuitsvis_props(weights: np.ndarray, queries: list[str], causal: bool,
                      decimals: int | None = None) -> dict[str, Any]:
    """CircuitsVis AttentionHeads' React props for weights [h, n, n]: attention [heads, dest, src], tokens,
    head names, maskUpperTri (true exactly when causal: the component defaults it to true)."""
    A = _exact(weights, decimals)  # [h, n, n]: dest = query, src = key
    return {"attention": A, "tokens": queries,
            "attentionHeadNames": [f"Head {i}" for i in range(A.shape[0])],
            "maskUpperTri": bool(causal)}


def bertviz(t: Trace, decimals: int | None = None) -> dict[str, Any]:
    """bertviz head_view's and model_view's keyword arguments: every layer's weights (:func:`bertviz_layout`)."""
    return bertviz_layout(t.stages["weights"].array, _texts(t.tokens),
                          _texts(t.context_tokens) if t.cross else None, decimals)


def circuitsvis(t: Trace, decimals: int | None = None) -> dict[str, Any]:
    """CircuitsVis AttentionHeads' props (:func:`circuitsvis_props` of its weights)."""
    check_export("circuitsvis", cross=t.cross, num_layers=t.num_layers)
    weights = t.stages["weights"].array  # [h, n, n], or [1, h, n, n] for one block
    return circuitsvis_props(weights[0] if t.config.has_block else weights, _texts(t.tokens), t.config.causal,
                             decimals)


def _masked_rows(values: np.ndarray, mask: np.ndarray | None) -> list[Any]:
    """One head's masked scores as nested lists: None where the mask excludes a key (never −inf or NaN)."""
    if mask is None:
        rows: list[Any] = values.tolist()
        return rows
    # numpy's stubs take no None as a fill value; the object array of floats and None is what is meant
    masked: list[Any] = np.where(mask, None, values).tolist()  # type: ignore[call-overload]  # [n, n] object array
    return masked


def transformer_explainer(t: Trace, decimals: int | None = None, block: int = 0) -> dict[str, Any]:
    """Transformer Explainer's ``outputs`` for this layer as block ``block``: five [n, n] matrices per head.
    A stack of blocks gives every layer, layer l as block ``block + l``."""
    check_export("transformer-explainer", cross=t.cross)
    s = t.stages
    if t.config.has_block:
        out: dict[str, Any] = {}
        for layer in range(t.num_layers):
            masked = s.get("masked_scores")
            out |= _te_block(s["scores"].array[layer], s["scaled_scores"].array[layer],
                             None if masked is None else masked.array[layer], s["weights"].array[layer],
                             None if masked is None or masked.mask is None else masked.mask[layer],
                             decimals, block + layer)
        return out
    masked_stage = s.get("masked_scores")  # absent when nothing is masked
    return _te_block(s["scores"].array, s["scaled_scores"].array,
                     None if masked_stage is None else masked_stage.array, s["weights"].array,
                     None if masked_stage is None else masked_stage.mask, decimals, block)


def _te_block(scores_in: np.ndarray, scaled_in: np.ndarray, masked_in: np.ndarray | None, weights_in: np.ndarray,
              mask: np.ndarray | None, decimals: int | None, block: int) -> dict[str, Any]:
    """One layer's Transformer Explainer matrices: scores, scaled, masked (None where masked) and weights [h, n, n]."""
    scores = _exact(scores_in, decimals)  # [h, n, n]  QKᵀ
    scaled = _exact(scaled_in, decimals)  # [h, n, n]  QKᵀ/√d_k
    masked = scaled if masked_in is None else _exact(masked_in, decimals)  # [h, n, n]
    weights = _exact(weights_in, decimals)  # [h, n, n]
    h, n, _ = weights.shape

    def matrix(data: Any) -> dict[str, Any]:
        return {"data": data, "dims": [n, n], "size": n * n}

    out: dict[str, Any] = {}
    for j in range(h):
        per_head = {
            "attn": scores[j],  # [h, n, n] -> [n, n]
            "attn_scaled": scaled[j],  # [h, n, n] -> [n, n]
            "attn_masked": _masked_rows(masked[j], None if mask is None else mask[j]),  # [n, n] lists, None masked
            "attn_softmax": weights[j],  # [h, n, n] -> [n, n]
            "attn_dropout": weights[j],  # dropout is the identity at inference
        }
        for suffix in TE_SUFFIXES:
            out[f"block_{block}_attn_head_{j}_{suffix}"] = matrix(per_head[suffix])
    return out


#: format name -> its function
EXPORTERS: dict[str, Callable[..., dict[str, Any]]] = {
    "bertviz": bertviz,
    "circuitsvis": circuitsvis,
    "transformer-explainer": transformer_explainer,
}


def export(t: Trace, fmt: str, decimals: int | None = None) -> dict[str, Any]:
    """The trace in format ``fmt`` (one of EXPORT_FORMATS); raises VariantConflictError when it cannot show it."""
    check_export(fmt, cross=t.cross, num_layers=t.num_layers)
    return EXPORTERS[fmt](t, decimals)
