"""attention-trace: the attention walkthrough of one query token, /check, /explain and /export, from a shell.

    attention-trace "the cat sat"                      one table per head for the query "cat" (= trace)
    attention-trace trace "the cat sat" --query the --heads 4 --causal --head 2
    attention-trace trace "the cat sat" --json         the full trace as JSON (--stages to pick some)
    attention-trace trace --tokens the cat sat --inject-bug NAME   (a known bug, GET /version)
    attention-trace check submission.json              a /check request body from a file; prints the verdict
    attention-trace explain "the cat sat" cat,sat      one cell's arithmetic, number by number
    attention-trace export "the cat sat" bertviz       the trace in an attention viewer's input format
    attention-trace html "the cat sat" trace.html      the viewer's offline page for this trace

Without --url it computes in this process (no server needed); with --url it
calls that service. A trace prints one thing: the table, --json, --export,
--npz, --html or --explain (whose --json is its own answer); asking for two
is a usage error. Exit status:
0 success (check: passed), 1 check: not passed, 2 usage or validation error
(the problem is printed to stderr), 3 the service failed or could not be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from .cli_common import (
    EXIT_NOT_PASSED,
    EXIT_OK,
    EXIT_SERVICE,
    EXIT_USAGE,
    PROG,
    Style,
    UsageError,
    _rjust,
    _visible_len,
    connection_options,
    fmt_number,
    fmt_percent,
    fmt_vector,
    make_client,
    percent_decimals,
    read_submission,
    resolve_query,
    write_file,
)
from engine.layer import BLOCK_PRESETS, FFN_KINDS, NORM_KINDS, NORM_POSITIONS, NORM_WEIGHTS, preset_fields

from .client import CheckResult, ClientError, ProblemError, Trace, TransportError
from .explain_cli import run_explain

#: the stages the walkthrough table reads
TABLE_STAGES = ["scores", "scaled_scores", "masked_scores", "weights", "context"]
#: how many keys the seed-style row layout shows before "auto" switches to one key per line
ROW_LAYOUT_MAX_KEYS = 8
#: the formats of --export and of the export subcommand (POST /export)
EXPORT_FORMATS = ("bertviz", "circuitsvis", "transformer-explainer")
#: the subcommands; anything else first is a sentence to trace
COMMANDS = ("trace", "check", "explain", "export", "html")

# Request fields as the command-line options that set them (for error messages).
FIELD_FLAGS = {"/sentence": "SENTENCE", "/d_model": "--d-model", "/num_heads": "--heads", "/seed": "--seed",
               "/scale": "--no-scale", "/causal": "--causal", "/positional_encoding": "--rope",
               "/rope_base": "--rope-base", "/rope_pairing": "--rope-pairing", "/num_kv_heads": "--kv-heads",
               "/window": "--window", "/context_sentence": "--context", "/decode": "--decode",
               "/head": "--head", "/query": "--explain", "/key": "--explain", "/format": "--export",
               "/tokens": "--tokens", "/stages": "--stages", "/inject_bug": "--inject-bug",
               "/num_layers": "--layers", "/block": "--block", "/norm": "--norm", "/norm_position": "--norm-position",
               "/ffn": "--ffn", "/d_ff": "--d-ff", "/norm_eps": "--norm-eps", "/norm_weights": "--norm-weights",
               "/layer": "--layer", "/interventions": "--ablate", "/patch_sentence": "--patch-from",
               "/head_weights": "--head-weights", "/sharpness": "--sharpness"}
#: the block's request fields, each set by its option of the same name (--layers sets num_layers)
BLOCK_FIELDS = ("num_layers", "block", "norm", "norm_position", "ffn", "d_ff", "norm_eps", "norm_weights")


# --------------------------------------------------------------- walkthrough


def _cell_rows(labels: list[str], cells: list[list[str]], keys: list[str], prefix_of: dict[str, str]) -> list[str]:
    """Seed-style rows: "Label | key → value · key → value", columns aligned across rows."""
    widths = [max(_visible_len(row[j]) for row in cells) for j in range(len(keys))]
    return [prefix_of[label] + " · ".join(f"{k} → {_rjust(row[j], widths[j])}" for j, k in enumerate(keys))
            for label, row in zip(labels, cells)]


def render_walkthrough(t: Trace, query: int, heads: Sequence[int], *, decimals: int = 3,
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


def render_check(r: CheckResult, source: str, style: Style | None = None) -> str:
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


# ----------------------------------------------------------------- arguments


def _trace_options(p: argparse.ArgumentParser, *, sentence_help: str = "the text to split into tokens (quote it)") -> None:
    """SENTENCE (or --tokens) and the request's fields: what every subcommand that traces takes."""
    p.add_argument("sentence", metavar="SENTENCE", nargs="?", help=sentence_help + "; or give --tokens")
    p.add_argument("--tokens", nargs="+", metavar="TOKEN", help="pre-split tokens, used as given, instead of SENTENCE")
    p.add_argument("--heads", type=int, metavar="N", dest="num_heads", help="number of heads (default 1)")
    p.add_argument("--d-model", type=int, metavar="N", dest="d_model", help="model width (default 24)")
    p.add_argument("--seed", type=int, metavar="N", help="seed of the embeddings and weights (default 0)")
    p.add_argument("--no-scale", dest="unscaled", action="store_true", help="do not divide the scores by √d_k")
    p.add_argument("--causal", action="store_true", help="mask every key after its query")
    p.add_argument("--inject-bug", metavar="NAME", dest="inject_bug",
                   help="trace with one known bug injected (the numbers are deliberately wrong, and labelled so)")
    v = p.add_argument_group("attention variants")
    v.add_argument("--rope", action="store_true", help="rotary position embeddings (RoPE) instead of sinusoidal "
                                                        "encodings: q and k are rotated by position")
    v.add_argument("--rope-base", type=float, metavar="B", dest="rope_base", help="RoPE's frequency base (10000)")
    v.add_argument("--rope-pairing", choices=("rotate_half", "interleaved"), dest="rope_pairing",
                   help="RoPE's pairs: rotate_half (Llama, default) or interleaved (RoFormer)")
    v.add_argument("--kv-heads", type=int, metavar="G", dest="num_kv_heads",
                   help="grouped-query attention: G K/V heads shared by the query heads (1 = multi-query)")
    v.add_argument("--window", type=int, metavar="W", help="sliding window (with --causal): each query sees at most "
                                                           "W keys, its own included")
    v.add_argument("--context", metavar="TEXT", dest="context_sentence",
                   help="cross-attention: the keys and values come from this context sentence")
    b = p.add_argument_group("Transformer block (any of these traces a stack of blocks; docs/engine.md)")
    b.add_argument("--block", choices=tuple(BLOCK_PRESETS),
                   help="a preset: vaswani2017 (post-norm LayerNorm, ReLU), gpt2 (pre-norm LayerNorm, GELU tanh; "
                        "sets --causal), llama (pre-norm RMSNorm, SwiGLU; sets --causal and --rope)")
    b.add_argument("--layers", type=int, metavar="N", dest="num_layers",
                   help="how many blocks are stacked (default 1; more needs a block option)")
    b.add_argument("--norm", choices=NORM_KINDS, help="the norms (default: the preset's)")
    b.add_argument("--norm-position", choices=NORM_POSITIONS, dest="norm_position",
                   help="post (2017) or pre (GPT-2, Llama: and a final norm); default: the preset's")
    b.add_argument("--ffn", choices=FFN_KINDS, help="the feed-forward network's activation (default: the preset's)")
    b.add_argument("--d-ff", type=int, metavar="N", dest="d_ff",
                   help="the feed-forward network's width (default 4·d_model; swiglu: Llama's rounding)")
    b.add_argument("--norm-eps", type=float, metavar="E", dest="norm_eps", help="the norms' ε (default: the preset's)")
    b.add_argument("--norm-weights", choices=NORM_WEIGHTS, dest="norm_weights",
                   help="unit (γ = 1, β = 0; the default) or seeded")
    v.add_argument("--decode", action="store_true",
                   help="also show the KV-cache decoding step of the query token (with --causal)")
    k = p.add_argument_group("constructed heads (docs/engine.md)")
    k.add_argument("--head-weights", nargs="+", metavar="KIND", dest="head_weights",
                   help="each head's weights, one per head: seeded, previous_token, same_token, first_token, "
                        "induction (heads built by hand with a known job)")
    k.add_argument("--sharpness", type=float, metavar="S",
                   help="the constructed heads' scores are S × their closed form (default 10)")
    i = p.add_argument_group("interventions (docs/engine.md, \"Interventions\")")
    i.add_argument("--ablate", action="append", metavar="L.H", type=_layer_head,
                   help="zero head H's output (its context, before W_O) in layer L; repeat for more heads")
    i.add_argument("--patch-from", metavar="SENTENCE", dest="patch_sentence",
                   help="patch each --ablate head from this sentence's clean run (as many tokens) instead of zeroing it")


def _layer_head(text: str) -> tuple[int, int]:
    """--ablate's L.H: a layer and a head, both from 0."""
    layer, dot, head = text.partition(".")
    if not dot or not layer.isdigit() or not head.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not LAYER.HEAD (e.g. 0.1: layer 0, head 1)")
    return int(layer), int(head)


def _display_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--decimals", type=int, default=3, choices=range(0, 13), metavar="N",
                   help="decimals of scores and context (default 3; percentages get two fewer, at least one)")


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subparser per command; ``attention-trace SENTENCE …`` is ``trace``."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Trace multi-head attention number by number: the walkthrough of one query token, a /check "
                    "of your numbers, one cell's arithmetic, a viewer's input format, or the offline page.",
        epilog=f"'{PROG} SENTENCE …' is '{PROG} trace SENTENCE …'. To trace a sentence that is a command's name, "
               f"write '{PROG} trace check' (or '{PROG} -- check'). Each command's --help lists its options. "
               "Exit status: 0 ok (check: passed), 1 check: not passed, 2 usage or validation error, "
               "3 service error.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    t = sub.add_parser("trace", help="the walkthrough of one query token (or the trace as JSON, npz, …)",
                       description="Print the attention walkthrough of one query token: for each head and each key, "
                                   "the raw score QKᵀ, the scaled score, the softmax weight in percent, and the head's "
                                   "context vector. Or one other output: --json, --export, --npz, --html or --explain.")
    _trace_options(t)
    t.add_argument("--query", "-q", metavar="TOKEN_OR_INDEX",
                   help="the query token: an index (0 = first, -1 = last) or a token's text; '=TEXT' forces text "
                        "(default: the second token, or the first if there is only one)")
    t.add_argument("--head", type=int, metavar="H", help="show only this head (0-based; default: every head)")
    t.add_argument("--layer", type=int, metavar="L", help="in a stack of blocks, the layer whose attention the table "
                   "(or --explain) shows (0-based; default 0)")
    t.add_argument("--stages", nargs="+", metavar="STAGE",
                   help="with --json or --npz: return only these stages (stage ids, e.g. weights context)")
    out = t.add_argument_group("output (one of them; default: the walkthrough table)").add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the full trace JSON instead of the table")
    out.add_argument("--export", choices=EXPORT_FORMATS, metavar="FORMAT",
                     help="print the trace as JSON in an attention viewer's input format: bertviz, circuitsvis or "
                          "transformer-explainer (POST /export; docs/interop.md)")
    out.add_argument("--npz", metavar="FILE", help="write every stage as exact float64 arrays to FILE "
                     "(application/x-npz: np.load reads it; metadata.json holds the rest of the answer)")
    out.add_argument("--html", metavar="FILE", help="write the viewer's page for this trace to FILE: one HTML file "
                     "that opens offline, read-only (the same file as POST /trace/html; needs the service package)")
    t.add_argument("--explain", metavar="QUERY,KEY",
                     help="explain one cell, number by number (q·k, ÷√d_k, exp, ÷Σ, weight·v): QUERY and KEY each a "
                          "token or a 0-based index (KEY from the context with --context); the head is --head "
                          "(default 0); with --json, the /explain answer")
    _display_options(t)
    t.add_argument("--layout", choices=("auto", "rows", "table"), default="auto",
                   help=f"'rows': the classic walkthrough's 'key → value' rows; 'table': one key per line "
                        f"(default auto: rows up to {ROW_LAYOUT_MAX_KEYS} tokens)")
    connection_options(t)
    t.set_defaults(run=run_trace, flags=FIELD_FLAGS)

    c = sub.add_parser("check", help="send a /check request body and print the verdict",
                       description="Send a submission to /check and print the verdict: a pass/fail line per submitted "
                                   "stage, the first wrong stage, the diagnosis (which known bug reproduces the "
                                   "numbers) and the message.",
                       epilog="SUBMISSION.json holds one JSON object, a /check request body: the trace request "
                              "(sentence or tokens, d_model, num_heads, …) plus \"submission\": {stage id: nested "
                              "arrays}. Exit status: 0 passed, 1 not passed, 2 usage or validation error, "
                              "3 service error.")
    c.add_argument("file", metavar="SUBMISSION.json", help="the request body; '-' reads standard input")
    c.add_argument("--rtol", type=float, help="relative tolerance (overrides the file's)")
    c.add_argument("--atol", type=float, help="absolute tolerance (overrides the file's)")
    c.add_argument("--json", action="store_true", help="print the /check response JSON instead of the report")
    connection_options(c)
    c.set_defaults(run=run_check, flags=None)

    e = sub.add_parser("explain", help="one cell's arithmetic (head, query, key), number by number",
                       description="Explain one attention cell number by number: q·k products, ÷ the scale, row max, "
                                   "exp, Σ, the weight, and each key's weight·v (POST /explain).")
    _trace_options(e)
    e.add_argument("cell", metavar="QUERY,KEY", help="the query and key tokens (text or 0-based index), e.g. cat,sat")
    e.add_argument("--head", type=int, metavar="H", help="the head (default 0)")
    e.add_argument("--layer", type=int, metavar="L", help="in a stack of blocks, the layer whose attention the cell "
                   "is in (default 0)")
    e.add_argument("--json", action="store_true", help="print the /explain answer instead")
    _display_options(e)
    connection_options(e)
    e.set_defaults(run=run_explain_command, flags=FIELD_FLAGS)

    x = sub.add_parser("export", help="the trace in an attention viewer's input format (JSON)",
                       description="Print the trace as JSON in the input format of bertviz, CircuitsVis or "
                                   "Transformer Explainer (POST /export; docs/interop.md).")
    _trace_options(x)
    x.add_argument("format", metavar="FORMAT", choices=EXPORT_FORMATS, help=", ".join(EXPORT_FORMATS))
    connection_options(x)
    x.set_defaults(run=run_export_command, flags=FIELD_FLAGS)

    h = sub.add_parser("html", help="the viewer's offline page for one trace",
                       description="Write the viewer's page for this trace: one HTML file that opens offline, "
                                   "read-only (the same file as POST /trace/html; needs the service package).")
    _trace_options(h)
    h.add_argument("file", metavar="FILE", help="where to write it ('-' is standard output)")
    connection_options(h)
    h.set_defaults(run=run_html_command, flags=FIELD_FLAGS)
    return p


def trace_body(args: argparse.Namespace) -> dict[str, Any]:
    """The /trace request that the trace options ask for."""
    if (args.sentence is None) == (args.tokens is None):
        raise UsageError("give exactly one of SENTENCE or --tokens")
    body: dict[str, Any] = {"sentence": args.sentence} if args.tokens is None else {"tokens": list(args.tokens)}
    for name in ("d_model", "num_heads", "seed"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    if args.unscaled:
        body["scale"] = False
    if args.causal:
        body["causal"] = True
    if args.rope:
        body["positional_encoding"] = "rope"
    for name in ("rope_base", "rope_pairing", "num_kv_heads", "window", "context_sentence", "inject_bug",
                 *BLOCK_FIELDS):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    if args.head_weights is not None:
        body["head_weights"] = list(args.head_weights)
    if args.sharpness is not None:
        body["sharpness"] = args.sharpness
    if args.decode:
        body["decode"] = True
    if args.patch_sentence is not None and not args.ablate:
        raise UsageError("--patch-from patches the heads of --ablate: add --ablate L.H")
    if args.ablate:
        kind = "zero" if args.patch_sentence is None else "patch"
        body["interventions"] = [{"target": "head_output", "layer": layer, "head": head, "kind": kind}
                                 for layer, head in args.ablate]
        if args.patch_sentence is not None:
            body["patch_sentence"] = args.patch_sentence
    return body


# ---------------------------------------------------------------------- runs


def run_trace(args: argparse.Namespace, out: TextIO) -> int:
    body = trace_body(args)
    if args.stages is not None and not (args.json or args.npz):
        raise UsageError("--stages picks the stages of --json or --npz; the other outputs need their own stages")
    if args.explain is not None:  # one cell's numbers (attention_trace/explain_cli.py); --json: its JSON
        other = [flag for flag, given in (("--export", args.export), ("--npz", args.npz), ("--html", args.html),
                                          ("--stages", args.stages)) if given is not None]
        if other:
            raise UsageError(f"argument --explain: not allowed with argument {other[0]}")
        return run_explain(args, body, out, args.explain)
    if args.export is not None:  # the trace in a viewer's input format (POST /export)
        return export(args, body, args.export, out)
    if args.html:  # the viewer's offline page, byte for byte what POST /trace/html answers (service/offline_page.py)
        return run_html(args, body, out, args.html)
    if args.stages is not None:
        body["stages"] = list(args.stages)
    elif not args.json and not args.npz:
        # masked_scores exists when the trace is causal: asked for, or set by a preset the request leaves it to
        causal = args.causal or preset_fields(args.block, set(body)).get("causal", False)
        body["stages"] = [s for s in TABLE_STAGES if s != "masked_scores" or causal]
    if args.npz:  # the archive exactly as the service sent it: exact float64 (np.load reads it)
        with make_client(args) as client:
            data = client.trace_npz(body)
        write_file(args.npz, data)
        out.write(f"wrote {len(data)} bytes to {args.npz} (application/x-npz; np.load reads it)\n")
        return EXIT_OK
    with make_client(args) as client:
        t = client.trace(body)
    if args.json:
        out.write(json.dumps(t.raw, ensure_ascii=False) + "\n")
        return EXIT_OK
    query = resolve_query(args.query, t.texts)
    h = t.config.num_heads
    if args.head is not None and not 0 <= args.head < h:
        raise UsageError(f"--head {args.head}: there {'is 1 head (0)' if h == 1 else f'are {h} heads (0 to {h - 1})'}")
    heads = [args.head] if args.head is not None else list(range(h))
    layer = check_layer_option(args.layer, t.config.num_layers)
    style = Style.for_stream(out, args.color)
    text = render_walkthrough(t, query, heads, decimals=args.decimals, layout=args.layout, style=style,
                              sentence=args.sentence, layer=layer)
    injected = t.raw.get("injected_bug")
    if injected:
        text += "\n\n" + style.red(f"Injected bug {injected['name']}") + f": {injected['summary']}. {injected['warning']}"
    if t.raw.get("intervention"):
        text += "\n\n" + render_intervention(t.raw["intervention"], args.decimals, style)
    out.write(text + "\n")
    return EXIT_OK


def render_intervention(doc: dict[str, Any], decimals: int, style: Style) -> str:
    """What the interventions changed: each one, each layer's largest change of the attention's output and of
    the residual stream, and the target token's logit and probability with a language-model head."""
    lines = [style.bold("Interventions") + " (the numbers above are the intervened trace's):"]
    lines += [f"  {iv['description']}" for iv in doc["interventions"]]
    for sid in ("output", "residual_stream"):
        delta = doc["max_abs_delta"].get(sid)
        if delta is not None:
            per = delta if isinstance(delta, list) else [delta]
            lines.append(f"  max |Δ| {sid}: " + ", ".join(fmt_number(x, decimals) for x in per))
    target = doc.get("target")
    if target:
        lines.append(f"  target {target['token']!r}: logit {fmt_number(target['logit']['baseline'], decimals)} -> "
                     f"{fmt_number(target['logit']['intervened'], decimals)}, probability "
                     f"{fmt_percent(target['probability']['baseline'], percent_decimals(decimals))} -> "
                     f"{fmt_percent(target['probability']['intervened'], percent_decimals(decimals))}")
    return "\n".join(lines)


def check_layer_option(layer: int | None, layers: int) -> int:
    """--layer, checked against the trace's layers (0 when not given)."""
    if layer is None:
        return 0
    if not 0 <= layer < layers:
        raise UsageError(f"--layer {layer}: the trace has {layers} layer{'s' if layers != 1 else ''} "
                         f"(0 to {layers - 1})")
    return layer


def export(args: argparse.Namespace, body: dict[str, Any], fmt: str, out: TextIO) -> int:
    with make_client(args) as client:
        doc = client.export(body, format=fmt)
    out.write(json.dumps(doc, ensure_ascii=False) + "\n")
    return EXIT_OK


def run_export_command(args: argparse.Namespace, out: TextIO) -> int:
    return export(args, trace_body(args), args.format, out)


def run_explain_command(args: argparse.Namespace, out: TextIO) -> int:
    return run_explain(args, trace_body(args), out, args.cell)


def run_html_command(args: argparse.Namespace, out: TextIO) -> int:
    return run_html(args, trace_body(args), out, args.file)


def run_html(args: argparse.Namespace, body: dict[str, Any], out: TextIO, path: str) -> int:
    """Trace the request and its scale-flipped comparison (as the viewer does), and write the standalone page."""
    try:
        from service.offline_page import comparison_request, render_html
    except ImportError as e:
        raise UsageError(f"--html needs the service package (service.offline_page): {e}") from None
    with make_client(args) as client:
        t = client.trace(body)
        try:
            alt = client.trace(comparison_request(body)).raw
        except ProblemError:  # too large to trace twice, say: the page says it holds no comparison
            alt = None
    data = render_html(t.raw, body, comparison=alt).encode("utf-8")
    write_file(path, data)
    if path != "-":
        out.write(f"wrote {len(data)} bytes to {path} (the viewer's page for this trace; opens offline)\n")
    return EXIT_OK


def run_check(args: argparse.Namespace, out: TextIO) -> int:
    body = read_submission(args.file)
    for name in ("rtol", "atol"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    with make_client(args) as client:
        r = client.check(body)
    if args.json:
        out.write(json.dumps(r.raw, ensure_ascii=False) + "\n")
    else:
        source = "standard input" if args.file == "-" else args.file
        out.write(render_check(r, source, Style.for_stream(out, args.color)) + "\n")
    return EXIT_OK if r.passed else EXIT_NOT_PASSED


# ---------------------------------------------------------------------- main


def _prefixes(pointer: str) -> list[str]:
    """A JSON pointer and each pointer it is inside, longest first (/a/0/b, /a/0, /a)."""
    parts = pointer.split("/")
    return ["/".join(parts[:k]) for k in range(len(parts), 1, -1)]


def print_problem(e: ProblemError, err: TextIO, flags: dict[str, str] | None = None) -> None:
    """The problem details, without a traceback: title, status, and each error with its field."""
    if e.errors:
        err.write(f"{PROG}: error: {e.title} ({e.status})\n")
        for item in e.errors:
            pointer = item.get("pointer") or ""
            where = pointer or "(the request)"
            flag = next((flags[p] for p in _prefixes(pointer) if p in flags), None) if flags else None
            if flag is not None:  # the pointer, or the field it is inside (/interventions/0/layer: --ablate)
                where = f"{flag} ({pointer})"
            err.write(f"  {where}: {item.get('message', '')}\n")
    else:
        err.write(f"{PROG}: error: {e.title} ({e.status}): {e.detail}\n")
    if e.request_id and e.status >= 500:
        err.write(f"  request id: {e.request_id}\n")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    out, err = sys.stdout, sys.stderr
    if argv[:1] == ["--"]:  # "attention-trace -- check": the sentence "check"
        argv = ["trace", "--", *argv[1:]]
    elif argv and argv[0] not in COMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["trace", *argv]  # the bare form: attention-trace SENTENCE … is trace
    parser = build_parser()
    if not argv:
        parser.print_usage(err)
        err.write(f"{PROG}: error: give a command or a sentence to trace (see '{PROG} --help')\n")
        return EXIT_USAGE
    args = parser.parse_args(argv)  # exits 2 on a usage error (conflicting outputs too), 0 on --help
    run, flags = args.run, args.flags
    try:
        return run(args, out)
    except UsageError as e:
        err.write(f"{PROG}: error: {e}\n")
        return EXIT_USAGE
    except ProblemError as e:
        print_problem(e, err, flags)
        return EXIT_USAGE if 400 <= e.status < 500 else EXIT_SERVICE
    except TransportError as e:
        err.write(f"{PROG}: error: {e}\n")
        return EXIT_SERVICE
    except ClientError as e:
        err.write(f"{PROG}: error: {e}\n")
        return EXIT_SERVICE
    except KeyboardInterrupt:
        err.write(f"{PROG}: interrupted\n")
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, and keep Python's
        # final flush from complaining about the closed pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_NOT_PASSED
    except Exception as e:  # a bug: say so in one line; ATTENTION_TRACE_DEBUG=1 shows the traceback
        if os.environ.get("ATTENTION_TRACE_DEBUG"):
            raise
        err.write(f"{PROG}: internal error: {type(e).__name__}: {e} "
                  "(set ATTENTION_TRACE_DEBUG=1 to see the traceback)\n")
        return EXIT_SERVICE


if __name__ == "__main__":
    sys.exit(main())
