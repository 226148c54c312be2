"""``attention-trace explain SENTENCE QUERY,KEY`` (or ``trace SENTENCE --explain QUERY,KEY``): one
cell's numbers, as readable lines.

QUERY and KEY are each a token's text or a 0-based index, resolved as
``--query`` is (``cli.resolve_query``); KEY indexes the context's tokens under
cross-attention. ``--head H`` picks the head (default 0); ``--json`` prints the
/explain answer instead.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any, TextIO

from .cli_common import (
    EXIT_OK,
    Style,
    UsageError,
    fmt_number,
    fmt_percent,
    fmt_vector,
    make_client,
    percent_decimals,
    resolve_query,
)
from .client import Explanation

#: numbers of a long sum shown before "…"
SHOWN_TERMS = 4


def split_spec(spec: str, queries: list[str], keys: list[str], *, cross: bool = False) -> tuple[int, int]:
    """"QUERY,KEY" as indices; a comma inside a token is allowed (each split point is tried in turn).
    ``cross``: the keys are the context's tokens."""
    source = "context" if cross else "sentence"
    cuts = [i for i, ch in enumerate(spec) if ch == ","]
    if not cuts:
        raise UsageError(f"--explain {spec!r}: give QUERY,KEY (each a token or a 0-based index), "
                         "e.g. --explain cat,sat")
    errors: list[str] = []
    for cut in cuts:
        left, right = spec[:cut], spec[cut + 1:]
        if not left or not right:
            continue
        try:
            return (resolve_query(left, queries, option="--explain query"),
                    resolve_query(right, keys, option="--explain key", source=source))
        except UsageError as e:
            errors.append(str(e))
    raise UsageError(errors[0] if errors else f"--explain {spec!r}: give QUERY,KEY, e.g. --explain cat,sat")


def _terms(values: Sequence[float], decimals: int, what: str = "terms") -> str:
    """a + b − c + … (n terms): a sum as written by hand, the first few terms shown."""
    shown = list(values) if len(values) <= SHOWN_TERMS + 1 else list(values[:SHOWN_TERMS])
    text = fmt_number(shown[0], decimals)
    for v in shown[1:]:
        t = fmt_number(v, decimals)
        text += f" − {t[1:]}" if t.startswith("-") else f" + {t}"
    return text + (f" + … ({len(values)} {what})" if len(shown) < len(values) else "")


def _list(values: Sequence[float], decimals: int, what: str) -> str:
    """a, b, c, … (n what): the first few numbers of a vector."""
    shown = ", ".join(fmt_number(v, decimals) for v in values[:SHOWN_TERMS])
    return shown + (f", … ({len(values)} {what})" if len(values) > SHOWN_TERMS else "")


def _paren(text: str) -> str:
    return f"({text})" if text.startswith("-") else text


def render_explanation(e: Explanation, *, decimals: int = 3, style: Style | None = None,
                       sentence: str | None = None) -> str:
    """The cell's steps as "formula = numbers = value" lines, each with the stage its number comes from."""
    style = style or Style(False)
    d = e.raw
    cfg = e.config

    def num(x: float) -> str:
        return fmt_number(x, decimals)

    s = {step["id"]: step for step in e.steps}
    subject = f'"{sentence}"' if sentence is not None else "the trace"
    head_txt = f"head {e.head}" + (f" (K/V head {d['kv_head']})" if d["kv_head"] != e.head else "")
    keys = d["key_tokens"]
    out = [style.bold(f"{subject}: {head_txt}, query {e.query} {e.query_token!r}, key {e.key} {e.key_token!r}")
           + f" · d_model {cfg.d_model} · {cfg.num_heads} head{'s' if cfg.num_heads != 1 else ''} · d_k {cfg.d_k}"
           + (" · keys from the context" if d["key_source"] == "context_tokens" else "")
           + (f" · layer {e.layer} of {cfg.num_layers}" if e.layer is not None else "")]
    if e.masked:
        out.append(style.red("masked") + f": {e.mask_reason}")
    out.append("")

    p, sc, scl, mx, ex, den, w, con = (s[i] for i in ("products", "score", "scaled", "row_max", "exp", "denominator",
                                                      "weight", "contributions"))
    visible_terms = [t for j, t in enumerate(den["values"]) if j not in d["masked_keys"]]
    lines: list[tuple[str, str, str]] = [
        ("products", f"{p['formula']} = {_list(p['values'], decimals, 'products')}", f"{p['stage']}, {p['k_stage']}"),
        ("score", f"{sc['formula']} = {_terms(p['values'], decimals, 'products')} = {num(sc['value'])}", sc["stage"]),
        ("scaled", f"{scl['formula']} = {num(sc['value'])} / {num(scl['divisor'])} = {num(scl['value'])}",
         scl["stage"]),
        ("row_max", f"{mx['formula']} = {num(mx['value'])} (key {mx['key']} {mx['key_token']!r})", mx["stage"]),
        ("exp", ("exp(−∞) = 0 (masked)" if e.masked else
                 f"{ex['formula']} = exp({num(scl['value'])} − {_paren(num(mx['value']))}) = {num(ex['value'])}"),
         ex["stage"]),
        ("denominator", f"Σⱼ exp(scaled_j − row_max) = {_terms(visible_terms, decimals)} = {num(den['value'])}"
                        + (f" (masked keys {d['masked_keys']} add 0)" if d["masked_keys"] else ""), den["stage"]),
        ("weight", (f"{w['formula']} = {num(ex['value'])} / {num(den['value'])} = {num(w['value'])} "
                    f"({fmt_percent(w['value'], percent_decimals(decimals))})"), w["stage"]),
    ]
    width = max(len(label) for label, _, _ in lines + [("contributions", "", "")])
    for label, text, stage in lines:
        out.append(f"  {label.ljust(width)}  {text}   [{stage}]")
        if label == "score" and not sc["exact"]:
            out.append(f"  {''.ljust(width)}  (the products added in order give {sc['recomputed']!r}, the trace's "
                       f"score is {sc['value']!r}: BLAS sums in its own order)")
    out.append(f"  {'contributions'.ljust(width)}  {con['formula']}   [{con['stage']}]")
    key_width = max(len(k) for k in keys)
    for j, (k, vec) in enumerate(zip(keys, con["values"])):
        prefix = f"  {''.ljust(width)}    {k.ljust(key_width)}  "
        if vec is None:
            out.append(prefix + "masked: no contribution")
            continue
        lead = f"{num(con['weights'][j])} · v_{k} = "
        out.append(prefix + lead + fmt_vector(vec, decimals, len(prefix) + len(lead)))
    prefix = f"  {''.ljust(width)}  context[{e.head}, {e.query}] = Σ = "
    out.append(prefix + fmt_vector(con["vector"], decimals, len(prefix)))
    if not con["exact"]:
        out.append(f"  {''.ljust(width)}  (added in key order the contributions differ from the trace's context by at "
                   f"most {con['max_abs_difference']:.1e}: BLAS sums in its own order)")
    dec = d.get("decode")
    if dec is not None:
        if dec["in_cache"]:
            out.append(f"  KV-cache decoding, step {dec['position']}: score {num(dec['score'])}, weight "
                       f"{num(dec['weight'])} (differences {dec['score_difference']:.1e}, "
                       f"{dec['weight_difference']:.1e})")
        else:
            out.append(f"  KV-cache decoding, step {dec['position']}: {dec['note']}")
    return "\n".join(out)


def run_explain(args: argparse.Namespace, body: dict[str, Any], out: TextIO, spec: str) -> int:
    """Resolve QUERY,KEY against the tokens (one small /trace call), then ask /explain and print it."""
    tokens_body = {k: v for k, v in body.items() if k != "decode"} | {"stages": ["tokens"]}
    with make_client(args) as client:
        t = client.trace(tokens_body)
        queries = t.texts
        context = t.raw.get("context_tokens")
        keys = [k["text"] for k in context] if context else queries
        query, key = split_spec(spec, queries, keys, cross=bool(context))
        layer = getattr(args, "layer", None)  # a stack of blocks: the layer whose attention the cell is in
        e = client.explain(body | ({} if layer is None else {"layer": layer}),
                           head=0 if args.head is None else args.head, query=query, key=key)
    if args.json:
        out.write(json.dumps(e.raw, ensure_ascii=False) + "\n")
    else:
        out.write(render_explanation(e, decimals=args.decimals, style=Style.for_stream(out, args.color),
                                     sentence=args.sentence) + "\n")
    return EXIT_OK
