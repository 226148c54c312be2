"""POST /export: a trace in the input format of an attention viewer (bertviz, CircuitsVis, Transformer Explainer).

The body is a /trace request plus ``format``; the answer carries the trace's
own numbers in that viewer's shape (``engine/export.py`` says where each
format is defined), next to the usual ``config`` and ``tokens``
(docs/interop.md, "Exports"). Validation, problems and the work budget are
the /trace ones: parsed at the edge by pydantic (``ExportRequest``), every
error an RFC 9457 problem.

Its request and answer models live here with the route and its fragment of
openapi.yaml (:func:`openapi_paths`), which refers to the shared parts
(``TokenOut``, ``ConfigOut``, ``ParametersIn``, …) in ``components.schemas``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from flask import Blueprint, Response, g
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from engine.export import EXPORT_FORMATS, TE_SUFFIXES, check_export, export, export_value_count

from .. import budget, compression, serialize
from ..edge import json_response, parse_body, settings
from ..models import ConfigOut, InjectedBug, TokenOut, engine_rules, omitted
from ..problems import ProblemError
from .trace import TraceRequest, injected_bug_document

if TYPE_CHECKING:
    from ..openapi_parts import Parts

bp = Blueprint("export", __name__)

ExportFormat = Literal[EXPORT_FORMATS]  # type: ignore[valid-type]  # Literal of a run-time tuple

#: /trace fields that choose what /trace returns, which an export does not: (field, its default, why)
_NOT_EXPORTED: tuple[tuple[str, Any, str], ...] = (
    ("stages", None, "stages chooses which stages /trace returns; an export always carries the stages its format "
                     "needs"),
    ("include_parameters", False, "the viewers take attention weights, not W_Q, W_K, W_V and W_O; get them from "
                                  "/trace"),
    ("parameters_layout", "per_head", "parameters_layout goes with include_parameters, which /export does not "
                                      "return"),
    ("decode", False, "the viewers show the full attention matrix, not KV-cache decoding steps; get them from "
                      "/trace"),
)

_FORMAT_HELP = (
    "The viewer: `bertviz` (head_view's `attention` [1 layer][1, heads, n, n] and `tokens`; with a context, its "
    "`cross_attention`, `encoder_tokens` = the context and `decoder_tokens` = the sentence), `circuitsvis` "
    "(AttentionHeads' props: `attention` [heads, dest, src], `tokens`, `attentionHeadNames`, `maskUpperTri`; "
    "self-attention only) or `transformer-explainer` (`block_0_attn_head_{j}_{attn|attn_scaled|attn_masked|"
    "attn_softmax|attn_dropout}`, each `{data, dims, size}`, masked cells null; self-attention only)."
)


class ExportRequest(TraceRequest):
    """A /trace request and the viewer format to export it to."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"sentence": "the cat sat", "d_model": 24, "num_heads": 4, "format": "bertviz"},
                {"sentence": "the cat sat", "d_model": 24, "num_heads": 4, "causal": True, "format": "circuitsvis"},
                {"sentence": "the cat sat", "num_heads": 2, "causal": True, "format": "transformer-explainer"},
            ]
        },
    )

    format: ExportFormat = Field(description=_FORMAT_HELP)

    @model_validator(mode="after")
    def _exportable(self) -> ExportRequest:
        for name, default, why in _NOT_EXPORTED:
            if getattr(self, name) != default:
                raise PydanticCustomError("not_exported", "{why}; drop {name} from an /export request",
                                          {"why": why, "name": name, "pointer": f"/{name}"})
        with engine_rules():
            check_export(self.format, cross=self.context_split is not None)
        return self

    @property
    def export_value_count(self) -> int:
        """How many numbers the export holds (the trace's own are ``value_count``)."""
        n_context = None if self.context_split is None else len(self.context_split)
        return export_value_count(self.format, self.trace_config, len(self.split), n_context)


# ----------------------------------------------------------------- responses (schema only)

_Matrix = list[list[float]]
_Layer = list[list[list[list[float]]]]  # [1, heads, queries, keys]


class BertvizSelf(BaseModel):
    """bertviz head_view(attention=…, tokens=…): self-attention."""

    model_config = ConfigDict(extra="forbid")

    attention: list[_Layer] = Field(description="One layer: [[1, heads, n, n]], the attention weights.")
    tokens: list[str]


class BertvizCross(BaseModel):
    """bertviz head_view(cross_attention=…, encoder_tokens=…, decoder_tokens=…): cross-attention."""

    model_config = ConfigDict(extra="forbid")

    cross_attention: list[_Layer] = Field(description="One layer: [[1, heads, n, m]], queries from the sentence "
                                                      "(decoder), keys from the context (encoder).")
    encoder_tokens: list[str] = Field(description="The context's tokens: the keys.")
    decoder_tokens: list[str] = Field(description="The sentence's tokens: the queries.")


class CircuitsVisHeads(BaseModel):
    """CircuitsVis AttentionHeads' props."""

    model_config = ConfigDict(extra="forbid")

    attention: list[_Matrix] = Field(description="[heads, dest (query), src (key)]: the attention weights.")
    tokens: list[str]
    attentionHeadNames: list[str] = Field(description="\"Head 0\", \"Head 1\", …: 0-based, as in the trace.")
    maskUpperTri: bool = Field(description="True exactly when the trace is causal (the component's default is "
                                           "true, so it is always sent).")


class ExplainerMatrix(BaseModel):
    """One of Transformer Explainer's outputs for one head."""

    model_config = ConfigDict(extra="forbid")

    data: list[list[float | None]] = Field(description="[n, n]; null where attn_masked masks a key.")
    dims: list[int] = Field(description="[n, n]")
    size: int = Field(description="n·n")


_ExplainerKey = Annotated[str, Field(pattern=r"^block_0_attn_head_[0-9]+_(" + "|".join(TE_SUFFIXES) + r")$")]


class ExportResponse(BaseModel):
    schema_version: str
    engine_version: str
    format: ExportFormat
    config: ConfigOut
    tokens: list[TokenOut]
    parameters_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    context_tokens: list[TokenOut] | None = omitted("Cross-attention only.")
    data: BertvizSelf | BertvizCross | CircuitsVisHeads | dict[_ExplainerKey, ExplainerMatrix] = Field(
        description="The viewer's input: head_view's keyword arguments (bertviz), AttentionHeads' props "
        "(circuitsvis), or Transformer Explainer's `outputs` (transformer-explainer).")
    injected_bug: InjectedBug | None = omitted("Only with inject_bug: the numbers are deliberately wrong in this way.")


#: the models whose schemas this module's path publishes in components.schemas
MODELS: tuple[type[BaseModel], ...] = (ExportRequest, ExportResponse)


# ----------------------------------------------------------------- the endpoint


def export_document(req: ExportRequest) -> dict[str, Any]:
    """The /export answer for a validated request."""
    t = req.run_trace(bug=req.inject_bug)
    for sid in ("scores", "scaled_scores", "masked_scores", "weights"):  # every number an export takes
        st = t.stages.get(sid)
        if st is not None and not np.isfinite(st.values).all():
            raise serialize.NonFiniteError(f"non-finite value in {sid}")
    doc: dict[str, Any] = {
        "schema_version": serialize.SCHEMA_VERSION,
        "engine_version": t.engine_version,
        "format": req.format,
        "config": serialize.config_document(t, precision=req.precision),
        "tokens": serialize.tokens_document(t.tokens),
        "parameters_digest": t.parameters_digest,
    }
    if t.cross:
        doc["context_tokens"] = serialize.tokens_document(t.context_tokens or [])
    doc["data"] = export(t, req.format, req.precision)
    if req.inject_bug:
        doc["injected_bug"] = injected_bug_document(req.inject_bug)
    return doc


@bp.post("/export")
def post_export() -> Response:
    req = parse_body(ExportRequest)
    limits = settings()
    work = budget.cost("/trace", [req]) + req.export_value_count  # the trace, then the export's numbers
    if work > limits.max_request_cost:
        raise ProblemError(422, "Invalid request",
                           f"the trace and its {req.format} export would cost {work} units of work, above the "
                           f"limit of {limits.max_request_cost}; use fewer tokens or heads",
                           kind="validation-error",
                           errors=[{"pointer": "", "type": "export_too_costly",
                                    "message": f"{work} units; the limit is {limits.max_request_cost}"}])
    g.cpu_estimate = compression.estimate_s(work)  # what compression may spend
    return json_response(export_document(req))


# ----------------------------------------------------------------- the contract


def _example() -> dict[str, Any]:
    """A real, small /export answer, computed now, so the example cannot drift."""
    import orjson

    req = ExportRequest.model_validate({"sentence": "the cat sat", "d_model": 4, "num_heads": 2, "causal": True,
                                        "format": "circuitsvis"})
    return orjson.loads(serialize.dumps(export_document(req)))


def openapi_paths(parts: Parts) -> dict[str, Any]:
    """/export: its path item of openapi.yaml (service/openapi.py)."""
    examples = {
        "bertviz": {"summary": "bertviz head_view, 4 heads",
                    "value": {"sentence": "the cat sat", "d_model": 24, "num_heads": 4, "format": "bertviz"}},
        "bertviz_cross": {"summary": "bertviz cross-attention view",
                          "value": {"sentence": "the cat sat", "context_sentence": "le chat", "num_heads": 2,
                                    "format": "bertviz"}},
        "circuitsvis": {"summary": "CircuitsVis attention_heads, causal",
                        "value": {"sentence": "the cat sat", "num_heads": 2, "causal": True, "format": "circuitsvis"}},
        "transformer_explainer": {"summary": "Transformer Explainer's attention outputs",
                                  "value": {"sentence": "the cat sat", "num_heads": 2, "causal": True,
                                            "format": "transformer-explainer"}},
    }
    return {"/export": {"post": {
        "operationId": "export",
        "tags": ["trace"],
        "summary": "Export a trace to bertviz, CircuitsVis or Transformer Explainer",
        "description": "The body is a /trace request plus `format`. The answer carries the trace's own numbers "
                       "(the weights; for transformer-explainer also the raw, scaled and masked scores), exactly, "
                       "in the viewer's input shape, under `data` (docs/interop.md). `stages`, `include_parameters`, "
                       "`parameters_layout` and `decode` do not apply (422); `precision` rounds the numbers and "
                       "`inject_bug` exports the wrong ones, labelled. circuitsvis and transformer-explainer draw "
                       "self-attention only: with a context they answer 422 (bertviz has a cross-attention view). "
                       "The trace and its export together must fit the request work budget (422 otherwise).",
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": parts.ref("ExportRequest"), "examples": examples}}},
        "responses": {
            "200": {"description": "The export.", "headers": parts.headers, "content": {"application/json": {
                "schema": parts.ref("ExportResponse"), "example": _example()}}},
            **parts.problems,
            **parts.common,
        },
    }}}
