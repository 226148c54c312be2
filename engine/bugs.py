"""The attention mistakes students make most often, as data.

Each :class:`Bug` swaps one step of ``engine.layer`` (or one step's
parameter, which is a step too) for a wrong one, with the formula that the
wrong step really computes. Moving a step (dividing after the softmax instead
of before it) or replacing two that belong together (averaging the heads
changes what W_O multiplies) swaps two. Nothing else in the engine or the
service knows a bug by name: ``/trace`` injects one with
``engine.inject_bug``, and ``/check`` diagnoses a submission by recomputing
the reference's trace from each bug's step on.

A bug also says when it changes nothing (``unchanged_when``): showing or
diagnosing it there would label correct numbers as wrong, so such a request
is refused with the reason. The names are a public contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import attention as A
from .errors import BugNotApplicableError, UnknownBugError
from .layer import Step, TraceConfig


@dataclass(frozen=True)
class Bug:
    name: str
    summary: str  # one line, fit to show a student
    stage: str  # the first stage it changes
    replaces: tuple[Step, ...]  # the wrong steps, each replacing the correct step of its name
    #: why it would change no number for this configuration and token count, or None when it does
    unchanged_when: Callable[[TraceConfig, int], str | None]
    needs_causal: bool = False  # it is a mistake in the mask, so it needs one


# ---------------------------------------------------------------- the wrong steps


def _unscaled() -> float:
    return 1.0


def _scale_by_d_model(d_model: int) -> float:
    return float(np.sqrt(d_model))


def _scale_twice(d_k: int, scale: bool) -> float:
    factor = A.scale_factor(d_k, scale)
    return factor * factor  # (√d_k)², as the mistake computes it: not always exactly d_k


def _softmax_then_scale(scores: np.ndarray, excluded: np.ndarray | None, d_k: int, scale: bool) -> np.ndarray:
    return A.softmax(scores, excluded) / A.scale_factor(d_k, scale)  # [h, n, n], rows sum to 1/√d_k


def _fill_with_zero(scores: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    filled, excluded = A.apply_mask(scores, mask)  # [h, n, n]
    return filled, np.zeros_like(excluded)  # the zeros are real scores: nothing is excluded


def _softmax_over_queries(scores: np.ndarray, excluded: np.ndarray | None) -> np.ndarray:
    mask = None if excluded is None else excluded.swapaxes(-1, -2)
    return A.softmax(scores.swapaxes(-1, -2), mask).swapaxes(-1, -2)  # [h, n, n], columns sum to 1


def _mean_of_heads(context: np.ndarray) -> np.ndarray:
    return context.mean(axis=0)  # [h, n, d_k] -> [n, d_k]: the heads' signals blur together


def _tiled_output(concat: np.ndarray, W_O: np.ndarray) -> np.ndarray:
    tiled = np.tile(concat, (1, W_O.shape[1] // concat.shape[1]))  # [n, d_k] -> [n, h·d_k]: the mean in every slot
    return A.output_projection(tiled, W_O)  # [n, h·d_k] -> [n, d_model]


# ------------------------------------------------------ when a bug changes nothing


def _factor_is_one(config: TraceConfig, n: int) -> str | None:
    if not config.scale:
        return "with scale: false the scores are not divided at all"
    if config.d_k == 1:
        return "d_k is 1, so √d_k is 1"
    return None


def _d_model_is_d_k(config: TraceConfig, n: int) -> str | None:
    if config.scale and config.num_heads == 1:
        return "with one head d_k = d_model, so √d_model is √d_k"
    if not config.scale and config.d_model == 1:
        return "d_model is 1, so √d_model is 1, the divisor that scale: false uses"
    return None


def _one_token(config: TraceConfig, n: int) -> str | None:
    return "with one token there is nothing to mask or normalise across" if n == 1 else None


def _one_head(config: TraceConfig, n: int) -> str | None:
    return "with one head the mean of the heads is that head" if config.num_heads == 1 else None


_SCALE_AFTER = Step("weights", _softmax_then_scale, ("masked_scores", "excluded", "d_k", "scale"),
                    "softmax({masked_scores})/√d_k")

BUGS: dict[str, Bug] = {
    b.name: b
    for b in (
        Bug("scale_after_softmax",
            "the scores were divided by √d_k after the softmax, softmax(QKᵀ)/√d_k, instead of before it, "
            "so the weights no longer sum to 1", "scaled_scores",
            (Step("scale_factor", _unscaled, (), ""), _SCALE_AFTER), _factor_is_one),
        Bug("scale_by_d_model",
            "the scores were divided by √d_model instead of √d_k (the width of one head)", "scaled_scores",
            (Step("scale_factor", _scale_by_d_model, ("d_model",), "/√d_model"),), _d_model_is_d_k),
        Bug("double_scale",
            "the scores were divided by √d_k twice (by d_k)", "scaled_scores",
            (Step("scale_factor", _scale_twice, ("d_k", "scale"), "/d_k"),), _factor_is_one),
        Bug("no_scale",
            "the scores were not divided by √d_k at all, so the softmax saturates", "scaled_scores",
            (Step("scale_factor", _unscaled, (), ""),), _factor_is_one),
        Bug("finite_mask_fill",
            "masked keys were filled with a finite value (0) instead of being excluded, so future tokens "
            "still get weight", "masked_scores",
            (Step("masked_scores", _fill_with_zero, ("scaled_scores", "mask"), "fill0({scaled_scores})",
                  note=": keys after the query are set to 0, not excluded", outputs=("masked_scores", "excluded")),),
            _one_token, needs_causal=True),
        Bug("softmax_wrong_axis",
            "the softmax was taken over the queries (columns) instead of the keys (rows), so rows do not sum to 1",
            "weights",
            (Step("weights", _softmax_over_queries, ("masked_scores", "excluded"),
                  "softmax_over_queries({masked_scores})"),), _one_token),
        Bug("average_heads",
            "the heads were averaged instead of concatenated, which mixes their outputs and loses information",
            "concat",
            (Step("concat", _mean_of_heads, ("context",), "Mean(head₁, …, head_h)"),
             Step("output", _tiled_output, ("concat", "W_O"), "Tile({concat})·W_Oᵀ")), _one_head),
    )
}

BUG_NAMES: tuple[str, ...] = tuple(BUGS)


def why_unchanged(bug: Bug, config: TraceConfig, n: int) -> BugNotApplicableError | None:
    """The error that says why ``bug`` would change no number of this trace, or None when it would."""
    if bug.needs_causal and not config.causal:
        return BugNotApplicableError(f"the {bug.name} bug needs causal: true (there is no mask without it)",
                                     code="bug_needs_causal")
    reason = bug.unchanged_when(config, n)
    if reason:
        return BugNotApplicableError(f"the {bug.name} bug changes no number of this trace: {reason}; "
                                     "choose another bug or configuration", code="bug_changes_nothing")
    return None


def check_bug(name: str, config: TraceConfig, n: int) -> Bug:
    """The bug of that name, if it exists and changes this trace; else an EngineError that says why."""
    if name not in BUGS:
        raise UnknownBugError(f"unknown bug {name!r}; known bugs: {', '.join(BUGS)}")
    error = why_unchanged(BUGS[name], config, n)
    if error:
        raise error
    return BUGS[name]


def applicable_bugs(config: TraceConfig, n: int) -> list[Bug]:
    """The bugs that change a trace of this configuration, in the documented order (for diagnosis)."""
    return [b for b in BUGS.values() if why_unchanged(b, config, n) is None]
