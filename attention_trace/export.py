"""Hand a trace to the attention viewers people already use, in a notebook (docs/interop.md, "Exports").

    from bertviz import head_view
    import circuitsvis as cv
    from attention_trace import LocalClient
    from attention_trace.export import to_bertviz, to_circuitsvis

    t = LocalClient().trace(sentence="the cat sat", d_model=24, num_heads=4)
    attention, tokens = to_bertviz(t)
    head_view(attention, tokens)                          # bertviz
    cv.attention.attention_heads(**to_circuitsvis(t))     # CircuitsVis

Each function takes a client :class:`~attention_trace.client.Trace`, a /trace
answer as a JSON dict, or an /export answer (``Client.export(...)``, any
format): the numbers are the trace's attention weights (stage ``weights``,
[head, query, key]), unchanged. Heads are numbered from 0, as in the trace.

Cross-attention (a trace with ``context_sentence`` or ``context_tokens``):
bertviz shows it in head_view's encoder-decoder form, so :func:`to_bertviz`
returns a dict of keyword arguments instead of a pair::

    head_view(**to_bertviz(t))   # cross_attention=(…,), encoder_tokens=context, decoder_tokens=sentence

:func:`bertviz_kwargs` always returns that keyword form (``head_view(**bertviz_kwargs(t))``
works for both). CircuitsVis draws self-attention only: :func:`to_circuitsvis`
refuses a cross-attention trace.

The layouts themselves are ``engine.export``'s (the very functions /export
answers with), so there is one implementation of each format; this module only
reads the weights out of a client's trace and adapts them to the Python
packages' keyword arguments. Needs only numpy; bertviz's attention is a torch tensor when torch can be
imported (bertviz itself needs torch), else a numpy array.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Union

import numpy as np

from engine.export import bertviz_layout, circuitsvis_props

from .client import Trace

__all__ = ["to_bertviz", "bertviz_kwargs", "to_circuitsvis"]

TraceLike = Union[Trace, Mapping[str, Any]]


class _Weights:
    """What every viewer needs: the weights [h, n, m], the queries' and keys' tokens, and whether it is causal."""

    def __init__(self, weights: np.ndarray, queries: list[str], context: list[str] | None, causal: bool) -> None:
        self.weights, self.queries, self.context, self.causal = weights, queries, context, causal

    @property
    def cross(self) -> bool:
        return self.context is not None


def _texts(tokens: Any) -> list[str] | None:
    return None if tokens is None else [t["text"] for t in tokens]


def _from_export(doc: Mapping[str, Any]) -> np.ndarray:
    """The weights [h, n, m] in an /export answer of any format."""
    data = doc["data"]
    fmt = doc["format"]
    if fmt == "bertviz":
        layers = data.get("attention", data.get("cross_attention"))
        return np.asarray(layers[0], dtype=np.float64)[0]  # [1, h, n, m] -> [h, n, m]
    if fmt == "circuitsvis":
        return np.asarray(data["attention"], dtype=np.float64)  # [h, n, n]
    if fmt == "transformer-explainer":
        heads = sum(1 for key in data if key.endswith("_attn_softmax"))
        return np.asarray([data[f"block_0_attn_head_{j}_attn_softmax"]["data"] for j in range(heads)],
                          dtype=np.float64)  # h × [n, n] -> [h, n, n]
    raise ValueError(f"an /export answer of format {fmt!r} is not one this module reads")


def _weights(trace: TraceLike) -> _Weights:
    if isinstance(trace, Trace):
        doc: Mapping[str, Any] = trace.raw
        weights = trace.stages["weights"].array()  # [h, n, m]; a KeyError says which stages there are
        queries = trace.texts
    elif isinstance(trace, Mapping):
        doc = trace
        if "format" in doc and "data" in doc:
            weights = _from_export(doc)
        else:
            stages = doc.get("stages") or {}
            if "weights" not in stages:
                raise KeyError("this trace has no 'weights' stage: trace it without `stages`, or with 'weights' "
                               f"among them (it has {', '.join(stages) or 'none'})")
            weights = np.asarray(stages["weights"]["values"], dtype=np.float64)  # [h, n, m]
        queries = _texts(doc["tokens"]) or []
    else:
        raise TypeError(f"expected an attention_trace Trace, or a /trace or /export answer as a dict, got "
                        f"{type(trace).__name__}")
    causal = bool((doc.get("config") or {}).get("causal", False))
    return _Weights(weights, queries, _texts(doc.get("context_tokens")), causal)


def _layer(layer: np.ndarray) -> Any:
    """bertviz's attention tensor for one layer [1, h, n, m]: a torch tensor when torch can be imported."""
    try:
        import torch
    except ImportError:
        return layer
    return torch.tensor(layer)  # a copy: float64, as the trace's numbers


def bertviz_kwargs(trace: TraceLike) -> dict[str, Any]:
    """bertviz ``head_view``'s keyword arguments: ``attention`` and ``tokens``, or for cross-attention
    ``cross_attention``, ``encoder_tokens`` (the context: keys) and ``decoder_tokens`` (the sentence: queries).
    The attention is a tuple of one [1, h, n, m] tensor (numpy without torch)."""
    w = _weights(trace)
    kwargs = bertviz_layout(w.weights, w.queries, w.context)
    key = "cross_attention" if w.cross else "attention"
    return {**kwargs, key: tuple(_layer(layer) for layer in kwargs[key])}


def to_bertviz(trace: TraceLike) -> tuple[tuple[Any, ...], list[str]] | dict[str, Any]:
    """What bertviz's ``head_view`` (and ``model_view``) take: ``(attention, tokens)``, attention a tuple of
    one [1, heads, n, n] tensor (this trace is one layer). Cross-attention: the keyword dict of
    :func:`bertviz_kwargs`, for ``head_view(**to_bertviz(t))``."""
    kwargs = bertviz_kwargs(trace)
    if "cross_attention" in kwargs:
        return kwargs
    return kwargs["attention"], kwargs["tokens"]


def to_circuitsvis(trace: TraceLike, *, react: bool = False) -> dict[str, Any]:
    """``circuitsvis.attention.attention_heads``'s keyword arguments: ``attention`` [heads, dest, src]
    (numpy), ``tokens``, ``attention_head_names`` ("Head 0", …) and ``mask_upper_tri`` (true exactly when
    the trace is causal; CircuitsVis would otherwise mask the upper triangle by default).

    ``react=True`` gives the React component's props instead (``attentionHeadNames``, ``maskUpperTri``,
    nested lists), as /export answers them. Cross-attention is refused (ValueError): AttentionHeads draws
    one token list on both axes.
    """
    w = _weights(trace)
    if w.cross:
        raise ValueError("CircuitsVis' attention_heads draws square self-attention (one token list for both "
                         "axes), so it cannot show cross-attention's context keys; use to_bertviz")
    props = circuitsvis_props(w.weights, w.queries, w.causal)
    if react:
        return {**props, "attention": props["attention"].tolist()}
    return {"attention": props["attention"], "tokens": props["tokens"],
            "attention_head_names": props["attentionHeadNames"], "mask_upper_tri": props["maskUpperTri"]}
