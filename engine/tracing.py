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

A stack of blocks (``TraceConfig`` with a block field) stacks every stage of a layer on a leading ``layer``
axis and adds the block's: the norms' statistics and outputs, the residual sums, the FFN's stages, then
``residual_stream`` [depth, token, d_model] and, in pre-norm, the final norm (docs/engine.md, "The
Transformer block").

``trace`` checks the request (``engine.checks``), runs the configuration's
steps (``engine.layer``) and keeps every array; ``inject_bug`` recomputes a
trace from one known mistake's step on (``engine.bugs``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, cast

import numpy as np
from numpy.typing import ArrayLike

from . import attention as A
from . import constructed as C
from .bugs import Bug, applicable_bugs, check_bug
from .checks import (
    block_context_conflicts,
    check_parameter_shapes,
    cross_attention_conflicts,
    explicit_context_conflicts,
    given_input,
    split_context,
    split_tokens,
)
from .errors import BugNotApplicableError, NonFiniteInputError, NumericOverflowError, ShapeError, raise_all
from .layer import (
    LAYER_STAGE_IDS,
    STAGE_INFO,
    Rerun,
    Step,
    TraceConfig,
    base_name,
    formulas,
    initial_state,
    layer_steps,
    run,
    stage_axes,
    stage_ids,
    swapped,
)
from .params import (
    BlockParameters,
    Parameters,
    block_parameters_digest,
    generate_block_parameters,
    generate_parameters,
    generated_block_digest,
    generated_parameters_digest,
    parameters_digest,
)
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

    @property
    def array(self) -> np.ndarray:
        """``values`` of a numeric stage (every stage but the token lists), typed as the array it is."""
        return cast(np.ndarray, self.values)


@dataclass(frozen=True)
class Trace:
    config: TraceConfig
    tokens: list[Token]
    parameters: Parameters | BlockParameters  # BlockParameters for a stack of blocks
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
    #: the interventions made (engine.interventions.Intervention), in order; () for a plain trace
    interventions: tuple[Any, ...] = ()
    #: with interventions: the trace they were made in (the same request, not intervened)
    baseline: Trace | None = field(default=None, repr=False)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    # Computed when read, not when the trace is made: diagnosis recomputes a trace per known bug and never reads
    # them, and an answer reads each once (not cached: functools.cached_property's lock cost ~0.5 µs a read).
    @property
    def entropy(self) -> np.ndarray:
        """Each weights row's entropy in nats, [head, query] ([layer, head, query] in a stack)."""
        return A.entropy(self._weights)

    @property
    def max_weight(self) -> np.ndarray:
        """Each weights row's largest weight, [head, query] ([layer, head, query] in a stack)."""
        return A.max_weight(self._weights)

    @property
    def _weights(self) -> np.ndarray:
        return self.stages["weights"].array if self.config.has_block else self.state["weights"]

    @property
    def vocabulary(self) -> list[str] | None:
        """The language-model head's vocabulary, the logits' columns in order (None without a head)."""
        vocab = self.state.get("vocabulary")
        return None if vocab is None else list(vocab)

    @property
    def num_layers(self) -> int:
        """How many layers the trace has (1 for a single attention layer)."""
        return self.config.num_layers

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
    input: ArrayLike | None = None,
    parameters: Parameters | BlockParameters | None = None,  # BlockParameters for a stack of blocks
    bug: str | None = None,
    split: list[Token] | None = None,
    context_sentence: str | None = None,
    context_tokens: list[str] | None = None,
    context_input: ArrayLike | None = None,
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
                                           context_input_given=context_input is not None, cross=cross),
               *block_context_conflicts(block=config.has_block, cross=cross),
               *C.trace_conflicts(constructed=config.constructed, input_given=input is not None,
                                  parameters_given=parameters is not None, cross=cross)])
    n_context = None if ctx is None else len(ctx)
    wrong = (check_bug(bug, config, len(toks), explicit_input=input is not None, n_context=n_context)
             if bug is not None else None)
    params: Parameters | BlockParameters
    if config.has_block:
        params, digest, weights = _block_parameters(config, parameters)
    elif config.constructed:  # seeded heads' weights, with the constructed heads' written in
        sizes = (config.seed, config.d_model, config.num_heads, config.head_kinds,
                 C.gain_of(config.sharpness, config.scale_factor), config.layout)
        params, digest = C.constructed_parameters(*sizes), C.constructed_parameters_digest(*sizes)
    elif parameters is None:
        # Engine 1.0's call (and cache key) unless K/V heads are shared.
        sizes = (config.seed, config.d_model, config.num_heads, *((config.kv_heads,) if config.grouped else ()))
        params = generate_parameters(*sizes)
        digest = generated_parameters_digest(*sizes)
    else:
        check_parameter_shapes(vars(parameters), config.d_model, config.num_heads, config.num_kv_heads)
        for name, W in vars(parameters).items():
            if not np.isfinite(W).all():
                raise NonFiniteInputError(f"parameters.{name} contains a non-finite value", field=f"parameters/{name}")
        params, digest = parameters, parameters_digest(cast(Parameters, parameters))  # a single layer's
    if not config.has_block:
        weights = vars(params)
    x = None if input is None else given_input(input, len(toks), config.d_model)
    x_ctx = None if context_input is None or ctx is None else given_input(
        context_input, len(ctx), config.d_model, "context_input")

    steps = layer_steps(config, explicit_input=x is not None, cross=cross)
    state = initial_state(config, [t.text for t in toks], weights, x,
                          context_texts=None if ctx is None else [t.text for t in ctx], context_x=x_ctx)
    with np.errstate(over="ignore", invalid="ignore"):  # huge explicit values: checked in _assemble
        run(steps, state)
    t = _assemble(config, toks, params, digest, steps, state, explicit_parameters=parameters is not None,
                  context=ctx)
    return inject_bug(t, wrong) if wrong is not None else t


def _block_parameters(config: TraceConfig, given: Any) -> tuple[BlockParameters, str, dict[str, np.ndarray | None]]:
    """A stack's weights (seeded, or ``given`` BlockParameters), their digest, and the state's names for them:
    ``W_Q@l`` … per layer, ``final_norm_gamma``/``final_norm_beta``."""
    if given is None:
        key = (config.seed, config.d_model, config.num_heads, config.kv_heads if config.grouped else None,
               config.num_layers, config.ff_width, config.gated, config.norm_kind == "layer_norm",
               config.seeded_norm, config.final_norm)
        params, digest = generate_block_parameters(*key), generated_block_digest(*key)
        if config.constructed:  # the constructed heads written in, the FFNs zero (engine.constructed)
            params = C.constructed_block_parameters(params, config.head_kinds,
                                                    C.gain_of(config.sharpness, config.scale_factor), config.layout,
                                                    config.pre_norm)
            digest = block_parameters_digest(params)
    else:
        params = given
        _check_block_parameters(params, config)
        digest = block_parameters_digest(params)
    weights: dict[str, np.ndarray | None] = {f"{name}@{layer}": a for layer, p in enumerate(params.layers)
                                             for name, a in p.named()}
    if params.final_norm is not None:
        weights["final_norm_gamma"] = params.final_norm.gamma
        weights["final_norm_beta"] = params.final_norm.beta
    return params, digest, weights


def _check_block_parameters(params: Any, config: TraceConfig) -> None:
    """Given weights of a stack: one set per layer, each array of this configuration's shape, all finite."""
    if not isinstance(params, BlockParameters) or params.num_layers != config.num_layers:
        raise ShapeError(f"a stack of {config.num_layers} blocks takes BlockParameters with {config.num_layers} "
                         "layers", field="parameters")
    d, f = config.d_model, config.ff_width
    norm = {"gamma": (d,), "beta": (d,) if config.norm_kind == "layer_norm" else None}
    for layer, p in enumerate(params.layers):
        check_parameter_shapes(vars(p.attention), d, config.num_heads, config.num_kv_heads)
        expected = {"W_1": (f, d), "W_2": (d, f), "W_3": (f, d) if config.gated else None,
                    **{f"{which}_{w}": shape for which in ("norm1", "norm2") for w, shape in norm.items()}}
        got = {"W_1": p.W_1, "W_2": p.W_2, "W_3": p.W_3, "norm1_gamma": p.norm1.gamma, "norm1_beta": p.norm1.beta,
               "norm2_gamma": p.norm2.gamma, "norm2_beta": p.norm2.beta}
        _check_arrays(got, expected, f"parameters/{layer}")
    final = params.final_norm
    if (final is None) != (not config.final_norm):
        raise ShapeError("a pre-norm stack has a final norm, a post-norm one has none", field="parameters")
    if final is not None:
        _check_arrays({"final_norm_gamma": final.gamma, "final_norm_beta": final.beta},
                      {f"final_norm_{w}": shape for w, shape in norm.items()}, "parameters")


def _check_arrays(got: dict[str, Any], expected: Mapping[str, tuple[int, ...] | None], where: str) -> None:
    for name, shape in expected.items():
        a = got[name]
        if (a is None) != (shape is None) or (a is not None and np.shape(a) != shape):
            raise ShapeError(f"{where}/{name} has shape {None if a is None else list(np.shape(a))} but must be "
                             f"{None if shape is None else list(shape)}", field=f"{where}/{name}")
        if a is not None and not np.isfinite(a).all():
            raise NonFiniteInputError(f"{where}/{name} contains a non-finite value", field=f"{where}/{name}")


class _QuietRerun(Rerun):
    """A Rerun whose steps run with float64 overflow silenced (huge explicit values; see ``trace``).

    In a stack, a per-layer stage id (``q``, ``norm1``, and ``excluded`` for masked_scores' mask) reads its
    layers' values stacked, as the trace's stage holds them."""

    def __init__(self, steps: tuple[Step, ...], state: dict[str, Any], replacements: tuple[Any, ...],
                 num_layers: int | None = None) -> None:
        super().__init__(steps, state, replacements)
        self._layers = num_layers

    def _per_layer(self, key: str) -> list[str] | None:
        if self._layers is None or (key not in LAYER_STAGE_IDS and key != "excluded"):
            return None
        return [f"{key}@{layer}" for layer in range(self._layers)]

    def needs_run(self, key: str) -> bool:
        keys = self._per_layer(key)
        return super().needs_run(key) if keys is None else any(super(_QuietRerun, self).needs_run(k) for k in keys)

    def __getitem__(self, key: str) -> Any:
        keys = self._per_layer(key)
        if keys is not None:
            parts = [self[k] for k in keys]
            return None if parts[0] is None else np.stack(parts)  # L × [...] -> [L, ...]; no mask: None
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
    return _QuietRerun(t.steps, t.state, bug.steps(t.config), t.num_layers if t.config.has_block else None)


def recompute(t: Trace, bug: Bug) -> Trace:
    """``t`` recomputed with one known mistake, from its step on: the arrays before it are reused."""
    r = _QuietRerun(t.steps, t.state, bug.steps(t.config))
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
    if t.interventions:  # a bug's rerun would drop them: no known bug explains an intervened trace
        return []
    made_by = {}  # each value's last step (a stage of a stack: its last layer's), by the name a stage has
    for i, step in enumerate(t.steps):
        for out in step.writes:
            made_by[base_name(out)] = i
    if first_wrong not in made_by:
        return []
    matches = []
    for bug in applicable_bugs(t.config, t.n_tokens, explicit_input=t.input_source == "explicit",
                               n_context=t.n_context):
        start = swapped(t.steps, bug.steps(t.config))[1]
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
        if x is None or y is None or isinstance(x.values, list) or isinstance(y.values, list):  # the token lists
            continue
        if x.shape != y.shape or not np.array_equal(x.values, y.values):
            return False
        if (x.mask is None) != (y.mask is None) or (x.mask is not None and y.mask is not None
                                                         and not np.array_equal(x.mask, y.mask)):
            return False
    return True


def _assemble(config: TraceConfig, toks: list[Token], params: Parameters | BlockParameters, digest: str, steps: tuple[Step, ...],
              state: dict[str, Any], *, explicit_parameters: bool, bug: str | None = None,
              context: list[Token] | None = None) -> Trace:
    """The Trace of a finished run: its stages, in walkthrough order, and the weights' statistics."""
    explicit_input = "token_embedding" not in state  # x was given, so stages 2–3 were never computed
    explicit = explicit_input or explicit_parameters
    cross = context is not None
    shown = formulas(steps)
    if config.has_block:
        stages = _stack_stages(config, shown, state, explicit_input)
    else:
        stages = {sid: _stage(info, shown[sid], state[sid], state["excluded"] if sid == "masked_scores" else None,
                              axes, axis_tokens)
                  for sid, info, axes, axis_tokens in _stage_layout(config, explicit_input, cross)}
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


@lru_cache(maxsize=256)  # a function of the configuration and two choices: a handful recur
def _stage_layout(config: TraceConfig, explicit_input: bool, cross: bool
                  ) -> tuple[tuple[str, Any, tuple[str, ...], tuple[str | None, ...]], ...]:
    """Each stage's id, info, axis names and axis token lists, in walkthrough order (all but the values)."""
    return tuple((sid, STAGE_INFO[sid], *stage_axes(sid, config, cross=cross))
                 for sid in stage_ids(config, explicit_input=explicit_input, cross=cross))


_new = object.__new__


def _stage(info: Any, formula: str, values: np.ndarray | list[str], mask: np.ndarray | None,
           axes: tuple[str, ...], axis_tokens: tuple[str | None, ...]) -> Stage:
    """``Stage(info, formula, values, mask, axes, axis_tokens)``, every field given, without the frozen
    dataclass's ``object.__setattr__`` per field: 0.25 instead of 1.25 µs, and a trace makes one per stage."""
    st = _new(Stage)
    st.__dict__.update(info=info, formula=formula, values=values, mask=mask, axes=axes, axis_tokens=axis_tokens)
    return st


def _stack_stages(config: TraceConfig, shown: Mapping[str, str], state: dict[str, Any],
                  explicit_input: bool) -> dict[str, Stage]:
    """A stack's stages: a per-layer stage holds its layers' values stacked on a leading layer axis (its formula
    is the first layer's: every layer runs the same steps); the others are the whole trace's."""
    layers = range(config.num_layers)
    stages = {}
    for sid in stage_ids(config, explicit_input=explicit_input):
        if sid in LAYER_STAGE_IDS:
            values = np.stack([state[f"{sid}@{i}"] for i in layers])  # L × [...] -> [L, ...]
            mask = np.stack([state[f"excluded@{i}"] for i in layers]) if sid == "masked_scores" else None
            formula = shown[f"{sid}@0"]
        else:
            values, mask, formula = state[sid], None, shown[sid]
        stages[sid] = Stage(STAGE_INFO[sid], formula, values, mask, *stage_axes(sid, config))
    return stages
