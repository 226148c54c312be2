"""Engine trace -> JSON bytes.

orjson writes float64 with the shortest representation that round-trips
exactly, and serialises contiguous numpy arrays natively (much faster than
nested lists through the stdlib). It would turn NaN into null, so every
array is checked for finiteness first: a non-finite number is a bug, and it
fails the request loudly instead of reaching a grader as null.
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import orjson

from engine import Trace, fields
from engine.decoding import DecodeStep, GenerationStep
from engine.lm import SHOWN_CANDIDATES
from engine.params import BlockParameters, Parameters
from engine.tokenize import Token

SCHEMA_VERSION = "1.3.0"

_OPTS = orjson.OPT_SERIALIZE_NUMPY


class NonFiniteError(RuntimeError):
    """A NaN or infinity was about to be serialised."""


#: below this many numbers in all, a document's arrays are checked as one (numpy's per-call cost dominates)
_ONE_CHECK_MAX = 65_536


class Finite:
    """The arrays of one document, checked for NaN and infinity together before it is encoded.

    Every array is checked, as before; only the number of numpy calls changes. A
    small document's arrays are joined and tested elementwise in one call. A large
    one's are summed one by one (no copy): a sum is finite only if every term is
    (NaN and ±inf propagate through addition), and an overflowing sum of finite
    numbers falls back to the elementwise test, which also names the array.
    """

    def __init__(self) -> None:
        self._arrays: list[tuple[str, np.ndarray]] = []
        self._size = 0

    def add(self, a: np.ndarray, where: str) -> np.ndarray:
        self._arrays.append((where, a))
        self._size += a.size
        return a

    def check(self) -> None:
        if not self._arrays:
            return
        if self._size <= _ONE_CHECK_MAX:
            # Each array flattened (a view, or a small copy), joined: 1-D pieces join faster than axis=None's.
            if np.isfinite(np.concatenate([a.ravel() for _, a in self._arrays])).all():  # -> [size]
                return
        else:
            with np.errstate(over="ignore", invalid="ignore"):  # an overflowing sum is an answer here, not a warning
                if all(math.isfinite(a.sum()) for _, a in self._arrays):
                    return
        for where, a in self._arrays:
            if not np.isfinite(a).all():
                raise NonFiniteError(f"non-finite value in {where}")


def _array(a: np.ndarray, where: str, precision: int | None, finite: Finite) -> np.ndarray:
    """``a`` as orjson writes it: contiguous float64, rounded if asked; ``finite`` checks it with the rest
    of its document."""
    finite.add(a, where)
    if precision is not None:
        a = np.round(a, precision)
    return np.ascontiguousarray(a, dtype=np.float64)


def _masked(values: np.ndarray, mask: np.ndarray, where: str, precision: int | None, finite: Finite) -> list[Any]:
    """Masked entries become None (JSON null); never -inf, NaN or a fill value."""
    # numpy's stubs take no None as a fill value; the object array of floats and None is what is meant
    return np.where(mask, None, _array(values, where, precision, finite)).tolist()  # type: ignore[call-overload]


def trace_document(
    t: Trace,
    *,
    include_parameters: bool = False,
    stages: list[str] | None = None,
    precision: int | None = None,
    parameters_layout: str = "per_head",
    decode: list[DecodeStep] | None = None,
    binary: bool = False,
) -> dict[str, Any]:
    """The /trace response body. ``stages`` selects stage ids; ``precision`` rounds every number.

    ``binary``: for service/npz.py, a masked stage's values stay an array (NaN where masked) and the
    stage gains a boolean ``mask``; the JSON answer has null there instead."""
    wanted = set(stages) if stages is not None else None
    finite = Finite()
    cross = t.cross
    out_stages: dict[str, Any] = {}
    for sid, st in t.stages.items():
        if wanted is not None and sid not in wanted:
            continue
        info, v, mask = st.info, st.values, st.mask
        if isinstance(v, list):  # the token lists
            values: Any = v
            shape: tuple[int, ...] = (len(v),)
        elif mask is not None and binary:
            values = np.where(mask, np.nan, _array(v, sid, precision, finite))
            shape = v.shape
        elif mask is not None:
            values = _masked(v, mask, sid, precision, finite)
            shape = v.shape
        else:
            values = _array(v, sid, precision, finite)
            shape = v.shape
        # axes and shape as tuples, the stage's own: immutable, so shared without a copy (orjson writes a tuple
        # as a JSON array, exactly as a list)
        out = out_stages[sid] = {"step": info.step, "title": info.title, "formula": st.formula, "axes": st.axes,
                                 "shape": shape, "values": values}
        if binary and mask is not None:
            out["mask"] = np.asarray(mask, dtype=bool)
        if cross:  # which token list each axis indexes: the queries' or the context's
            out["axis_tokens"] = st.axis_tokens
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "engine_version": t.engine_version,
        "config": config_document(t, include_parameters=include_parameters, stages=stages, precision=precision),
        "tokens": tokens_document(t.tokens),
        "parameters_digest": t.parameters_digest,
        "stages": out_stages,
        "stats": {
            "axes": ["layer", "head", "query"] if t.config.has_block else ["head", "query"],
            "entropy": _array(t.entropy, "entropy", precision, finite),
            "max_weight": _array(t.max_weight, "max_weight", precision, finite),
        },
    }
    if include_parameters and t.config.has_block:  # each layer's arrays on a leading layer axis, then the final norm's
        stack = cast(BlockParameters, t.parameters)
        doc["parameters"] = {name: _array(a, name, precision, finite) for name, a in stack.stacked().items()}
    elif include_parameters and parameters_layout == "torch":
        p = cast(Parameters, t.parameters)  # a single layer's
        d_model = t.config.d_model
        stacked = np.concatenate([W.reshape(-1, d_model) for W in (p.W_Q, p.W_K, p.W_V)])  # -> [3·d_model, d_model]
        doc["parameters"] = {"in_proj_weight": _array(stacked, "in_proj_weight", precision, finite),
                             "out_proj.weight": _array(p.W_O, "out_proj.weight", precision, finite)}
    elif include_parameters:
        p = cast(Parameters, t.parameters)  # a single layer's
        doc["parameters"] = {name: _array(getattr(p, name), name, precision, finite)
                             for name in ("W_Q", "W_K", "W_V", "W_O")}
    if t.cross:
        doc["context_tokens"] = tokens_document(cast(list[Token], t.context_tokens))  # t.cross: given
    # Options that change the answer's shape are echoed in config only when used (1.0 answers keep theirs).
    if include_parameters and parameters_layout != "per_head":
        doc["config"]["parameters_layout"] = parameters_layout
    if decode is not None:
        doc["config"]["decode"] = True
        doc["decode"] = decode_document(decode, precision, finite)
    if t.config.has_lm_head:  # the token of each column of the logits
        doc["vocabulary"] = t.vocabulary
    finite.check()
    return doc


def generation_document(steps: list[GenerationStep], vocabulary: list[str], precision: int | None
                        ) -> list[dict[str, Any]]:
    """The ``generation`` member: each generated token, how it was chosen (its candidates name their tokens from
    ``vocabulary``) and its rows."""
    finite = Finite()

    def arr(a: np.ndarray, where: str) -> np.ndarray:
        return _array(a, where, precision, finite)

    def num(x: float) -> float:
        return float(x) if precision is None else float(np.round(x, precision))

    out = []
    for s in steps:
        out.append({
            "position": s.position, "token": s.token, "index": s.index, "probability": num(s.probability),
            "candidates": [{"token": vocabulary[j], "index": int(j), "probability": num(s.probs[j]), "sampling_probability": num(p)}
                           for j, p in zip(s.kept[:SHOWN_CANDIDATES], s.kept_probs[:SHOWN_CANDIDATES])],
            "logits": arr(s.logits, f"generation[{s.position}].logits"),
            "probs": arr(s.probs, f"generation[{s.position}].probs"),
            "cache_positions": list(s.cache_positions),
            "weights": arr(s.weights, f"generation[{s.position}].weights")})
    finite.check()
    return out


def tokens_document(tokens: list[Token]) -> list[dict[str, Any]]:
    """The ``tokens`` (and ``context_tokens``) member: each token's index, text and offsets in its sentence."""
    return [{"index": k.index, "text": k.text, "start": k.start, "end": k.end} for k in tokens]


def decode_document(steps: list[DecodeStep], precision: int | None, finite: Finite) -> list[dict[str, Any]]:
    """The ``decode`` member: each generation step's arrays (RoPE's rotated rows are null without RoPE)."""
    def arr(a: np.ndarray | None, where: str) -> np.ndarray | None:
        return None if a is None else _array(a, where, precision, finite)

    return [{"position": s.position, "token": s.token.text, "cache_positions": list(s.cache_positions),
             **{name: arr(getattr(s, name), f"decode[{s.position}].{name}") for name in _DECODE_ARRAYS}}
            for s in steps]


_DECODE_ARRAYS = ("q", "k", "v", "q_rotated", "k_rotated", "k_cache", "v_cache", "scores", "scaled_scores",
                  "weights", "context", "output")


def config_document(
    t: Trace, *, include_parameters: bool = False, stages: list[str] | None = None, precision: int | None = None
) -> dict[str, Any]:
    """The request's settings with defaults filled in, and the derived sizes: each declared field as in use
    (engine/fields.py), a variant's only when it is used, so engine 1.0 answers keep their exact shape."""
    cfg = t.config

    def between(variant: str) -> dict[str, Any]:  # the request's options and the sizes, after the attention's own
        return {} if variant != "attention" else {
            "include_parameters": include_parameters,
            "stages": [sid for sid in t.stages if sid in stages] if stages is not None else None,
            "precision": precision,
            "d_k": cfg.d_k,
            "scale_factor": cfg.scale_factor,
            "n_tokens": t.n_tokens,
            "n_parameters": t.parameters.n_parameters,
            "n_matrices": t.parameters.n_matrices,
        }

    return fields.config_echo(t, between)


def dumps(doc: Any) -> bytes:
    """``doc`` as JSON bytes: orjson, numpy arrays as they are."""
    return orjson.dumps(doc, option=_OPTS)
