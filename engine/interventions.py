"""Interventions: take a trace apart (ablate or patch one activation) and measure what changes.

An intervention names one activation of the recipe and what to put there:

    target        the value (engine.layer's name)          shape      at positions (the token axis)
    head_output   context@l[head]    (a head's output, before W_O)    [n, d_k]   rows = tokens
    head_pattern  weights@l[head]    (a head's attention pattern)     [n, n]     rows = queries
    mlp_output    ffn_output@l       (the FFN's output)               [n, d_model]
    residual      x_l: layer l's input (input for l = 0, layer_output@{l−1}; l = num_layers is the last
                  layer's output, what the final norm reads)          [n, d_model]

    kind   zero   the rows set to 0
           mean   the rows set to their mean over the sentence's positions (a head pattern: uniform over the keys
                  each query may attend to, the pattern that knows nothing)
           patch  the rows replaced by the same activation of a second input of the same length, run clean

Like a PyTorch forward hook, the intervention replaces the value when its step has computed it, and every later
step reads the replaced value: the trace is the baseline's arrays up to the first intervened step, then the
steps from there on run again (``intervene``). ``effect`` compares it with the baseline: each stage's largest
change, per layer, and with a language-model head the target token's logit and probability.

Pure numpy; the rules (``check_interventions``, ``intervention_conflicts``) live here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .errors import EngineError, InvalidSizeError, StageUnavailableError, VariantConflictError, raise_all
from .layer import LAYER_STAGE_IDS, TOKEN_STAGE_IDS, TraceConfig
from .tracing import Trace, _assemble

#: what an intervention may replace
TARGETS: tuple[str, ...] = ("head_output", "head_pattern", "mlp_output", "residual")
#: what it puts there
KINDS: tuple[str, ...] = ("zero", "mean", "patch")
#: the most interventions one request may make
MAX_INTERVENTIONS = 16
#: the value each target replaces, by its base name in the recipe (residual: see ``value_name``)
_VALUE = {"head_output": "context", "head_pattern": "weights", "mlp_output": "ffn_output"}
_HEADED = ("head_output", "head_pattern")


@dataclass(frozen=True)
class Intervention:
    """Replace ``target`` at ``layer`` (and ``head``) in the rows ``positions`` (None: every position)."""

    target: str
    layer: int
    kind: str = "zero"
    head: int | None = None
    positions: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.positions, list):
            object.__setattr__(self, "positions", tuple(self.positions))

    def describe(self) -> str:
        """One line, as the answer shows it: "layer 0 head 1 output (context, before W_O): zero at every position"."""
        what = {
            "head_output": f"layer {self.layer} head {self.head} output (context, before W_O)",
            "head_pattern": f"layer {self.layer} head {self.head} attention pattern",
            "mlp_output": f"layer {self.layer} MLP output (ffn_output)",
            "residual": f"residual stream at depth {self.layer} (residual_stream[{self.layer}])",
        }[self.target]
        how = {
            "zero": "set to 0",
            "patch": "patched from the second input",
            "mean": (
                "uniform over the allowed keys"
                if self.target == "head_pattern"
                else "set to its mean over the positions"
            ),
        }[self.kind]
        where = "every position" if self.positions is None else "positions " + ", ".join(map(str, self.positions))
        return f"{what}: {how} at {where}"


def value_name(config: TraceConfig, iv: Intervention) -> str:
    """The state's name of the value ``iv`` replaces."""
    if iv.target == "residual":
        return "input" if iv.layer == 0 else f"layer_output@{iv.layer - 1}"
    base = _VALUE[iv.target]
    return f"{base}@{iv.layer}" if config.has_block else base


# ------------------------------------------------------------------ the rules


def check_interventions(
    interventions: Sequence[Intervention],
    config: TraceConfig,
    n: int,
    *,
    patch_n: int | None = None,
    cross: bool = False,
    field: str = "interventions",
) -> None:
    """Every intervention names an activation this configuration computes, at a layer, head and positions that
    exist; a patch needs the second input (``patch_n`` its token count), of the same length. Every problem at
    once, each at its field."""
    problems: list[EngineError] = []
    if len(interventions) > MAX_INTERVENTIONS:
        raise InvalidSizeError(
            f"{len(interventions)} interventions is more than the limit of {MAX_INTERVENTIONS}", field=field
        )
    layers = config.num_layers if config.has_block else 1
    for i, iv in enumerate(interventions):
        at = f"{field}/{i}"
        if iv.target not in TARGETS or iv.kind not in KINDS:
            bad, choices = ("target", TARGETS) if iv.target not in TARGETS else ("kind", KINDS)
            problems.append(
                InvalidSizeError(
                    f"{bad} must be one of {', '.join(choices)}", field=f"{at}/{bad}", code="unknown_intervention"
                )
            )
            continue
        if iv.target in ("mlp_output", "residual") and not config.has_block:
            problems.append(
                StageUnavailableError(
                    f"{iv.target} is part of a Transformer block, and this trace is one attention layer: give block "
                    "(or another block field), or intervene on head_output or head_pattern",
                    field=f"{at}/target",
                    code="intervention_needs_block",
                )
            )
            continue
        top = layers if iv.target == "residual" else layers - 1  # the residual stream has num_layers + 1 depths
        if not 0 <= iv.layer <= top:
            problems.append(
                InvalidSizeError(
                    f"layer {iv.layer} does not exist: {iv.target} has layers 0 to {top}"
                    + (" (num_layers is the last layer's output)" if iv.target == "residual" else ""),
                    field=f"{at}/layer",
                    code="intervention_out_of_range",
                )
            )
        if iv.target in _HEADED:
            if iv.head is None or not 0 <= iv.head < config.num_heads:
                problems.append(
                    InvalidSizeError(
                        f"{iv.target} needs a head from 0 to {config.num_heads - 1}, got {iv.head}",
                        field=f"{at}/head",
                        code="intervention_out_of_range",
                    )
                )
        elif iv.head is not None:
            problems.append(
                InvalidSizeError(
                    f"{iv.target} has no head: drop head", field=f"{at}/head", code="intervention_out_of_range"
                )
            )
        for j, p in enumerate(iv.positions or ()):
            if not 0 <= p < n:
                problems.append(
                    InvalidSizeError(
                        f"position {p} does not exist: the sentence has positions 0 to {n - 1}",
                        field=f"{at}/positions/{j}",
                        code="intervention_out_of_range",
                    )
                )
        if iv.positions is not None and (not iv.positions or len(set(iv.positions)) != len(iv.positions)):
            problems.append(
                InvalidSizeError(
                    "positions must be distinct and at least one (or null: every position)",
                    field=f"{at}/positions",
                    code="intervention_out_of_range",
                )
            )
        if iv.target == "head_pattern" and iv.kind == "zero":
            problems.append(
                VariantConflictError(
                    "an attention pattern's rows sum to 1: its ablation is mean (uniform over the allowed keys); to "
                    "silence the head, zero its head_output",
                    field=f"{at}/kind",
                    code="pattern_not_zeroed",
                )
            )
        if iv.kind == "patch":
            if patch_n is None:
                problems.append(
                    VariantConflictError(
                        "a patch takes the activation from a second input: give patch_sentence (of the same length)",
                        field=f"{at}/kind",
                        code="patch_needs_sentence",
                    )
                )
            elif cross:
                problems.append(
                    VariantConflictError(
                        "patching runs the second input with this trace's own "
                        "context; cross-attention is not patched: use zero or mean",
                        field=f"{at}/kind",
                        code="patch_needs_self_attention",
                    )
                )
    if patch_n is not None:
        if patch_n != n:
            problems.append(
                VariantConflictError(
                    f"patch_sentence has {patch_n} tokens and the sentence {n}: patching replaces activations position "
                    f"by position, so both must have the same length",
                    field="patch_sentence",
                    code="patch_length_mismatch",
                )
            )
        if not any(iv.kind == "patch" for iv in interventions):
            problems.append(
                VariantConflictError(
                    "patch_sentence is read only by an intervention of kind patch: add one, or drop patch_sentence",
                    field="patch_sentence",
                    code="patch_sentence_unused",
                )
            )
    raise_all(problems)


def intervention_conflicts(
    *,
    interventions: bool,
    patch_given: bool = False,
    target_given: bool = False,
    explicit_input: bool = False,
    bug: bool = False,
    decode: bool = False,
    generate: bool = False,
    lm_head: bool = False,
    explain: bool = False,
) -> list[EngineError]:
    """What interventions cannot be combined with: a known bug, decoding, generation (they recompute the
    trace without the intervention); the second input of a patch needs generated embeddings; a target token
    needs a language-model head."""
    out: list[EngineError] = []
    if not interventions:
        for name, given in (("patch_sentence", patch_given), ("target_token", target_given)):
            if given:
                out.append(
                    VariantConflictError(
                        f"{name} belongs to interventions: add interventions or drop {name}",
                        field=name,
                        code="needs_interventions",
                    )
                )
        return out
    if explain:
        out.append(
            VariantConflictError(
                "/explain recomputes a cell from the trace's own steps, which interventions "
                "replace: drop interventions (POST /trace shows the intervened numbers)",
                field="interventions",
                code="interventions_conflict",
            )
        )
    for name, given in (("inject_bug", bug), ("decode", decode), ("generate", generate)):
        if given:
            out.append(
                VariantConflictError(
                    f"interventions and {name} cannot be combined: {name} recomputes the trace without them; drop one",
                    field="interventions",
                    code="interventions_conflict",
                )
            )
    if patch_given and explicit_input:
        out.append(
            VariantConflictError(
                "patch_sentence is embedded as the sentence is, and this trace takes your "
                "own input: drop input or the patch",
                field="patch_sentence",
                code="patch_needs_generated_input",
            )
        )
    if target_given and not lm_head:
        out.append(
            VariantConflictError(
                "target_token is a token of the language-model head's vocabulary: add lm_head or drop target_token",
                field="target_token",
                code="target_needs_lm_head",
            )
        )
    return out


# ------------------------------------------------------------------ running


def _rows(iv: Intervention) -> tuple[Any, ...]:
    """The index of the replaced rows in the value: [head, positions] or [positions]."""
    pos: Any = slice(None) if iv.positions is None else list(iv.positions)
    return (iv.head, pos) if iv.target in _HEADED else (pos,)


def apply(
    iv: Intervention, value: np.ndarray, source: np.ndarray | None = None, excluded: np.ndarray | None = None
) -> np.ndarray:
    """``value`` with ``iv``'s rows replaced (a new array; ``value`` is left as it is).

    ``source``: the second input's value of the same name (patch); ``excluded``: the pattern's mask
    ([h, n, n] booleans, None when every key is allowed)."""
    out = np.array(value, dtype=np.float64, copy=True)
    rows = _rows(iv)
    if iv.kind == "patch":
        assert source is not None
        out[rows] = source[rows]
    elif iv.kind == "zero":
        out[rows] = 0.0
    elif iv.target == "head_pattern":  # uniform over each query's allowed keys
        allowed = np.ones(value.shape[1:]) if excluded is None else (~excluded[iv.head]).astype(np.float64)
        uniform = allowed / allowed.sum(axis=-1, keepdims=True)  # [n, m]: every row has at least its own key
        out[rows] = uniform[rows[1:]]
    else:  # the mean over every position of the sentence
        whole = value[iv.head] if iv.target in _HEADED else value  # [n, d]
        out[rows] = whole.mean(axis=0)  # [n, d] -> [d], broadcast over the rows
    return out


def intervene(base: Trace, interventions: Sequence[Intervention], source: Trace | None = None) -> Trace:
    """``base`` with the interventions made (``source``: the patch's clean run of the second input): the
    baseline's arrays up to the first intervened step, then every step from there on again, each intervened
    value replaced as soon as its step computes it (in the order given, when several replace the same value)."""
    config = base.config
    hooks: dict[str, list[Intervention]] = {}
    for iv in interventions:
        hooks.setdefault(value_name(config, iv), []).append(iv)
    made_at = {out: i for i, step in enumerate(base.steps) for out in step.writes}
    state = dict(base.state)  # the arrays before the first intervened step are the baseline's own

    def replaced(name: str) -> None:
        for iv in hooks[name]:
            excluded = state.get(name.replace("weights", "excluded")) if iv.target == "head_pattern" else None
            state[name] = apply(iv, state[name], None if source is None else source.state[name], excluded)

    start = len(base.steps)
    for name in hooks:
        if name in made_at:
            start = min(start, made_at[name])
        else:  # your own x (the residual at layer 0): no step makes it; replaced before any step runs
            replaced(name)
            start = 0
    with np.errstate(over="ignore", invalid="ignore"):
        for step in base.steps[start:]:
            out = step.fn(*[state[name] for name in step.inputs])
            if step.outputs:
                state.update(zip(step.outputs, out))
            else:
                state[step.name] = out
            for name in step.writes:
                if name in hooks:
                    replaced(name)
    t = _assemble(
        config,
        base.tokens,
        base.parameters,
        base.parameters_digest,
        base.steps,
        state,
        explicit_parameters=base.parameters_source == "explicit",
        context=base.context_tokens,
    )
    return replace(t, interventions=tuple(interventions), baseline=base)


# ------------------------------------------------------------------ the effect


def max_abs_delta(base: Trace, t: Trace) -> dict[str, list[float] | float]:
    """Each numeric stage's largest change |intervened − baseline|: per layer for a stack's per-layer stages
    (per depth for residual_stream), one number for the others; masked entries are not compared."""
    out: dict[str, list[float] | float] = {}
    layered = t.config.has_block
    for sid, st in t.stages.items():
        if sid in TOKEN_STAGE_IDS or sid not in base.stages:
            continue
        d = np.abs(np.asarray(st.values) - np.asarray(base.stages[sid].values))
        if st.mask is not None:
            d = np.where(st.mask, 0.0, d)
        if layered and (sid in LAYER_STAGE_IDS or sid == "residual_stream"):
            out[sid] = [float(x) for x in d.reshape(d.shape[0], -1).max(axis=1, initial=0.0)]
        else:
            out[sid] = float(d.max(initial=0.0))
    return out


def target_effect(base: Trace, t: Trace, target_token: str | None = None) -> dict[str, Any]:
    """With a language-model head: the target token (given, else the baseline's most probable next token), its
    logit at the last position and its next-token probability, before and after, and their change (the logit
    difference)."""
    vocab = base.vocabulary or []
    p0, p1 = np.asarray(base.stages["next_token_probs"].values), np.asarray(t.stages["next_token_probs"].values)
    j = vocab.index(target_token) if target_token is not None else int(np.argmax(p0))
    l0 = float(np.asarray(base.stages["logits"].values)[-1, j])  # the last position's logit of the target
    l1 = float(np.asarray(t.stages["logits"].values)[-1, j])
    return {
        "token": vocab[j],
        "index": j,
        "logit": {"baseline": l0, "intervened": l1, "delta": l1 - l0},
        "probability": {"baseline": float(p0[j]), "intervened": float(p1[j]), "delta": float(p1[j] - p0[j])},
    }


def check_target_token(target_token: str | None, vocabulary: Sequence[str]) -> None:
    if target_token is not None and target_token not in vocabulary:
        raise InvalidSizeError(
            f"target_token {target_token[:64]!r} is not in the vocabulary (the sentence's "
            "tokens and the candidates): add it to candidates",
            field="target_token",
            code="target_not_in_vocabulary",
        )
