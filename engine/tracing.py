"""Assemble the full per-stage trace of one multi-head self-attention layer.

Walkthrough order (stage ids are a public contract)::

     1 tokens               sentence -> words and punctuation
     2 token_embedding      E[token]                         [token, d_model]
     3 positional_encoding  PE(pos)                          [token, d_model]
     4 input                x = E + PE                       [token, d_model]
     5 q, k, v              x·W_Qᵢᵀ, x·W_Kᵢᵀ, x·W_Vᵢᵀ        [head, token, d_k]
     6 scores               QKᵀ                              [head, query, key]
     7 scaled_scores        QKᵀ/√d_k  (or /1)                [head, query, key]
     8 masked_scores        causal mask (only when causal)   [head, query, key]
     9 weights              softmax(·) per row               [head, query, key]
    10 context              weights·V                        [head, token, d_k]
    11 concat               Concat(head₁…head_h)             [token, h·d_k]
    12 output               concat·W_Oᵀ                      [token, d_model]

``trace`` checks the request (``engine.checks``), runs the configuration's
steps (``engine.layer``) and keeps every array; ``inject_bug`` recomputes a
trace from one known mistake's step on (``engine.bugs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from . import attention as A
from .bugs import Bug, check_bug
from .checks import check_parameter_shapes, explicit_array, split_tokens
from .errors import BugNotApplicableError, NonFiniteInputError, NumericOverflowError
from .layer import STAGE_INFO, Step, TraceConfig, formulas, initial_state, layer_steps, rerun, run, stage_ids
from .params import Parameters, generate_parameters, generated_parameters_digest, parameters_digest
from .tokenize import Token
from .version import ENGINE_VERSION


@dataclass(frozen=True)
class Stage:
    info: Any  # engine.layer.StageInfo
    formula: str
    values: np.ndarray | list[str]
    mask: np.ndarray | None = None  # True = masked (null in JSON); same shape as values

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
    entropy: np.ndarray  # [head, query]
    max_weight: np.ndarray  # [head, query]
    engine_version: str = ENGINE_VERSION
    parameters_source: Literal["generated", "explicit"] = "generated"
    input_source: Literal["generated", "explicit"] = "generated"
    bug: str | None = None  # the injected bug's name, if any
    # What the steps computed, for recomputing from any step on (engine.layer.rerun).
    steps: tuple[Step, ...] = field(default=(), repr=False)
    state: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def trace(
    config: TraceConfig,
    *,
    sentence: str | None = None,
    tokens: list[str] | None = None,
    input: np.ndarray | None = None,
    parameters: Parameters | None = None,
    bug: str | None = None,
    split: list[Token] | None = None,
) -> Trace:
    """Run every stage for one sentence (or pre-split tokens) and return them all.

    ``input`` [token, d_model] and ``parameters`` replace the generated ones;
    ``bug`` names one of ``engine.bugs.BUGS`` to inject (the result is labelled).
    ``split`` is what ``engine.checks.split_tokens`` already made of that
    sentence or tokens, so a caller that checked them need not split twice.
    """
    toks = split if split is not None else split_tokens(sentence=sentence, tokens=tokens,
                                                        max_tokens=config.max_tokens)
    wrong = check_bug(bug, config, len(toks), explicit_input=input is not None) if bug is not None else None
    if parameters is None:
        params = generate_parameters(config.seed, config.d_model, config.num_heads)
        digest = generated_parameters_digest(config.seed, config.d_model, config.num_heads)
    else:
        check_parameter_shapes(vars(parameters), config.d_model, config.num_heads)
        for name, W in vars(parameters).items():
            if not np.isfinite(W).all():
                raise NonFiniteInputError(f"parameters.{name} contains a non-finite value", field=f"parameters/{name}")
        params, digest = parameters, parameters_digest(parameters)
    x = None if input is None else explicit_array("input", input, (len(toks), config.d_model), "[token, d_model]")

    steps = layer_steps(config, explicit_input=x is not None)
    state = initial_state(config, [t.text for t in toks], vars(params), x)
    with np.errstate(over="ignore", invalid="ignore"):  # huge explicit values: checked in _assemble
        run(steps, state)
    t = _assemble(config, toks, params, digest, steps, state, explicit_parameters=parameters is not None)
    return inject_bug(t, wrong) if wrong is not None else t


def recompute(t: Trace, bug: Bug) -> Trace:
    """``t`` recomputed with one known mistake, from its step on: the arrays before it are reused."""
    with np.errstate(over="ignore", invalid="ignore"):
        steps, state = rerun(t.steps, t.state, bug.replaces)
    return _assemble(t.config, t.tokens, t.parameters, t.parameters_digest, steps, state,
                     explicit_parameters=t.parameters_source == "explicit", bug=bug.name)


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
        if x is None or y is None or sid == "tokens":
            continue
        if x.shape != y.shape or not np.array_equal(x.values, y.values):
            return False
        if (x.mask is None) != (y.mask is None) or (x.mask is not None and not np.array_equal(x.mask, y.mask)):
            return False
    return True


def _assemble(config: TraceConfig, toks: list[Token], params: Parameters, digest: str, steps: tuple[Step, ...],
              state: dict[str, Any], *, explicit_parameters: bool, bug: str | None = None) -> Trace:
    """The Trace of a finished run: its stages, in walkthrough order, and the weights' statistics."""
    explicit_input = "token_embedding" not in state  # x was given, so stages 2–3 were never computed
    explicit = explicit_input or explicit_parameters
    shown = formulas(steps)
    stages = {sid: Stage(STAGE_INFO[sid], shown[sid], state[sid],
                         state["excluded"] if sid == "masked_scores" else None)
              for sid in stage_ids(config, explicit_input=explicit_input)}
    if explicit and not all(np.isfinite(s.values).all() for s in stages.values() if not isinstance(s.values, list)):
        # Only explicit inputs this large (|x|·|W| beyond ~1e150) can overflow float64.
        raise NumericOverflowError("the explicit input and parameters overflow float64; use smaller values")
    return Trace(
        config=config,
        tokens=toks,
        parameters=params,
        parameters_digest=digest,
        stages=stages,
        entropy=A.entropy(state["weights"]),
        max_weight=A.max_weight(state["weights"]),
        parameters_source="explicit" if explicit_parameters else "generated",
        input_source="explicit" if explicit_input else "generated",
        bug=bug,
        steps=steps,
        state=state,
    )
