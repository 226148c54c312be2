"""POST /explain: one cell of a trace, number by number (engine/explain.py), over HTTP.

The body is a /trace request plus ``head``, ``query`` and ``key`` (0-based);
the answer is the explanation of that cell with the trace's schema and engine
versions and its config. Edge handling is /trace's (``service.edge``): the
content type and body limit, strict pydantic validation with every problem in
one 422, the engine's refusals as 422s, the request's cost estimate for
compression, and JSON without NaN or infinities.

Its request and answer models live here with the route and its fragment of
openapi.yaml (:func:`openapi_paths`), which refers to the shared parts
(``ConfigOut``, …) in ``components.schemas``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
import orjson
from flask import Blueprint, Response, g
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidatorFunctionWrapHandler, WrapValidator,
                      model_validator)
from pydantic_core import PydanticCustomError

import engine
from engine import EngineError, TraceConfig
from engine.explain import (NORMS, STEP_IDS, check_cell, check_explainable, check_ffn_cell, check_layer,
                            check_logit_cell, check_norm_cell, explain_cell, explain_ffn_cell, explain_logit_cell,
                            explain_norm_cell)
from engine import interventions as IV
from engine.errors import raise_all
from engine.layer import FFN_KINDS, NORM_KINDS

from .. import budget, compression, serialize
from ..edge import json_response, parse_body, read_json_body
from ..models import ConfigOut, StageId, engine_rules, omitted
from .trace import TraceRequest

if TYPE_CHECKING:
    from ..openapi_parts import Parts

bp = Blueprint("explain", __name__)

#: the cells /explain walks: an attention weight (the default), a norm's value, a feed-forward unit
CELL_KINDS: tuple[str, ...] = ("attention", *NORMS, "ffn", "logit")

_CELL_DOC = (" Validated against the configuration after tokenizing; a value out of range is a 422 whose entry "
             "names the field and the valid range.")


def _cell_kind(v: Any, handler: ValidatorFunctionWrapHandler) -> str:
    """An attention cell's ``cell`` is "attention" (a norm's or the FFN's body is another model's): a cell of
    no kind is told every kind."""
    try:
        return handler(v)
    except ValidationError:
        kinds = [repr(kind) for kind in CELL_KINDS]
        raise PydanticCustomError("literal_error", "Input should be {expected}",
                                  {"expected": f"{', '.join(kinds[:-1])} or {kinds[-1]}"}) from None


class ExplainRequest(TraceRequest):
    """A /trace request plus the cell to explain: head, query and key (0-based)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"sentence": "the cat sat", "d_model": 24, "num_heads": 1, "head": 0, "query": 1, "key": 2},
                {"sentence": "the cat sat", "d_model": 8, "num_heads": 2, "causal": True, "head": 1, "query": 0,
                 "key": 2},
            ]
        },
    )

    # The ranges depend on the configuration and the tokens: checked below, with the valid range in the message.
    head: int = Field(json_schema_extra={"minimum": 0},
                      description="The head, 0 … num_heads − 1 (a query head under grouped-query attention)."
                      + _CELL_DOC)
    query: int = Field(json_schema_extra={"minimum": 0},
                       description="The query token's index in the sentence's tokens, 0 … n − 1." + _CELL_DOC)
    key: int = Field(json_schema_extra={"minimum": 0},
                     description="The key token's index, 0 … n − 1; in cross-attention an index into the "
                     "context's tokens." + _CELL_DOC)
    cell: Annotated[Literal["attention"], WrapValidator(_cell_kind)] = Field(
        default="attention",
        description="Which cell to explain: `attention` (the default: head, query and key), or in a stack of "
        "blocks a norm's value (`norm1`, `norm2`, `final_norm`: with layer, token and feature; NormExplainRequest) "
        "or a feed-forward unit (`ffn`: with layer, token and unit; FFNExplainRequest).")
    layer: int = Field(default=0, json_schema_extra={"minimum": 0},
                       description="In a stack of blocks: the layer whose attention the cell is in, 0 … num_layers − "
                       "1; 0 otherwise." + _CELL_DOC)

    @model_validator(mode="after")
    def _cell(self) -> ExplainRequest:
        n_keys = len(self._context) if self._context is not None else len(self._tokens)
        with engine_rules():
            check_explainable(self.inject_bug)
            check_cell(self.trace_config, len(self._tokens), n_keys, self.head, self.query, self.key,
                       cross=self._context is not None)
            # the ignore below: a _Bounds stands in for the Trace
            check_layer(_Bounds(self.trace_config, len(self._tokens)), self.layer)  # type: ignore[arg-type]
        return self


class _Bounds:
    """What the engine's cell rules read of a trace (its configuration, token and layer counts), known from
    the validated request before anything is traced."""

    __slots__ = ("config", "n_tokens", "num_layers")

    def __init__(self, config: TraceConfig, n_tokens: int) -> None:
        self.config, self.n_tokens, self.num_layers = config, n_tokens, config.num_layers


def _at_cell(error: EngineError) -> EngineError:
    """The engine names the norm it explains ``norm``, which a request calls ``cell`` (its ``norm`` field is the
    block's norm kind): the same error, at /cell."""
    if error.field not in ("norm", "unit") or error.code not in ("norm_not_in_block", "explain_needs_block"):
        return error
    message = "cell" + error.message[len("norm"):] if error.message.startswith("norm must") else error.message
    return type(error)(message, field="cell", code=error.code)


class LogitExplainRequest(TraceRequest):
    """A /trace request with lm_head, plus one logit to explain: cell "logit", token and column (vocabulary)."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"sentence": "the cat sat", "d_model": 8, "num_heads": 2, "block": "gpt2", "lm_head": "tied",
         "cell": "logit", "token": 2, "column": 1}]})

    cell: Literal["logit"] = Field(description="One logit of the language-model head.")
    token: int = Field(json_schema_extra={"minimum": 0}, description="The position, 0 … n − 1." + _CELL_DOC)
    column: int = Field(json_schema_extra={"minimum": 0},
                        description="The vocabulary token's column, 0 … vocabulary size − 1." + _CELL_DOC)

    @model_validator(mode="after")
    def _cell(self) -> LogitExplainRequest:
        with engine_rules():
            check_explainable(self.inject_bug)
            check_logit_cell(_LMBounds(self.trace_config, self._tokens), self.token,  # type: ignore[arg-type]  # validated ints
                             self.column)
        return self


class _LMBounds:
    """What check_logit_cell reads of a trace (its configuration, token count and vocabulary), before it exists."""

    def __init__(self, config: TraceConfig, tokens: list[Any]) -> None:
        from engine.lm import vocabulary

        self.config, self.n_tokens = config, len(tokens)
        self.vocabulary = vocabulary([t.text for t in tokens], config.candidates) if config.has_lm_head else None


class NormExplainRequest(TraceRequest):
    """A /trace request with a block field, plus a norm's value to explain: cell, layer, token and feature."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"sentence": "the cat sat", "d_model": 8, "num_heads": 2, "block": "gpt2", "num_layers": 2, "cell": "norm1",
         "layer": 1, "token": 2, "feature": 5}]})

    cell: Literal[NORMS] = Field(  # type: ignore[valid-type]  # Literal of a run-time tuple
        description="The norm: norm1, norm2 (each layer's), or final_norm (pre-norm stacks only; no layer).")
    layer: int = Field(default=0, json_schema_extra={"minimum": 0},
                       description="The layer, 0 … num_layers − 1 (ignored for final_norm)." + _CELL_DOC)
    token: int = Field(json_schema_extra={"minimum": 0}, description="The token, 0 … n − 1." + _CELL_DOC)
    feature: int = Field(json_schema_extra={"minimum": 0}, description="The feature, 0 … d_model − 1." + _CELL_DOC)

    @model_validator(mode="after")
    def _cell(self) -> NormExplainRequest:
        with engine_rules():
            check_explainable(self.inject_bug)
            try:
                # the ignore below: a _Bounds stands in for the Trace
                check_norm_cell(_Bounds(self.trace_config, len(self._tokens)),  # type: ignore[arg-type]
                                self.cell, self.layer, self.token, self.feature)
            except EngineError as e:
                raise _at_cell(e) from None
        return self


class FFNExplainRequest(TraceRequest):
    """A /trace request with a block field, plus a feed-forward unit to explain: cell "ffn", layer, token, unit."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"sentence": "the cat sat", "d_model": 8, "num_heads": 2, "block": "llama", "d_ff": 16, "cell": "ffn",
         "layer": 0, "token": 1, "unit": 3}]})

    cell: Literal["ffn"] = Field(description="The feed-forward network.")
    layer: int = Field(default=0, json_schema_extra={"minimum": 0},
                       description="The layer, 0 … num_layers − 1." + _CELL_DOC)
    token: int = Field(json_schema_extra={"minimum": 0}, description="The token, 0 … n − 1." + _CELL_DOC)
    unit: int = Field(json_schema_extra={"minimum": 0}, description="The hidden unit, 0 … d_ff − 1." + _CELL_DOC)

    @model_validator(mode="after")
    def _cell(self) -> FFNExplainRequest:
        with engine_rules():
            check_explainable(self.inject_bug)
            try:
                # the ignore below: a _Bounds stands in for the Trace
                check_ffn_cell(_Bounds(self.trace_config, len(self._tokens)),  # type: ignore[arg-type]
                               self.layer, self.token, self.unit)
            except EngineError as e:
                raise _at_cell(e) from None
        return self


class ExplainStep(BaseModel):
    """One step of the cell's walk. Every step has id, stage, formula, value and index; the rest depend on it."""

    id: Literal[STEP_IDS]  # type: ignore[valid-type]  # Literal of a run-time tuple
    stage: StageId = Field(description="The stage the step's number comes from (exp and denominator are inside "
                                       "the softmax, stage `weights`).")
    formula: str
    value: float | None = Field(description="The step's number, equal to the trace's where it is a stage entry. "
                                            "null for the vector steps, products and contributions (their numbers "
                                            "are in `values` and `vector`).")
    values: list[float | list[float] | None] | None = omitted(
        "products: the d_k products; denominator: every key's exponential (0 for a masked key); contributions: "
        "weight_j·v_j per key (null for a masked key).")
    index: list[int] = Field(description="Where `value` (or the vector step's row) is in `stage`'s values.")
    note: str
    recomputed: float | list[float] | None = omitted(
        "The step recomputed here from the numbers shown (products added in order, score / divisor, exp of one "
        "number, terms added in order, exp / denominator, contributions added in order); null where there is "
        "nothing to recompute.", nullable=True)
    exact: bool | None = omitted("Whether `recomputed` equals the trace's number bit for bit (a BLAS product may "
                                 "sum in another order); null where nothing was recomputed.", nullable=True)
    q: list[float] | None = omitted("products: the query vector (q, or q_rotated).")
    k: list[float] | None = omitted("products: the key vector (k, or k_rotated).")
    k_stage: StageId | None = omitted("products: the stage of `k`.")
    k_index: list[int] | None = omitted("products: [kv_head, key] in `k_stage`.")
    divisor: float | None = omitted("scaled: the trace's scale factor (√d_k, or 1).")
    key: int | None = omitted("row_max: the key holding the row's maximum.")
    key_token: str | None = omitted("row_max: that key's token.")
    exponent: float | None = omitted("exp: scaled − row_max (null for a masked cell).", nullable=True)
    weights: list[float] | None = omitted("contributions: the query row's weights.")
    v: list[list[float]] | None = omitted("contributions: every key's value vector.")
    v_stage: StageId | None = omitted("contributions: the stage of `v`.")
    v_index: list[int] | None = omitted("contributions: [kv_head] in `v_stage`.")
    vector: list[float] | None = omitted("contributions: the trace's context[head, query].")
    max_abs_difference: float | None = omitted("contributions: max |recomputed − vector|.")


class ExplainDecode(BaseModel):
    """With decode: the query's KV-cache step against the cell."""

    position: int
    cache_positions: list[int]
    in_cache: bool
    cache_index: int | None
    score: float | None
    scaled: float | None
    weight: float | None
    score_difference: float | None
    weight_difference: float | None
    note: str


class ExplainResponse(BaseModel):
    schema_version: str
    engine_version: str
    config: ConfigOut
    parameters_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    head: int
    kv_head: int = Field(description="The K/V head the query head reads: ⌊head / (num_heads / num_kv_heads)⌋.")
    query: int
    key: int
    query_token: str
    key_token: str
    key_tokens: list[str] = Field(description="Every key's token, in order (the context's in cross-attention).")
    key_source: Literal["tokens", "context_tokens"]
    d_k: int
    scale: bool
    scale_factor: float = Field(description="The trace's divisor: √d_k, or 1 with scale false.")
    masked: bool = Field(description="Whether the mask hides this key from this query.")
    mask_reason: str | None = Field(description="Why, for a masked cell; null otherwise.")
    masked_keys: list[int] = Field(description="The keys the mask hides from this query row.")
    steps: list[ExplainStep] = Field(description="products, score, scaled, row_max, exp, denominator, weight, "
                                                 "contributions, in this order.")
    layer: int | None = omitted("A stack of blocks only: the layer the cell is in.")
    decode: ExplainDecode | None = omitted("Only with decode: the query's KV-cache step.")


class NormExplainStep(BaseModel):
    """One step of a norm's value: its token's statistic(s), the normalised value, then the gain (and bias)."""

    id: Literal["mean", "variance", "mean_square", "normalised", "scaled"]
    stage: StageId = Field(description="The stage the step's number is in (the normalised value is inside the "
                                       "norm's stage).")
    index: list[int] = Field(description="Where `value` is in `stage`'s values.")
    formula: str
    value: float = Field(description="The step's number: the trace's own, where it is a stage entry.")
    note: str
    values: list[float] | None = omitted("mean: the token's d_model features; variance: each (x[j] − μ)²; "
                                         "mean_square: each x[j]².")
    recomputed: float | None = omitted("The step redone from the numbers shown (sums in feature order).")
    exact: bool | None = omitted("Whether `recomputed` equals the trace's number bit for bit.")
    x: float | None = omitted("normalised: the input's value at the feature.")
    epsilon: float | None = omitted("normalised: ε, inside the square root.")
    gamma: float | None = omitted("scaled: γ at the feature.")
    beta: float | None = omitted("scaled: β at the feature; LayerNorm only.")


class NormExplainResponse(BaseModel):
    schema_version: str
    engine_version: str
    config: ConfigOut
    parameters_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    # the ignore below: Literal of a run-time tuple
    norm: Literal[NORMS] = Field(description="The norm explained (the request's cell).")  # type: ignore[valid-type]
    norm_kind: Literal[NORM_KINDS]  # type: ignore[valid-type]  # Literal of a run-time tuple
    layer: int | None = omitted("norm1 and norm2 only (the final norm is the stack's, after every layer).")
    token: int
    token_text: str
    feature: int
    source_stage: StageId = Field(description="The stage the norm reads: residual_stream (pre-norm), residual1 or "
                                              "residual2 (post-norm).")
    source_index: list[int] = Field(description="The row it reads in source_stage.")
    steps: list[NormExplainStep] = Field(description="LayerNorm: mean, variance, normalised, scaled; RMSNorm: "
                                                     "mean_square, normalised, scaled.")


class LogitExplainStep(BaseModel):
    """One step of a logit: the hidden state's products with W_U's row, their sum, the next token's probability."""

    id: Literal["products", "logit", "probability"]
    stage: StageId
    index: list[int] = Field(description="Where `value` is in `stage`'s values.")
    formula: str
    value: float | None = Field(description="The step's number; null for products (in `values`).")
    note: str
    values: list[float] | None = omitted("products: h[j]·W_U[v, j] for each j.")
    x: list[float] | None = omitted("products: the last hidden state's row.")
    w: list[float] | None = omitted("products: W_U's row v (the token's embedding with the tied head).")
    recomputed: float | None = omitted("The step redone from the numbers shown.")
    exact: bool | None = omitted("Whether `recomputed` equals the trace's number bit for bit.")
    temperature: float | None = omitted("probability: T.")
    row_max: float | None = omitted("probability: the row's largest logit.")
    exponent: float | None = omitted("probability: exp((logit − max)/T).")
    denominator: float | None = omitted("probability: Σᵥ exp((logitᵥ − max)/T).")


class LogitExplainResponse(BaseModel):
    schema_version: str
    engine_version: str
    config: ConfigOut
    parameters_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    token: int
    token_text: str
    column: int
    column_token: str = Field(description="The vocabulary token of the column.")
    lm_head: Literal["tied", "seeded"]
    source_stage: StageId = Field(description="The stage the head reads: final_norm (pre-norm) or "
                                              "residual_stream (post-norm).")
    steps: list[LogitExplainStep] = Field(description="products, logit, and at the last position probability.")


class FFNExplainStep(BaseModel):
    """One step of a feed-forward unit: the products with its W_1 row, their sum, the activation, its share."""

    id: Literal["products", "pre_activation", "up", "activation", "gated", "contribution"]
    stage: StageId
    index: list[int] = Field(description="Where `value` (or the step's row) is in `stage`'s values.")
    formula: str
    value: float | None = Field(description="The step's number; null for products and contribution (their "
                                             "numbers are in `values`).")
    note: str
    values: list[float] | None = omitted("products: x[j]·W_1[u, j] for each j; contribution: h[u]·W_2[:, u].")
    x: list[float] | None = omitted("products: the FFN's input row.")
    w: list[float] | None = omitted("products: W_1's row u.")
    recomputed: float | None = omitted("The step redone from the numbers shown (the activation with Python's "
                                       "math module).")
    exact: bool | None = omitted("Whether `recomputed` equals the trace's number bit for bit.")
    vector: list[float] | None = omitted("contribution: the trace's ffn_output row, which every unit's share adds "
                                         "up to.")


class FFNExplainResponse(BaseModel):
    schema_version: str
    engine_version: str
    config: ConfigOut
    parameters_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    layer: int
    token: int
    token_text: str
    unit: int
    ffn: Literal[FFN_KINDS]  # type: ignore[valid-type]  # Literal of a run-time tuple
    d_ff: int
    source_stage: StageId = Field(description="The stage the FFN's input row is in.")
    steps: list[FFNExplainStep] = Field(description="products, pre_activation, (up,) activation, (gated,) "
                                                    "contribution, in this order.")


#: the models whose schemas this module's path publishes in components.schemas
MODELS: tuple[type[BaseModel], ...] = (ExplainRequest, ExplainResponse, NormExplainRequest, NormExplainResponse,
                                       FFNExplainRequest, FFNExplainResponse, LogitExplainRequest,
                                       LogitExplainResponse)


# ------------------------------------------------------------------ the answer


def _finite(doc: Any, where: str) -> None:
    """Fail loudly on a NaN or infinity, as serialize does for arrays: JSON would carry it as null."""
    if isinstance(doc, float):
        if not math.isfinite(doc):
            raise serialize.NonFiniteError(f"non-finite value in {where}")
    elif isinstance(doc, dict):
        for k, v in doc.items():
            _finite(v, f"{where}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            _finite(v, f"{where}[{i}]")


def _rounded(doc: Any, precision: int) -> Any:
    """Every float rounded as /trace rounds its stages (numpy's round-half-even on float64)."""
    if isinstance(doc, float):
        return float(np.round(np.float64(doc), precision))
    if isinstance(doc, dict):
        return {k: _rounded(v, precision) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_rounded(v, precision) for v in doc]
    return doc


AnyExplainRequest = ExplainRequest | NormExplainRequest | FFNExplainRequest


def explain_document(req: AnyExplainRequest) -> dict[str, Any]:
    """The /explain answer for a validated request: an attention cell, a norm's value or a feed-forward unit."""
    raise_all(IV.intervention_conflicts(interventions=bool(req.interventions), explain=True))
    t = req.run_trace()
    if isinstance(req, NormExplainRequest):
        cell = explain_norm_cell(t, req.cell, req.token, req.feature, layer=req.layer)
    elif isinstance(req, FFNExplainRequest):
        cell = explain_ffn_cell(t, req.token, req.unit, layer=req.layer)
    elif isinstance(req, LogitExplainRequest):
        cell = explain_logit_cell(t, req.token, req.column)
    else:
        cell = explain_cell(t, req.head, req.query, req.key, decode=engine.decode(t) if req.decode else None,
                            layer=req.layer)
    _finite(cell, "explanation")
    if req.precision is not None:
        cell = _rounded(cell, req.precision)
    return {"schema_version": serialize.SCHEMA_VERSION, "engine_version": t.engine_version,
            "config": serialize.config_document(t, precision=req.precision),
            "parameters_digest": t.parameters_digest, **cell}


#: the request model of each cell other than an attention weight
_CELL_REQUESTS: dict[str, type[NormExplainRequest | FFNExplainRequest | LogitExplainRequest]] = {
    **{norm: NormExplainRequest for norm in NORMS}, "ffn": FFNExplainRequest, "logit": LogitExplainRequest}


def request_model(raw: bytes) -> type[ExplainRequest | NormExplainRequest | FFNExplainRequest]:
    """The model a body is validated with, by its ``cell``: ExplainRequest (an attention cell, as before the
    block's cells existed, for any body without a block cell), NormExplainRequest or FFNExplainRequest."""
    if b"cell" not in raw and b"\\u" not in raw:  # no "cell" key, even escaped: the attention cell
        return ExplainRequest
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return ExplainRequest  # refused by parse_body, as before
    cell = body.get("cell") if isinstance(body, dict) else None
    return _CELL_REQUESTS.get(cell, ExplainRequest) if isinstance(cell, str) else ExplainRequest


@bp.post("/explain")
def post_explain() -> Response:
    raw = read_json_body()
    req = parse_body(request_model(raw), raw)
    g.cpu_estimate = compression.estimate_s(budget.cost("/trace", [req]))  # the trace it computes
    return json_response(explain_document(req))


# ------------------------------------------------------------------ the contract


def _example() -> dict[str, Any]:
    """A real, small answer, computed now, so the example cannot drift: a masked cell of a causal trace."""
    import orjson

    req = ExplainRequest(sentence="the cat sat", d_model=4, num_heads=2, causal=True, head=1, query=1, key=2)
    return orjson.loads(serialize.dumps(explain_document(req)))


def openapi_paths(parts: Parts) -> dict[str, Any]:
    """/explain: its path item of openapi.yaml (service/openapi.py)."""
    return {"/explain": {"post": {
        "operationId": "explain", "tags": ["trace"],
        "summary": "Explain one cell: every number from q·k to the weight",
        "description": "The classic 'the cat sat' worked example, for any head, query and key: the d_k products q_i[m]·k_j[m] "
                       "(RoPE's rotated q and k; the query head's K/V head under grouped-query attention), their sum "
                       "= scores, ÷ the scale factor = scaled_scores, the row's maximum, exp(scaled − max), the "
                       "softmax's denominator, exp / denominator = weights, and each key's weight_j·v_j with their "
                       "sum = context. Each step has its formula, the stage its number comes from and its index "
                       "there; the numbers are the trace's own, and `recomputed` / `exact` say whether the step "
                       "recomputed from the shown numbers equals them bit for bit. A masked cell keeps its score, "
                       "gets exp 0 and weight 0, and `mask_reason` says why. The body is a /trace request plus "
                       "head, query and key (docs/explain.md). In a stack of blocks (a block field), `layer` "
                       "chooses the attention's layer, and `cell` a norm's value (`norm1`, `norm2`, `final_norm` "
                       "with token and feature: the token's mean and variance, or mean square, each (x[j] − μ)², "
                       "the normalised value and γ·x̂ + β) or a feed-forward unit (`ffn` with token and unit: the "
                       "products with W_1's row, their sum, the activation, SwiGLU's up projection and gate, and "
                       "the unit's share of ffn_output). With lm_head, `logit` with token and column: the last hidden "
                       "state's products with W_U's row (the column token's embedding, tied), their sum, and at the "
                       "last position the next token's probability.",
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"anyOf": [parts.ref("ExplainRequest"), parts.ref("NormExplainRequest"),
                                 parts.ref("FFNExplainRequest"), parts.ref("LogitExplainRequest")]},
            "examples": {"seed": {"summary": "The seed's sentence: query 'cat', key 'sat'",
                                  "value": {"sentence": "the cat sat", "d_model": 24, "num_heads": 1, "head": 0,
                                            "query": 1, "key": 2}}}}}},
        "responses": {
            "200": {"description": "The cell's explanation.", "headers": parts.headers, "content": {
                "application/json": {"schema": {"anyOf": [parts.ref("ExplainResponse"),
                                                          parts.ref("NormExplainResponse"),
                                                          parts.ref("FFNExplainResponse"),
                                                          parts.ref("LogitExplainResponse")]},
                                     "example": _example()}}},
            **parts.problems, **parts.common,
        },
    }}}
