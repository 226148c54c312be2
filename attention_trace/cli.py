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
from urllib.parse import urlencode

from .cli_common import (
    EXIT_NOT_PASSED,
    EXIT_OK,
    EXIT_SERVICE,
    EXIT_USAGE,
    PROG,
    UsageError,
    connection_options,
    make_client,
    read_submission,
    resolve_query,
    write_file,
)
from engine import fields
from engine.layer import preset_fields

from .client import ClientError, ProblemError, TransportError
from .explain_cli import run_explain
from . import generate_cli
from .render import ROW_LAYOUT_MAX_KEYS, Style, fmt_number, fmt_percent, percent_decimals, render_check, render_walkthrough

#: the stages the walkthrough table reads
TABLE_STAGES = ["scores", "scaled_scores", "masked_scores", "weights", "context"]
#: the formats of --export and of the export subcommand (POST /export)
EXPORT_FORMATS = ("bertviz", "circuitsvis", "transformer-explainer")
#: the subcommands; anything else first is a sentence to trace
COMMANDS = ("trace", "check", "explain", "export", "html", "generate")
#: the viewer's projector text scales (percent) and colour themes (service/static/url-state.js, TEXT_SCALES and
#: THEMES; tests/test_cli.py holds them equal), which ``html --text/--theme`` write into the page's view
TEXT_SCALES = (100, 125, 150, 200)
THEMES = ("system", "light", "dark", "contrast")

#: the options that set a request field but are not trace settings, by the field's pointer (for error messages)
_OPTION_FLAGS = {"/decode": "--decode", "/head": "--head", "/query": "--explain", "/key": "--explain",
                 "/format": "--export", "/stages": "--stages", "/inject_bug": "--inject-bug", "/layer": "--layer",
                 "/interventions": "--ablate", "/patch_sentence": "--patch-from"}
#: request fields as the command-line options that set them (for error messages): the declared ones' own
FIELD_FLAGS = {**{f"/{f.name}": f.flag for f in fields.FIELDS if f.flag is not None}, **_OPTION_FLAGS}


# ----------------------------------------------------------------- arguments


def _add_field_option(group: argparse._ActionsContainer, f: fields.Field) -> None:
    """A declared field's option (engine/fields.py): its flag, metavar, choices and help, and its default in the
    help. Every option defaults to None, which leaves the field out of the request (the service's default)."""
    if f.flag is None:
        return
    if not f.flag.startswith("-"):  # the positional argument
        group.add_argument(f.name, metavar=f.flag, nargs="?", help=f.help)
        return
    if f.switch is not None:  # an option without an argument, which sets the field to one value
        group.add_argument(f.flag, dest=f.name, action="store_const", const=f.switch, help=f.help)
        return
    shown = f"{f.default:g}" if isinstance(f.default, float) else f.default
    options: dict[str, Any] = {"dest": f.name, "metavar": f.metavar,
                               "help": f.help if f.default is None else f"{f.help} (default {shown})"}
    if f.kind in ("int", "float"):
        options |= {"type": int if f.kind == "int" else float, "metavar": f.metavar or "N"}
    elif f.kind == "choice":
        options["choices"] = f.choices
    elif f.kind in ("choices", "tokens", "strings"):
        options["nargs"] = "+"
    group.add_argument(f.flag, **options)


def _trace_options(p: argparse.ArgumentParser) -> None:
    """SENTENCE (or --tokens) and the request's fields: what every subcommand that traces takes. Each declared
    field's option (engine/fields.py) in its variant's group."""
    groups: dict[str | None, argparse._ActionsContainer] = {None: p}
    for v in fields.VARIANTS:
        if v.title not in groups:
            groups[v.title] = p.add_argument_group(v.title)
    for f in fields.FIELDS:
        _add_field_option(groups[fields.variant(f.variant).title], f)
    p.add_argument("--inject-bug", metavar="NAME", dest="inject_bug",
                   help="trace with one known bug injected (the numbers are deliberately wrong, and labelled so)")
    groups[fields.variant("cross").title].add_argument(
        "--decode", action="store_true", help="also show the KV-cache decoding step of the query token (with --causal)")
    groups[fields.variant("interventions").title].add_argument(
        "--ablate", action="append", metavar="L.H", type=_layer_head,
        help="zero head H's output (its context, before W_O) in layer L; repeat for more heads")
    groups[fields.variant("interventions").title].add_argument(
        "--patch-from", metavar="SENTENCE", dest="patch_sentence", help=fields.BY_NAME["patch_sentence"].help)


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
    h.add_argument("--text", type=int, choices=TEXT_SCALES, metavar="PERCENT",
                   help="the page opens at this text scale, for a projector: " + ", ".join(map(str, TEXT_SCALES))
                        + " (default 100; the viewer's text size)")
    h.add_argument("--theme", choices=THEMES, help="the page opens in this colour theme (default: the system's)")
    connection_options(h)
    h.set_defaults(run=run_html_command, flags=FIELD_FLAGS)
    generate_cli.add_parser(sub)
    return p


def trace_body(args: argparse.Namespace) -> dict[str, Any]:
    """The /trace request that the trace options ask for."""
    if (args.sentence is None) == (args.tokens is None):
        raise UsageError("give exactly one of SENTENCE or --tokens")
    body: dict[str, Any] = {}
    for f in fields.FIELDS:  # every declared field whose option was given
        value = getattr(args, f.name, None) if f.flag is not None else None
        if value is not None:
            body[f.name] = list(value) if isinstance(value, list) else value
    if args.inject_bug is not None:
        body["inject_bug"] = args.inject_bug
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
    if args.html:  # the viewer's offline page, byte for byte what POST /trace/html answers (viewer/offline_page.py)
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
        from viewer.offline_page import comparison_request, render_html
    except ImportError as e:
        raise UsageError(f"--html needs the service package (viewer.offline_page): {e}") from None
    with make_client(args) as client:
        t = client.trace(body)
        try:
            alt = client.trace(comparison_request(body)).raw
        except ProblemError:  # too large to trace twice, say: the page says it holds no comparison
            alt = None
    view = {k: v for k, v in (("text", getattr(args, "text", None)), ("theme", getattr(args, "theme", None)))
            if v is not None and v not in (100, "system")}
    data = render_html(t.raw, body, comparison=alt, view=urlencode(view) if view else None).encode("utf-8")
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
