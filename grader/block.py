"""A block course's references, verdicts and diagnosis: one Transformer block per configuration, from the engine.

A configuration of a block course (``[block]`` in the course file) is a one-block stack of the engine
(``engine.trace`` with the block's preset and overrides, ``num_layers`` 1). Its :class:`Reference` holds

* the attention's arrays, from the engine's trace of the attention alone on the block's own attention input
  (x in post-norm, the normalised x in pre-norm) with the layer's weights: the attention's functions are
  checked and diagnosed by ``engine.checking`` exactly as in an attention course (``Reference.trace``);
* the block's stages (``BLOCK_STAGES``) and the inputs each of its functions is called with: every norm's
  input, γ and β, the FFN's input and matrices, the block's x and its weights (``params``);
* ``order``: each stage's place in the block's walkthrough, so that no call is given an input that holds the
  answer of a call not yet made (``core.Grader.plan``).

The block's stages are checked here, by /check's rule (``engine.checking.compare``). A mistake is named by
recomputing with each of the engine's known block mistakes (``engine.bugs.BLOCK_BUGS``):

* a stage function (``layer_norm``, ``rms_norm``, ``ffn``) is given the reference's inputs, so only its own
  steps are recomputed with the mistake swapped in, from those inputs (:func:`function_matches`). The engine's
  ``diagnose`` recomputes the whole stack from the mistake's first step on: right for the first norm, but
  the second norm would then read a residual stream the mistake already changed, not the one it was given;
* ``block`` is given x and the weights, so the whole stack is recomputed (``engine.recompute_values``), with
  every known mistake of the block and of the attention (:func:`block_matches`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, cast

import numpy as np

import engine
from engine import TraceConfig
from engine.bugs import ALL_BUGS, BLOCK_BUGS, LM_BUGS, applicable_bugs
from engine.checking import Tolerance, compare
from engine.layer import base_name, layer_of, swapped
from engine.params import BlockParameters, NormParameters

from .assignment import AXES, BLOCK_STAGES, Reference, reference_from_engine
from .config import Configuration
from .reference import CheckOutcome, StageVerdict, passes

#: each block stage's steps (base names), the ones its function computes
_NORM_STEPS = ("{}_mean", "{}_variance", "{}_mean_square", "{}")
_FFN_STEPS = ("ffn_pre_activation", "ffn_up", "ffn_activation", "ffn_gated", "ffn_output")
_NORMS = ("norm1", "norm2", "final_norm")
#: the language-model head's stage functions and the step each computes
_LM_STEPS = {"lm_head": "logits", "next_token_probs": "next_token_probs"}


def own_bugs(kind: str) -> list[str]:
    """The known mistakes written inside a norm (``kind`` "norm") or the FFN ("ffn"): every step they swap is
    one of that function's. The others (the residual sums, where the norms go, the final norm left out) are
    mistakes of ``block`` itself, which its whole-block recomputation names."""
    if kind in _LM_STEPS:  # the head's: any of its mistakes that swaps that function's step
        return list(LM_BUGS)
    mine = set(_FFN_STEPS) if kind == "ffn" else {s.format(n) for n in _NORMS for s in _NORM_STEPS}
    return [name for name, bug in BLOCK_BUGS.items()
            if bug.replaces_for is None and bug.replaces and {base_name(r.name) for r in bug.replaces} <= mine]


def about_position(name: str) -> bool:
    """Whether the known mistake of that name is in the positional encoding: where it is added, or how often."""
    bug = engine.BUGS.get(name)
    # the attention's mistakes replace whole Steps (a Rewrite is a block's, and BUGS holds none)
    return bug is not None and any(s.name == "input" or "token_embedding" in s.inputs  # type: ignore[union-attr]
                                   for s in bug.replaces)


def block_trace(c: Configuration, seed: int) -> engine.Trace:
    """The engine's one-block stack of a block course's configuration, its attention's weights times
    ``weight_scale``."""
    config = c.trace_config(seed)
    tokens = None if c.tokens is None else list(c.tokens)
    t = engine.trace(config, sentence=c.sentence, tokens=tokens)
    if c.weight_scale == 1.0:
        return t
    s = c.weight_scale
    stack = cast(BlockParameters, t.parameters)  # a block course's trace is a stack
    layers = tuple(dataclasses.replace(p, attention=engine.Parameters(
        W_Q=p.attention.W_Q * s, W_K=p.attention.W_K * s, W_V=p.attention.W_V * s, W_O=p.attention.W_O * s))
        for p in stack.layers)
    return engine.trace(config, sentence=c.sentence, tokens=tokens,
                        parameters=dataclasses.replace(stack, layers=layers))


def reference(c: Configuration, seed: int) -> Reference:
    """A block configuration's reference (module docstring)."""
    t = block_trace(c, seed)
    cfg, st = t.config, t.state
    stack = cast(BlockParameters, t.parameters)  # a block course's trace is a stack
    p = stack.layers[0]
    attention = engine.trace(TraceConfig(d_model=cfg.d_model, num_heads=cfg.num_heads, causal=cfg.causal, seed=seed),
                             tokens=[tok.text for tok in t.tokens], input=st["attention_input@0"],
                             parameters=p.attention)
    ref = reference_from_engine(attention)
    pre, layer_norm = cfg.pre_norm, cfg.norm_kind == "layer_norm"
    a = ref.arrays
    a.update(norm1=st["norm1@0"], norm2=st["norm2@0"], ffn_output=st["ffn_output@0"],
             norm1_input=st["input"] if pre else st["residual1@0"],
             norm2_input=st["residual1@0"] if pre else st["residual2@0"],
             ffn_input=st["norm2@0"] if pre else st["norm1@0"],
             block_input=st["input"], W_1=p.W_1, W_2=p.W_2,
             block_output=st["final_norm"] if pre else st["layer_output@0"])
    norms: dict[str, NormParameters] = {"norm1": p.norm1, "norm2": p.norm2}
    if pre:
        a.update(final_norm=st["final_norm"], final_norm_input=st["stack_output"])
        norms["final_norm"] = cast(NormParameters, stack.final_norm)  # a pre-norm stack has one
    for which, n in norms.items():
        a[f"{which}_gamma"] = n.gamma
        if layer_norm:
            a[f"{which}_beta"] = cast(np.ndarray, n.beta)  # LayerNorm has a bias
    if p.W_3 is not None:
        a["W_3"] = p.W_3
    if cfg.has_lm_head:  # the head reads the block's output (the final norm's in pre-norm)
        a.update(lm_input=a["block_output"], unembedding=st["unembedding"], logits=st["logits"],
                 next_token_probs=st["next_token_probs"])
    params: dict[str, Any] = {**{name: getattr(p.attention, name) for name in ("W_Q", "W_K", "W_V", "W_O")},
              **{name: a[name] for name in ("W_1", "W_2", "W_3") if name in a},
              **{f"{which}_{w}": a[f"{which}_{w}"] for which in norms for w in ("gamma", "beta")
                 if f"{which}_{w}" in a},
              "eps": cfg.eps}
    ref.values = {"eps": cfg.eps, "block_params": params, "temperature": cfg.temperature}
    ref.stack = t
    position = {s.name: i for i, s in enumerate(t.steps)}
    ref.order = {sid: position[f"{sid}@0"] for sid in ref.arrays if f"{sid}@0" in position}
    ref.order.update(input=position["attention_input@0"], block_output=len(t.steps))
    if pre:
        ref.order["final_norm"] = position["final_norm"]
    if cfg.has_lm_head:
        ref.order.update(logits=position["logits"], next_token_probs=position["next_token_probs"])
    return ref


# ----------------------------------------------------------------- checking


def _message(stage: str, expected: np.ndarray, got: np.ndarray, null: np.ndarray, tol: Tolerance) -> tuple[bool, str]:
    """Pass or fail by /check's rule, and /check's kind of message: how many values are off and the first."""
    if got.shape != expected.shape:
        return False, f"the shape is wrong: expected {list(expected.shape)} ({AXES[stage]}), got {list(got.shape)}"
    c = compare.compare(expected, None, compare.received_npz(got, null), tol)
    if not c.mismatches:
        return True, f"all {c.n_values} values match (largest error {c.max_abs_error or 0.0:.6g})"
    r = c.first_received
    shown = "null" if r is None else r if isinstance(r, str) else f"{r:.6g}"
    return False, (f"{c.mismatches} of {c.n_values} values are off; the first is at {c.first} ({AXES[stage]}): "
                   f"expected {c.first_expected:.6g}, got {shown}")


def check(ref: Reference, function: str, answers: Mapping[str, tuple[np.ndarray, np.ndarray]],
          tol: Tolerance) -> CheckOutcome:
    """One block function's answers on one configuration: a verdict per stage, and the known mistakes that
    reproduce every stage it got wrong."""
    stages: dict[str, StageVerdict] = {}
    matched: list[list[str]] = []
    for stage, (got, null) in answers.items():
        ok, message = _message(stage, np.asarray(ref.arrays[stage], dtype=np.float64), got, null, tol)
        stages[stage] = StageVerdict(ok, message)
        if not ok:
            matched.append(block_matches(ref, got, null, tol) if function == "block"
                           else function_matches(ref, function, stage, got, null, tol))
    matches = [b for b in matched[0] if all(b in m for m in matched[1:])] if matched else []
    passed = all(v.passed for v in stages.values())
    none = "" if passed or matches else (
        "None of the known mistakes of the block reproduces these numbers." if function == "block" else
        f"None of the known mistakes of {function} reproduces these numbers, from the inputs it was given.")
    return CheckOutcome(passed, stages, matches, [], none)


def _steps_of(stage: str) -> set[str]:
    """The base names of the steps a block stage function computes for ``stage``."""
    if stage == "ffn_output":
        return set(_FFN_STEPS)
    if stage in _LM_STEPS.values():
        return {stage}
    return {s.format(stage) for s in _NORM_STEPS}


def function_matches(ref: Reference, function: str, stage: str, got: np.ndarray, null: np.ndarray,
                     tol: Tolerance) -> list[str]:
    """The known mistakes of ``function`` that reproduce its answer for ``stage``: only the function's own steps
    recomputed with the mistake, from the reference's values of everything they read (what it was given)."""
    t = ref.stack
    own = own_bugs("ffn" if function == "ffn" else function if function in _LM_STEPS else "norm")
    mine = _steps_of(stage)
    layer = None if stage in ("final_norm", *_LM_STEPS.values()) else 0
    key = stage if layer is None else f"{stage}@{layer}"
    out = []
    for bug in applicable_bugs(t.config, t.n_tokens):
        if bug.name not in own:
            continue
        try:
            new, _, _ = swapped(t.steps, bug.steps(t.config))
        except ValueError:  # none of its steps is in this block
            continue
        state = dict(t.state)
        ran = False
        for step in new:
            if base_name(step.name) in mine and layer_of(step.name) == layer:
                with np.errstate(all="ignore"):
                    value = step.fn(*[state[name] for name in step.inputs])
                if step.outputs:
                    state.update(zip(step.outputs, value))
                else:
                    state[step.name] = value
                ran = True
        if not ran:
            continue
        want = np.asarray(state[key], dtype=np.float64)
        if np.array_equal(want, t.state[key]):
            continue  # it changes nothing here (this norm or FFN does not have that step)
        with np.errstate(all="ignore"):
            if want.shape == got.shape and passes(want, None, got, null, tol):
                out.append(bug.name)
    return out


def block_matches(ref: Reference, got: np.ndarray, null: np.ndarray, tol: Tolerance) -> list[str]:
    """The known mistakes (the block's and the attention's) that reproduce a block's output: the whole block
    recomputed from its x with each one swapped in (a mistake in where the positional encoding goes cannot
    be made by a block given x)."""
    t = ref.stack
    # the block's output: what leaves its one layer (a mistake may rewire which value that is), normalised once
    # more in pre-norm
    key = "final_norm" if t.config.pre_norm else "layer_output@0"
    out = []
    for bug in applicable_bugs(t.config, t.n_tokens):
        if about_position(bug.name):
            continue
        want = np.asarray(engine.recompute_values(t, bug)[key], dtype=np.float64)
        with np.errstate(all="ignore"):
            if want.shape == got.shape and passes(want, None, got, null, tol):
                out.append(bug.name)
    return out


def cannot_show(c: Configuration, n: int) -> set[str]:
    """The known mistakes (the attention's and the block's) the engine cannot compute on this configuration."""
    config = c.trace_config()
    return {name for name, bug in ALL_BUGS.items()
            if getattr(engine.bugs.refusal(bug, config, n), "code", "") == "bug_not_applicable"}


def summaries() -> dict[str, str]:
    """The block's known mistakes' summaries, to name them."""
    return {name: bug.summary for name, bug in {**BLOCK_BUGS, **LM_BUGS}.items()}


__all__ = ["BLOCK_STAGES", "about_position", "block_matches", "block_trace", "cannot_show", "check", "function_matches",
           "own_bugs", "reference", "summaries"]
