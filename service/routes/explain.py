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
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from flask import Blueprint, Response, g
from pydantic import BaseModel, ConfigDict, Field, model_validator

import engine
from engine.explain import STEP_IDS, check_cell, check_explainable, explain_cell

from .. import budget, compression, serialize
from ..edge import json_response, parse_body, read_json_body
from ..models import ConfigOut, StageId, engine_rules, omitted
from .trace import TraceRequest

if TYPE_CHECKING:
    from ..openapi import Parts

bp = Blueprint("explain", __name__)

_CELL_DOC = (" Validated against the configuration after tokenizing; a value out of range is a 422 whose entry "
             "names the field and the valid range.")


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

    @model_validator(mode="after")
    def _cell(self) -> ExplainRequest:
        n_keys = len(self._context) if self._context is not None else len(self._tokens)
        with engine_rules():
            check_explainable(self.inject_bug)
            check_cell(self.trace_config, len(self._tokens), n_keys, self.head, self.query, self.key,
                       cross=self._context is not None)
        return self


class ExplainStep(BaseModel):
    """One step of the cell's walk. Every step has id, stage, formula, value and index; the rest depend on it."""

    id: Literal[STEP_IDS]  # type: ignore[valid-type]
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
    decode: ExplainDecode | None = omitted("Only with decode: the query's KV-cache step.")


#: the models whose schemas this module's path publishes in components.schemas
MODELS: tuple[type[BaseModel], ...] = (ExplainRequest, ExplainResponse)


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


def explain_document(req: ExplainRequest) -> dict[str, Any]:
    """The /explain answer for a validated request."""
    t = req.run_trace()
    cell = explain_cell(t, req.head, req.query, req.key, decode=engine.decode(t) if req.decode else None)
    _finite(cell, "explanation")
    if req.precision is not None:
        cell = _rounded(cell, req.precision)
    return {"schema_version": serialize.SCHEMA_VERSION, "engine_version": t.engine_version,
            "config": serialize.config_document(t, precision=req.precision),
            "parameters_digest": t.parameters_digest, **cell}


@bp.post("/explain")
def post_explain() -> Response:
    req = parse_body(ExplainRequest, read_json_body())
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
                       "head, query and key (docs/explain.md).",
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": parts.ref("ExplainRequest"),
            "examples": {"seed": {"summary": "The seed's sentence: query 'cat', key 'sat'",
                                  "value": {"sentence": "the cat sat", "d_model": 24, "num_heads": 1, "head": 0,
                                            "query": 1, "key": 2}}}}}},
        "responses": {
            "200": {"description": "The cell's explanation.", "headers": parts.headers, "content": {
                "application/json": {"schema": parts.ref("ExplainResponse"), "example": _example()}}},
            **parts.problems, **parts.common,
        },
    }}}
