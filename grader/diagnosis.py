"""What the grader says about a wrong answer beyond pass/fail, and when it may say it.

* **A known mistake is named only when it explains the student** (:func:`naming`): it must
  reproduce the student's numbers on every configuration where the function is wrong. One that
  matches on some of them only (one token, say, where √n = 1 and several mistakes give the same
  numbers) is reported with exactly those configurations, and the ones where it does not match.
* **A placeholder is not a mistake** (:func:`placeholder`): an answer whose every value is the
  same number, where the reference's values differ (an unfinished ``return np.zeros(...)``), gets
  its own plain message and is never matched to a known mistake.
* **A constant factor** (:func:`constant_factor`, :func:`factor_expression`): the student's values
  are the expected ones times c; when c differs between configurations but is the same expression
  of the sizes on each (√d_k/√n: divided by √n instead of √d_k), that expression is named.
* **Wiring** (:func:`wiring_matches`): when every stage function passes and the layer fails, the
  layer is recomputed from its own inputs with each known mistake (the engine's), to name the one
  the layer makes; a mistake in where the positional encoding goes is also tried as if the layer
  took its x for the bare embeddings (:func:`as_embeddings`): the layer is given x = E + PE.

Numbers are compared by /check's rule with the course's tolerance (``reference.passes``: ``engine.checking``'s).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import engine
from engine import TraceConfig
from engine.checking import Tolerance
from engine.layer import initial_state, layer_steps, run, swapped

from .config import Configuration
from .reference import passes

#: the sizes a constant factor may be an expression of
SIZES = ("n", "d_k", "d_model", "h")
#: relative agreement of a factor with an expression of the sizes (the factor is a least-squares fit of
#: numbers that passed the tolerance, so it is not exact)
FACTOR_MATCH = 1e-4


def as_embeddings(bug: engine.Bug) -> bool:
    """A known mistake in which stages get the positional encoding (a step after x reads the bare embeddings
    E): a layer given x = E + PE makes it by taking its x for E, so it is recomputed with E replaced by x."""
    # the attention's mistakes replace whole Steps (a Rewrite is a block's, and BUGS holds none)
    return (all(s.name != "input" for s in bug.replaces)
            and any("token_embedding" in s.inputs for s in bug.replaces))  # type: ignore[union-attr]  # see above


def engine_trace(c: Configuration, seed: int) -> engine.Trace:
    """The engine's trace of one configuration with its weights (scaled by ``weight_scale``); in a block course,
    the one-block stack's (``block.block_trace``)."""
    if c.block is not None:
        from .block import block_trace

        return block_trace(c, seed)
    config = TraceConfig(d_model=c.d_model, num_heads=c.num_heads, causal=c.causal, seed=seed)
    return engine.trace(config, sentence=c.sentence, tokens=None if c.tokens is None else list(c.tokens),
                        parameters=c.parameters(seed))


# ----------------------------------------------------------------- placeholders


def placeholder(values: np.ndarray, null: np.ndarray, expected: np.ndarray) -> tuple[str, str] | None:
    """(detail, redacted) when every value the student gave is one and the same number while the
    reference's values are not; None otherwise. ``expected`` holds NaN where the reference masks."""
    shown = values[~null]
    want = expected[np.isfinite(expected)]
    if shown.size < 2 or want.size < 2:
        return None
    if np.ptp(shown) != 0.0:
        return None
    spread = float(np.ptp(want))
    if spread <= 1e-9 * max(1.0, float(np.abs(want).max())):
        return None  # the reference is constant here too (one token's weights are all 1)
    c = float(shown[0])
    what = "0" if c == 0.0 else f"{c:.6g}"
    return (f"every value is {what}, but the expected values differ: this looks like a placeholder (an unfinished "
            "function that returns zeros or a constant), so no known mistake is matched to it",
            "every value is the same number, but the expected values differ (an unfinished placeholder?)")


# ----------------------------------------------------------------- constant factors


def constant_factor(sid: str, expected: np.ndarray, got: np.ndarray, null: np.ndarray, tol: Tolerance) -> float | None:
    """c when the student's values are the expected ones times one constant c ≠ 1 (within the tolerance);
    ``expected`` holds NaN where the reference masks."""
    exp_mask = np.isnan(expected)
    if got.shape != expected.shape:
        return None
    with np.errstate(all="ignore"):
        pairs = ~exp_mask & ~null & np.isfinite(got)
        e, r = expected[pairs], got[pairs]
        ee = float(e @ e)
        if e.size < 2 or ee == 0.0:
            return None
        c = float(e @ r) / ee
        if not math.isfinite(c) or c == 0.0 or abs(c - 1.0) <= 1e-3:
            return None
        want = np.where(exp_mask, 0.0, expected)
        if not passes(c * want, exp_mask, got, null, tol):
            return None
    return c


def _expressions() -> list[tuple[str, dict[str, float]]]:
    """Expressions of the sizes, simplest first: x^p and x^p·y^q with p, q in {±1/2, ±1}."""
    powers = (0.5, -0.5, 1.0, -1.0)
    out: list[tuple[dict[str, float], int]] = []
    for a in SIZES:
        for p in powers:
            out.append(({a: p}, 1))
    for a, b in itertools.combinations(SIZES, 2):
        for p, q in itertools.product(powers, powers):
            out.append(({a: p, b: q}, 2))
    return [(_show(e), e) for e, _ in out]


def _show(expr: Mapping[str, float]) -> str:
    def term(name: str, p: float) -> str:
        return f"√{name}" if abs(p) == 0.5 else name

    num = [term(k, p) for k, p in expr.items() if p > 0]
    den = [term(k, p) for k, p in expr.items() if p < 0]
    top = "·".join(num) or "1"
    return top if not den else f"{top}/{'·'.join(den)}"


def factor_expression(factors: Sequence[tuple[float, Mapping[str, int]]]) -> tuple[str, dict[str, float]] | None:
    """The one expression of the sizes that gives every (factor, sizes) pair; None when none does or
    more than one of the simplest kind does (the configurations cannot tell them apart)."""
    if len(factors) < 2:
        return None
    found: list[tuple[str, dict[str, float]]] = []
    for text, expr in _expressions():
        if found and len(expr) > len(found[0][1]):
            break
        ok = True
        for c, sizes in factors:
            v = math.prod(float(sizes[k]) ** p for k, p in expr.items())
            if v == 1.0 or abs(c - v) > FACTOR_MATCH * abs(v):
                ok = False
                break
        if ok:
            found.append((text, expr))
    return found[0] if len(found) == 1 else None


def factor_reading(expr: Mapping[str, float]) -> str:
    """What multiplying by the expression means: ``√d_k/√n`` is dividing by √n where the reference divides
    by √d_k."""
    def term(name: str, p: float) -> str:
        return f"√{name}" if abs(p) == 0.5 else name

    num = [term(k, p) for k, p in expr.items() if p > 0]
    den = [term(k, p) for k, p in expr.items() if p < 0]
    if num and den:
        return f"as if you divided by {'·'.join(den)} where the reference divides by {'·'.join(num)}"
    if den:
        return f"as if you divided by {'·'.join(den)} once too often"
    return f"as if you multiplied by {'·'.join(num)}, or left out a division by it"


# ----------------------------------------------------------------- naming


def _names(cnames: list[str]) -> str:
    return ", ".join(f"'{c}'" for c in cnames)


def cannot_show(c: Configuration, n: int) -> set[str]:
    """The known mistakes the engine cannot compute on this configuration (a log-softmax's −inf under a
    mask, say): there they neither match nor fail to match. (A mistake that would change no number there
    is not among them: where the student is wrong, it does not explain them.)"""
    config = TraceConfig(d_model=c.d_model, num_heads=c.num_heads, causal=c.causal)
    out = set()
    for name, bug in engine.BUGS.items():
        err = engine.bugs.refusal(bug, config, n)
        if err is not None and getattr(err, "code", "") == "bug_not_applicable":
            out.add(name)
    return out


def naming(wrong: list[str], matched: Mapping[str, list[str]], summaries: Mapping[str, str],
           unknown: Mapping[str, set[str]] | None = None) -> tuple[list[str], bool]:
    """The lines that name known mistakes for a test whose function is wrong (numbers, not a crash or a
    placeholder) on the configurations ``wrong``; ``matched[c]``: the mistakes that reproduce it on c;
    ``unknown[c]``: those that cannot be computed on c (:func:`cannot_show`), which do not count there.
    A mistake is named plainly only when it matches on every one of them where it can be computed; one
    that matches on some is reported with exactly where it matched and where it did not. Returns (lines,
    whether a mistake was named plainly)."""
    if not wrong:
        return [], False
    unknown = unknown or {}
    order: list[str] = []
    for c in wrong:
        for b in matched.get(c, []):
            if b not in order:
                order.append(b)

    def off(b: str) -> list[str]:
        return [c for c in wrong if b not in matched.get(c, []) and b not in unknown.get(c, set())]

    everywhere = [b for b in order if not off(b)]
    lines = []
    for i, b in enumerate(everywhere):
        what = f": {summaries[b].rstrip('.')}." if summaries.get(b) else "."
        skipped = [c for c in wrong if b in unknown.get(c, set()) and b not in matched.get(c, [])]
        note = (f" (On {_names(skipped)} that mistake cannot be computed, so it was not compared there.)"
                if skipped else "")
        lines.append(f"{'Your numbers match' if i == 0 else 'They also match'} the known mistake '{b}'{what}{note}")
    partial: dict[tuple[tuple[str, ...], tuple[str, ...]], list[str]] = {}
    for b in order:
        if b in everywhere:
            continue
        on = tuple(c for c in wrong if b in matched.get(c, []))
        partial.setdefault((on, tuple(off(b))), []).append(b)
    for (on, off_), names in partial.items():
        missed = list(off_)
        which = " and ".join(f"'{b}'" for b in names)
        lines.append(f"Only on {_names(list(on))} do your numbers match the known mistake{'s' * (len(names) > 1)} "
                     f"{which}; on {_names(missed)}, where this function is wrong too, they do not, so "
                     f"{'neither is' if len(names) > 1 else 'it is not'} what your code does.")
    return lines, bool(everywhere)


# ----------------------------------------------------------------- wiring


def _agrees(values: Mapping[str, Any], answers: Mapping[str, tuple[np.ndarray, np.ndarray]], tol: Tolerance) -> bool:
    for sid, (got, null) in answers.items():
        if sid not in values:
            return False
        want = np.asarray(values[sid], dtype=np.float64)
        if want.shape != got.shape:
            return False
        mask = values.get("excluded") if sid == "masked_scores" else None
        with np.errstate(all="ignore"):
            if not passes(want, mask, got, null, tol):
                return False
    return True


def _as_embeddings(t: engine.Trace, bug: engine.Bug) -> dict[str, Any]:
    """The layer recomputed with ``bug``, taking the layer's given x (the reference's x = E + PE) for the
    token embeddings E: what a layer computes that adds the encoding itself, wrongly."""
    steps = layer_steps(t.config)
    new, _, _ = swapped(steps, bug.replaces)
    weights = {name: getattr(t.parameters, name) for name in ("W_Q", "W_K", "W_V", "W_O")}
    state = initial_state(t.config, [tok.text for tok in t.tokens], weights)
    after = [s.name for s in new].index("token_embedding") + 1
    state["token_embedding"] = np.asarray(t.stages["input"].values, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        run(new, state, after)
    return state


def wiring_matches(t: engine.Trace, answers: Mapping[str, tuple[np.ndarray, np.ndarray]], tol: Tolerance) -> list[str]:
    """The known mistakes that reproduce a layer's answers (stage -> (values, masked)), recomputed from the
    layer's own inputs, in the engine's order."""
    out = []
    explicit = t.input_source == "explicit"  # a block course's attention, traced on its own input
    for bug in engine.applicable_bugs(t.config, t.n_tokens, explicit_input=explicit):
        if _agrees(engine.recompute_values(t, bug), answers, tol):
            out.append(bug.name)
    if explicit:  # no embeddings to take x for: the encoding's mistakes are not the layer's there
        return out
    for name, bug in engine.BUGS.items():
        if not as_embeddings(bug) or name in out or engine.bugs.refusal(bug, t.config, t.n_tokens) is not None:
            continue
        if _agrees(_as_embeddings(t, bug), answers, tol):
            out.append(name)
    return out


def sizes_of(c: Configuration, n: int) -> dict[str, int]:
    return {"n": n, "d_k": c.d_k, "d_model": c.d_model, "h": c.num_heads}
