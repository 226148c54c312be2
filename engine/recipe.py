"""Print the step recipe of any configuration: what it computes, in order, without running it.

    python -m engine.recipe --d-model 8 --heads 2 --rope
    python -m engine.recipe --heads 4 --kv-heads 2 --causal --window 3 --decode
    python -m engine.recipe --causal --bug NAME       (one of engine.BUG_NAMES, or of the block's)
    python -m engine.recipe --d-model 8 --heads 2 --block llama --layers 2 --bug residual_forgotten

One line per step of ``engine.layer.layer_steps``: its number, the value(s) it
writes, the pure function of ``engine.attention`` (or ``engine.bugs``) that
computes them, the values it reads, and its formula as the trace shows it
(``engine.layer.formulas``: every input's formula substituted). With ``--bug``
the bug's wrong steps are swapped in and marked, as ``engine.recompute`` runs
them. Only the engine is needed (numpy).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .bugs import ALL_BUGS, check_bug
from .checks import check_cross_attention, check_decodable
from .errors import EngineError
from .layer import (BLOCK_PRESETS, FFN_KINDS, NORM_KINDS, NORM_POSITIONS, ROPE_PAIRINGS, Step, TraceConfig, formulas,
                    layer_steps, preset_fields, swapped)

#: values every recipe starts from (they are in the state before the first step)
_GIVEN = ("tokens", "n", "seed", "d_model", "num_heads", "d_k", "scale", "W_Q", "W_K", "W_V", "W_O", "kv_group",
          "window", "rope_base")


def _function_name(step: Step) -> str:
    fn = step.fn
    module = getattr(fn, "__module__", "") or ""
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    short = {"engine.attention": "attention", "engine.bugs": "bugs", "engine.layer": "layer",
             "engine.params": "params", "engine.block": "block"}.get(module, module)
    return f"{short}.{name}" if short else name


def describe(steps: tuple[Step, ...], *, wrong: frozenset[str] = frozenset(), given: Sequence[str] = _GIVEN) -> str:
    """The recipe as text: one line per step; ``wrong`` marks the names of swapped-in steps."""
    shown = formulas(steps)
    rows = []
    for i, step in enumerate(steps, 1):
        writes = ", ".join(step.writes)
        call = f"{_function_name(step)}({', '.join(step.inputs)})"
        mark = "✗" if step.name in wrong else " "
        if len(call) > 72:  # a stack's residual_stream reads every layer's output
            call = call[:69] + "…)"
        rows.append((f"{i:>2}{mark}", writes, call, shown.get(step.name, "") if step.formula else ""))
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    lines = [f"starts from: {', '.join(given)}"]
    lines += [f"{n} {writes.ljust(w1)} = {call.ljust(w2)}  {formula}".rstrip() for n, writes, call, formula in rows]
    return "\n".join(lines)


def recipe(config: TraceConfig, *, explicit_input: bool = False, cross: bool = False, decode: bool = False,
           bug: str | None = None, n: int = 3) -> str:
    """The recipe of a configuration (``n`` tokens decide whether a bug changes anything)."""
    steps = layer_steps(config, explicit_input=explicit_input, cross=cross, decode=decode)
    given = list(_GIVEN)
    if config.has_block:  # each layer's weights, named <name>@<layer>, and the norms' ε
        given = [g for g in given if not g.startswith("W_")] + [
            "W_Q@l, W_K@l, W_V@l, W_O@l, W_1@l, W_2@l" + (", W_3@l" if config.gated else "")
            + ", norm1_gamma@l, norm2_gamma@l" + (", norm1_beta@l, norm2_beta@l" if config.norm_kind == "layer_norm"
                                                  else "")
            + (", final_norm_gamma" + (", final_norm_beta" if config.norm_kind == "layer_norm" else "")
               if config.final_norm else ""), "norm_eps"]
    if explicit_input or decode:
        given.append("input")
    if cross:
        given += ["context_tokens", "m"] + (["context_input"] if explicit_input else [])
    if decode:
        given += ["position", "k_cache", "v_cache"]
    wrong: frozenset[str] = frozenset()
    if bug is not None:
        b = check_bug(bug, config, n, explicit_input=explicit_input, n_context=n if cross else None)
        correct = set(steps)
        steps = swapped(steps, b.steps(config))[0]
        wrong = frozenset(s.name for s in steps if s not in correct)
    what = ("one KV-cache decoding step" if decode else "the full trace") + (", cross-attention" if cross else "") \
        + (", x given" if explicit_input else "") + (f", with the bug {bug} (✗)" if bug else "")
    head = (f"{what}: d_model {config.d_model}, {config.num_heads} head(s) of d_k {config.d_k}"
            + (f", {config.kv_heads} K/V head(s)" if config.grouped else "")
            + f", positional_encoding {config.positional_encoding}"
            + (f" ({config.rope_pairing})" if config.rope else "")
            + f", mask {config.mask}" + (f" (window {config.window})" if config.window else "")
            + ("" if config.scale else ", not scaled"))
    if config.has_block:
        head += (f"; {config.num_layers} {config.norm_position or config.preset.norm_position}-norm block(s)"
                 f" ({config.norm_kind}, ffn {config.ffn_kind}, d_ff {config.ff_width}), each layer's values named "
                 "<name>@<layer>")
    return head + "\n" + describe(steps, wrong=wrong, given=given)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.recipe", description="Print the steps a configuration "
                                "computes, in order: each step's output, function, inputs and formula.")
    p.add_argument("--d-model", type=int, default=24, dest="d_model", help="model width (default 24)")
    p.add_argument("--heads", type=int, default=1, dest="num_heads", help="query heads (default 1)")
    p.add_argument("--kv-heads", type=int, dest="num_kv_heads", help="K/V heads (grouped-query attention)")
    p.add_argument("--no-scale", dest="scale", action="store_false", help="do not divide by √d_k")
    p.add_argument("--causal", action="store_true", help="the causal mask")
    p.add_argument("--window", type=int, help="a sliding window (with --causal)")
    p.add_argument("--rope", action="store_true", help="RoPE instead of sinusoidal encodings")
    p.add_argument("--rope-pairing", choices=tuple(ROPE_PAIRINGS), default="rotate_half", dest="rope_pairing")
    p.add_argument("--no-encoding", action="store_true", help="positional_encoding none")
    p.add_argument("--cross", action="store_true", help="cross-attention: keys and values from a context")
    p.add_argument("--input", action="store_true", dest="explicit_input", help="x given (no stages 2-4)")
    p.add_argument("--decode", action="store_true", help="one step of KV-cache decoding (needs --causal)")
    p.add_argument("--layers", type=int, default=1, dest="num_layers", help="stacked blocks (needs a block)")
    p.add_argument("--block", choices=tuple(BLOCK_PRESETS), help="a block preset (llama also sets RoPE and causal, "
                   "gpt2 causal)")
    p.add_argument("--norm", choices=NORM_KINDS, help="the block's norm")
    p.add_argument("--norm-position", choices=NORM_POSITIONS, dest="norm_position", help="post-norm or pre-norm")
    p.add_argument("--ffn", choices=FFN_KINDS, help="the block's feed-forward network")
    p.add_argument("--d-ff", type=int, dest="d_ff", help="the FFN's width (default 4·d_model; Llama's for swiglu)")
    p.add_argument("--bug", choices=tuple(ALL_BUGS), metavar="NAME", help="swap in a known bug's steps")
    p.add_argument("--tokens", type=int, default=3, metavar="N", help="token count, for --bug (default 3)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        given = {"causal"} if args.causal else set()
        if args.rope or args.no_encoding:
            given.add("positional_encoding")
        preset = preset_fields(args.block, given)
        config = TraceConfig(d_model=args.d_model, num_heads=args.num_heads, num_kv_heads=args.num_kv_heads,
                             scale=args.scale, causal=preset.get("causal", args.causal), window=args.window,
                             positional_encoding=preset.get("positional_encoding", "rope" if args.rope else "none"
                                                            if args.no_encoding else "sinusoidal"),
                             rope_pairing=args.rope_pairing, num_layers=args.num_layers, block=args.block,
                             norm=args.norm, norm_position=args.norm_position, ffn=args.ffn, d_ff=args.d_ff)
        if args.cross:
            check_cross_attention(causal=config.causal, window=config.window,
                                  positional_encoding=config.positional_encoding)
        if args.decode:
            check_decodable(causal=config.causal, cross=args.cross, bug=args.bug, block=config.has_block)
        if args.cross and config.has_block:
            raise EngineError("a block's attention is self-attention; drop --cross or the block options")
        print(recipe(config, explicit_input=args.explicit_input, cross=args.cross, decode=args.decode,
                     bug=args.bug, n=args.tokens))
    except EngineError as e:
        print(f"python -m engine.recipe: error: {e.message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
