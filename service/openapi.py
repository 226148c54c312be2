"""Build openapi.yaml from the pydantic models (the one source of truth).

Each endpoint family's module (``service/routes/``) gives its paths
(``openapi_paths``) and the models they publish (``MODELS``); this module
adds what the document shares: the info, the tags, the problem responses
(``Parts``) and ``components``. ``scripts/gen-openapi`` writes the result to
openapi.yaml; the test suite rebuilds it and fails if the committed file
drifted from the models, and validates every response it receives against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from engine import STAGE_IDS

from .models import Problem
from .routes import FAMILIES
from .serialize import SCHEMA_VERSION
from .settings import Settings

REF = "#/components/schemas/{model}"

#: every model of the contract, the source of components.schemas: each family's, and the problem document
CONTRACT_MODELS: tuple[type[BaseModel], ...] = tuple(dict.fromkeys(
    [Problem, *(model for family in FAMILIES for model in family.MODELS)]))

#: the document's paths in the order it has listed them since schema 1.0 (a generated client's diff, and
#: the served bytes, stay the same); a family's new path must be placed here
PATH_ORDER: tuple[str, ...] = ("/trace", "/check", "/trace/batch", "/explain", "/export", "/check/batch", "/",
                               "/static/{path}", "/trace/html", "/health", "/version", "/openapi.yaml")


def _problem(description: str, example: dict[str, Any]) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/problem+json": {"schema": {"$ref": REF.format(model="Problem")}, "example": example}},
    }


@dataclass(frozen=True)
class Parts:
    """What every family's paths are built with: the shared responses and headers, and the default limits
    the descriptions quote."""

    problems: dict[str, Any]  # 400, 413, 415, 422: a request body that cannot be answered
    common: dict[str, Any]  # 404, 405, 500: any path
    headers: dict[str, Any]  # X-Request-ID, on every answer
    limits: Settings

    @staticmethod
    def ref(model: str) -> dict[str, str]:
        """A reference to a model's schema in components.schemas."""
        return {"$ref": REF.format(model=model)}

    def post(self, op_id: str, tag: str, summary: str, description: str, request_model: str, answer_model: str,
             example: Any, *, request_media: dict[str, Any] | None = None,
             answer_media: dict[str, Any] | None = None) -> dict[str, Any]:
        """A POST path item: a JSON body (and ``request_media``'s other types), a JSON answer (and
        ``answer_media``'s), the problems and the common responses."""
        return {"post": {
            "operationId": op_id, "tags": [tag], "summary": summary, "description": description,
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": self.ref(request_model)}, **(request_media or {})}},
            "responses": {
                "200": {"description": "OK", "headers": self.headers, "content": {"application/json": {
                    "schema": self.ref(answer_model), "example": example},
                    **(answer_media or {})}},
                **self.problems, **self.common,
            },
        }}

    def get(self, op_id: str, summary: str, description: str, schema: str, example: Any,
            mime: str = "application/json") -> dict[str, Any]:
        """A GET path item of the meta tag: one answer of ``mime`` (the model ``schema``, or none)."""
        plain = {"type": "object"} if mime == "application/yaml" else {"type": "string"}  # YAML parses to a mapping
        content = {mime: {"schema": self.ref(schema) if schema else plain, "example": example}}
        return {"get": {"operationId": op_id, "summary": summary, "description": description, "tags": ["meta"],
                        "responses": {"200": {"description": "OK", "headers": self.headers, "content": content},
                                      **self.common}}}


def build_spec() -> dict[str, Any]:
    _, defs = models_json_schema([(m, "validation") for m in CONTRACT_MODELS], ref_template=REF)
    schemas = defs["$defs"]
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
    parts = Parts(problems, common, {"X-Request-ID": {"$ref": "#/components/headers/X-Request-ID"}}, limits)
    paths: dict[str, Any] = {}
    for family in FAMILIES:
        paths.update(family.openapi_paths(parts))
    if set(paths) != set(PATH_ORDER):
        raise RuntimeError(f"PATH_ORDER lists {sorted(PATH_ORDER)}, the routes give {sorted(paths)}")

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
    return header + yaml.dump(spec, Dumper=_PlainDumper, sort_keys=False, allow_unicode=True, width=100)


class _PlainDumper(yaml.SafeDumper):
    """Writes shared sub-objects out in full: no &anchors or *aliases in the spec."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
