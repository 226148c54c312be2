"""POST /trace, /trace/batch and /trace/html: every stage of one layer, as JSON, npz or the viewer's page.

The request (``TraceRequest``: the shared ``TraceSpec`` plus what to return
and how) and the answer's models (``TraceResponse`` and its parts) live here
with the routes and their fragment of openapi.yaml (:func:`openapi_paths`).
``render_trace`` gives the exact bytes /trace answers; the response cache keeps
them per request body (service/cache.py, service/compression.py), and
``Accept: application/x-npz`` answers the same document as exact arrays
(service/npz.py). /trace/html answers the trace drawn by the viewer as one
offline file (viewer/offline_page.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import hashlib

import numpy as np
import orjson
from flask import Blueprint, Response, current_app, g, request
from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

import engine
from engine import BUG_NAMES, BUGS, check_bug
from engine import interventions as IV
from engine import lm as LM
from engine.bugs import ALL_BUGS, BLOCK_BUGS
from engine.layer import ALL_STAGE_IDS, check_stages
from viewer.offline_page import comparison_request, export_filename, render_html_bytes

from .. import batch, budget, compression, npz, serialize
from ..batch import BatchRequest
from ..edge import json_response, parse_body, read_json_body, settings
from ..models import (BoundedNumber, ConfigOut, InjectableBugName, InjectedBug, StageId, TokenOut, TraceSpec,
                      engine_rules, generate_option_field, omitted)
from ..problems import ProblemError

if TYPE_CHECKING:
    from ..openapi_parts import Parts

bp = Blueprint("trace", __name__)

#: what /trace and /trace/batch can answer, the default first
_TRACE_TYPES = ("application/json", npz.MEDIA_TYPE)


class TraceRequest(TraceSpec):
    """What to trace, and how to return it."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"sentence": "the cat sat", "d_model": 24, "num_heads": 4},
                {"tokens": ["the", "cat", "sat"], "d_model": 24, "num_heads": 1, "scale": False, "causal": True},
                {"sentence": "the cat sat", "d_model": 24, "num_heads": 4, "inject_bug": BUG_NAMES[0],
                 "stages": ["weights"], "precision": 4},
            ]
        },
    )

    include_parameters: bool = Field(
        default=False, description="Also return W_Q [head, d_k, d_model], W_K and W_V [kv head, d_k, d_model] "
        "(kv heads = num_kv_heads, or num_heads) and W_O [d_model, h·d_k]; in a stack of blocks every layer's "
        "weights on a leading layer axis (W_1, W_2, SwiGLU's W_3, the norms' γ and β) and the final norm's."
    )
    parameters_layout: Literal["per_head", "torch"] = Field(
        default="per_head",
        description="With include_parameters: per_head gives W_Q, W_K, W_V, W_O as above; torch gives "
        "`in_proj_weight` [3·d_model, d_model] (W_Q, W_K, W_V stacked, heads in order) and `out_proj.weight` "
        "[d_model, d_model], ready for torch.nn.MultiheadAttention(d_model, num_heads, bias=False)'s "
        "load_state_dict (without shared K/V heads, which that module does not have).",
    )
    stages: list[StageId] | None = Field(
        default=None,
        min_length=1,
        max_length=len(ALL_STAGE_IDS),
        description="Return only these stages (by id, at most 20: leave it out for every stage); default: every "
        "stage. A grader that only needs "
        "`weights` gets only `weights`. A stage this configuration does not compute is a 422, each one listed: "
        "`masked_scores` without `causal: true`, `q_rotated`/`k_rotated` without RoPE, `positional_encoding` "
        "under RoPE, the context stages without a context, `token_embedding` and `positional_encoding` (and the "
        "context's) with your own input, a block's stages (`norm1` … `final_norm`) without a block field or "
        "where the block has none (`stage_needs_block`). It filters what is returned, not the decoding steps, "
        "and not what max_trace_values counts.",
    )
    precision: int | None = Field(
        default=None,
        ge=0,
        le=17,
        description="Round every returned number to this many decimal places (numpy round-half-even); "
        "default: no rounding, every float64 exact.",
    )

    decode: bool = Field(
        default=False,
        description="Also return `decode`: the layer re-run one token at a time with a KV cache, as a model "
        "generates text (causal self-attention only). Step t's rows equal the full trace's row t. `precision` "
        "rounds it, `stages` does not filter it, and its numbers count towards max_trace_values.",
    )

    # Generation with the language-model head (lm_head): these four fields, kept together.
    generate: int | None = generate_option_field("generate")
    top_k: int | None = generate_option_field("top_k")
    top_p: float | None = generate_option_field("top_p")
    sample_seed: int | None = generate_option_field("sample_seed")

    inject_bug: InjectableBugName | None = Field(
        default=None,
        description="Return the trace with one known bug injected (clearly labelled in `injected_bug`): "
        + "; ".join(f"`{b.name}`: {b.summary}" for b in BUGS.values())
        + ". " + ", ".join(f"`{b.name}`" for b in BUGS.values() if b.needs_causal) + " needs `causal: true`. "
        "A bug that would change no number of this trace (a scaling bug with `scale: false` or d_k = 1, "
        "averaging one head, a softmax or mask bug on one token) is refused with a 422 that says why. "
        "A stack of blocks (a block field) also takes the block's known mistakes, each made in every layer (GET "
        "/version's `block_bugs` says what each is): " + ", ".join(f"`{name}`" for name in BLOCK_BUGS)
        + ". They are refused without a block field (add one), and where the stack cannot show them (the final "
        "norm's mistake in post-norm, which has no final norm; SwiGLU's without SwiGLU, GELU's without GELU, the "
        "variance's under RMSNorm; a block written in the other norm position, where the stack is in that one), "
        "with a 422 that says why; so is the attention's mistake whose keys read the embeddings, since a stack's "
        "keys read the residual stream.",
    )

    @model_validator(mode="after")
    def _options(self) -> TraceRequest:
        if self.generate is None:
            unused = [name for name in ("top_k", "top_p", "sample_seed") if getattr(self, name) is not None]
            if unused:
                raise PydanticCustomError("needs_generate", "{message}", {
                    "message": f"{unused[0]} chooses how generate picks its tokens: add generate (how many tokens) "
                               f"or drop {unused[0]}", "pointer": f"/{unused[0]}"})
        if self.parameters_layout == "torch":
            layout = []  # both problems at once, as every conflict
            if not self.include_parameters:
                layout.append({"type": "layout_needs_parameters", "pointer": "/parameters_layout",
                               "message": "parameters_layout chooses how the weights are returned: add "
                                          "include_parameters: true, or drop parameters_layout"})
            if self.trace_config.grouped:
                layout.append({"type": "layout_needs_all_kv_heads", "pointer": "/parameters_layout",
                               "message": "torch.nn.MultiheadAttention has a K and V head per query head; drop "
                                          "num_kv_heads or use parameters_layout per_head"})
            if self.trace_config.has_block:
                layout.append({"type": "layout_needs_one_layer", "pointer": "/parameters_layout",
                               "message": "torch.nn.MultiheadAttention holds one attention layer, not a stack of "
                                          "blocks; use parameters_layout per_head (each array gains a layer axis)"})
            if layout:
                first = layout[0]
                raise PydanticCustomError(first["type"], "{message}", {"message": first["message"],
                                                                       "pointer": first["pointer"],
                                                                       "also": layout[1:]})
        with engine_rules():
            if self.stages is not None:
                # As /check's submission: a stage your own input skips is refused, not silently left out.
                check_stages(self.stages, self.trace_config, explicit_input=self.input is not None, field="stages",
                             cross=self._context is not None)
            if self.inject_bug is not None:
                check_bug(self.inject_bug, self.trace_config, len(self._tokens), explicit_input=self.input is not None,
                          n_context=None if self._context is None else len(self._context))
        return self



# ------------------------------------------------------------------ the answer (schema only)


class StageOut(BaseModel):
    step: int = Field(description="Step number in the walkthrough (q, k and v share step 5).")
    title: str
    formula: str
    axes: list[str] = Field(description="Axis names, outermost first, e.g. [head, query, key].")
    shape: list[int] = Field(description="Length of each axis.")
    values: list[Any] = Field(
        description="Nested arrays in `axes` order. Numbers are float64, written so they round-trip exactly; "
        "masked entries of masked_scores are null. The tokens stage holds strings."
    )
    axis_tokens: list[Literal["tokens", "context_tokens"] | None] | None = omitted(
        "Cross-attention only: for each axis, the token list it indexes (`tokens`, the queries' "
        "sentence, or `context_tokens`, the keys' context), or null for a non-token axis.")


class StatsOut(BaseModel):
    axes: list[str] = Field(description='["head", "query"]; ["layer", "head", "query"] in a stack of blocks.')
    entropy: list[list[float]] | list[list[list[float]]] = Field(description="Entropy of each weights row, in nats.")
    max_weight: list[list[float]] | list[list[list[float]]] = Field(
        description="Largest weight in each row; near 1 means saturated.")


class ParametersOut(BaseModel):
    W_Q: list[list[list[float]]] = Field(description="[head, d_k, d_model]")
    W_K: list[list[list[float]]] = Field(description="[kv head, d_k, d_model]: kv heads = num_kv_heads, or "
                                                     "num_heads")
    W_V: list[list[list[float]]] = Field(description="[kv head, d_k, d_model]: kv heads = num_kv_heads, or "
                                                     "num_heads")
    W_O: list[list[BoundedNumber]] = Field(description="[d_model, num_heads·d_k]")


class BlockParametersOut(BaseModel):
    """A stack of blocks: each layer's arrays stacked on a leading layer axis, then the final norm's."""

    W_Q: list[list[list[list[float]]]] = Field(description="[layer, head, d_k, d_model]")
    W_K: list[list[list[list[float]]]] = Field(description="[layer, kv head, d_k, d_model]")
    W_V: list[list[list[list[float]]]] = Field(description="[layer, kv head, d_k, d_model]")
    W_O: list[list[list[float]]] = Field(description="[layer, d_model, num_heads·d_k]")
    norm1_gamma: list[list[float]] = Field(description="[layer, d_model]: the first norm's γ.")
    norm1_beta: list[list[float]] | None = omitted("[layer, d_model]: the first norm's β; LayerNorm only.")
    W_1: list[list[list[float]]] = Field(description="[layer, d_ff, d_model]: the first projection (SwiGLU's gate).")
    W_3: list[list[list[float]]] | None = omitted("[layer, d_ff, d_model]: SwiGLU's up projection; swiglu only.")
    W_2: list[list[list[float]]] = Field(description="[layer, d_model, d_ff]: back to d_model.")
    norm2_gamma: list[list[float]] = Field(description="[layer, d_model]: the second norm's γ.")
    norm2_beta: list[list[float]] | None = omitted("[layer, d_model]: the second norm's β; LayerNorm only.")
    final_norm_gamma: list[float] | None = omitted("[d_model]: the final norm's γ; pre-norm only.")
    final_norm_beta: list[float] | None = omitted("[d_model]: the final norm's β; pre-norm LayerNorm only.")


class TorchParametersOut(BaseModel):
    """parameters_layout "torch": torch.nn.MultiheadAttention(d_model, num_heads, bias=False)'s state_dict."""

    model_config = ConfigDict(populate_by_name=True)

    in_proj_weight: list[list[float]] = Field(description="[3·d_model, d_model]: W_Q, W_K, W_V, each [h·d_k, d_model]")
    out_proj_weight: list[list[float]] = Field(alias="out_proj.weight", description="[d_model, d_model]: W_O")


class DecodeStepOut(BaseModel):
    position: int = Field(description="The token generated at this step (its index in tokens).")
    token: str
    cache_positions: list[int] = Field(description="The positions whose keys and values are cached after this "
                                                   "step, oldest first (the last `window` with a sliding window).")
    q: list[list[float]] = Field(description="[head, d_k]: x_t·W_Qᵀ, unrotated.")
    k: list[list[float]] = Field(description="[kv head, d_k]: x_t·W_Kᵀ, the unrotated key. Without RoPE it is the "
                                             "row appended to the key cache; under RoPE the cache holds k_rotated.")
    v: list[list[float]] = Field(description="[kv head, d_k]: x_t·W_Vᵀ, the row appended to the value cache.")
    q_rotated: list[list[float]] | None = Field(description="[head, d_k]: q turned by position t (RoPE); null "
                                                            "without RoPE.")
    k_rotated: list[list[float]] | None = Field(description="[kv head, d_k]: k turned by position t, the row "
                                                            "appended to the key cache (RoPE); null without RoPE.")
    k_cache: list[list[list[float]]] = Field(description="[kv head, cached, d_k]")
    v_cache: list[list[list[float]]] = Field(description="[kv head, cached, d_k]")
    scores: list[list[float]] = Field(description="[head, cached]")
    scaled_scores: list[list[float]] = Field(description="[head, cached]")
    weights: list[list[float]] = Field(description="[head, cached]")
    context: list[list[float]] = Field(description="[head, d_k]")
    output: list[float] = Field(description="[d_model]")


class CandidateOut(BaseModel):
    token: str
    index: int = Field(description="Its column in the vocabulary.")
    probability: float = Field(description="Its probability at the temperature, before top-k and top-p.")
    sampling_probability: float = Field(description="Its probability renormalised over the kept set (top-k, then "
                                                    "top-p): what sampling draws with.")


class GenerationStepOut(BaseModel):
    position: int = Field(description="The new token's index in the sequence (the sentence's tokens come first).")
    token: str = Field(description="The chosen token.")
    index: int = Field(description="Its column in the vocabulary.")
    probability: float = Field(description="Its probability at the temperature.")
    candidates: list[CandidateOut] = Field(description=f"The kept set's {LM.SHOWN_CANDIDATES} most probable "
                                                       "tokens, most probable first.")
    logits: list[float] = Field(description="[vocab]: the logits of the position before it.")
    probs: list[float] = Field(description="[vocab]: softmax(logits / temperature), what it was chosen from.")
    cache_positions: list[int] = Field(description="The positions each layer's KV cache holds after its step.")
    weights: list[list[list[float]]] = Field(description="[layer, head, cached]: its row of attention.")


class InterventionDoneOut(BaseModel):
    target: str
    layer: int
    kind: str
    head: int | None
    positions: list[int] | None
    description: str = Field(description="What was replaced, how and where, in words.")


class ChangeOut(BaseModel):
    baseline: float
    intervened: float
    delta: float = Field(description="intervened − baseline.")


class TargetEffectOut(BaseModel):
    token: str = Field(description="target_token, or the baseline's most probable next token.")
    index: int = Field(description="Its column in the vocabulary.")
    logit: ChangeOut = Field(description="Its logit at the last position (the logit difference is `delta`).")
    probability: ChangeOut = Field(description="Its next-token probability.")


class InterventionOut(BaseModel):
    interventions: list[InterventionDoneOut]
    baseline_request: dict[str, Any] = Field(description="This request without interventions, patch_sentence and "
                                                         "target_token: POST it to /trace for the whole baseline.")
    baseline_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$",
                                 description="SHA-256 of baseline_request as JSON with sorted keys, no spaces.")
    baseline_stages: dict[str, Any] = Field(description="The baseline's key stage: next_token_probs with lm_head, "
                                                        "else residual_stream in a stack, output in one layer.")
    max_abs_delta: dict[str, list[float] | float] = Field(
        description="Each numeric stage's largest |intervened − baseline|: a list per layer for a stack's "
        "per-layer stages (per depth for residual_stream), one number otherwise; masked entries are skipped.")
    patch_tokens: list[str] | None = omitted("Only with patch_sentence: its tokens.")
    target: TargetEffectOut | None = omitted("Only with lm_head.")


class TraceResponse(BaseModel):
    schema_version: str
    engine_version: str
    config: ConfigOut
    tokens: list[TokenOut]
    parameters_digest: str = Field(
        pattern=r"^sha256:[0-9a-f]{64}$", description="SHA-256 of the weights: equal digests mean identical weights."
    )
    stages: dict[StageId, StageOut] = Field(description="Every stage, keyed by stage id, in walkthrough order.")
    stats: StatsOut
    parameters: ParametersOut | TorchParametersOut | BlockParametersOut | None = omitted(
        "Only when include_parameters is true, in parameters_layout (a stack of blocks: every layer's weights).")
    context_tokens: list[TokenOut] | None = omitted(
        "Cross-attention only: the context's tokens (offsets into context_sentence).")
    decode: list[DecodeStepOut] | None = omitted("Only with decode: one entry per token.")
    injected_bug: InjectedBug | None = omitted("Only with inject_bug: the numbers are deliberately wrong in this way.")
    vocabulary: list[str] | None = omitted("Only with lm_head: the token of each column of the logits.")
    generation: list[GenerationStepOut] | None = omitted("Only with generate: one entry per generated token.")
    intervention: InterventionOut | None = omitted("Only with interventions: what they changed (the stages are "
                                                   "the intervened trace's).")



#: the models whose schemas this module's paths publish in components.schemas
MODELS: tuple[type[BaseModel], ...] = (TraceRequest, TraceResponse, *batch.MODELS)


# ------------------------------------------------------------------ the answer


def trace_document(req: TraceRequest, *, binary: bool = False) -> dict[str, Any]:
    """The /trace answer as a document; ``binary`` keeps masked stages as arrays plus a mask (service/npz.py)."""
    t, baseline = req.run_traces(bug=req.inject_bug)
    doc = serialize.trace_document(t, include_parameters=req.include_parameters, stages=req.stages,
                                   precision=req.precision, parameters_layout=req.parameters_layout,
                                   decode=engine.decode(t) if req.decode else None, binary=binary)
    if req.inject_bug:
        doc["injected_bug"] = injected_bug_document(req.inject_bug)
    if req.generate is not None:
        steps = engine.decoding.generate(t, req.generate, top_k=req.top_k, top_p=req.top_p,
                                         sample_seed=req.sample_seed)
        doc["config"] |= {"generate": req.generate, **({"top_k": req.top_k} if req.top_k is not None else {}),
                          **({"top_p": req.top_p} if req.top_p is not None else {}), "sample_seed": req.sample_seed}
        doc["generation"] = serialize.generation_document(steps, t.vocabulary or [], req.precision)
    if baseline is not None:
        doc["intervention"] = intervention_document(req, t, baseline)
    return doc


#: the request fields that ask for interventions: the baseline request is the same request without them
INTERVENTION_FIELDS = frozenset({"interventions", "patch_sentence", "target_token"})


def baseline_request(req: TraceRequest) -> dict[str, Any]:
    """The request without its interventions (the fields as given): what a client posts for the baseline."""
    return req.model_dump(mode="json", exclude_unset=True, exclude=set(INTERVENTION_FIELDS), by_alias=True)


def intervention_document(req: TraceRequest, t: engine.Trace, baseline: engine.Trace) -> dict[str, Any]:
    """What the interventions changed: each described, the baseline request and its digest, the baseline's key
    stage, each stage's largest change (per layer in a stack) and, with lm_head, the target token's logit and
    probability before and after."""
    def rounded(x: Any) -> Any:
        return x if req.precision is None else np.round(np.asarray(x, dtype=np.float64), req.precision).tolist()

    base_req = baseline_request(req)
    key = "next_token_probs" if "next_token_probs" in baseline.stages else (
        "residual_stream" if "residual_stream" in baseline.stages else "output")
    out: dict[str, Any] = {
        "interventions": [{**iv.model_dump(), "description": e.describe()}
                          for iv, e in zip(req.interventions or (), t.interventions)],
        "baseline_request": base_req,
        "baseline_digest": "sha256:" + hashlib.sha256(orjson.dumps(base_req, option=orjson.OPT_SORT_KEYS))
        .hexdigest(),
        "baseline_stages": {key: rounded(np.asarray(baseline.stages[key].values).tolist())},
        "max_abs_delta": {sid: rounded(d) for sid, d in IV.max_abs_delta(baseline, t).items()},
    }
    if req.patch_sentence is not None:
        out["patch_tokens"] = [tok.text for tok in req.patch_split or ()]
    if t.config.has_lm_head:
        effect = IV.target_effect(baseline, t, req.target_token)
        for part in ("logit", "probability"):
            effect[part] = {k: rounded(v) for k, v in effect[part].items()}
        out["target"] = effect
    return out


def injected_bug_document(name: str) -> dict[str, str]:
    """The ``injected_bug`` member of an answer whose numbers carry a known bug on request."""
    return {"name": name, "summary": ALL_BUGS[name].summary,
            "warning": f"These numbers are deliberately wrong: the known bug '{name}' was injected on request."}


def render_trace(req: TraceRequest) -> bytes:
    """The exact bytes /trace answers for a validated request."""
    return serialize.dumps(trace_document(req))


def render_trace_npz(req: TraceRequest) -> list[bytes]:
    """The bytes /trace answers to ``Accept: application/x-npz`` (service/npz.py), in parts."""
    return npz.dump_parts(trace_document(req, binary=True))


def cpu_estimate(req: TraceRequest) -> float:
    """The CPU seconds a validated /trace request is expected to cost (service/budget.py's work units, as
    compression estimates them)."""
    return compression.estimate_s(budget.cost("/trace", [req]))


# ------------------------------------------------------------------ the routes


def wants_npz() -> bool:
    """Content negotiation on /trace and /trace/batch: JSON unless the client prefers ``application/x-npz``
    (without an Accept header, or with */* or equal preference, JSON)."""
    accept = request.environ.get("HTTP_ACCEPT")
    if accept is None or accept == "*/*" or ("npz" not in accept.lower() and "*" not in accept):
        return False  # nothing can prefer npz (no header, any type alike, or none that matches it): skip the parse
    return request.accept_mimetypes.best_match(_TRACE_TYPES) == npz.MEDIA_TYPE


#: an npz answer up to this size is joined into one bytes (each part costs a write into the worker's buffer);
#: a larger one goes out in its parts (its arrays' bytes), never copied into one buffer: L's 7.9 MB archive
#: took 20.2-20.5 -> 16.5-17.0 ms of server time (one connection, three interleaved pairs)
_NPZ_JOIN_MAX = 256 * 1024


def _npz_body(parts: list[bytes], *, joined: bool = False) -> bytes | list[bytes]:
    return b"".join(parts) if joined or sum(map(len, parts)) <= _NPZ_JOIN_MAX else parts


def post_trace_npz(raw: bytes) -> Response:
    """/trace as exact binary arrays (service/npz.py). The response cache keeps it under its own key."""
    cache = current_app.extensions["attention_trace.responses"]
    key = compression.encoded_key(npz.MEDIA_TYPE, raw)  # a variant's key, as each encoding's answer has
    body = cache.get(key) if cache is not None else None
    if body is None:
        req = parse_body(TraceRequest, raw)
        parts = render_trace_npz(req)
        cacheable = cache is not None and sum(map(len, parts)) <= cache.max_entry
        body = _npz_body(parts, joined=cacheable)
        if cacheable:
            cache.put(key, body, cost=cpu_estimate(req))
    resp = current_app.response_class(body, mimetype=npz.MEDIA_TYPE)
    compression.add_vary(resp, "Accept")
    return resp


@bp.post("/trace")
def post_trace() -> Response:
    raw = read_json_body()
    if wants_npz():
        return post_trace_npz(raw)
    resp = post_trace_json(raw)
    compression.add_vary(resp, "Accept")  # the same URL answers npz to a client that asks for it
    return resp


def post_trace_json(raw: bytes) -> Response:
    cache = current_app.extensions["attention_trace.responses"]
    if cache is None:
        req = parse_body(TraceRequest, raw)
        if compression.may_compress(settings()):  # only compression reads it
            g.cpu_estimate = cpu_estimate(req)
        return current_app.response_class(render_trace(req), mimetype="application/json")
    # The cache keeps answers as sent: identity, and compressed (service/compression.py).
    g.response_cache_key = raw
    encoding = compression.choose_encoding(settings())
    packed = cache.get(compression.encoded_key(encoding, raw)) if encoding else None
    if packed is not None:
        resp = current_app.response_class(packed, mimetype="application/json")
        resp.headers["Content-Encoding"] = encoding
        compression.add_vary(resp, "Accept-Encoding")
        return resp
    hit = cache.get_with_cost(raw)
    if hit is not None:
        body, g.cpu_estimate = hit
    else:
        req = parse_body(TraceRequest, raw)
        g.cpu_estimate = cpu_estimate(req)  # what compression may spend
        body = render_trace(req)
        cache.put(raw, body, cost=g.cpu_estimate)
    return current_app.response_class(body, mimetype="application/json")


@bp.post("/trace/batch")
def post_trace_batch() -> Response:
    items = parse_body(BatchRequest, read_json_body())
    if wants_npz():
        doc = batch.batch_document(request.path, items, settings(), TraceRequest,
                                   lambda req: trace_document(req, binary=True))
        resp = current_app.response_class(_npz_body(npz.dump_parts(doc)), mimetype=npz.MEDIA_TYPE)
    else:  # each item's answer as /trace's pre-encoded bytes, embedded as they are
        resp = json_response(batch.batch_document(request.path, items, settings(), TraceRequest,
                                                  lambda req: orjson.Fragment(render_trace(req))))
    compression.add_vary(resp, "Accept")
    return resp


@bp.post("/trace/html")
def post_trace_html() -> Response:
    """The trace of a /trace request body, drawn by the viewer, in one self-contained HTML file (a download)."""
    raw = read_json_body()
    req = parse_body(TraceRequest, raw)
    if req.stages is not None:
        message = "the page draws every stage: leave out stages"
        raise ProblemError(422, "Invalid request", f"/stages: {message}", kind="validation-error",
                           errors=[{"pointer": "/stages", "type": "export_needs_every_stage", "message": message}])
    limits = settings()
    # The page's cost, before any work (service/budget.py): over the budget, refused.
    work = budget.page_cost([req])
    if work > limits.max_request_cost:
        raise ProblemError(422, "Invalid request",
                           f"the page for this trace would cost {work} units of work, above the limit of "
                           f"{limits.max_request_cost}; use fewer tokens, a smaller d_model or fewer heads "
                           "(POST /trace answers the trace itself)",
                           kind="validation-error",
                           errors=[{"pointer": "", "type": "page_too_costly",
                                    "message": f"{work} units; the limit is {limits.max_request_cost}"}])
    body = orjson.loads(raw)
    # The "why divide by √d_k" comparison, as the viewer asks for it; left out when both traces together would
    # exceed one request's work budget (the page then says it holds none).
    alt = parse_body(TraceRequest, orjson.dumps(comparison_request(body)))
    with_alt = budget.page_cost([req, alt])
    compare = with_alt <= limits.max_request_cost
    work = with_alt if compare else work
    doc = trace_document(req)
    comparison = trace_document(alt) if compare else None
    g.cpu_estimate = compression.estimate_s(work)
    page = render_html_bytes(doc, body, comparison=comparison, dumps=serialize.dumps)
    resp = current_app.response_class(page, mimetype="text/html")
    resp.headers["Content-Type"] = "text/html; charset=utf-8"
    resp.headers["Content-Disposition"] = f'attachment; filename="{export_filename(doc, body)}"'
    return resp


# ------------------------------------------------------------------ the contract


def _example() -> dict[str, Any]:
    """A real, small response, computed now, so the example cannot drift."""
    req = TraceRequest(sentence="the cat", d_model=4, num_heads=2)
    return orjson.loads(render_trace(req))


#: content negotiation on /trace and /trace/batch (service/npz.py): the same answer as exact arrays
NPZ_ANSWER = {"application/x-npz": {
    "schema": {"type": "string", "contentMediaType": "application/x-npz",
               "description": "Sent when the request's Accept prefers application/x-npz (JSON stays the "
                              "default). An uncompressed zip that np.load reads: `metadata.json` is the JSON "
                              "answer with each numeric array replaced by {\"npz\": KEY}, KEY the array's "
                              "JSON Pointer without the leading slash (e.g. `stages/q/values`); each array "
                              "is the member KEY.npy, float64 in the JSON's shape. Masked entries are NaN, "
                              "and a masked stage gains `mask` (boolean, true where the JSON has null). "
                              "Every number equals the JSON answer's bit for bit."}}}


def openapi_paths(parts: Parts) -> dict[str, Any]:
    """/trace, /trace/batch and /trace/html: their path items of openapi.yaml (service/openapi.py)."""
    return {
        "/trace": {
            "post": {
                "operationId": "trace",
                "tags": ["trace"],
                "summary": "Trace one multi-head self-attention layer",
                "description": "Unknown fields are rejected and types are strict (`true` is not a number, "
                               "`\"24\"` is not an integer).",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {
                        "schema": parts.ref("TraceRequest"),
                        "examples": {
                            "classroom": {"summary": "The seed's sentence, 4 heads",
                                          "value": {"sentence": "the cat sat", "d_model": 24, "num_heads": 4}},
                            "unscaled_causal": {"summary": "Pre-split tokens, no scaling, causal mask",
                                                "value": {"tokens": ["the", "cat", "sat"], "scale": False,
                                                          "causal": True}},
                        },
                    }},
                },
                "responses": {
                    "200": {"description": "The full trace.", "headers": parts.headers, "content": {
                        "application/json": {"schema": parts.ref("TraceResponse"), "example": _example()},
                        **NPZ_ANSWER}},
                    **parts.problems,
                    **parts.common,
                },
            }
        },
        "/trace/batch": parts.post(
            "traceBatch", "trace", "Several traces in one request",
            "Each item is a /trace request body, answered independently and in order: a bad item gets "
            "its own problem entry (with pointers under /items/<i>) and does not fail the rest. "
            "`Accept: application/x-npz` answers every item's arrays in one archive (keys under "
            "`results/<i>/result/`).",
            "BatchRequest", "BatchResponse", None, answer_media=NPZ_ANSWER),
        "/trace/html": {"post": {
            "operationId": "traceHtml", "tags": ["viewer"],
            "summary": "The viewer's page for one trace, as one offline HTML file",
            "description": "Takes a /trace request (every stage: no `stages`) and answers the viewer's page with "
                           "that trace and its scale-flipped comparison embedded, script and style inlined, and "
                           "a Content-Security-Policy meta that allows only them (by hash): it opens from disk, "
                           "offline, read-only, and sends no request (docs/viewer.md).",
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": parts.ref("TracePageRequest")}}},
            "responses": {"200": {"description": "The page, as a download.", "headers": {
                **parts.headers, "Content-Disposition": {"schema": {"type": "string"}, "description":
                                                         'attachment; filename="attention-trace_….html"'}},
                "content": {"text/html": {"schema": {"type": "string"}}}},
                **parts.problems, **parts.common},
        }},
    }
