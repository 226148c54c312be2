"""The attention bugs students make most often, as documented, injectable variants.

Each bug changes one step of the correct computation. ``/trace`` can return a
trace with one injected (for spot-the-bug exercises and a grader's own
negative tests), and ``/check`` recomputes with each one to diagnose a
submission. The names are a public contract.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bug:
    name: str
    summary: str  # one line, fit to show a student
    stage: str  # the first stage it changes


BUGS: dict[str, Bug] = {
    b.name: b
    for b in (
        Bug("scale_after_softmax",
            "the scores were divided by √d_k after the softmax, softmax(QKᵀ)/√d_k, instead of before it, "
            "so the weights no longer sum to 1", "scaled_scores"),
        Bug("scale_by_d_model",
            "the scores were divided by √d_model instead of √d_k (the width of one head)", "scaled_scores"),
        Bug("double_scale",
            "the scores were divided by √d_k twice (by d_k)", "scaled_scores"),
        Bug("no_scale",
            "the scores were not divided by √d_k at all, so the softmax saturates", "scaled_scores"),
        Bug("finite_mask_fill",
            "masked keys were filled with a finite value (0) instead of being excluded, so future tokens "
            "still get weight", "masked_scores"),
        Bug("softmax_wrong_axis",
            "the softmax was taken over the queries (columns) instead of the keys (rows), so rows do not sum to 1",
            "weights"),
        Bug("average_heads",
            "the heads were averaged instead of concatenated, which mixes their outputs and loses information",
            "concat"),
    )
}

BUG_NAMES: tuple[str, ...] = tuple(BUGS)
