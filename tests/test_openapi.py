"""openapi.yaml is valid, generated from the pydantic models, and honest."""

from __future__ import annotations

import yaml
from openapi_spec_validator import validate
from pydantic.json_schema import models_json_schema

from answer_values import document_differences
from conftest import ROOT
from service.models import TraceRequest
from service.openapi import CONTRACT_MODELS
from service.openapi import REF, render


def test_spec_is_valid_openapi_3_1(spec):
    assert spec["openapi"].startswith("3.1")
    validate(spec)


def test_committed_spec_matches_the_models():
    # Fails on any drift between service/models.py and openapi.yaml: run scripts/gen-openapi and commit the
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
