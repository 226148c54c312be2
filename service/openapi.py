"""Build openapi.yaml from the pydantic models (the one source of truth).

Each endpoint family's module (``service/routes/``) gives its paths
(``openapi_paths``) and the models they publish (``MODELS``); this module
adds what the document shares: the info, the tags, the problem responses
(``Parts``, service/openapi_parts.py) and ``components``. ``scripts/gen-openapi`` writes the result to
openapi.yaml; the test suite rebuilds it and fails if the committed file
drifted from the models, and validates every response it receives against it.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from engine import STAGE_IDS
from engine.bugs import BLOCK_BUG_NAMES, BUG_NAMES, LM_BUG_NAMES
from engine.constructed import HEAD_KINDS
from engine.layer import FFN_KINDS

from .models import STAGE_ID_CHOICES, Problem, TraceSpec
from .openapi_parts import REF, Parts
from .routes import FAMILIES
from .serialize import SCHEMA_VERSION
from .settings import Settings

#: every model of the contract, the source of components.schemas: each family's, and the problem document
CONTRACT_MODELS: tuple[type[BaseModel], ...] = tuple(dict.fromkeys(
    [Problem, *(model for family in FAMILIES for model in family.MODELS)]))

#: the request parts every request that traces shares, written out once in components.schemas and referenced
#: (allOf) by each request that holds them: the sentence and the configuration (TraceSpec), then what /trace
#: returns and how (TraceOptions: TraceRequest's own fields, which /explain's and /export's requests inherit)
SHARED_REQUEST_PARTS: tuple[str, ...] = ("TraceSpec", "TraceOptions")

#: the lists of names the contract uses in several places, each written out once as a named enum
NAMED_ENUMS: dict[str, tuple[str, ...]] = {
    "StageId": STAGE_ID_CHOICES,
    "MistakeName": BUG_NAMES + BLOCK_BUG_NAMES + LM_BUG_NAMES,
    "HeadKind": HEAD_KINDS,
    "FFNKind": FFN_KINDS,
}

#: the document's paths in the order it has listed them since schema 1.0 (a generated client's diff, and
#: the served bytes, stay the same); a family's new path must be placed here
PATH_ORDER: tuple[str, ...] = ("/trace", "/check", "/trace/batch", "/explain", "/export", "/check/batch", "/",
                               "/static/{path}", "/trace/html", "/health", "/version", "/openapi.yaml")


def _problem(description: str, example: dict[str, Any]) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": {"$ref": REF.format(model="Problem")}, "example": example}},
    }


def _response_ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/responses/{name}"}


def build_spec() -> dict[str, Any]:
    schemas = components_schemas()
    limits = Settings()
    stage_list = ", ".join(f"`{s}`" for s in STAGE_IDS)
    problems = {
        "400": _problem("The body is not valid JSON (at /check, or not a readable npz archive: "
                        "urn:attention-trace:problem:malformed-npz).", {
            "type": "urn:attention-trace:problem:malformed-json", "title": "Malformed JSON", "status": 400,
            "detail": "The request body is not valid JSON: Invalid JSON: EOF while parsing a value at line 1 column 0.",
            "instance": "/trace"}),
        "413": _problem("The body is larger than the configured limit (at /check, or holds more JSON values, or "
                        "an npz archive has more members or unpacks to more bytes, than the limits allow).", {
            "type": "urn:attention-trace:problem:payload-too-large", "title": "Request Entity Too Large",
            "status": 413, "detail": f"The request body is larger than the limit of {limits.max_body_bytes} bytes.",
            "instance": "/trace"}),
        "415": _problem("The body is not sent as JSON.", {
            "type": "urn:attention-trace:problem:unsupported-media-type", "title": "Unsupported Media Type",
            "status": 415, "detail": "Send the body as JSON with 'Content-Type: application/json' (got 'text/plain').",
            "instance": "/trace"}),
        "422": _problem("The JSON is well formed but the request is invalid; `errors` lists every problem.", {
            "type": "urn:attention-trace:problem:validation-error", "title": "Invalid request", "status": 422,
            "detail": "/num_heads: d_model 24 is not divisible by num_heads 5 (d_k would be 4.8); choose num_heads "
                      "among the divisors of d_model: 1, 2, 3, 4, 6, 8, 12, 24",
            "instance": "/trace",
            "errors": [{"pointer": "/num_heads", "type": "head_division",
                        "message": "d_model 24 is not divisible by num_heads 5 (d_k would be 4.8); choose num_heads "
                                   "among the divisors of d_model: 1, 2, 3, 4, 6, 8, 12, 24"}]}),
    }
    common = {
        "404": _problem("No such resource.", {
            "type": "urn:attention-trace:problem:not-found", "title": "Not Found", "status": 404,
            "detail": "There is no resource at /nope. See /openapi.yaml for the endpoints.", "instance": "/nope"}),
        "405": {**_problem("Method not allowed; the Allow header lists the allowed ones.", {
            "type": "urn:attention-trace:problem:method-not-allowed", "title": "Method Not Allowed", "status": 405,
            "detail": "GET is not allowed on /trace.", "instance": "/trace"}),
            "headers": {"Allow": {"schema": {"type": "string"}, "description": "Allowed methods."}}},
        "500": _problem("Unexpected server failure; never a stack trace.", {
            "type": "urn:attention-trace:problem:internal-error", "title": "Internal Server Error", "status": 500,
            "detail": "The server failed to answer this request. It has been logged.", "instance": "/trace"}),
    }
    # Each problem response is written once, in components.responses; an operation's 422 names, in its own
    # description, the rules its schema cannot state (INVALID_REQUESTS).
    responses = {RESPONSE_NAMES[status]: response for status, response in {**problems, **common}.items()}
    parts = Parts({status: _response_ref(RESPONSE_NAMES[status]) for status in problems},
                  {status: _response_ref(RESPONSE_NAMES[status]) for status in common},
                  {"X-Request-ID": {"$ref": "#/components/headers/X-Request-ID"}}, limits)
    paths: dict[str, Any] = {}
    for family in FAMILIES:
        paths.update(family.openapi_paths(parts))
    if set(paths) != set(PATH_ORDER):
        raise RuntimeError(f"PATH_ORDER lists {sorted(PATH_ORDER)}, the routes give {sorted(paths)}")
    for item in paths.values():
        for op in item.values():
            if "422" in op["responses"]:
                op["responses"]["422"] = {**_response_ref(RESPONSE_NAMES["422"]),
                                          "description": invalid_request_description(op["operationId"])}

    return {
        "openapi": "3.1.0",
        "info": {
            "title": "attention-trace",
            "version": SCHEMA_VERSION,
            "summary": "Every number of multi-head self-attention, stage by stage.",
            "description": (
                "POST a sentence to /trace and get every stage of one multi-head self-attention layer, "
                "softmax(QKᵀ/√d_k)V, as JSON: tokens, seeded embeddings, positional encodings, Q/K/V per head, "
                "raw and scaled scores, the causal mask, softmax weights, per-head context, the concatenation "
                f"and the W_O projection. Stage ids: {stage_list}.\n\n"
                "Results are deterministic for a given request and `engine_version`. Errors are RFC 9457 "
                "problem details. Limits (defaults; operators may change them, GET /version reports them): "
                f"{limits.max_tokens} tokens, d_model {limits.max_d_model}, {limits.max_heads} heads, "
                f"{limits.max_trace_values} numbers per trace, {limits.max_body_bytes} body bytes "
                f"({limits.max_check_body_bytes} for /check), "
                f"{limits.max_sentence_chars} sentence characters."
            ),
            "license": {"name": "MIT", "identifier": "MIT"},
        },
        "servers": [{"url": "http://127.0.0.1:8000", "description": "make run"}],
        "tags": [{"name": "trace", "description": "Attention traces"},
                 {"name": "check", "description": "Grading: compare a submission with the reference"},
                 {"name": "meta", "description": "Health, versions and this document"},
                 {"name": "viewer", "description": "The interactive walkthrough page"}],
        "paths": {path: paths[path] for path in PATH_ORDER},
        "components": {
            "schemas": schemas,
            "responses": responses,
            "headers": {"X-Request-ID": {
                "description": "The caller's X-Request-ID when it matches ^[A-Za-z0-9._:-]{1,128}$, else a "
                               "generated one; the access log records the same id.",
                "schema": {"type": "string"}}},
        },
    }


def _drop_none_examples(spec: dict[str, Any]) -> dict[str, Any]:
    for path in spec["paths"].values():
        for op in path.values():
            for resp in op["responses"].values():
                for media in resp.get("content", {}).values():
                    if media.get("example") is None:
                        media.pop("example", None)
    return spec


def render() -> str:
    """The exact text of openapi.yaml."""
    spec = _drop_none_examples(build_spec())
    # The routes' own models (service/routes/) go unnamed: GET /openapi.yaml serves this file, and its bytes,
    # this line included, are in the recorded answer corpus.
    header = "# Generated by scripts/gen-openapi from service/models.py and service/openapi.py. Do not edit.\n"
    return header + yaml.dump(spec, Dumper=_PlainDumper, sort_keys=False, allow_unicode=True, width=130,
                             default_flow_style=None)


class _PlainDumper(yaml.SafeDumper):
    """Writes shared sub-objects out in full: no &anchors or *aliases in the spec."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


# ------------------------------------------------------------------ components.schemas, each part once

#: each problem response's name in components.responses
RESPONSE_NAMES: dict[str, str] = {"400": "MalformedBody", "413": "PayloadTooLarge", "415": "UnsupportedMediaType",
                                  "422": "InvalidRequest", "404": "NotFound", "405": "MethodNotAllowed",
                                  "500": "InternalError"}


def _refused(why: str, default: Any) -> dict[str, Any]:
    """A request field an operation refuses unless left at its default: the schema admits only the default."""
    return {"type": "null", "description": why} if default is None else {"const": default, "description": why}


def refused_fields() -> dict[str, dict[str, dict[str, Any]]]:
    """Per request schema, the inherited fields its operation refuses (each rule stays in its route or the
    engine; this only states it in the schema): the schema admits them at their default only."""
    from .routes.export import _NOT_EXPORTED

    not_explained = {"inject_bug": _refused("An explanation follows the correct layer's formulas: no injected "
                                            "mistake here (explain_with_bug); /trace shows the mistake's numbers.",
                                            None)}
    return {
        "TracePageRequest": {"stages": _refused("The page draws every stage: leave out stages "
                                                "(export_needs_every_stage).", None)},
        "ExportRequest": {name: _refused(f"Not taken by /export: {why} (not_exported).", default)
                          for name, default, why in _NOT_EXPORTED},
        "ExplainRequest": not_explained, "NormExplainRequest": not_explained, "FFNExplainRequest": not_explained,
    }


#: what JSON Schema can state of TraceSpec's rules between fields: exactly one of sentence and tokens (each a
#: string or a list, not null), and at most one of context_sentence and context_tokens
_ONE_SOURCE: dict[str, Any] = {
    "oneOf": [{"required": ["sentence"], "properties": {"sentence": {"type": "string"}}},
              {"required": ["tokens"], "properties": {"tokens": {"type": "array"}}}],
    "not": {"required": ["context_sentence", "context_tokens"],
            "properties": {"context_sentence": {"type": "string"}, "context_tokens": {"type": "array"}}},
}


def _walk(node: Any, visit: Any) -> None:
    """Call ``visit`` on every mapping of a JSON document, depth first."""
    if isinstance(node, dict):
        visit(node)
        for value in node.values():
            _walk(value, visit)
    elif isinstance(node, list):
        for value in node:
            _walk(value, visit)


def components_schemas() -> dict[str, Any]:
    """components.schemas: pydantic's JSON Schema of every model of the contract, with each shared part written
    once: the request parts every request that traces shares (SHARED_REQUEST_PARTS, referenced through allOf),
    the lists of names (NAMED_ENUMS), and no per-field titles (pydantic's "Num Heads" for num_heads). What the
    schema adds to the models: the rules between fields JSON Schema can state (_ONE_SOURCE), and the fields an
    operation refuses (refused_fields). tests/test_openapi.py proves that, these aside, the document states
    exactly the models' schemas."""
    models: tuple[type[BaseModel], ...] = (*CONTRACT_MODELS, TraceSpec)
    _, defs = models_json_schema([(m, "validation") for m in models], ref_template=REF)
    schemas: dict[str, Any] = defs["$defs"]
    spec, trace = schemas["TraceSpec"], schemas["TraceRequest"]
    spec.pop("additionalProperties")
    spec.update(_ONE_SOURCE)
    spec["description"] += spec_rules_description()
    schemas["TraceOptions"] = {
        "description": "What /trace returns, and how: shared by the requests that answer with a trace's numbers.",
        "properties": {k: v for k, v in trace["properties"].items() if k not in spec["properties"]},
        "title": "TraceOptions", "type": "object"}
    schemas["TracePageRequest"] = {**trace, "title": "TracePageRequest",
                                   "description": "A /trace request for the viewer's page: every stage."}
    schemas["TracePageRequest"].pop("examples", None)
    for name, fields in refused_fields().items():
        schemas[name] = {**schemas[name], "properties": {**schemas[name]["properties"], **fields}}
    for name, schema in list(schemas.items()):
        if name in SHARED_REQUEST_PARTS or schema.get("additionalProperties") is not False:
            continue
        bases = [b for b in SHARED_REQUEST_PARTS if schemas[b]["properties"].keys() <= schema["properties"].keys()]
        if not bases:
            continue
        shared = {k: v for b in bases for k, v in schemas[b]["properties"].items()}
        own = {k: v for k, v in schema["properties"].items() if shared.get(k) != v}
        rest = {k: v for k, v in schema.items() if k not in ("properties", "additionalProperties")}
        # unevaluatedProperties, not additionalProperties: the fields the allOf's parts declare count as known
        schemas[name] = {"allOf": [{"$ref": REF.format(model=b)} for b in bases], **rest,
                         **({"properties": own} if own else {}), "unevaluatedProperties": False}
    enums = {names: name for name, names in NAMED_ENUMS.items()}

    def share(node: dict[str, Any]) -> None:
        for prop in node.get("properties", {}).values() if isinstance(node.get("properties"), dict) else ():
            if isinstance(prop, dict):
                prop.pop("title", None)
        name = enums.get(tuple(node.get("enum", ())))
        if name is not None and node.get("type", "string") == "string":  # (propertyNames' enum has no type)
            del node["enum"]
            node.pop("type", None)
            node["$ref"] = REF.format(model=name)

    _walk(schemas, share)
    for name, names in NAMED_ENUMS.items():
        schemas[name] = {"enum": list(names), "title": name, "type": "string"}
    return dict(sorted(schemas.items()))


#: the rules JSON Schema cannot state, each group with the error types (the `type` of an `errors` entry) it
#: answers: of the sentence and the configuration (every request that traces), then of TraceOptions' fields
_SPEC_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("an integer written with a fraction (`24.0`): JSON Schema's integer admits it, the service's strict types do "
     "not", ("int_type",)),
    ("sizes that must divide: d_model by num_heads, num_heads by num_kv_heads, an even d_k under RoPE",
     ("head_division", "kv_head_division", "rope_odd_d_k")),
    ("the text: a sentence or token that holds no token, or a character no tokenizer should see",
     ("empty_sentence", "empty_tokens", "blank_token", "bad_character")),
    ("the limits in force (GET /version's `limits`): tokens, d_model, heads, the numbers of a trace, and a stack's "
     "request cost (its numbers plus its weights, n_parameters)",
     ("sentence_too_long", "too_many_tokens", "d_model_too_large", "num_heads_too_large", "trace_too_large")),
    ("a field the engine checks before the schema (num_kv_heads, rope_base, rope_pairing, window, num_layers, the "
     "block fields, head_weights, sharpness), whose message says what to send", ("invalid_size",)),
    ("settings that do not go together (a window without causal; cross-attention with causal or RoPE; your own "
     "x for one side only; decode without causal, with a context, a mistake or a stack; num_layers above 1 "
     "without a block field; a stack with a context or your own weights)",
     ("window_needs_causal", "cross_attention_causal", "cross_attention_rope", "context_input_without_context",
      "explicit_input_pair", "decode_needs_causal", "decode_cross_attention", "decode_with_bug", "decode_block",
      "layers_need_block", "block_cross_attention", "block_parameters")),
    ("constructed heads (head_weights): one kind per head, induction with 2 layers or more, no context, own x or "
     "own weights, all K/V heads, a positional code, room for the layout in d_model and d_k, and a RoPE base "
     "that tells the positions apart",
     ("heads_length", "unknown_head_kind", "induction_needs_layers", "constructed_cross", "constructed_input",
      "constructed_parameters", "constructed_needs_mha", "constructed_needs_pe", "d_model_too_small",
      "d_k_too_small", "rope_base_blurs_positions")),
    ("your own arrays (input, context_input, parameters): their shapes, and numbers that overflow float64",
     ("array_shape", "non_finite_input", "numeric_overflow")),
    ("the language-model head (lm_head, temperature, candidates): a head without a block field, temperature or "
     "candidates without lm_head, a vocabulary above its limit", ("lm_head_needs_block", "needs_lm_head",
                                                                   "vocabulary_too_large")),
    ("interventions (interventions, patch_sentence, target_token): a layer, head or position out of range, a target "
     "the configuration does not compute, a zeroed pattern, a patch without its sentence or of another length, a "
     "target token without lm_head or outside the vocabulary, those fields without interventions, and "
     "interventions with your own x, a mistake, decode or generate",
     ("unknown_intervention", "intervention_needs_block", "intervention_out_of_range", "pattern_not_zeroed",
      "patch_needs_sentence", "patch_needs_self_attention", "patch_length_mismatch", "patch_sentence_unused",
      "needs_interventions", "interventions_conflict", "patch_needs_generated_input", "target_needs_lm_head",
      "target_not_in_vocabulary")),
)
_GENERATE_RULES = ("generation (generate, top_k, top_p, sample_seed): top_k, top_p or sample_seed without generate; "
                   "generate without lm_head or causal, beyond the token limit, with your own x or a mistake",
                   ("needs_generate", "generate_needs_lm_head", "generate_needs_causal", "generate_too_long",
                    "generate_needs_embeddings", "generate_with_bug"))
_STAGE_RULES = ("stages this configuration does not compute (masked_scores without causal, the rotated stages "
                "without RoPE, the context's without a context, a block's without one, the embeddings with your "
                "own x, the language-model head's without lm_head)", ("stage_needs_causal", "stage_needs_rope",
                                                                       "stage_needs_context", "stage_needs_block",
                                                                       "stage_not_computed", "stage_needs_lm_head"))
_BUG_RULES = ("a mistake this trace cannot show (inject_bug: one that needs causal, or would change no number "
              "here, or a stack's mistake without a block field or where the stack has no such part)",
              ("bug_needs_causal", "bug_not_applicable", "bug_changes_nothing"))
_LAYOUT_RULES = ("parameters_layout torch without include_parameters, with shared K/V heads or with a stack",
                 ("layout_needs_parameters", "layout_needs_all_kv_heads", "layout_needs_one_layer"))

#: per operation, the groups of rules its schema cannot state
INVALID_REQUESTS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "trace": (*_SPEC_RULES, _STAGE_RULES, _BUG_RULES, _LAYOUT_RULES, _GENERATE_RULES),
    "traceHtml": (*_SPEC_RULES, _BUG_RULES, _LAYOUT_RULES, _GENERATE_RULES,
                  ("the page's cost above the request-cost limit", ("page_too_costly",))),
    "check": (*_SPEC_RULES, ("the submission: " + _STAGE_RULES[0] + "; a stage's shape; a value that is not a "
                             "number (token stages: not a string); checking that would cost more than the "
                             "request-cost limit", (*_STAGE_RULES[1], "array_shape", "submission_type",
                                                    "check_too_costly")),
              ("a tolerance of the other metric (threshold without rel_error; rtol, atol or stage_rtol with it)",
               ("tolerance_conflict",)),
              ("an npz body (application/x-npz): an array that is not real numbers, a mask that does not fit, a "
               "member referenced but missing or sent but unreferenced, a reference where none may be",
               ("npz_dtype", "npz_mask", "npz_member_missing", "npz_member_unused", "npz_reference"))),
    "explain": (*_SPEC_RULES, _STAGE_RULES, _BUG_RULES, _LAYOUT_RULES, _GENERATE_RULES,
                ("the cell: an index out of its range (head, query, key, layer, token, feature, unit, column), a "
                 "norm or feed-forward cell without a block field, a norm the stack does not have, a logit without "
                 "lm_head, a mistake",
                 (*(f"{index}_out_of_range" for index in ("head", "query", "key", "layer", "token", "feature",
                                                          "unit", "column")), "explain_needs_block",
                  "norm_not_in_block", "explain_needs_lm_head", "explain_with_bug"))),
    "export": (*_SPEC_RULES, _BUG_RULES, _GENERATE_RULES,
               ("the format: circuitsvis and transformer-explainer draw self-attention of one layer; the export "
                "and its trace together above the request-cost limit",
                ("export_needs_self_attention", "export_needs_one_layer", "export_too_costly"))),
    "traceBatch": (("too many items, or items that together cost more than the limits (each item's own "
                    "problems are in its result)", ("too_many_items", "batch_too_large", "batch_too_costly")),),
    "checkBatch": (("too many items, or items that together cost more than the limits (each item's own "
                    "problems are in its result)", ("too_many_items", "batch_too_large", "batch_too_costly")),),
}


def invalid_types(operation_id: str) -> frozenset[str]:
    """The error types a schema-valid request to this operation may still be refused with (422)."""
    return frozenset(t for _, types in INVALID_REQUESTS[operation_id] for t in types)


def spec_rules_description() -> str:
    """What TraceSpec's description adds: the rules of the sentence and configuration its schema cannot state,
    each with the error types it answers (written once here; each operation's 422 names the types)."""
    return ("\n\nA request the schema accepts can still be refused (422) by a rule it cannot state:"
            + "".join(f"\n- {what}: " + ", ".join(f"`{t}`" for t in types) for what, types in _SPEC_RULES))


def invalid_request_description(operation_id: str) -> str:
    """An operation's 422: the rules between fields, and against the limits, that its schema cannot state, each
    with the error types it answers; the trace specification's by their types alone (TraceSpec's description
    says what each is)."""
    groups = INVALID_REQUESTS[operation_id]
    shared = [t for group in groups if group in _SPEC_RULES for t in group[1]]
    own = "".join(f"\n- {what}: " + ", ".join(f"`{t}`" for t in types)
                  for what, types in groups if (what, types) not in _SPEC_RULES)
    spec = ("\n- the trace specification's rules (the TraceSpec schema's description says each): "
            + ", ".join(f"`{t}`" for t in shared)) if shared else ""
    return ("The JSON is well formed but the request is invalid; `errors` lists every problem, each with its "
            "`pointer` and `type`. A request the schema accepts can still be refused by a rule it cannot state:"
            + spec + own)
