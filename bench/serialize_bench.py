"""Section 2: serialization time and bytes; the `stages`/`precision` options; compression.

Serialization: the service's own document (``service.serialize.trace_document``)
encoded by the service's path (orjson with OPT_SERIALIZE_NUMPY on contiguous
float64 arrays) against the stdlib path (``ndarray.tolist()`` then
``json.dumps`` with compact separators). Both are checked to carry the same
values; whether the bytes are identical is reported, not assumed.

Compression: each workload's response body through gzip (levels 1 and 6) and
brotli (qualities 1, 4 and, for bodies up to 1 MB, 11): time to compress, time
to decompress, bytes saved, and the break-even bandwidth
``saved bytes / (compress + decompress time)``: below that link speed the
compressed response arrives sooner; above it, compression only costs CPU.

Section 2 ends with a "block" row: a stack of Transformer blocks of GPT-2 small's proportions
(``block_workload``: GPT-2 small itself when the limits allow it, else the largest stack of d_k 64 and
d_ff 4·d_model they allow, on 64 tokens), whose render / orjson and npz / JSON ratios compare with L's.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

import engine
from service import serialize
from service.settings import Settings

from . import service_path
from .common import Table, fmt_bytes, fmt_rate, fmt_ratio, fmt_time, interleaved, median_time
from .engine_bench import config_of
from .workloads import Workload


def to_lists(o: Any) -> Any:
    """The document with every array as nested lists: what stdlib json needs."""
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, dict):
        return {k: to_lists(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [to_lists(v) for v in o]
    return o


def stdlib_dumps(doc: Any) -> bytes:
    return json.dumps(to_lists(doc), separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def document(w: Workload) -> tuple[Any, Any]:
    if is_stack(w):  # the block's settings are resolved by the request model, as the service does
        t = service_path.validate(w.body_bytes, Settings()).run_trace()
    else:
        t = engine.trace(config_of(w), sentence=w.body["sentence"])
    return t, serialize.trace_document(t, include_parameters=w.include_parameters)


# ---------------------------------------------------------------- a stack of blocks

#: GPT-2 small: d_model 768, 12 heads (d_k 64), 12 layers, d_ff 4·d_model, here on 64 tokens
GPT2_SMALL = {"d_model": 768, "num_heads": 12, "num_layers": 12}
BLOCK_TOKENS = 64


def is_stack(w: Workload) -> bool:
    return "block" in w.extra


def stack_numbers(w: Workload, settings: Settings | None = None) -> int | None:
    """The numbers the service counts for a stack's request (None when the limits refuse it)."""
    from pydantic import ValidationError

    try:
        return service_path.validate(w.body_bytes, settings or Settings()).value_count
    except ValidationError:
        return None


def _gpt2_shaped(d_model: int, num_layers: int) -> Workload:
    return Workload("block", BLOCK_TOKENS, d_model, d_model // 64, causal=True,
                    extra={"block": "gpt2", "num_layers": num_layers})


def block_workload(settings: Settings | None = None) -> Workload:
    """GPT-2 small's shape on 64 tokens if the limits allow it; else the largest stack of its proportions they
    allow (d_k 64, d_ff 4·d_model, the gpt2 preset): the most numbers over d_model and layers."""
    s = settings or Settings()
    small = _gpt2_shaped(GPT2_SMALL["d_model"], GPT2_SMALL["num_layers"])
    if stack_numbers(small, s) is not None:
        return Workload("block", BLOCK_TOKENS, small.d_model, small.num_heads, causal=True, extra=small.extra,
                        note="GPT-2 small's shape")
    best: tuple[int, int, int] = (0, 0, 0)
    for d_model in range(64, s.max_d_model + 1, 64):
        for layers in range(1, GPT2_SMALL["num_layers"] + 1):
            count = stack_numbers(_gpt2_shaped(d_model, layers), s)
            if count is None:
                break
            best = max(best, (count, d_model, layers))
    count, d_model, layers = best
    w = _gpt2_shaped(d_model, layers)
    return Workload("block", BLOCK_TOKENS, d_model, w.num_heads, causal=True, extra=w.extra,
                    note=f"GPT-2 small (d_model 768, 12 heads, 12 layers) is refused by the limits, so the largest "
                         f"stack of its proportions they allow ({count:,} numbers)")


def bytes_check(a: bytes, b: bytes) -> str:
    if a == b:
        return "identical"
    if orjson.loads(a) != json.loads(b):
        return "VALUES DIFFER"
    # Same numbers; count those written differently (orjson 0.0000307 vs json 3.07e-05).
    ta = a.replace(b"[", b",").replace(b"]", b",").split(b",")
    tb = b.replace(b"[", b",").replace(b"]", b",").split(b",")
    diff = sum(1 for x, y in zip(ta, tb, strict=True) if x != y) if len(ta) == len(tb) else -1
    return f"same values, {diff:,} numbers spelled differently" if diff >= 0 else "same values, spelled differently"


def run_serialization(workloads: list[Workload], repeats: int, budget_s: float, results: dict[str, Any],
                      skip_stdlib: set[str] | None = None, *, stack: bool = True) -> Table:
    """Section 2, one row per workload and, with ``stack``, a last row for a stack of blocks ("block",
    :func:`block_workload`), whose ratios compare with L's."""
    if stack and not any(is_stack(w) for w in workloads):
        workloads = [*workloads, block_workload()]
    table = Table("2. Serialization per workload (median)",
                  ["workload", "numbers", "response bytes", "orjson (service)", "stdlib json of nested lists",
                   "stdlib / orjson", "same output?", "whole render in process", "render / orjson",
                   "npz bytes", "whole render as npz", "npz / JSON render"])
    s = Settings()
    for w in workloads:
        _, doc = document(w)
        a = serialize.dumps(doc)
        with_stdlib = w.name not in (skip_stdlib or set())
        b = stdlib_dumps(doc) if with_stdlib else b""
        check = bytes_check(a, b) if with_stdlib else "– (--quick)"
        raw = w.body_bytes

        def render(raw: bytes = raw) -> bytes:
            return service_path.render(raw, s)

        def render_npz(raw: bytes = raw) -> list[bytes]:
            return service_path.render_npz(raw, s)

        if render() != a:
            check += "; render_trace differs from trace_document!"
        npz_size = len(render_npz())
        big = w.n_tokens >= 128 or is_stack(w)
        fns: list[Callable[[], Any]] = [lambda: serialize.dumps(doc), render, render_npz]
        if with_stdlib:
            fns.append(lambda: stdlib_dumps(doc))
        t_orjson, t_render, t_npz, *rest = interleaved(fns, max(3, repeats // 3) if big else repeats,
                                                       budget_s=budget_s)
        t_std = rest[0] if rest else None
        results[w.name] = {"bytes": len(a), "stdlib_bytes": len(b), "orjson_s": t_orjson, "stdlib_s": t_std,
                           "render_s": t_render, "same_output": check, "npz_bytes": npz_size, "render_npz_s": t_npz}
        count = stack_numbers(w) if is_stack(w) else w.numbers
        if is_stack(w):
            results[w.name] |= {"numbers": count, "shape": w.shape + f", {w.extra['num_layers']} layers, gpt2",
                                "note": w.note}
        table.add(w.name, f"{count:,}", f"{len(a):,}", fmt_time(t_orjson), fmt_time(t_std),
                  fmt_ratio(t_std / t_orjson) if t_std else "–", check, fmt_time(t_render),
                  fmt_ratio(t_render / t_orjson), f"{npz_size:,}", fmt_time(t_npz), fmt_ratio(t_npz / t_render))
    for w in workloads:
        if is_stack(w):
            table.notes.append(f"block = a stack of Transformer blocks, {w.shape}, the gpt2 preset, "
                               f"{w.extra['num_layers']} layers, d_ff {4 * w.d_model}: {w.note}")
    table.notes.append("orjson = service.serialize.dumps(trace_document(...)) (OPT_SERIALIZE_NUMPY); stdlib = "
                       "ndarray.tolist() + json.dumps(separators=(',', ':'), ensure_ascii=False), timed together")
    table.notes.append("whole render = TraceRequest.model_validate_json + the service's render_trace "
                       "(validate, trace, document, encode): the service's work for one request without HTTP")
    table.notes.append("whole render as npz = the same for Accept: application/x-npz (service/npz.py): every "
                       "array as exact float64 bytes in an uncompressed zip instead of decimal text")
    table.notes.append("\"spelled differently\": orjson writes small magnitudes positionally "
                       "(-0.000030694177521364736) where json writes -3.0694177521364736e-05: the same float64 "
                       "on parsing, different bytes")
    return table


OPTION_CASES: list[tuple[str, dict[str, Any]]] = [
    ("all stages, exact (default)", {}),
    ('stages ["weights"]', {"stages": ["weights"]}),
    ("precision 6", {"precision": 6}),
    ('stages ["weights"], precision 4', {"stages": ["weights"], "precision": 4}),
]


def run_options(w: Workload, repeats: int, budget_s: float, results: dict[str, Any]) -> Table:
    """Request options that cut the work and the bytes: in-process render time (validate, trace, encode)."""
    table = Table(f"2b. Request options at {w.name} ({w.shape}): validated request → response bytes, in process",
                  ["options", "response bytes", "bytes vs default", "render time", "time vs default"])
    s = Settings()
    fns, sizes, labels = [], [], []
    for label, extra in OPTION_CASES:
        raw = orjson.dumps({**w.body, **extra})
        try:
            service_path.validate(raw, s)
        except Exception as e:  # noqa: BLE001 - an option the models do not (yet) accept
            table.notes.append(f"{label}: skipped ({type(e).__name__}: {str(e).splitlines()[0]})")
            continue

        def fn(raw: bytes = raw) -> bytes:
            return service_path.render(raw, s)

        sizes.append(len(fn()))
        fns.append(fn)
        labels.append(label)
    times = interleaved(fns, max(3, repeats // 3), budget_s=budget_s)
    for label, size, t in zip(labels, sizes, times, strict=True):
        results[label] = {"bytes": size, "render_s": t}
        table.add(label, f"{size:,}", fmt_ratio(size / sizes[0]), fmt_time(t), fmt_ratio(t / times[0]))
    return table


# ------------------------------------------------------------------ compression


def _gzip(level: int) -> Any:
    def compress(data: bytes) -> bytes:
        c = zlib.compressobj(level, zlib.DEFLATED, 31)  # 31: gzip container, as Content-Encoding: gzip
        return c.compress(data) + c.flush()

    return compress


#: bodies above this skip the slow settings (gzip -6, br q4), whose cost per byte L already shows
BIG_BODY = 20_000_000


def codecs(size: int) -> list[tuple[str, Any, Any]]:
    out = [("gzip -1", _gzip(1), lambda d: zlib.decompress(d, 47))]
    if size <= BIG_BODY:
        out.append(("gzip -6", _gzip(6), lambda d: zlib.decompress(d, 47)))
    try:
        import brotli
    except ImportError:
        return out
    for q in (1, 4, 11):
        if (q == 11 and size > 1_000_000) or (q == 4 and size > BIG_BODY):
            continue  # q11 runs at ~1 MB/s: seconds per large body, never an on-the-fly choice
        out.append((f"br q{q}", lambda d, q=q: brotli.compress(d, quality=q), brotli.decompress))
    return out


def run_compression(bodies: dict[str, bytes], server_s: dict[str, float], repeats: int, budget_s: float,
                    results: dict[str, Any]) -> Table:
    table = Table("2c. Response compression per workload (median)",
                  ["workload", "body", "codec", "compressed", "saved", "compress", "decompress",
                   "compress / server time", "break-even link"])
    try:
        import brotli  # noqa: F401 (only whether the codec is installed)
    except ImportError:
        table.notes.append("brotli rows skipped: the brotli package is not installed (bench/requirements.txt)")
    for name, body in bodies.items():
        results[name] = {}
        for codec, comp, decomp in codecs(len(body)):
            packed = comp(body)
            assert decomp(packed) == body
            reps = repeats if len(body) < 1_000_000 else max(3, repeats // 4)
            t_c = median_time(lambda: comp(body), reps, warmup=0 if len(body) > 1_000_000 else 1, budget_s=budget_s)
            t_d = median_time(lambda: decomp(packed), reps, warmup=0, budget_s=budget_s)
            saved = len(body) - len(packed)
            breakeven = saved / (t_c + t_d)
            srv = server_s.get(name)
            results[name][codec] = {"bytes": len(packed), "compress_s": t_c, "decompress_s": t_d,
                                    "breakeven_bytes_per_s": breakeven}
            table.add(name, fmt_bytes(len(body)), codec, fmt_bytes(len(packed)),
                      f"{100 * saved / len(body):.0f}%", fmt_time(t_c), fmt_time(t_d),
                      fmt_ratio(t_c / srv) if srv else "–", fmt_rate(breakeven))
    table.notes.append("break-even link = saved bytes / (compress + decompress time): on a slower link the "
                       "compressed response arrives sooner; on a faster one compression only costs time")
    table.notes.append("compress / server time: the CPU a worker would add per request, against the time the "
                       "service takes to render that response in process (section 2, whole render)")
    table.notes.append(f"bodies over {BIG_BODY // 1_000_000} MB skip gzip -6 and br q4, and all over 1 MB skip "
                       "br q11: their cost per byte is the smaller bodies' (seconds per response)")
    return table
