"""Build openapi.yaml from the pydantic models (the one source of truth).

``scripts/gen-openapi`` writes the result to openapi.yaml; the test suite
rebuilds it and fails if the committed file drifted from the models, and
validates every response it receives against it.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from engine import STAGE_IDS

from .explain_api import ExplainRequest, ExplainResponse
from .explain_api import openapi_path as explain_openapi_path
from .export_api import ExportRequest, ExportResponse
from .export_api import openapi_operation as export_openapi_operation
from .models import SCHEMA_MODELS
from .npz import MAX_MEMBERS

from .serialize import SCHEMA_VERSION
from .settings import Settings

REF = "#/components/schemas/{model}"

#: every model of the contract, the source of components.schemas: /trace's and /check's (service/models.py)
#: and those of the endpoints built on them (/export, /explain)
CONTRACT_MODELS: tuple[type[BaseModel], ...] = (*SCHEMA_MODELS, ExportRequest, ExportResponse, ExplainRequest,
                                                ExplainResponse)


def _problem(description: str, example: dict[str, Any]) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": {"$ref": REF.format(model="Problem")}, "example": example}},
    }


def _example_trace() -> dict[str, Any]:
    """A real, small response, computed now, so the example cannot drift."""
    import orjson

    from .core import render_trace
    from .models import TraceRequest

    req = TraceRequest(sentence="the cat", d_model=4, num_heads=2)
    return orjson.loads(render_trace(req))


def _example_check() -> dict[str, Any]:
    """A real /check answer for a submission with the first documented bug."""
    from engine import BUG_NAMES

    from .core import check_document, trace_document
    from .models import CheckRequest, TraceRequest

    base = {"sentence": "the cat sat", "d_model": 4, "num_heads": 1}
    buggy = trace_document(TraceRequest(**base, inject_bug=BUG_NAMES[0], stages=["weights"]))
    submission = {"weights": buggy["stages"]["weights"]["values"].tolist()}
    return check_document(CheckRequest(**base, submission=submission))


def build_spec() -> dict[str, Any]:
    _, defs = models_json_schema([(m, "validation") for m in CONTRACT_MODELS], ref_template=REF)
    schemas = defs["$defs"]
    limits = Settings()
    stage_list = ", ".join(f"`{s}`" for s in STAGE_IDS)
    tag = {"name": "trace", "description": "Attention traces"}
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
    request_id = {"X-Request-ID": {"$ref": "#/components/headers/X-Request-ID"}}

    def get_op(op_id: str, summary: str, description: str, schema: str, example: Any,
               mime: str = "application/json") -> dict[str, Any]:
        plain = {"type": "object"} if mime == "application/yaml" else {"type": "string"}  # YAML parses to a mapping
        content = {mime: {"schema": {"$ref": REF.format(model=schema)} if schema else plain,
                          "example": example}}
        return {"get": {"operationId": op_id, "summary": summary, "description": description, "tags": ["meta"],
                        "responses": {"200": {"description": "OK", "headers": request_id, "content": content},
                                      **common}}}

    # Content negotiation on /trace and /trace/batch (service/npz.py): the same answer as exact arrays.
    npz_media = {"application/x-npz": {
        "schema": {"type": "string", "contentMediaType": "application/x-npz",
                   "description": "Sent when the request's Accept prefers application/x-npz (JSON stays the "
                                  "default). An uncompressed zip that np.load reads: `metadata.json` is the JSON "
                                  "answer with each numeric array replaced by {\"npz\": KEY}, KEY the array's "
                                  "JSON Pointer without the leading slash (e.g. `stages/q/values`); each array "
                                  "is the member KEY.npy, float64 in the JSON's shape. Masked entries are NaN, "
                                  "and a masked stage gains `mask` (boolean, true where the JSON has null). "
                                  "Every number equals the JSON answer's bit for bit."}}}

    # /check also takes the submission as an npz archive (service/npz.py, read_submission).
    npz_submission = {"application/x-npz": {
        "schema": {"type": "string", "contentMediaType": "application/x-npz",
                   "description": "The same request as an archive np.load reads (what np.savez or "
                                  "np.savez_compressed writes), for submissions too large for JSON: "
                                  "`metadata.json` is the CheckRequest, in which any submitted numeric stage may "
                                  "be {\"npz\": KEY} and the member KEY.npy holds its array (float64; float32 and "
                                  "integers are read as float64), as the npz answers lay them out. Masked entries "
                                  "of masked_scores: -Infinity or ≤ -1e9, or {\"npz\": KEY, \"mask\": {\"npz\": "
                                  "MASK_KEY}} with a boolean array true where masked. Other fields, and the token "
                                  "stages, stay JSON in metadata.json. Bounds, checked before anything is read: "
                                  f"the body and what its members unpack to at most {limits.max_check_body_bytes} "
                                  f"bytes each, at most {MAX_MEMBERS} members, metadata.json at most "
                                  f"{limits.max_check_json_values} JSON values; every member is referenced by "
                                  "metadata.json. The answer is the same JSON as for the JSON body."}}}

    def post_op(op_id: str, tag_name: str, summary: str, description: str, req_schema: str, resp_schema: str,
                example: Any, npz: bool = False, npz_request: bool = False) -> dict[str, Any]:
        return {"post": {
            "operationId": op_id, "tags": [tag_name], "summary": summary, "description": description,
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": REF.format(model=req_schema)}}, **(npz_submission if npz_request else {})}},
            "responses": {
                "200": {"description": "OK", "headers": request_id, "content": {"application/json": {
                    "schema": {"$ref": REF.format(model=resp_schema)}, "example": example},
                    **(npz_media if npz else {})}},
                **problems, **common,
            },
        }}

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
        "tags": [tag, {"name": "check", "description": "Grading: compare a submission with the reference"},
                 {"name": "meta", "description": "Health, versions and this document"},
                 {"name": "viewer", "description": "The interactive walkthrough page"}],
        "paths": {
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
                            "schema": {"$ref": REF.format(model="TraceRequest")},
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
                        "200": {"description": "The full trace.", "headers": request_id, "content": {
                            "application/json": {"schema": {"$ref": REF.format(model="TraceResponse")},
                                                 "example": _example_trace()},
                            **npz_media}},
                        **problems,
                        **common,
                    },
                }
            },
            "/check": post_op(
                "check", "check", "Check a student's numbers stage by stage",
                "Recomputes the reference trace for the same request, compares each submitted stage with "
                "`metric` `allclose` (the default: numpy.isclose's rule, rtol 1e-5 and atol 1e-8, plus "
                "`stage_rtol` 1e-4 times the stage's largest |value|, so that correct float32 work passes) or "
                "`rel_error` (CS231n's, against `threshold`), echoed in `tolerance`; names the first wrong stage "
                "in walkthrough order, and diagnoses which known bug (see `inject_bug` and GET /version) "
                "reproduces the submission, or else gives `hints` from the student's numbers. A NaN or infinity "
                "in a submitted stage fails that stage (200, with the indices); in masked_scores, -Infinity or "
                "a value ≤ -1e9 where the reference masks counts as masked. The body may be as large as "
                f"{limits.max_check_body_bytes} bytes with at most {limits.max_check_json_values} JSON values "
                "(413 above either); a submission too large for JSON (every stage of the largest trace is "
                "47 MiB of JSON) goes as an application/x-npz body. The answer summarises the submission, never "
                "repeats it (token texts are cut to 64 characters), so it stays small whatever the body holds. "
                "The response is deterministic and its messages are written to be shown to a student.",
                "CheckRequest", "CheckResponse", _example_check(), npz_request=True),
            "/trace/batch": post_op(
                "traceBatch", "trace", "Several traces in one request",
                "Each item is a /trace request body, answered independently and in order: a bad item gets "
                "its own problem entry (with pointers under /items/<i>) and does not fail the rest. "
                "`Accept: application/x-npz` answers every item's arrays in one archive (keys under "
                "`results/<i>/result/`).",
                "BatchRequest", "BatchResponse", None, npz=True),
            "/explain": explain_openapi_path(schemas, problems, common, request_id, REF),
            "/export": export_openapi_operation(schemas, REF, problems, common, request_id),
            "/check/batch": post_op(
                "checkBatch", "check", "Several checks in one request",
                "Each item is a /check request body, answered independently and in order.",
                "BatchRequest", "BatchResponse", None),
            "/": {"get": {
                "operationId": "viewer", "tags": ["viewer"], "summary": "The interactive walkthrough page",
                "description": "A self-contained teaching page (docs/viewer.md) that draws the trace using only "
                               "this public API. It carries its own Content-Security-Policy.",
                "responses": {"200": {"description": "The page.", "headers": request_id,
                                      "content": {"text/html": {"schema": {"type": "string"}}}},
                              "304": {"description": "Not modified (ETag / If-None-Match)."},
                              **{k: v for k, v in common.items() if k != "500"}},
            }},
            "/static/{path}": {"get": {
                "operationId": "viewerStatic", "tags": ["viewer"], "summary": "The page's script, style and icon",
                "parameters": [{"name": "path", "in": "path", "required": True, "schema": {"type": "string"},
                                "description": "A file of the viewer, e.g. app.js."}],
                "responses": {"200": {"description": "The file.", "headers": request_id, "content": {
                    mime: {"schema": {"type": "string"}}
                    for mime in ("text/html", "text/javascript", "text/css", "image/svg+xml")}},
                    "304": {"description": "Not modified (ETag / If-None-Match)."},
                    **{k: v for k, v in common.items() if k != "500"}},
            }},
            "/trace/html": {"post": {
                "operationId": "traceHtml", "tags": ["viewer"],
                "summary": "The viewer's page for one trace, as one offline HTML file",
                "description": "Takes a /trace request (every stage: no `stages`) and answers the viewer's page with "
                               "that trace and its scale-flipped comparison embedded, script and style inlined, and "
                               "a Content-Security-Policy meta that allows only them (by hash): it opens from disk, "
                               "offline, read-only, and sends no request (docs/viewer.md).",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": REF.format(model="TraceRequest")}}}},
                "responses": {"200": {"description": "The page, as a download.", "headers": {
                    **request_id, "Content-Disposition": {"schema": {"type": "string"}, "description":
                                                          'attachment; filename="attention-trace_….html"'}},
                    "content": {"text/html": {"schema": {"type": "string"}}}},
                    **problems, **common},
            }},
            "/health": get_op("health", "Liveness", "Cheap: touches no engine state.", "Health", {"status": "ok"}),
            "/version": get_op("version", "Versions and limits",
                               "Engine and schema versions, library versions and the limits in force.",
                               "VersionInfo", None),
            "/openapi.yaml": get_op("openapi", "This document", "The committed OpenAPI document, as served.",
                                    "", None, mime="application/yaml"),
        },
        "components": {
            "schemas": schemas,
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
    header = "# Generated by scripts/gen-openapi from service/models.py and service/openapi.py. Do not edit.\n"
    return header + yaml.dump(spec, Dumper=_PlainDumper, sort_keys=False, allow_unicode=True, width=100)


class _PlainDumper(yaml.SafeDumper):
    """Writes shared sub-objects out in full: no &anchors or *aliases in the spec."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
