"""The command line's text: colours, number formats, the walkthrough table, a check's verdict and one cell's
explanation, as ``attention-trace`` prints them and as ``str()`` of a client's Trace, CheckResult and
Explanation shows them.

It imports nothing of the package at run time (the answer types only for type checkers), so that the client,
the command line and the explain command all use it with no import cycle.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import Any, Protocol, TextIO


class Answer(Protocol):
    """A client's answer (attention_trace.client: Trace, CheckResult, Explanation): its document's members read by
    attribute. Named by what it is, not imported: the client imports this module to print its answers."""

    def __getattr__(self, name: str) -> Any: ...

#: how many keys the seed-style row layout shows before "auto" switches to one key per line
ROW_LAYOUT_MAX_KEYS = 8
#: context vectors: numbers a line
CONTEXT_PER_LINE = 8
#: numbers of a long sum shown before "…"
SHOWN_TERMS = 4


# -------------------------------------------------------------------- styling


class Style:
    """ANSI bold/green/red when enabled (a TTY by default, never with NO_COLOR)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    @classmethod
    def for_stream(cls, stream: TextIO, mode: str) -> Style:
        if mode == "always":
            return cls(True)
        if mode == "never":
            return cls(False)
        tty = hasattr(stream, "isatty") and stream.isatty()
        return cls(tty and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb")

    def _wrap(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled else text

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def green(self, text: str) -> str:
        return self._wrap("32", text)

    def red(self, text: str) -> str:
        return self._wrap("31;1", text)


def _visible_len(text: str) -> int:
    return len(re.sub(r"\x1b\[[0-9;]*m", "", text))


def _rjust(text: str, width: int) -> str:
    return " " * max(0, width - _visible_len(text)) + text


# ------------------------------------------------------------------- numbers


def fmt_number(x: float, decimals: int) -> str:
    """Fixed decimals, without a "-0.000"."""
    s = f"{x:.{decimals}f}"
    return s[1:] if s.startswith("-") and float(s) == 0 else s


def fmt_percent(w: float, decimals: int) -> str:
    return fmt_number(100.0 * w, decimals) + "%"


def percent_decimals(decimals: int) -> int:
    """Softmax percentages: two decimals fewer than the scores (3 -> 7.7%), at least one."""
    return max(1, decimals - 2)


def fmt_vector(values: Sequence[float], decimals: int, indent: int) -> str:
    """[a, b, c, …], CONTEXT_PER_LINE numbers a line, continuation lines indented."""
    parts = [fmt_number(v, decimals) for v in values]
    width = max(len(p) for p in parts)
    lines = [", ".join(p.rjust(width) for p in parts[i:i + CONTEXT_PER_LINE])
             for i in range(0, len(parts), CONTEXT_PER_LINE)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


# --------------------------------------------------------------- walkthrough


def _cell_rows(labels: list[str], cells: list[list[str]], keys: list[str], prefix_of: dict[str, str]) -> list[str]:
    """Seed-style rows: "Label | key → value · key → value", columns aligned across rows."""
    widths = [max(_visible_len(row[j]) for row in cells) for j in range(len(keys))]
    return [prefix_of[label] + " · ".join(f"{k} → {_rjust(row[j], widths[j])}" for j, k in enumerate(keys))
            for label, row in zip(labels, cells)]


def render_walkthrough(t: Answer, query: int, heads: Sequence[int], *, decimals: int = 3,
                       layout: str = "auto", style: Style | None = None, sentence: str | None = None,
                       layer: int = 0) -> str:
    """The classic walkthrough's table for one query token, for each of the given heads (in a stack of blocks,
    of ``layer``'s attention)."""
    style = style or Style(False)
    cfg = t.config
    texts = t.texts
    # The keys: the sentence's own tokens, or the context's in cross-attention.
    keys = [k["text"] for k in t.raw["context_tokens"]] if t.raw.get("context_tokens") else texts
    n = len(keys)
    pdec = percent_decimals(decimals)

    def of_layer(a: Any) -> Any:
        """A stack's stages have a leading layer axis: the table shows one layer's."""
        return a[layer] if cfg.stack and a is not None else a

    scores = of_layer(t.array("scores"))  # [head, query, key]
    scaled = of_layer(t.array("scaled_scores"))
    weights = of_layer(t.array("weights"))
    context = of_layer(t.array("context"))  # [head, token, d_k]
    masked = of_layer(t.stages["masked_scores"].mask) if cfg.causal else None  # [head, query, key]
    scale_txt = (f"scores ÷ √{cfg.d_k} = {fmt_number(cfg.scale_factor, decimals)}" if cfg.scale
                 else "scores not scaled (÷ 1)")
    subject = f'"{sentence}"' if sentence is not None else " ".join(texts)
    head_word = "head" if cfg.num_heads == 1 else "heads"
    raw_cfg = t.raw["config"]
    variants = "".join([
        f" · RoPE ({raw_cfg['rope_pairing']}, base {raw_cfg['rope_base']:g})" if "rope_base" in raw_cfg else "",
        f" · {raw_cfg['num_kv_heads']} K/V heads {raw_cfg['query_heads_of_kv_head']}" if "num_kv_heads" in raw_cfg
        else "",
        f" · window {raw_cfg['window']}" if "window" in raw_cfg else "",
        f" · head weights {', '.join(raw_cfg['head_weights'])} (sharpness {raw_cfg['sharpness']:g})"
        if "head_weights" in raw_cfg
        else "",
        f" · cross-attention to {json.dumps(' '.join(keys), ensure_ascii=False)}" if keys is not texts else "",
        f" · {cfg.num_layers} {cfg.norm_position}-norm block{'s' if cfg.num_layers != 1 else ''} "
        f"({cfg.block or 'no preset'}: {cfg.norm}, {cfg.ffn}, d_ff {cfg.d_ff}), layer {layer}'s attention"
        if cfg.stack else "",
    ])
    out = [style.bold(subject) + f" · {len(texts)} token{'s' if len(texts) != 1 else ''} · d_model {cfg.d_model} · "
           f"{cfg.num_heads} {head_word} · d_k {cfg.d_k} · seed {cfg.seed} · {scale_txt}"
           + (" · causal" if cfg.causal else "") + variants]
    out.append(f"Query: {json.dumps(texts[query], ensure_ascii=False)} (token {query})")
    if layout == "auto":
        layout = "rows" if n <= ROW_LAYOUT_MAX_KEYS else "table"
    scale_label = "Scale ÷√d_k" if cfg.scale else "Scale ÷1"
    for h in heads:
        out.append("")
        out.append(style.bold(f"Head {h} of {cfg.num_heads}") if cfg.num_heads > 1 else style.bold("Head 0"))
        is_masked = [bool(masked[h, query, j]) if masked is not None else False for j in range(n)]
        raw = [fmt_number(scores[h, query, j], decimals) for j in range(n)]
        sc = [fmt_number(scaled[h, query, j], decimals) for j in range(n)]
        soft = ["masked" if is_masked[j] else fmt_percent(weights[h, query, j], pdec) for j in range(n)]
        ctx = context[h, query]
        if layout == "rows":
            labels, cells = ["Score QKᵀ", scale_label], [raw, sc]
            if masked is not None:
                labels.append("Mask (window)" if "window" in raw_cfg else "Mask (causal)")
                cells.append(["masked" if m else s for m, s in zip(is_masked, sc)])
            labels.append("Softmax")
            cells.append(soft)
            width = max(len(label) for label in [*labels, "Weight V"])
            prefix_of = {label: f"  {label.ljust(width)} | " for label in [*labels, "Weight V"]}
            out.extend(_cell_rows(labels, cells, keys, prefix_of))
            prefix = prefix_of["Weight V"] + "context = "
            out.append(prefix + fmt_vector(ctx, decimals, len(prefix)))
        else:
            headers = ["#", "key", "score QKᵀ", "scaled ÷√d_k" if cfg.scale else "scaled ÷1"]
            headers += (["mask"] if masked is not None else []) + ["softmax"]
            rows = []
            for j in range(n):
                row = [str(j), keys[j], raw[j], sc[j]]
                if masked is not None:
                    row.append("masked" if is_masked[j] else "")
                row.append(soft[j])
                rows.append(row)
            widths = [max(len(headers[c]), *(len(r[c]) for r in rows)) for c in range(len(headers))]
            left = {1}  # the key column reads left to right; numbers align right
            if masked is not None:
                left.add(4)

            def line(cols: list[str]) -> str:
                return "  " + "  ".join(c.ljust(w) if i in left else c.rjust(w)
                                        for i, (c, w) in enumerate(zip(cols, widths))).rstrip()

            out.append(line(headers))
            out.extend(line(r) for r in rows)
            prefix = "  Weight V: context = "
            out.append(prefix + fmt_vector(ctx, decimals, len(prefix)))
        if t.raw.get("decode"):
            step = t.raw["decode"][query]
            cached = step["cache_positions"]
            out.append(f"  KV-cache decoding, step {query}: the cache holds the keys and values of positions "
                       f"{cached[0]}…{cached[-1]} ({len(cached)} of {len(texts)}); this query's weights over them: "
                       + " ".join(fmt_percent(w, pdec) for w in step["weights"][h]))
    return "\n".join(out)


# --------------------------------------------------------------------- check


def render_check(r: Answer, source: str, style: Style | None = None) -> str:
    """Per-stage pass/fail lines, the first wrong stage, the diagnosis and the message."""
    style = style or Style(False)
    cfg = r.config
    out = [style.bold(f"Check of {source}") + f": {cfg.n_tokens} tokens · d_model {cfg.d_model} · "
           f"{cfg.num_heads} head{'s' if cfg.num_heads != 1 else ''} · d_k {cfg.d_k} · seed {cfg.seed}"
           + ("" if cfg.scale else " · not scaled") + (" · causal" if cfg.causal else "")
           + f" · {r.tolerance}", ""]
    headers = ["step", "stage", "result", "wrong", "message"]
    rows = [[str(s.step), sid, "pass" if s.passed else "FAIL", f"{s.mismatches}/{s.n_values}", s.message]
            for sid, s in r.stages.items()]
    widths = [max(len(headers[c]), *(len(row[c]) for row in rows)) for c in range(4)]
    right = {0, 3}

    def line(cols: list[str], colour: bool) -> str:
        cells = []
        for i, c in enumerate(cols[:4]):
            cell = c.rjust(widths[i]) if i in right else c.ljust(widths[i])
            if colour and i == 2:
                cell = style.green(cell) if c == "pass" else style.red(cell)
            cells.append(cell)
        return "  " + "  ".join(cells + [cols[4]])

    out.append(line(headers, False))
    out.extend(line(row, True) for row in rows)
    out.append("")
    d = r.diagnosis
    if r.passed:
        verdict = style.green("passed")
        first = "none"
        diagnosis = "no bug"
    else:
        verdict = style.red("not passed")
        first = f"{r.first_wrong_stage} (step {r.stages[r.first_wrong_stage].step})" if r.first_wrong_stage else "?"
        diagnosis = f"{d.bug}: {d.summary}" if d.bug else "none of the known bugs"
        if len(d.matches) > 1:
            diagnosis += f" (also matches: {', '.join(m for m in d.matches if m != d.bug)})"
    labels = [("Result", verdict), ("First wrong stage", first), ("Diagnosis", diagnosis), ("Message", r.message)]
    w = max(len(k) for k, _ in labels) + 1
    out.extend(f"{(k + ':').ljust(w)} {v}" for k, v in labels)
    return "\n".join(out)


# ---------------------------------------------------------------- explanation


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


def render_explanation(e: Answer, *, decimals: int = 3, style: Style | None = None,
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
