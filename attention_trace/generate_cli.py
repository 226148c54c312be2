"""``attention-trace generate SENTENCE --tokens N``: a stack's language-model head generates N tokens, each
printed with its probability and the candidates it was chosen from (POST /trace with ``generate``)."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from engine.fields import GENERATE_OPTIONS
from engine.layer import BLOCK_PRESETS

from .cli_common import EXIT_OK, connection_options, make_client
from .render import Style, fmt_percent

#: what the command asks for when an option is left out (the request's own default is none: no generation)
_DEFAULTS = {"generate": 5}

#: the generate command's options as the request fields they set (for error messages)
GENERATE_FLAGS = {
    "/sentence": "SENTENCE",
    **{f"/{f.name}": f.flag for f in GENERATE_OPTIONS},
    "/temperature": "--temperature",
    "/seed": "--weights-seed",
    "/block": "--block",
    "/num_layers": "--layers",
    "/d_model": "--d-model",
    "/num_heads": "--heads",
    "/lm_head": "--lm-head",
    "/candidates": "--candidates",
    "/head_weights": "--head-weights",
    "/causal": "--block",
}


def add_parser(sub: Any) -> None:
    g = sub.add_parser(
        "generate",
        help="generate tokens with a stack's language-model head, step by step",
        description="Generate --tokens N tokens after SENTENCE with a stack of blocks and its "
        "language-model head (tied to the token embeddings unless --lm-head seeded), "
        "each through a KV cache per layer, and print each step: the chosen token, its "
        "probability and the candidates. Greedy unless --seed is given. The vocabulary "
        "is the sentence's distinct tokens, then --candidates.",
    )
    g.add_argument("sentence", metavar="SENTENCE", help="the prompt (quote it)")
    g.add_argument("--temperature", type=float, metavar="T", help="softmax(logits / T) (default 1)")
    for f in GENERATE_OPTIONS:  # /trace's generation options, as declared (engine/fields.py)
        default = _DEFAULTS.get(f.name)
        g.add_argument(
            f.flag,
            type=int if f.kind == "int" else float,
            default=default,
            metavar=f.metavar,
            dest=f.name,
            help=f.help + (f" (default {default})" if default is not None else ""),
        )
    g.add_argument(
        "--weights-seed", type=int, metavar="N", dest="seed", help="seed of the embeddings and weights (default 0)"
    )
    g.add_argument(
        "--block",
        choices=tuple(BLOCK_PRESETS),
        default="gpt2",
        help="the stack's preset (default gpt2; vaswani2017 is made causal)",
    )
    g.add_argument("--layers", type=int, metavar="N", dest="num_layers", help="how many blocks (default 1)")
    g.add_argument("--d-model", type=int, metavar="N", dest="d_model", help="model width (default 24)")
    g.add_argument("--heads", type=int, metavar="N", dest="num_heads", help="number of heads (default 1)")
    g.add_argument(
        "--lm-head",
        choices=("tied", "seeded"),
        default="tied",
        dest="lm_head",
        help="the unembedding: the token embeddings (tied, default) or seeded rows",
    )
    g.add_argument(
        "--candidates", nargs="+", metavar="TOKEN", help="tokens the vocabulary holds besides the sentence's"
    )
    g.add_argument(
        "--head-weights",
        nargs="+",
        metavar="KIND",
        dest="head_weights",
        help="constructed heads, one kind per head (e.g. induction with --layers 2 --d-model 64)",
    )
    g.add_argument("--json", action="store_true", help="print the answer's JSON instead")
    connection_options(g)
    g.set_defaults(run=run_generate, flags=GENERATE_FLAGS)


def generate_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"sentence": args.sentence, "block": args.block, "lm_head": args.lm_head}
    if args.block == "vaswani2017":
        body["causal"] = True  # an encoder's preset: generation predicts from the tokens before
    for name in ("seed", "num_layers", "d_model", "num_heads", "candidates", "head_weights"):
        if getattr(args, name) is not None:
            body[name] = getattr(args, name)
    return body


def run_generate(args: argparse.Namespace, out: TextIO) -> int:
    with make_client(args) as client:
        doc = client.generate(
            generate_body(args),
            tokens=args.generate,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            sample_seed=args.sample_seed,
        )
    if args.json:
        out.write(json.dumps(doc, ensure_ascii=False) + "\n")
        return EXIT_OK
    out.write(render_generation(doc, args.sentence, Style.for_stream(out, getattr(args, "color", "auto"))) + "\n")
    return EXIT_OK


def render_generation(doc: dict[str, Any], sentence: str, style: Style) -> str:
    c = doc["config"]
    how = "greedy" if c.get("sample_seed") is None else f"sampled, seed {c['sample_seed']}"
    filters = "".join(f", {k.replace('_', '-')} {c[k]}" for k in ("top_k", "top_p") if k in c)
    lines = [
        f"{sentence}  →  {' '.join(s['token'] for s in doc['generation'])}",
        f"({c['block']}, {c['num_layers']} layer(s), lm_head {c['lm_head']}, temperature {c['temperature']:g}, "
        f"{how}{filters}; vocabulary of {c['n_vocabulary']})",
    ]
    for i, s in enumerate(doc["generation"], 1):
        candidates = ", ".join(f"{k['token']} {fmt_percent(k['probability'], 1)}" for k in s["candidates"][:5])
        lines.append(
            f"step {i} (position {s['position']}): {style.bold(s['token'])} "
            f"p = {fmt_percent(s['probability'], 1)}   candidates: {candidates}"
        )
    return "\n".join(lines)
