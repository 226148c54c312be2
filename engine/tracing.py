"""Assemble the full per-stage trace of one multi-head self-attention layer.

Walkthrough order (stage ids are a public contract)::

     1 tokens               sentence -> words and punctuation
     2 token_embedding      E[token]                         [token, d_model]
     3 positional_encoding  PE(pos)  (not with RoPE)         [token, d_model]
     4 input                x = E + PE                       [token, d_model]
     1–4 context_*          the same for the context         [token, d_model]   (cross-attention only)
     5 q, k, v              x·W_Qᵢᵀ, x·W_Kᵢᵀ, x·W_Vᵢᵀ        [head, token, d_k] (k, v: [kv_head, …] in GQA)
     5 q_rotated, k_rotated RoPE(q), RoPE(k)                 [head, token, d_k] (RoPE only)
     6 scores               QKᵀ                              [head, query, key]
     7 scaled_scores        QKᵀ/√d_k  (or /1)                [head, query, key]
     8 masked_scores        causal mask (only when causal)   [head, query, key] (and the sliding window)
     9 weights              softmax(·) per row               [head, query, key]
    10 context              weights·V                        [head, token, d_k]
    11 concat               Concat(head₁…head_h)             [token, h·d_k]
    12 output               concat·W_Oᵀ                      [token, d_model]

``trace`` checks the request (``engine.checks``), runs the configuration's
steps (``engine.layer``) and keeps every array; ``inject_bug`` recomputes a
trace from one known mistake's step on (``engine.bugs``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import numpy as np

from . import attention as A
from .bugs import Bug, applicable_bugs, check_bug
from .checks import (
    check_parameter_shapes,
    cross_attention_conflicts,
    explicit_context_conflicts,
    given_input,
    split_context,
    split_tokens,
)
from .errors import BugNotApplicableError, NonFiniteInputError, NumericOverflowError, raise_all
from .layer import (
    STAGE_INFO,
    Rerun,
    Step,
    TraceConfig,
    formulas,
    initial_state,
    layer_steps,
    run,
    stage_axes,
    stage_ids,
    swapped,
)
from .params import Parameters, generate_parameters, generated_parameters_digest, parameters_digest
from .tokenize import Token
from .version import ENGINE_VERSION


@dataclass(frozen=True)
class Stage:
    info: Any  # engine.layer.StageInfo
    formula: str
    values: np.ndarray | list[str]
    mask: np.ndarray | None = None  # True = masked (null in JSON); same shape as values
    #: axis names for this trace: info.axes, except "kv_head" for k, v, k_rotated under GQA/MQA
    axes: tuple[str, ...] = ()
    #: per axis, the token list it indexes: "tokens", "context_tokens" (cross-attention's keys) or None
    axis_tokens: tuple[str | None, ...] = ()

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.values),) if isinstance(self.values, list) else self.values.shape


@dataclass(frozen=True)
class Trace:
    config: TraceConfig
    tokens: list[Token]
    parameters: Parameters
    parameters_digest: str
    stages: dict[str, Stage]
    engine_version: str = ENGINE_VERSION
    parameters_source: Literal["generated", "explicit"] = "generated"
    input_source: Literal["generated", "explicit"] = "generated"
    bug: str | None = None  # the injected bug's name, if any
    # What the steps computed, for recomputing from any step on (engine.layer.rerun).
    steps: tuple[Step, ...] = field(default=(), repr=False)
    state: dict[str, Any] = field(default_factory=dict, repr=False)
    #: cross-attention: the context's tokens, which the keys and values come from (None in self-attention)
    context_tokens: list[Token] | None = None

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    # Computed on first use: diagnosis recomputes a trace per known bug and never reads them.
    @cached_property
    def entropy(self) -> np.ndarray:
        """Each weights row's entropy in nats, [head, query]."""
        return A.entropy(self.state["weights"])

    @cached_property
    def max_weight(self) -> np.ndarray:
        """Each weights row's largest weight, [head, query]."""
        return A.max_weight(self.state["weights"])

    @property
    def cross(self) -> bool:
        """Whether this is cross-attention (keys and values from a context)."""
        return self.context_tokens is not None

    @property
    def n_context(self) -> int | None:
        """How many context tokens (keys) there are in cross-attention; None in self-attention."""
        return None if self.context_tokens is None else len(self.context_tokens)


def trace(
    config: TraceConfig,
    *,
    sentence: str | None = None,
    tokens: list[str] | None = None,
    input: np.ndarray | None = None,
    parameters: Parameters | None = None,
    bug: str | None = None,
    split: list[Token] | None = None,
    context_sentence: str | None = None,
    context_tokens: list[str] | None = None,
    context_input: np.ndarray | None = None,
    context_split: list[Token] | None = None,
) -> Trace:
    """Run every stage for one sentence (or pre-split tokens) and return them all.

    ``input`` [token, d_model] and ``parameters`` replace the generated ones;
    ``bug`` names one of ``engine.bugs.BUGS`` to inject (the result is labelled).
    ``split`` is what ``engine.checks.split_tokens`` already made of that
    sentence or tokens, so a caller that checked them need not split twice.

    Cross-attention: ``context_sentence`` or ``context_tokens`` (or the
    already checked ``context_split``) gives the keys' and values' tokens;
    the queries come from the sentence. With your own ``input``, give the
    context's x as ``context_input`` [context token, d_model] too.
    """
    toks = split if split is not None else split_tokens(sentence=sentence, tokens=tokens,
                                                        max_tokens=config.max_tokens)
    ctx = context_split if context_split is not None else split_context(
        context_sentence=context_sentence, context_tokens=context_tokens, max_tokens=config.max_tokens)
    cross = ctx is not None
    raise_all([*(cross_attention_conflicts(causal=config.causal, window=config.window,
                                           positional_encoding=config.positional_encoding) if cross else []),
               *explicit_context_conflicts(input_given=input is not None,
                                           context_input_given=context_input is not None, cross=cross)])
    n_context = None if ctx is None else len(ctx)
    wrong = (check_bug(bug, config, len(toks), explicit_input=input is not None, n_context=n_context)
             if bug is not None else None)
    if parameters is None:
        # Engine 1.0's call (and cache key) unless K/V heads are shared.
        sizes = (config.seed, config.d_model, config.num_heads, *((config.kv_heads,) if config.grouped else ()))
        params = generate_parameters(*sizes)
        digest = generated_parameters_digest(*sizes)
    else:
        check_parameter_shapes(vars(parameters), config.d_model, config.num_heads, config.num_kv_heads)
        for name, W in vars(parameters).items():
            if not np.isfinite(W).all():
                raise NonFiniteInputError(f"parameters.{name} contains a non-finite value", field=f"parameters/{name}")
        params, digest = parameters, parameters_digest(parameters)
    x = None if input is None else given_input(input, len(toks), config.d_model)
    x_ctx = None if context_input is None or ctx is None else given_input(
        context_input, len(ctx), config.d_model, "context_input")

    steps = layer_steps(config, explicit_input=x is not None, cross=cross)
    state = initial_state(config, [t.text for t in toks], vars(params), x,
                          context_texts=None if ctx is None else [t.text for t in ctx], context_x=x_ctx)
    with np.errstate(over="ignore", invalid="ignore"):  # huge explicit values: checked in _assemble
        run(steps, state)
    t = _assemble(config, toks, params, digest, steps, state, explicit_parameters=parameters is not None,
                  context=ctx)
    return inject_bug(t, wrong) if wrong is not None else t


class _QuietRerun(Rerun):
    """A Rerun whose steps run with float64 overflow silenced (huge explicit values; see ``trace``)."""

    def __getitem__(self, key: str) -> Any:
        if not self.needs_run(key):  # the reference's own array, or one computed already: no step runs
            return super().__getitem__(key)
        with np.errstate(over="ignore", invalid="ignore"):
            return super().__getitem__(key)

    def finish(self) -> dict[str, Any]:
        with np.errstate(over="ignore", invalid="ignore"):
            return super().finish()


def recompute_values(t: Trace, bug: Bug) -> Rerun:
    """The named values of ``t`` recomputed with one known mistake, computed as they are read (the
    arrays before the bug's step are reused; later steps run only as far as needed), without
    assembling a Trace: what /check's diagnosis compares. A stage's values are ``values[stage_id]``;
    masked_scores' mask is ``values["excluded"]``."""
    return _QuietRerun(t.steps, t.state, bug.replaces)


def recompute(t: Trace, bug: Bug) -> Trace:
    """``t`` recomputed with one known mistake, from its step on: the arrays before it are reused."""
    r = recompute_values(t, bug)
    steps, state = r.steps, r.finish()
    return _assemble(t.config, t.tokens, t.parameters, t.parameters_digest, steps, state,
                     explicit_parameters=t.parameters_source == "explicit", bug=bug.name, context=t.context_tokens)


def diagnose(t: Trace, first_wrong: str, submitted: list[str],
             agrees: Callable[[Mapping[str, Any], list[str]], bool]) -> list[str]:
    """The known bugs that reproduce a submission whose first wrong stage is ``first_wrong``, in the
    documented order: each applicable bug whose recomputation changes ``first_wrong`` and whose values
    ``agrees`` with the submission on every submitted stage it can change.

    ``submitted``: the submitted stage ids in walkthrough order. ``agrees(values, stage_ids)`` says whether
    the submission matches ``values`` (``values[stage_id]``; masked_scores' mask is ``values["excluded"]``)
    on those stages, earliest first: the cheapest to recompute, and a bug that changes a stage the reference
    got right usually fails right there. The stages before a bug's step are the reference's very arrays, so
    only the affected ones are compared. Tokens, or an explicit input, are no step's output: no bug explains them.
    """
    made_by = {out: i for i, step in enumerate(t.steps) for out in step.writes}
    if first_wrong not in made_by:
        return []
    matches = []
    for bug in applicable_bugs(t.config, t.n_tokens, explicit_input=t.input_source == "explicit",
                               n_context=t.n_context):
        start = swapped(t.steps, bug.replaces)[1]
        affected = [sid for sid in submitted if made_by.get(sid, -1) >= start]
        if first_wrong in affected and agrees(recompute_values(t, bug), affected):
            matches.append(bug.name)
    return matches


def inject_bug(t: Trace, bug: Bug) -> Trace:
    """``recompute(t, bug)``, refused (BugNotApplicableError) when with these very numbers it changes nothing."""
    wrong = recompute(t, bug)
    if same_numbers(wrong, t, list(t.stages)):
        raise BugNotApplicableError(f"the {bug.name} bug changes no number of this trace: with this input and "
                                    "these weights it computes the correct values; choose another bug or input",
                                    code="bug_changes_nothing")
    return wrong


def same_numbers(a: Trace, b: Trace, stage_ids: list[str]) -> bool:
    """Whether two traces hold identical values (and masks) in the given stages."""
    for sid in stage_ids:
        x, y = a.stages.get(sid), b.stages.get(sid)
        if x is None or y is None or isinstance(x.values, list):  # the token lists
            continue
        if x.shape != y.shape or not np.array_equal(x.values, y.values):
            return False
        if (x.mask is None) != (y.mask is None) or (x.mask is not None and not np.array_equal(x.mask, y.mask)):
            return False
    return True


def _assemble(config: TraceConfig, toks: list[Token], params: Parameters, digest: str, steps: tuple[Step, ...],
              state: dict[str, Any], *, explicit_parameters: bool, bug: str | None = None,
              context: list[Token] | None = None) -> Trace:
    """The Trace of a finished run: its stages, in walkthrough order, and the weights' statistics."""
    explicit_input = "token_embedding" not in state  # x was given, so stages 2–3 were never computed
    explicit = explicit_input or explicit_parameters
    cross = context is not None
    shown = formulas(steps)
    stages = {sid: Stage(STAGE_INFO[sid], shown[sid], state[sid],
                         state["excluded"] if sid == "masked_scores" else None,
                         *stage_axes(sid, config, cross=cross))
              for sid in stage_ids(config, explicit_input=explicit_input, cross=cross)}
    if explicit and not all(np.isfinite(s.values).all() for s in stages.values() if not isinstance(s.values, list)):
        # Only explicit inputs this large (|x|·|W| beyond ~1e150) can overflow float64.
        raise NumericOverflowError("the explicit input and parameters overflow float64; use smaller values")
    return Trace(
        config=config,
        tokens=toks,
        parameters=params,
        parameters_digest=digest,
        stages=stages,
        parameters_source="explicit" if explicit_parameters else "generated",
        input_source="explicit" if explicit_input else "generated",
        bug=bug,
        steps=steps,
        state=state,
        context_tokens=context,
    )
