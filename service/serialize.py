"""Engine trace -> JSON bytes.

orjson writes float64 with the shortest representation that round-trips
exactly, and serialises contiguous numpy arrays natively (much faster than
nested lists through the stdlib). It would turn NaN into null, so every
array is checked for finiteness first: a non-finite number is a bug, and it
fails the request loudly instead of reaching a grader as null.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson

from engine import Trace
from engine.decoding import DecodeStep, GenerationStep
from engine.lm import SHOWN_CANDIDATES
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
    return np.where(mask, None, _array(values, where, precision, finite)).tolist()  # object array: floats and None


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
        doc["parameters"] = {name: _array(a, name, precision, finite) for name, a in t.parameters.stacked().items()}
    elif include_parameters and parameters_layout == "torch":
        p = t.parameters
        d_model = t.config.d_model
        stacked = np.concatenate([W.reshape(-1, d_model) for W in (p.W_Q, p.W_K, p.W_V)])  # -> [3·d_model, d_model]
        doc["parameters"] = {"in_proj_weight": _array(stacked, "in_proj_weight", precision, finite),
                             "out_proj.weight": _array(p.W_O, "out_proj.weight", precision, finite)}
    elif include_parameters:
        p = t.parameters
        doc["parameters"] = {name: _array(getattr(p, name), name, precision, finite)
                             for name in ("W_Q", "W_K", "W_V", "W_O")}
    if t.cross:
        doc["context_tokens"] = tokens_document(t.context_tokens)
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
    """The request's settings with defaults filled in, and the derived sizes."""
    cfg = t.config
    doc: dict[str, Any] = {
        "d_model": cfg.d_model,
        "num_heads": cfg.num_heads,
        "seed": cfg.seed,
        "scale": cfg.scale,
        "causal": cfg.causal,
        "positional_encoding": cfg.positional_encoding,
        "include_parameters": include_parameters,
        "stages": [sid for sid in t.stages if sid in stages] if stages is not None else None,
        "precision": precision,
        "d_k": cfg.d_k,
        "scale_factor": cfg.scale_factor,
        "n_tokens": t.n_tokens,
        "n_parameters": t.parameters.n_parameters,
        "n_matrices": t.parameters.n_matrices,
    }
    # A variant's settings only when it is used: engine 1.0 answers keep their exact shape.
    if cfg.rope:
        doc |= {"rope_base": cfg.rope_base, "rope_pairing": cfg.rope_pairing}
    if cfg.num_kv_heads is not None:
        doc |= {"num_kv_heads": cfg.kv_heads, "query_heads_of_kv_head": [list(g) for g in cfg.query_heads_of_kv_head],
                "kv_cache_bytes_per_token": cfg.kv_cache_bytes_per_token}
    if cfg.window is not None:
        doc["window"] = cfg.window
    if t.cross:
        doc["n_context_tokens"] = t.n_context
    if cfg.has_block:  # the stack's settings as resolved: the preset's choices and the defaults filled in
        doc |= {"num_layers": cfg.num_layers, "block": cfg.block, "norm": cfg.norm_kind,
                "norm_position": "pre" if cfg.pre_norm else "post", "ffn": cfg.ffn_kind, "d_ff": cfg.ff_width,
                "norm_eps": cfg.eps, "norm_weights": "seeded" if cfg.seeded_norm else "unit"}
    if cfg.constructed:  # which heads are built by hand (engine.constructed)
        doc |= {"head_weights": list(cfg.head_kinds), "sharpness": cfg.sharpness}
    if cfg.has_lm_head:
        doc |= {"lm_head": cfg.lm_head, "temperature": cfg.temperature, "n_vocabulary": len(t.vocabulary or ())}
    return doc


#: a document with more numbers than this is encoded a piece of at most this many numbers at a time
#: (~2 MB of JSON, a few ms each): see dumps
_PIECE = 131_072


def dumps(doc: Any, numbers: int | None = None) -> bytes:
    """``doc`` as JSON bytes, exactly as ``orjson.dumps`` writes it.

    ``numbers``: how many numbers the caller already knows the document's arrays hold (a trace's
    ``trace_value_count``); its strings and scalars add a few per stage and token, so up to half the
    limit below it is encoded in one call without counting (~12 µs of an S answer).

    A large document is encoded a piece at a time (each stage's arrays, split along their first axis),
    then joined: the same bytes (tests/test_serialize.py), ~0-15 % more CPU, but orjson holds the
    interpreter lock only for a piece at a time. In one call it held it for the whole 40 MB answer
    (60-90 ms, 170 ms on a loaded machine), and the worker's event loop and its /health lane waited that
    long (measured: /health p99 414 ms under large traces)."""
    if (numbers is not None and numbers <= 2 * _PIECE) or _numbers(doc) <= 4 * _PIECE:
        return orjson.dumps(doc, option=_OPTS)
    out: list[bytes] = []
    _encode(doc, out)
    return b"".join(out)


#: values that count as one number, matched by exact type before any isinstance (the fast path)
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _numbers(v: Any) -> int:
    """About how many values ``v`` holds (a list is taken to be as its first item throughout).

    It runs on every answer, so a dict's scalar members are counted without a call each: an S answer
    has ~150 members, and one call per member cost ~30 µs of a ~350 µs request."""
    kind = type(v)
    if kind is dict:
        n = 0
        for x in v.values():
            n += 1 if type(x) in _SCALARS else _numbers(x)
        return n
    if kind is np.ndarray:
        return v.size
    if kind is list or kind is tuple:  # a stage's axes and shape are tuples
        return len(v) * (1 if type(v[0]) in _SCALARS else max(1, _numbers(v[0]))) if v else 0
    if isinstance(v, np.ndarray):
        return v.size
    if isinstance(v, dict):
        return sum(_numbers(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return len(v) * max(1, _numbers(v[0])) if v else 0
    return 1


def _encode(v: Any, out: list[bytes]) -> None:
    if _numbers(v) <= _PIECE:
        out.append(orjson.dumps(v, option=_OPTS))
    elif isinstance(v, dict):
        sep = b"{"
        for key, x in v.items():
            out.append(sep + orjson.dumps(key) + b":")
            _encode(x, out)
            sep = b","
        out.append(b"}")
    elif (isinstance(v, np.ndarray) and v.ndim == 1) or (isinstance(v, (list, tuple)) and type(v[0]) in _SCALARS):
        # a flat run of numbers (an array's axis, or a list of floats and nulls): slices of _PIECE. One piece
        # per number cost ~2 KB each in orjson's output buffers: 19 GB for a list of 9 × 524,289 numbers.
        out.append(b"[" + b",".join(orjson.dumps(v[i:i + _PIECE], option=_OPTS)[1:-1]
                                    for i in range(0, len(v), _PIECE)) + b"]")
    else:  # a list, a tuple, or an array of 2 or more axes (its rows are C-contiguous, as orjson needs)
        sep = b"["
        for x in v:
            out.append(sep)
            _encode(x, out)
            sep = b","
        out.append(b"]")
