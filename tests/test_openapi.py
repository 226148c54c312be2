"""openapi.yaml is valid, generated from the pydantic models, and honest."""

from __future__ import annotations

import yaml
from openapi_spec_validator import validate
from pydantic.json_schema import models_json_schema

from answer_values import document_differences
from conftest import ROOT
from service.routes.trace import TraceRequest
from service.openapi import CONTRACT_MODELS
from service.openapi import REF, render


def test_spec_is_valid_openapi_3_1(spec):
    assert spec["openapi"].startswith("3.1")
    validate(spec)


def test_committed_spec_matches_the_models():
    # Fails on any drift between the models (service/models.py, service/routes/) and openapi.yaml: run scripts/gen-openapi and commit the
    # result. The examples are real answers computed at generation, so their numbers are compared as answers
    # are (within 1e-12 of their scale: another CPU's BLAS rounds last bits differently); all else exactly.
    committed = (ROOT / "openapi.yaml").read_text(encoding="utf-8")
    fresh = render()
    if committed != fresh:
        problems = document_differences(yaml.safe_load(committed), yaml.safe_load(fresh))
        assert not problems, "openapi.yaml is stale: run scripts/gen-openapi\n" + "\n".join(problems[:10])


def test_components_equal_the_pydantic_json_schema(spec):
    _, defs = models_json_schema([(m, "validation") for m in CONTRACT_MODELS], ref_template=REF)
    assert spec["components"]["schemas"] == defs["$defs"]


def test_every_request_field_is_documented(spec):
    props = spec["components"]["schemas"]["TraceRequest"]["properties"]
    assert set(props) == set(TraceRequest.model_fields)
    assert spec["components"]["schemas"]["TraceRequest"]["additionalProperties"] is False


def test_examples_validate_against_their_schemas(spec, spec_checker):
    import orjson

    for path, item in spec["paths"].items():
        for method, op in item.items():
            for status, resp in op["responses"].items():
                for mime, media in resp.get("content", {}).items():
                    if "example" in media and mime.endswith("json"):
                        spec_checker.check(path, method, int(status), mime, orjson.dumps(media["example"]))


def test_trace_example_is_a_real_response(client, spec):
    example = spec["paths"]["/trace"]["post"]["responses"]["200"]["content"]["application/json"]["example"]
    live = client.post("/trace", json={"sentence": "the cat", "d_model": 4, "num_heads": 2}).get_json()
    assert document_differences(example, live) == []


def test_undocumented_statuses_are_caught(spec_checker, spec):
    import pytest

    with pytest.raises(AssertionError, match="not documented"):
        spec_checker.check("/health", "get", 418, "application/json", b"{}")
    with pytest.raises(AssertionError, match="breaks the spec"):
        spec_checker.check("/health", "get", 200, "application/json", b'{"status": "bad"}')
    assert document_differences(spec, yaml.safe_load(render())) == []


def _observed(spec, docs) -> tuple[dict[str, list[set[str]]], dict[str, set[str]]]:
    """For each named response schema, the key sets of every object the answers hold under it, and the
    keys sent as null."""
    from jsonschema import Draft202012Validator

    components = spec["components"]["schemas"]
    seen: dict[str, list[set[str]]] = {}
    nulls: dict[str, set[str]] = {}

    def walk(schema: dict, doc, name: str | None = None) -> None:
        if "$ref" in schema:
            ref = schema["$ref"].rsplit("/", 1)[1]
            return walk(components[ref], doc, ref)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                for branch in schema[key]:  # the first branch the value is valid against
                    if Draft202012Validator({**branch, "components": spec["components"]}).is_valid(doc):
                        return walk(branch, doc, None)
                raise AssertionError(f"no branch of {name} matches")
        if isinstance(doc, dict):
            if name is not None and "properties" in schema:
                seen.setdefault(name, []).append(set(doc))
                nulls.setdefault(name, set()).update(k for k, v in doc.items() if v is None)
            props = schema.get("properties", {})
            extra = schema.get("additionalProperties")
            for k, v in doc.items():
                if k in props:
                    walk(props[k], v)
                elif isinstance(extra, dict):
                    walk(extra, v)
        elif isinstance(doc, list) and isinstance(schema.get("items"), dict):
            for v in doc:
                walk(schema["items"], v)

    for path, method, status, mime, body in docs:
        op = spec["paths"].get(path, {}).get(method) or spec["paths"]["/trace"]["post"]
        walk(op["responses"][str(status)]["content"][mime]["schema"], body)
    return seen, nulls


def test_response_schemas_require_exactly_the_fields_every_answer_sends_and_have_no_defaults(client, spec):
    """A field the service leaves out when it does not apply is optional and has no `default` (generated
    clients read a default as "always present": openapi-typescript typed parameters, context_tokens,
    decode, config's variant fields … as always there, and tsc refused every real answer); a field every
    answer sends is required. Checked over real answers of every endpoint (tests/contract_answers.py)."""
    from contract_answers import answers

    docs = [(path, method, status, mime, body) for _, path, method, status, mime, body in answers(client)]
    seen, nulls = _observed(spec, docs)
    schemas = spec["components"]["schemas"]
    problems = []
    for name, key_sets in sorted(seen.items()):
        schema = schemas[name]
        always = set.intersection(*key_sets)
        ever = set.union(*key_sets)
        required = set(schema.get("required", []))
        if required != always:
            problems.append(f"{name}: required {sorted(required - always)} not always sent; "
                            f"always sent but optional {sorted(always - required)}")
        for prop, sub in schema["properties"].items():
            if "default" in sub:
                problems.append(f"{name}.{prop} has a default")
            if prop not in ever:
                problems.append(f"{name}.{prop} is in no answer here: add one that sends it")
            elif prop not in required and {"type": "null"} in sub.get("anyOf", []) and prop not in nulls[name]:
                problems.append(f"{name}.{prop} is left out where it does not apply, never sent as null, "
                                "but its schema admits null")
    assert not problems, "\n".join(problems)


def test_each_endpoint_family_documents_exactly_the_routes_it_serves(app, spec):
    """One pattern (service/routes/): each family's blueprint serves exactly the paths its openapi_paths
    gives, and the document is the union of them."""
    from service.openapi import Parts
    from service.routes import FAMILIES
    from service.settings import Settings

    parts = Parts({}, {}, {}, Settings())
    documented = set()
    for family in FAMILIES:
        served = {r.rule.replace("<path:filename>", "{path}") for r in app.url_map.iter_rules()
                  if r.endpoint.startswith(f"{family.bp.name}.")}
        paths = set(family.openapi_paths(parts))
        assert served == paths, family.__name__
        assert not documented & paths, family.__name__
        documented |= paths
    assert documented == set(spec["paths"])
