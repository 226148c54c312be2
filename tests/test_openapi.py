"""openapi.yaml is valid, generated from the pydantic models, and honest."""

from __future__ import annotations

import yaml
from openapi_spec_validator import validate
from pydantic.json_schema import models_json_schema

from answer_values import document_differences
from conftest import ROOT
from service.routes.trace import TraceRequest
from service.models import TraceSpec
from service.openapi import _ONE_SOURCE, CONTRACT_MODELS, NAMED_ENUMS, REF, refused_fields, render, spec_rules_description


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


def _expanded(schemas: dict, name: str) -> dict:
    """A component as pydantic writes it: its allOf parts' properties merged in (its own win: a field the operation
    refuses), the named enums written out, no per-field titles."""
    import copy

    schema = copy.deepcopy(schemas[name])
    if "allOf" in schema:
        parts = [_expanded(schemas, ref["$ref"].rsplit("/", 1)[1]) for ref in schema.pop("allOf")]
        schema["properties"] = {k: v for part in parts for k, v in part["properties"].items()} | schema.get(
            "properties", {})
        del schema["unevaluatedProperties"]
        schema["additionalProperties"] = False
    return _inline_enums(schemas, schema)


def _inline_enums(schemas: dict, node):
    if isinstance(node, list):
        return [_inline_enums(schemas, v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _inline_enums(schemas, v) for k, v in node.items()}
    ref = out.get("$ref", "").rsplit("/", 1)[-1]
    if ref in NAMED_ENUMS:
        del out["$ref"]
        out["enum"] = list(NAMED_ENUMS[ref])
    if tuple(out.get("enum", ())) in NAMED_ENUMS.values():
        out["type"] = "string"
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: {a: b for a, b in v.items() if a != "title"} for k, v in out["properties"].items()}
    return out


def test_components_state_the_pydantic_json_schema_with_each_shared_part_once(spec):
    """Each request that traces refers to the one TraceSpec (and TraceOptions), each list of names is one enum,
    and, expanded, every component is pydantic's schema of its model: the only additions are the rules JSON
    Schema can state between fields, and the fields an operation refuses, admitted only at their default."""
    import copy

    _, defs = models_json_schema([(m, "validation") for m in (*CONTRACT_MODELS, TraceSpec)], ref_template=REF)
    pydantic = defs["$defs"]
    schemas = spec["components"]["schemas"]
    refused = refused_fields()
    for name, model in pydantic.items():
        expected = _inline_enums({}, copy.deepcopy(model))
        expected["properties"] = {**expected.get("properties", {}), **refused.get(name, {})}
        if not expected["properties"]:
            del expected["properties"]
        if name == "TraceSpec":  # the shared part is open: each request closes itself (unevaluatedProperties)
            del expected["additionalProperties"]
            expected.update(copy.deepcopy(_ONE_SOURCE))
            expected["description"] += spec_rules_description()  # its rules JSON Schema cannot state, once
        assert _expanded(schemas, name) == expected, name
    tracing = ("TraceRequest", "CheckRequest", "ExplainRequest", "NormExplainRequest", "FFNExplainRequest",
               "ExportRequest", "TracePageRequest")
    for name in tracing:
        assert {"$ref": REF.format(model="TraceSpec")} in schemas[name]["allOf"], name
        assert not set(schemas[name].get("properties", {})) & set(schemas["TraceSpec"]["properties"]), name
    enums: list[list] = []

    def collect(node) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("enum"), list) and len(node["enum"]) > 1:
                enums.append(node["enum"])
            for v in node.values():
                collect(v)
        elif isinstance(node, list):
            for v in node:
                collect(v)

    collect(spec)
    for name, names in NAMED_ENUMS.items():  # the stage ids, the mistakes' names …: each list written once
        assert enums.count(list(names)) == 1, name
        assert not [e for e in enums if e != list(names) and set(e) & set(names) == set(names)], name
    text = (ROOT / "openapi.yaml").read_text(encoding="utf-8")
    assert text.count("urn:attention-trace:problem:malformed-json") == 1  # each problem response once
    assert len(text.splitlines()) <= 3000


def test_the_schema_states_what_json_schema_can_of_the_rules_between_fields(spec):
    from jsonschema import Draft202012Validator

    def valid(name: str, body: dict) -> bool:
        schema = {"$ref": REF.format(model=name), "components": spec["components"]}
        return Draft202012Validator(schema).is_valid(body)

    for name in ("TraceRequest", "CheckRequest", "ExportRequest"):
        extra = {"CheckRequest": {"submission": {"weights": [[[1.0]]]}},
                 "ExportRequest": {"format": "bertviz"}}.get(name, {})
        assert valid(name, {"sentence": "the cat", **extra}), name
        assert valid(name, {"tokens": ["the"], "sentence": None, **extra}), name
        assert not valid(name, {**extra}), f"{name}: neither sentence nor tokens"
        assert not valid(name, {"sentence": "the", "tokens": ["the"], **extra}), f"{name}: both"
        assert not valid(name, {"sentence": "the", "context_sentence": "le", "context_tokens": ["le"], **extra})
        assert not valid(name, {"sentence": "the", "nope": 1, **extra}), f"{name}: an unknown field"
    assert valid("TraceRequest", {"sentence": "the", "stages": ["weights"]})
    assert not valid("TracePageRequest", {"sentence": "the", "stages": ["weights"]})
    assert valid("TracePageRequest", {"sentence": "the", "stages": None, "causal": True})
    assert not valid("ExportRequest", {"sentence": "the", "format": "bertviz", "decode": True})
    assert valid("ExportRequest", {"sentence": "the", "format": "bertviz", "decode": False})
    assert not valid("ExplainRequest", {"sentence": "the", "head": 0, "query": 0, "key": 0,
                                        "inject_bug": "no_scale"})


def test_every_published_request_example_is_schema_valid(spec):
    from jsonschema import Draft202012Validator

    checked = 0
    for name, schema in spec["components"]["schemas"].items():
        for example in schema.get("examples", []):
            validator = Draft202012Validator({"$ref": REF.format(model=name), "components": spec["components"]})
            assert validator.is_valid(example), (name, example)
            checked += 1
    for path, item in spec["paths"].items():
        for method, op in item.items():
            media = op.get("requestBody", {}).get("content", {}).get("application/json")
            for key, example in (media or {}).get("examples", {}).items():
                validator = Draft202012Validator({**media["schema"], "components": spec["components"]})
                assert validator.is_valid(example["value"]), (path, key)
                checked += 1
    assert checked >= 15


def test_every_request_field_is_documented(spec):
    schemas = spec["components"]["schemas"]
    props = schemas["TraceSpec"]["properties"] | schemas["TraceOptions"]["properties"]
    assert set(props) == set(TraceRequest.model_fields)
    assert schemas["TraceRequest"]["unevaluatedProperties"] is False


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
        response = op["responses"][str(status)]
        if "$ref" in response:
            response = spec["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
        walk(response["content"][mime]["schema"], body)
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
    from service.openapi_parts import Parts
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
