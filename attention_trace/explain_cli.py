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
from typing import Any, TextIO

from .cli_common import EXIT_OK, UsageError, make_client, resolve_query
from .render import Style, render_explanation


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
