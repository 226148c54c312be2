"""The attention mistakes students make most often, as data.

Each :class:`Bug` swaps one step of ``engine.layer`` (or one step's
parameter, which is a step too) for a wrong one, with the formula that the
wrong step really computes. Moving a step (dividing after the softmax instead
of before it) or replacing two that belong together (averaging the heads
changes what W_O multiplies) swaps two. Nothing else in the engine or the
service knows a bug by name: ``/trace`` injects one with
``engine.inject_bug``, and ``/check`` diagnoses a submission by recomputing
the reference's trace from each bug's step on.

A bug has one refusal rule (``refuse``), a function of :class:`Here` (the
configuration, the query and key counts, an explicit x, cross-attention) that
answers why this mistake cannot show, or changes nothing, here; None when it
can be shown. It returns a :class:`Refusal` of one of three kinds: the
mistake is in the mask and there is none (``needs_causal``), a trace of this
configuration cannot show it (``cannot_show``: a positional-encoding mistake
with a given x or under RoPE, a log-softmax's −inf under a mask, a
projection mistake in cross-attention), or it would change no number
(``changes_nothing``: showing or diagnosing it would label correct numbers
as wrong). Rules are built from the small predicates below with
:func:`first`. The names are a public contract; new bugs go at the end,
since diagnosis names the first match in this order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Literal

import numpy as np
from numpy.typing import NDArray

from . import attention as A
from . import block as B
from . import lm as LM
from .errors import BugNotApplicableError, UnknownBugError
from .layer import Rewrite, Step, TraceConfig, block_wiring
from .params import token_embeddings


@dataclass(frozen=True)
class Here:
    """Where a bug would be shown: the configuration, n queries and m keys (m = n in self-attention, the
    context's length in cross-attention), whether x is given, and whether it is cross-attention."""

    config: TraceConfig
    n: int
    m: int
    explicit_input: bool = False
    cross: bool = False


@dataclass(frozen=True)
class Refusal:
    """Why a bug is refused here: it needs a mask (``needs_causal``), this trace cannot show it
    (``cannot_show``), or it would change no number (``changes_nothing``)."""

    kind: Literal["needs_causal", "cannot_show", "changes_nothing"]
    reason: str


#: a bug's refusal rule: why it cannot show or changes nothing here, or None when it shows
Rule = Callable[[Here], Refusal | None]


def first(*rules: Rule) -> Rule:
    """The rule that answers with the first of ``rules`` that refuses."""
    def rule(here: Here) -> Refusal | None:
        for r in rules:
            refusal_ = r(here)
            if refusal_ is not None:
                return refusal_
        return None
    return rule


def never(here: Here) -> Refusal | None:
    """The rule of a bug that always changes something."""
    return None


@dataclass(frozen=True, eq=False)
class Bug:
    name: str
    summary: str  # one line, fit to show a student
    stage: str  # the first stage it changes
    replaces: tuple[Step | Rewrite, ...]  # the wrong steps, each replacing the correct step of its name
    refuse: Rule = never  # why it cannot show, or changes nothing, here (None: it shows)
    #: the wrong steps for a configuration, when they depend on it (a pre-norm block written for a post-norm one
    #: is the pre-norm block of the same norm and FFN); ``replaces`` otherwise
    replaces_for: Callable[[TraceConfig], tuple[Step | Rewrite, ...]] | None = None

    def steps(self, config: TraceConfig) -> tuple[Step | Rewrite, ...]:
        """The wrong steps this mistake swaps into a trace of ``config``."""
        return self.replaces if self.replaces_for is None else self.replaces_for(config)

    @cached_property
    def needs_causal(self) -> bool:
        """Whether it is a mistake in the mask, so that a trace without one refuses it (the API says so)."""
        refused = self.refuse(Here(TraceConfig(), 3, 3))
        return refused is not None and refused.kind == "needs_causal"


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


def _mean_of_heads(context: NDArray[np.float64]) -> NDArray[np.float64]:
    blurred: NDArray[np.float64] = context.mean(axis=0)  # [h, n, d_k] -> [n, d_k]: the heads' signals blur together
    return blurred


def _tiled_output(concat: np.ndarray, W_O: np.ndarray) -> np.ndarray:
    tiled = np.tile(concat, (1, W_O.shape[1] // concat.shape[1]))  # [n, d_k] -> [n, h·d_k]: the mean in every slot
    return A.output_projection(tiled, W_O)  # [n, h·d_k] -> [n, d_model]


def _project_without_transpose(x: NDArray[np.float64], W: NDArray[np.float64]) -> NDArray[np.float64]:
    h, d_k, d_model = W.shape
    y = x @ W.reshape(h * d_k, d_model)  # [n, d_model] @ [h·d_k, d_model]: the missing .T (square, so it runs)
    return y.reshape(x.shape[0], h, d_k).transpose(1, 0, 2)  # [n, h·d_k] -> [h, n, d_k]


def _split_heads_without_transpose(x: NDArray[np.float64], W: NDArray[np.float64]) -> NDArray[np.float64]:
    h, d_k, d_model = W.shape
    y = x @ W.reshape(h * d_k, d_model).T  # [n, d_model] @ [d_model, h·d_k] -> [n, h·d_k]
    return y.reshape(h, x.shape[0], d_k)  # [n, h·d_k] -> [h, n, d_k] with no transpose: heads mix tokens


def _mask_with_diagonal(scores: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    own = np.eye(mask.shape[-1], dtype=bool)  # [n, n]: each query's own key
    return A.apply_mask(scores, mask | own)  # causal: j >= i, so a query cannot see itself (a window stays)


def _mask_after_softmax(scores: np.ndarray, excluded: np.ndarray) -> np.ndarray:
    return np.where(excluded, 0.0, A.softmax(scores))  # [h, n, n]: future keys zeroed, rows not renormalised


def _log_softmax(scores: NDArray[np.float64], excluded: None) -> NDArray[np.float64]:
    shifted: NDArray[np.float64] = scores - scores.max(axis=-1, keepdims=True)  # [h, n, n]
    total: NDArray[np.float64] = np.exp(shifted).sum(axis=-1, keepdims=True)  # [h, n, n] -> [h, n, 1]
    return shifted - np.log(total)  # [h, n, n]: log-probabilities, ≤ 0


def _concat_token_major(context: np.ndarray) -> np.ndarray:
    h, n, d_k = context.shape
    return context.reshape(n, h * d_k)  # [h, n, d_k] -> [n, h·d_k] without the transpose: rows mix tokens


def _first_block_output(concat: np.ndarray, W_O: np.ndarray) -> np.ndarray:
    return A.output_projection(concat, W_O[:, : concat.shape[1]])  # [n, d_k] @ [d_k, d_model]: one head's block


def _embedding_only(token_embedding: np.ndarray) -> np.ndarray:
    return token_embedding.copy()  # [n, d_model]: the positional encoding was never added


def _encoding_added_twice(token_embedding: np.ndarray, positional_encoding: np.ndarray) -> np.ndarray:
    x = A.add_positional_encoding(token_embedding, positional_encoding)  # [n, d_model]
    return A.add_positional_encoding(x, positional_encoding)  # [n, d_model]: x += PE once more


# ------------------------------------------------- why a bug cannot show, or changes nothing


def _unchanged(reason: str | None) -> Refusal | None:
    return None if reason is None else Refusal("changes_nothing", reason)


def _cannot(reason: str | None) -> Refusal | None:
    return None if reason is None else Refusal("cannot_show", reason)


def needs_mask(here: Here) -> Refusal | None:
    return None if here.config.causal else Refusal("needs_causal", "there is no mask without it")


def _factor_is_one(here: Here) -> Refusal | None:
    if not here.config.scale:
        return _unchanged("with scale: false the scores are not divided at all")
    if here.config.d_k == 1:
        return _unchanged("d_k is 1, so √d_k is 1")
    return None


def _d_model_is_d_k(here: Here) -> Refusal | None:
    config = here.config
    if config.scale and config.num_heads == 1:
        return _unchanged("with one head d_k = d_model, so √d_model is √d_k")
    if not config.scale and config.d_model == 1:
        return _unchanged("d_model is 1, so √d_model is 1, the divisor that scale: false uses")
    return None


def _one_token(here: Here) -> Refusal | None:
    return _unchanged("with one token there is nothing to mask or normalise across" if here.n == 1 else None)


def _one_visible_key(here: Here) -> Refusal | None:
    if here.n == 1 and here.m == 1:
        return _unchanged("with one token there is nothing to mask or normalise across")
    if here.config.window == 1:
        return _unchanged("with window 1 each query sees only its own key, so each row and each column holds one "
                          "weight, 1")
    return None


def _one_head(here: Here) -> Refusal | None:
    return _unchanged("with one head the mean of the heads is that head" if here.config.num_heads == 1 else None)


def _square_one(here: Here) -> Refusal | None:
    return _unchanged("with d_model 1 every weight matrix is its own transpose" if here.config.d_model == 1 else None)


def _one_head_or_token(here: Here) -> Refusal | None:
    if here.config.num_heads == 1:
        return _unchanged("with one head there is nothing to interleave")
    return _unchanged("with one token there is nothing to interleave" if here.n == 1 else None)


def _no_encoding(here: Here) -> Refusal | None:
    if here.config.positional_encoding == "none":
        return _unchanged("with positional_encoding: none the encoding is zero")
    if here.n == 1 and here.config.d_model == 1:
        return _unchanged("one token at d_model 1 has the encoding sin(0) = 0")
    return None


def _added_encoding(here: Here) -> Refusal | None:
    if here.explicit_input:
        return _cannot("with your own input x there is no positional encoding step to get wrong")
    if here.config.rope:
        return _cannot("with RoPE no positional encoding is added to x: position enters by rotating q and k; "
                       "show it with positional_encoding \"sinusoidal\"")
    if here.cross:
        return _cannot("in cross-attention the sentence and the context each add their own encoding; "
                       "show it in self-attention")
    return None


def _no_mask(here: Here) -> Refusal | None:
    return _cannot("with causal: true a log-softmax gives −inf to the masked keys, which no trace can hold; "
                   "show it with causal: false" if here.config.causal else None)


def _self_projection(here: Here) -> Refusal | None:
    return _cannot("in cross-attention the keys and values are projected from the context, not from x; "
                   "show it in self-attention" if here.cross else None)


def _square_projection(here: Here) -> Refusal | None:
    config = here.config
    if config.grouped:
        return _cannot(f"with {config.kv_heads} K/V heads the stacked W_K is [{config.kv_heads * config.d_k}, "
                       f"{config.d_model}], not square, so x·W fails with a shape error instead of giving wrong "
                       "numbers; show it with num_kv_heads equal to num_heads")
    return _self_projection(here)


_SCALE_AFTER = Step("weights", _softmax_then_scale, ("masked_scores", "excluded", "d_k", "scale"),
                    "softmax({masked_scores})/√d_k")
_MEAN_OF_HEADS = Step("concat", _mean_of_heads, ("context",), "Mean(head₁, …, head_h)")


def _projections(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], how: str) -> tuple[Step, ...]:
    """A mistake in project() is made for each of its three calls."""
    return tuple(Step(name, fn, ("input", f"W_{name.upper()}"), f"{name.upper()}ᵢ = {how}") for name in "qkv")

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
            first(needs_mask, _one_token)),
        Bug("softmax_wrong_axis",
            "the softmax was taken over the queries (columns) instead of the keys (rows), so rows do not sum to 1",
            "weights",
            (Step("weights", _softmax_over_queries, ("masked_scores", "excluded"),
                  "softmax_over_queries({masked_scores})"),), _one_visible_key),
        Bug("average_heads",
            "the heads were averaged instead of concatenated, which mixes their outputs and loses information",
            "concat",
            (_MEAN_OF_HEADS, Step("output", _tiled_output, ("concat", "W_O"), "Tile({concat})·W_Oᵀ")), _one_head),
        Bug("projection_not_transposed",
            "the projections used x·W instead of x·Wᵀ (the heads' [d_k, d_model] matrices stacked but not "
            "transposed), so every query, key and value is wrong", "q",
            _projections(_project_without_transpose, "x·W (W stacked [h·d_k, d_model], not transposed)"),
            first(_square_projection, _square_one)),
        Bug("heads_split_without_transpose",
            "the projection [n, h·d_k] was reshaped straight to [h, n, d_k], without going through [n, h, d_k] "
            "and transposing, so each head mixes pieces of different tokens", "q",
            _projections(_split_heads_without_transpose, "reshape(x·Wᵀ, [h, n, d_k]) (no transpose)"),
            first(_self_projection, _one_head_or_token)),
        Bug("mask_includes_diagonal",
            "the causal mask also hid each query's own key (j ≥ i instead of j > i), so the first query sees "
            "nothing and every other query ignores itself", "masked_scores",
            (Step("masked_scores", _mask_with_diagonal, ("scaled_scores", "mask"), "mask_diag({scaled_scores})",
                  note=": keys at and after the query are excluded, the query's own key too",
                  outputs=("masked_scores", "excluded")),),
            needs_mask),
        Bug("mask_after_softmax",
            "the mask was applied after the softmax, zeroing the future keys' weights without renormalising, "
            "so rows sum to less than 1", "weights",
            (Step("weights", _mask_after_softmax, ("scaled_scores", "excluded"), "mask(softmax({scaled_scores}))"),),
            first(needs_mask, _one_token)),
        Bug("log_softmax",
            "log-softmax was used instead of softmax, so the weights are log-probabilities (all ≤ 0) "
            "instead of probabilities that sum to 1", "weights",
            (Step("weights", _log_softmax, ("masked_scores", "excluded"), "log_softmax({masked_scores})"),),
            _no_mask),
        Bug("concat_token_major",
            "the heads' [h, n, d_k] context was reshaped straight to [n, h·d_k] without moving the head axis "
            "next to d_k, so each row mixes different tokens", "concat",
            (Step("concat", _concat_token_major, ("context",), "reshape(context, [n, h·d_k]) (no transpose)"),),
            _one_head_or_token),
        Bug("average_heads_sliced_W_O",
            "the heads were averaged and multiplied by W_O[:, :d_k], one head's block of W_O, instead of "
            "concatenated and multiplied by all of W_O", "concat",
            (_MEAN_OF_HEADS, Step("output", _first_block_output, ("concat", "W_O"), "{concat}·W_O[:, :d_k]ᵀ")),
            _one_head),
        Bug("positional_encoding_missing",
            "the positional encoding was never added to the embeddings, so the model cannot tell positions apart",
            "input", (Step("input", _embedding_only, ("token_embedding",), "x = E (PE forgotten)"),),
            first(_added_encoding, _no_encoding)),
        Bug("positional_encoding_twice",
            "the positional encoding was added twice, x = E + 2·PE", "input",
            (Step("input", _encoding_added_twice, ("token_embedding", "positional_encoding"), "x = E + PE + PE"),),
            first(_added_encoding, _no_encoding)),
    )
}

# ------------------------------------------------- mistakes in how the layer is wired
# Every step's function is right; the layer passes one the wrong thing, or skips one. A student who
# writes one function per stage makes these in the function that calls them all: each function passes
# its own test, and only the whole layer is wrong.


def _unmasked(scores: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return scores, np.zeros(scores.shape, dtype=bool)  # [h, n, n]: the causal flag ignored, nothing excluded


def _concat_as_output(concat: np.ndarray, W_O: np.ndarray) -> np.ndarray:
    return concat.copy()  # [n, h·d_k] = [n, d_model]: W_O never applied (the shapes agree, so it runs)


def _single_layer(here: Here) -> Refusal | None:
    return _cannot("in a Transformer block each layer's keys and values read the residual stream, not the "
                   "embeddings; show it in one attention layer (no block field)" if here.config.has_block else None)


def _grouped(here: Here) -> Refusal | None:
    return _cannot("with shared K/V heads W_Q and W_K have different shapes, so using one for the other fails "
                   "with a shape error; show it with num_kv_heads equal to num_heads" if here.config.grouped else None)


for _bug in (
    Bug("same_w_for_q_and_k",
        "the keys were projected with W_Q instead of W_K (the queries' matrix twice), so every head's scores "
        "q·qᵀ are symmetric", "k",
        (Step("k", A.project, ("input", "W_Q"), "Kᵢ = x·W_Qᵢᵀ (W_Q, not W_K)"),), first(_self_projection, _grouped)),
    Bug("positional_encoding_queries_only",
        "the positional encoding was added to the queries' input only: Q from x = E + PE, but K and V from the "
        "embeddings E alone, so the keys and values carry no position", "k",
        (Step("k", A.project, ("token_embedding", "W_K"), "Kᵢ = E·W_Kᵢᵀ (no PE)"),
         Step("v", A.project, ("token_embedding", "W_V"), "Vᵢ = E·W_Vᵢᵀ (no PE)")),
        first(_added_encoding, _single_layer, _no_encoding)),
    Bug("mask_not_applied",
        "the causal mask was never applied (the causal flag was ignored), so every query also attends to the "
        "keys after it", "masked_scores",
        (Step("masked_scores", _unmasked, ("scaled_scores", "mask"), "{scaled_scores} (not masked)",
              note=": the keys after the query are not excluded", outputs=("masked_scores", "excluded")),),
        first(needs_mask, _one_token)),
    Bug("output_projection_missing",
        "the heads' concatenation was returned as the output: W_O was never applied", "output",
        (Step("output", _concat_as_output, ("concat", "W_O"), "{concat} (W_O not applied)"),)),
):
    BUGS[_bug.name] = _bug
del _bug

BUG_NAMES: tuple[str, ...] = tuple(BUGS)


# ---------------------------------------------------------------- the block's mistakes
#
# Each is written as a student writes it: a ``layer_norm``, ``ffn`` or ``block`` function with the mistake in it,
# called wherever the correct one is (every layer, and the final norm). They are kept apart from BUGS, the
# attention's mistakes that the API publishes (inject_bug's names, GET /version), so that a trace without a block
# answers exactly as before; ``ALL_BUGS`` is both, and diagnosis tries the block's after the attention's.


def _layer_norm_over_tokens(x: NDArray[np.float64], mean: NDArray[np.float64], variance: NDArray[np.float64],
                            eps: float, gamma: NDArray[np.float64], beta: NDArray[np.float64]) -> NDArray[np.float64]:
    mu: NDArray[np.float64] = x.mean(axis=0)  # [n, d] -> [d]: one mean per feature, over the tokens (axis 0, not -1)
    var: NDArray[np.float64] = ((x - mu) ** 2).mean(axis=0)  # [n, d] -> [d]
    return (x - mu) / np.sqrt(var + eps) * gamma + beta  # [n, d]: each feature normalised across the sentence


def _rms_norm_over_tokens(x: NDArray[np.float64], mean_sq: NDArray[np.float64], eps: float,
                          gamma: NDArray[np.float64]) -> NDArray[np.float64]:
    ms: NDArray[np.float64] = (x * x).mean(axis=0)  # [n, d] -> [d]: over the tokens
    return x / np.sqrt(ms + eps) * gamma  # [n, d]


def _unbiased_variance(x: NDArray[np.float64], mean: NDArray[np.float64]) -> NDArray[np.float64]:
    variance: NDArray[np.float64] = x.var(axis=-1, ddof=1)  # [n, d] -> [n]: ÷ (d − 1), Bessel's (torch.var's default)
    return variance


def _layer_norm_eps_outside(x: NDArray[np.float64], mean: NDArray[np.float64], variance: NDArray[np.float64],
                            eps: float, gamma: NDArray[np.float64], beta: NDArray[np.float64]) -> NDArray[np.float64]:
    return (x - mean[..., None]) / (np.sqrt(variance[..., None]) + eps) * gamma + beta  # [n, d]: √σ² + ε


def _rms_norm_eps_outside(x: NDArray[np.float64], mean_sq: NDArray[np.float64], eps: float,
                          gamma: NDArray[np.float64]) -> NDArray[np.float64]:
    return x / (np.sqrt(mean_sq[..., None]) + eps) * gamma  # [n, d]: √mean(x²) + ε


def _sublayer_only(x: np.ndarray, sublayer: np.ndarray) -> np.ndarray:
    return sublayer  # [n, d]: x = sublayer(x), the x + forgotten


def _no_activation(x: np.ndarray) -> np.ndarray:
    return x.copy()  # [n, f]: the activation was left out, so the FFN is linear


def _norm_rewrite(layer_norm: Callable[..., np.ndarray], rms_norm: Callable[..., np.ndarray],
                  mark: str | Callable[[str], str], note: str) -> Callable[[Step], Step]:
    """A wrong norm made from the correct step: the same inputs, LayerNorm's or RMSNorm's wrong function."""
    def make(step: Step) -> Step:
        fn = layer_norm if step.fn is B.layer_norm else rms_norm
        return Step(step.name, fn, step.inputs, mark(step.formula) if callable(mark) else step.formula + mark,
                    note=note, outputs=step.outputs)
    return make


def _eps_outside(formula: str) -> str:
    return re.sub(r"√\((.*) \+ ε\)", r"(√\1 + ε)", formula)  # "√(σ² + ε)" -> "(√σ² + ε)"


def _unbiased_formula(formula: str) -> str:
    return formula.replace("mean over j of", "Σ over j of") + " / (d_model − 1)"


def _forget_residual(step: Step) -> Step:
    formula = re.sub(r"\b[xh] \+ ", "", step.formula, count=1)  # "h = x + MHA(…)" -> "h = MHA(…)"
    return Step(step.name, _sublayer_only, step.inputs, formula, note=": the residual connection was forgotten")


def _swap_gelu(step: Step) -> Step:
    if step.fn is B.gelu:
        return Step(step.name, B.gelu_tanh, step.inputs, "GELU_tanh({ffn_pre_activation})",
                    note=": GELU's tanh approximation where the exact (erf) GELU was asked for")
    return Step(step.name, B.gelu, step.inputs, "GELU({ffn_pre_activation})",
                note=": the exact (erf) GELU where the tanh approximation was asked for")


def _without_activation(step: Step) -> Step:
    return Step(step.name, _no_activation, step.inputs, "{ffn_pre_activation}",
                note=": the activation was left out, so the feed-forward network is linear")


def _needs_block(here: Here) -> Refusal | None:
    return _cannot(None if here.config.has_block else
                   "it is a mistake in a Transformer block, and this trace is one attention layer; give block "
                   "(\"vaswani2017\", \"gpt2\" or \"llama\") or another block field")


def _needs_layer_norm(here: Here) -> Refusal | None:
    if here.config.norm_kind != "layer_norm":
        return _cannot("RMSNorm has no variance: it divides by the root mean square; show it with norm \"layer_norm\"")
    if here.config.d_model == 1:
        return _cannot("with d_model 1 the unbiased variance divides by d_model − 1 = 0")
    return None


def _needs_post_norm(here: Here) -> Refusal | None:
    return _cannot("the block asked for is pre-norm already; its mistake is post_norm_for_pre_norm"
                   if here.config.pre_norm else None)


def _needs_pre_norm(here: Here) -> Refusal | None:
    return _cannot(None if here.config.pre_norm else
                   "the block asked for is post-norm already; its mistake is pre_norm_for_post_norm")


def _needs_gelu(here: Here) -> Refusal | None:
    return _cannot(None if here.config.ffn_kind in ("gelu", "gelu_tanh") else
                   "the feed-forward network has no GELU; show it with ffn \"gelu\" or \"gelu_tanh\"")


def _needs_swiglu(here: Here) -> Refusal | None:
    return _cannot(None if here.config.gated else
                   "the feed-forward network has no gate; show it with ffn \"swiglu\"")


def _needs_final_norm(here: Here) -> Refusal | None:
    return _cannot(None if here.config.final_norm else
                   "a post-norm stack has no final norm (its last layer ends with one); show it in pre-norm")


def _other_position(pre_norm: bool) -> Callable[[TraceConfig], tuple[Step, ...]]:
    """The block of the other norm position, same norm and FFN: what a student wrote instead."""
    def steps(config: TraceConfig) -> tuple[Step, ...]:
        before, after = block_wiring(config.norm_kind, pre_norm, config.ffn_kind)
        return (*before, *after)
    return steps


_NORMS = ("norm1", "norm2", "final_norm")

BLOCK_BUGS: dict[str, Bug] = {
    b.name: b
    for b in (
        Bug("residual_forgotten",
            "the residual connections were forgotten, x = Sublayer(x) instead of x + Sublayer(x), so each layer "
            "replaces the stream instead of adding to it", "residual1",
            (Rewrite("residual1", _forget_residual), Rewrite("residual2", _forget_residual)), _needs_block),
        Bug("norm_over_tokens",
            "the norm's statistics were taken over the tokens (axis 0) instead of over each token's features "
            "(axis −1), so each token is normalised with the whole sentence", "norm1",
            tuple(Rewrite(name, _norm_rewrite(_layer_norm_over_tokens, _rms_norm_over_tokens, " [over the tokens]",
                                              ": the statistics were taken over the tokens, not the features"))
                  for name in _NORMS), _needs_block),
        Bug("unbiased_variance",
            "LayerNorm's variance divided by d_model − 1 (Bessel's correction, torch.var's default) instead of "
            "d_model", "norm1_variance",
            tuple(Rewrite(f"{name}_variance", lambda s: Step(s.name, _unbiased_variance, s.inputs,
                                                             _unbiased_formula(s.formula),
                                                             note=": unbiased, ÷ (d_model − 1)"))
                  for name in _NORMS), first(_needs_block, _needs_layer_norm)),
        Bug("eps_outside_sqrt",
            "ε was added after the square root, (x − μ)/(√σ² + ε), instead of inside it, (x − μ)/√(σ² + ε)",
            "norm1",
            tuple(Rewrite(name, _norm_rewrite(_layer_norm_eps_outside, _rms_norm_eps_outside, _eps_outside,
                                              ": ε was added outside the square root"))
                  for name in _NORMS), _needs_block),
        Bug("pre_norm_for_post_norm",
            "a pre-norm block, x + Sublayer(Norm(x)), was written where the post-norm block Norm(x + Sublayer(x)) "
            "was asked for", "q", (), first(_needs_block, _needs_post_norm), _other_position(True)),
        Bug("post_norm_for_pre_norm",
            "a post-norm block, Norm(x + Sublayer(x)), was written where the pre-norm block x + Sublayer(Norm(x)) "
            "was asked for", "norm1", (), first(_needs_block, _needs_pre_norm), _other_position(False)),
        Bug("gelu_approximation_swapped",
            "the other GELU was used: the tanh approximation where the exact erf GELU was asked for, or the "
            "reverse (they differ by up to ~5e-4)", "ffn_activation",
            (Rewrite("ffn_activation", _swap_gelu),), first(_needs_block, _needs_gelu)),
        Bug("swiglu_gate_up_swapped",
            "SwiGLU's gate and up projections were swapped, SiLU(x·W_3ᵀ) ⊙ x·W_1ᵀ instead of "
            "SiLU(x·W_1ᵀ) ⊙ x·W_3ᵀ", "ffn_activation",
            (Step("ffn_activation", B.silu, ("ffn_up",), "SiLU({ffn_up})", note=": the up projection was activated"),
             Step("ffn_gated", B.multiply, ("ffn_activation", "ffn_pre_activation"),
                  "{ffn_activation} ⊙ {ffn_pre_activation}")),
            first(_needs_block, _needs_swiglu)),
        Bug("ffn_without_activation",
            "the feed-forward network's activation was left out, so it is one linear map", "ffn_activation",
            (Rewrite("ffn_activation", _without_activation),), _needs_block),
        Bug("final_norm_forgotten",
            "the pre-norm stack's final norm was forgotten, so its output is the raw last residual stream",
            "final_norm", (Step("final_norm", B.same, ("stack_output",), "x_L (the final norm forgotten)"),),
            first(_needs_block, _needs_final_norm)),
    )
}
BLOCK_BUG_NAMES: tuple[str, ...] = tuple(BLOCK_BUGS)


# ---------------------------------------------------------------- the language-model head's mistakes
#
# Made in a student's ``lm_head`` (the logits from the last hidden state) and ``next_token_probs``; kept apart as the
# block's are, so that a stack without a head is diagnosed and refused exactly as before.


def _probs_times_temperature(logits: np.ndarray, temperature: float) -> np.ndarray:
    return A.softmax(logits[-1] * temperature)  # [vocab]: logits·T, not logits/T


def _probs_over_positions(logits: np.ndarray, temperature: float) -> np.ndarray:
    over_tokens = A.softmax((logits / temperature).T)  # [vocab, n]: each vocabulary column normalised over positions
    return over_tokens[:, -1]  # [vocab]: the last position's column, which sums to 1 over the positions, not here


def _probs_of_first_position(logits: np.ndarray, temperature: float) -> np.ndarray:
    return A.softmax(logits[0] / temperature)  # [vocab]: row 0 (a batch index taken for the position)


def _logits_reshaped(h: np.ndarray, W_U: np.ndarray) -> np.ndarray:
    out: np.ndarray = h @ W_U.reshape(W_U.shape[1], W_U.shape[0])  # [n, d] @ [d, vocab]: reshaped, not transposed
    return out


def _other_head(step: Step) -> Step:
    """The other unembedding: the seeded rows where the tied head was asked for, or the reverse."""
    if step.fn is LM.seeded_unembedding:
        return Step(step.name, token_embeddings, ("seed", "d_model", "vocabulary"), "E[vocabulary]",
                    note=": the token embeddings (tied) where a seeded head was asked for")
    return Step(step.name, LM.seeded_unembedding, ("seed", "d_model", "vocabulary"), "W_U[vocabulary] (seeded)",
                note=": a separately seeded head where the head tied to the embeddings was asked for")


def _needs_lm_head(here: Here) -> Refusal | None:
    return _cannot(None if here.config.has_lm_head else
                   "it is a mistake in the language-model head, and this trace has none; add lm_head (\"tied\" or "
                   "\"seeded\") to a stack of blocks")


def _temperature_one(here: Here) -> Refusal | None:
    return _unchanged("with temperature 1 multiplying and dividing by it agree" if here.config.temperature == 1.0
                      else None)


def _constructed_layout(here: Here) -> Refusal | None:
    return _cannot("with constructed heads the tied head is the layout's embeddings, which a seeded head does not "
                   "replace here; show it with seeded heads" if here.config.constructed else None)


def _final_norm_there(here: Here) -> Refusal | None:
    return _cannot(None if here.config.final_norm else
                   "a post-norm stack has no final norm: its last layer ends with a norm; show it in pre-norm")


def _lm_hidden(config: TraceConfig) -> tuple[Step, ...]:
    return (Step("logits", LM.logits, ("stack_output", "unembedding"), "x_L·W_Uᵀ",
                 note=": the final norm skipped: the raw last residual stream"),)


LM_BUGS: dict[str, Bug] = {
    b.name: b
    for b in (
        Bug("temperature_multiplied",
            "the logits were multiplied by the temperature, softmax(logits·T), instead of divided by it, so a "
            "temperature below 1 flattens the distribution and above 1 sharpens it", "next_token_probs",
            (Step("next_token_probs", _probs_times_temperature, ("logits", "temperature"),
                  "softmax(({logits})[n−1] · T)", note=": multiplied by T, not divided"),),
            first(_needs_lm_head, _temperature_one)),
        Bug("softmax_over_positions",
            "the softmax was taken over the positions (axis 0) instead of over the vocabulary, so the "
            "probabilities do not sum to 1", "next_token_probs",
            (Step("next_token_probs", _probs_over_positions, ("logits", "temperature"),
                  "softmax_over_positions(({logits}) / T)[n−1]"),), _needs_lm_head),
        Bug("lm_final_norm_skipped",
            "the head read the last residual stream itself, not its final norm (GPT-2's ln_f), so every logit "
            "is scaled and shifted", "logits", (), first(_needs_lm_head, _final_norm_there), _lm_hidden),
        Bug("lm_head_not_tied",
            "the head was not tied to the token embeddings: a separately seeded W_U where the tied head was asked "
            "for (or the embeddings where a seeded head was)", "unembedding",
            (Rewrite("unembedding", _other_head),), first(_needs_lm_head, _constructed_layout)),
        Bug("lm_head_transposed",
            "W_U [vocab, d_model] was reshaped to [d_model, vocab] instead of transposed, so every logit mixes "
            "the wrong weights", "logits",
            (Step("logits", _logits_reshaped, ("final_norm", "unembedding"), "h·reshape(W_U, [d_model, vocab])"),),
            _needs_lm_head, lambda config: (Step(
                "logits", _logits_reshaped,
                ("final_norm" if config.final_norm else f"layer_output@{config.num_layers - 1}", "unembedding"),
                "h·reshape(W_U, [d_model, vocab])"),)),
        Bug("next_token_from_first_position",
            "the next token's probabilities came from the first position's logits (logits[0]) instead of the "
            "last one's (logits[n − 1])", "next_token_probs",
            (Step("next_token_probs", _probs_of_first_position, ("logits", "temperature"),
                  "softmax(({logits})[0] / T)", note=": the first position's logits, not the last's"),),
            first(_needs_lm_head, _one_token)),
    )
}
LM_BUG_NAMES: tuple[str, ...] = tuple(LM_BUGS)
#: every known mistake, the attention's first: diagnosis names the first match in this order
ALL_BUGS: dict[str, Bug] = {**BUGS, **BLOCK_BUGS, **LM_BUGS}


def refusal(bug: Bug, config: TraceConfig, n: int, *, explicit_input: bool = False,
            n_context: int | None = None) -> BugNotApplicableError | None:
    """The error that says why ``bug`` cannot be shown here or would change no number, or None when it would.

    ``n_context`` is the context's token count in cross-attention (None in self-attention).
    """
    refused = bug.refuse(Here(config, n, n if n_context is None else n_context, explicit_input, n_context is not None))
    if refused is None:
        return None
    if refused.kind == "needs_causal":
        return BugNotApplicableError(f"the {bug.name} bug needs causal: true ({refused.reason})",
                                     code="bug_needs_causal")
    if refused.kind == "cannot_show":
        return BugNotApplicableError(f"the {bug.name} bug cannot be shown here: {refused.reason}",
                                     code="bug_not_applicable")
    return BugNotApplicableError(f"the {bug.name} bug changes no number of this trace: {refused.reason}; "
                                 "choose another bug or configuration", code="bug_changes_nothing")


def check_bug(name: str, config: TraceConfig, n: int, *, explicit_input: bool = False,
              n_context: int | None = None) -> Bug:
    """The bug of that name, if it exists and changes this trace; else an EngineError that says why."""
    if name not in ALL_BUGS:
        # a trace without a block names engine 1.0's list, as before; a stack without a head the block's too
        known = {**BUGS, **BLOCK_BUGS, **(LM_BUGS if config.has_lm_head else {})} if config.has_block else BUGS
        raise UnknownBugError(f"unknown bug {name!r}; known bugs: {', '.join(known)}")
    error = refusal(ALL_BUGS[name], config, n, explicit_input=explicit_input, n_context=n_context)
    if error:
        raise error
    return ALL_BUGS[name]


def applicable_bugs(config: TraceConfig, n: int, *, explicit_input: bool = False,
                    n_context: int | None = None) -> list[Bug]:
    """The bugs that change a trace of this configuration, in the documented order (for diagnosis)."""
    return [b for b in ((ALL_BUGS if config.has_lm_head else {**BUGS, **BLOCK_BUGS}) if config.has_block
                        else BUGS).values()
            if refusal(b, config, n, explicit_input=explicit_input, n_context=n_context) is None]
