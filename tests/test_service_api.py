"""Flask test-client tests: every endpoint, every error status, and the JSON
numbers against the engine's float64 (every response is also checked against
openapi.yaml by the client fixture)."""

from __future__ import annotations

import json
import math
import unicodedata

import numpy as np
import pytest
from flask import request

import engine
from engine import TraceConfig
from service.serialize import SCHEMA_VERSION

CAT = {"sentence": "the cat sat", "d_model": 24, "num_heads": 4}


def post(client, body, **kw):
    return client.post("/trace", json=body, **kw)


def problem(resp, status):
    assert resp.status_code == status, resp.get_data(as_text=True)
    assert resp.mimetype == "application/problem+json"
    doc = resp.get_json(force=True)
    assert doc["status"] == status
    assert doc["type"].startswith("urn:attention-trace:problem:")
    assert doc["title"] and doc["detail"]
    assert "Traceback" not in resp.get_data(as_text=True)
    return doc


# ------------------------------------------------------------------ /trace


def test_trace_returns_every_stage_in_walkthrough_order(client):
    resp = post(client, CAT)
    assert resp.status_code == 200 and resp.mimetype == "application/json"
    doc = resp.get_json()
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["engine_version"] == engine.ENGINE_VERSION
    expected = [s for s in engine.STAGE_IDS if s != "masked_scores"]
    assert list(doc["stages"]) == expected
    assert [doc["stages"][s]["step"] for s in expected] == [1, 2, 3, 4, 5, 5, 5, 6, 7, 9, 10, 11, 12]
    assert doc["config"] == {
        "d_model": 24, "num_heads": 4, "seed": 0, "scale": True, "causal": False,
        "positional_encoding": "sinusoidal", "include_parameters": False, "stages": None, "precision": None,
        "d_k": 6, "scale_factor": math.sqrt(6), "n_tokens": 3, "n_parameters": 4 * 24 * 24, "n_matrices": 13,
    }
    assert doc["tokens"] == [
        {"index": 0, "text": "the", "start": 0, "end": 3},
        {"index": 1, "text": "cat", "start": 4, "end": 7},
        {"index": 2, "text": "sat", "start": 8, "end": 11},
    ]
    assert doc["stages"]["weights"]["formula"] == "softmax(QKᵀ/√d_k)"
    assert doc["stages"]["weights"]["axes"] == ["head", "query", "key"]
    assert doc["stats"]["axes"] == ["head", "query"]
    assert "parameters" not in doc


def test_json_numbers_round_trip_exactly_to_engine_float64(client):
    doc = post(client, CAT | {"include_parameters": True}).get_json()
    t = engine.trace(TraceConfig(d_model=24, num_heads=4), sentence="the cat sat")
    for sid, st in t.stages.items():
        got = doc["stages"][sid]
        assert got["shape"] == list(st.shape)
        if sid == "tokens":
            assert got["values"] == ["the", "cat", "sat"]
            continue
        # Bit-exact: the JSON text parses back to the very same doubles.
        assert np.array_equal(np.array(got["values"], dtype=np.float64), st.values), sid
    assert np.array_equal(np.array(doc["stats"]["entropy"]), t.entropy)
    assert np.array_equal(np.array(doc["stats"]["max_weight"]), t.max_weight)
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        assert np.array_equal(np.array(doc["parameters"][name]), getattr(t.parameters, name)), name
    assert doc["parameters_digest"] == t.parameters_digest
    assert np.array(doc["parameters"]["W_Q"]).shape == (4, 6, 24)
    assert np.array(doc["parameters"]["W_O"]).shape == (24, 24)


def test_causal_masked_entries_are_null_and_their_weights_zero(client):
    doc = post(client, {"sentence": "the cat sat on the mat", "num_heads": 2, "d_model": 8, "causal": True}).get_json()
    masked = doc["stages"]["masked_scores"]
    assert masked["step"] == 8 and masked["shape"] == [2, 6, 6]
    scaled = doc["stages"]["scaled_scores"]["values"]
    weights = doc["stages"]["weights"]["values"]
    for h in range(2):
        for i in range(6):
            for j in range(6):
                if j > i:
                    assert masked["values"][h][i][j] is None
                    assert weights[h][i][j] == 0.0
                else:
                    assert masked["values"][h][i][j] == scaled[h][i][j]
            assert math.isclose(sum(weights[h][i]), 1.0, abs_tol=1e-12)
    assert b"NaN" not in json.dumps(doc).encode() and b"Infinity" not in json.dumps(doc).encode()


def test_defaults_are_filled_in_and_scaling_toggle(client):
    on = post(client, {"tokens": ["the", "cat", "sat"]}).get_json()
    off = post(client, {"tokens": ["the", "cat", "sat"], "scale": False}).get_json()
    assert on["config"]["d_model"] == 24 and on["config"]["num_heads"] == 1 and on["config"]["d_k"] == 24
    assert off["config"]["scale_factor"] == 1.0
    assert off["stages"]["scaled_scores"]["formula"] == "QKᵀ/1"
    raw = np.array(on["stages"]["scores"]["values"])
    assert np.array_equal(np.array(off["stages"]["scaled_scores"]["values"]), raw)
    assert np.allclose(np.array(on["stages"]["scaled_scores"]["values"]), raw / math.sqrt(24), rtol=1e-15)
    # Unscaled rows are at least as peaked: the √d_k saturation in numbers.
    assert np.all(np.array(off["stats"]["max_weight"]) >= np.array(on["stats"]["max_weight"]) - 1e-15)


def test_tokens_list_and_positional_encoding_none(client):
    doc = post(client, {"tokens": ["bank", "bank"], "positional_encoding": "none", "d_model": 6}).get_json()
    emb = doc["stages"]["token_embedding"]["values"]
    assert emb[0] == emb[1]  # context-free before attention
    assert doc["stages"]["positional_encoding"]["values"] == [[0.0] * 6] * 2
    assert doc["stages"]["input"]["values"] == emb
    assert doc["tokens"][1] == {"index": 1, "text": "bank", "start": 5, "end": 9}


def test_unicode_sentence_is_traced(client):
    doc = post(client, {"sentence": "Café 👩‍💻 你好, שלום!", "d_model": 4}).get_json()
    texts = [t["text"] for t in doc["tokens"]]
    assert texts == ["Café", "👩‍💻", "你", "好", ",", "שלום", "!"]
    s = "Café 👩‍💻 你好, שלום!"
    assert all(s[t["start"]:t["end"]] == t["text"] for t in doc["tokens"])


def test_stages_option_returns_only_those_stages(client):
    full = post(client, CAT).get_json()
    doc = post(client, CAT | {"stages": ["weights", "scores"]}).get_json()
    assert list(doc["stages"]) == ["scores", "weights"]  # walkthrough order, whatever the request order
    assert doc["config"]["stages"] == ["scores", "weights"]
    assert doc["stages"]["weights"] == full["stages"]["weights"]
    assert doc["stats"] == full["stats"] and doc["tokens"] == full["tokens"]


def test_masked_scores_stage_needs_causal(client):
    doc = problem(post(client, CAT | {"stages": ["masked_scores"]}), 422)
    assert doc["errors"][0]["pointer"] == "/stages"
    ok = post(client, CAT | {"stages": ["masked_scores"], "causal": True}).get_json()
    assert ok["stages"]["masked_scores"]["values"][0][0][1] is None


@pytest.mark.parametrize("body", [{"stages": []}, {"stages": ["weight"]}, {"precision": -1}, {"precision": 18},
                                  {"precision": 2.5}])
def test_bad_stages_and_precision_are_422(client, body):
    problem(post(client, CAT | body), 422)


def test_precision_rounds_every_number(client):
    exact = post(client, CAT | {"causal": True, "include_parameters": True}).get_json()
    doc = post(client, CAT | {"causal": True, "include_parameters": True, "precision": 3}).get_json()
    assert doc["config"]["precision"] == 3
    for sid in ("input", "weights", "output"):
        want = np.round(np.array(exact["stages"][sid]["values"]), 3)
        assert np.array_equal(np.array(doc["stages"][sid]["values"]), want), sid
    masked = doc["stages"]["masked_scores"]["values"]
    assert masked[0][0][1] is None and masked[0][1][0] == round(exact["stages"]["masked_scores"]["values"][0][1][0], 3)
    assert np.array_equal(np.array(doc["stats"]["entropy"]), np.round(np.array(exact["stats"]["entropy"]), 3))
    assert np.array_equal(np.array(doc["parameters"]["W_O"]), np.round(np.array(exact["parameters"]["W_O"]), 3))
    # Short numbers on the wire: at most 3 decimals.
    text = post(client, CAT | {"precision": 3}).get_data(as_text=True)
    import re

    assert not re.search(r"\.\d{4,}", text.split('"stages":{')[1])


def test_same_request_same_bytes(client):
    assert post(client, CAT).get_data() == post(client, CAT).get_data()


# ------------------------------------------------------------ 422 problems


@pytest.mark.parametrize(
    ("body", "pointer", "needle"),
    [
        ({"sentence": "the cat sat", "d_model": 24, "num_heads": 5}, "/num_heads",
         "d_model 24 is not divisible by num_heads 5 (d_k would be 4.8)"),
        ({"sentence": "a", "tokens": ["a"]}, "", "not both"),
        ({}, "", "not neither"),
        ({"sentence": ""}, "/sentence", "the sentence is empty"),
        ({"sentence": " \t\n "}, "/sentence", "only whitespace"),
        ({"sentence": "a", "d_model": True}, "/d_model", "valid integer"),
        ({"sentence": "a", "d_model": "24"}, "/d_model", "valid integer"),
        ({"sentence": "a", "d_model": 24.0}, "/d_model", "valid integer"),
        ({"sentence": "a", "d_model": 0}, "/d_model", "greater than or equal to 1"),
        ({"sentence": "a", "num_heads": -2}, "/num_heads", "greater than or equal to 1"),
        ({"sentence": "a", "d_model": 10**30}, "/d_model", "above the limit"),
        ({"sentence": "a", "num_heads": 128, "d_model": 128}, "/num_heads", "above the limit of 64"),
        ({"sentence": "a", "seed": 2**32}, "/seed", "less than or equal to 4294967295"),
        ({"sentence": "a", "seed": -1}, "/seed", "greater than or equal to 0"),
        ({"sentence": "a", "scale": "yes"}, "/scale", "valid boolean"),
        ({"sentence": "a", "scale": 1}, "/scale", "valid boolean"),
        ({"sentence": "a", "positional_encoding": "learned"}, "/positional_encoding", "'sinusoidal', 'none' or 'rope'"),
        ({"sentence": "a", "dmodel": 24}, "/dmodel", "unknown field 'dmodel'"),
        ({"sentence": 5}, "/sentence", "valid string"),
        ({"tokens": []}, "/tokens", "the token list is empty"),
        ({"tokens": ["a", ""]}, "/tokens/1", "tokens[1] is empty"),
        ({"tokens": ["a", "  "]}, "/tokens/1", "tokens[1] is only whitespace"),
        ({"sentence": "nul\u0000byte"}, "/sentence", "control character U+0000"),
        ({"sentence": "x " * 300}, "/sentence", "more than 256 tokens"),
        ({"tokens": ["x"] * 300}, "/tokens", "300 tokens is more than the limit of 256"),
        ({"sentence": "x " * 256, "d_model": 512, "num_heads": 64}, "", "above the limit of 2500000"),
    ],
)
def test_invalid_requests_are_422_with_pointer_and_message(client, body, pointer, needle):
    doc = problem(post(client, body), 422)
    assert doc["type"] == "urn:attention-trace:problem:validation-error"
    assert any(e["pointer"] == pointer and needle in e["message"] for e in doc["errors"]), doc["errors"]
    assert needle in doc["detail"]


def test_the_characters_refused_are_exactly_unicode_controls_and_surrogates():
    """service.models finds them with one character class; it must be Unicode's Cc (tab, newline and
    carriage return allowed) and Cs, for every code point, with the first one named."""
    from service.models import _bad_characters

    for cp in range(0x110000):
        ch = chr(cp)
        cat = unicodedata.category(ch)
        found = _bad_characters("ok " + ch + "\x00")
        if cat == "Cs":
            assert found == f"a lone surrogate U+{cp:04X} at character 3; send valid Unicode"
        elif cat == "Cc" and ch not in "\t\n\r":
            assert found == f"a control character U+{cp:04X} at character 3; remove it"
        else:
            assert found == "a control character U+0000 at character 4; remove it", hex(cp)


def test_every_problem_is_listed_at_once(client):
    doc = problem(post(client, {"sentence": 3, "d_model": "x", "seed": -1, "oops": 1}), 422)
    assert {e["pointer"] for e in doc["errors"]} == {"/sentence", "/d_model", "/seed", "/oops"}


def test_lone_surrogate_is_rejected_as_malformed_json(client):
    # JSON text must be valid Unicode (RFC 8259 §8.2, I-JSON); the parser
    # refuses an unpaired \ud800 escape before validation sees it.
    resp = client.post("/trace", data=b'{"sentence": "a \\ud800 b"}', content_type="application/json")
    doc = problem(resp, 400)
    assert "hex escape" in doc["detail"]
    # A correctly paired surrogate escape is a real character and is fine.
    ok = client.post("/trace", data=b'{"sentence": "a \\ud83d\\ude00 b"}', content_type="application/json")
    assert [t["text"] for t in ok.get_json()["tokens"]] == ["a", "\U0001F600", "b"]


def test_body_that_is_not_an_object_is_422(client):
    for raw in (b"[1, 2]", b'"the cat"', b"42", b"null"):
        doc = problem(client.post("/trace", data=raw, content_type="application/json"), 422)
        assert doc["errors"][0]["pointer"] == ""


def test_limits_come_from_settings(app_factory):
    small = app_factory(max_tokens=2, max_d_model=8, max_heads=2).test_client()
    problem(post(small, {"sentence": "a b c"}), 422)
    problem(post(small, {"sentence": "a", "d_model": 16}), 422)
    problem(post(small, {"sentence": "a", "d_model": 8, "num_heads": 4}), 422)
    assert post(small, {"sentence": "a b", "d_model": 8, "num_heads": 2}).status_code == 200


# ----------------------------------------------------- 400 / 413 / 415 / 404 / 405 / 500


@pytest.mark.parametrize("raw", [b"{bad", b'{"sentence": "the cat"', b"", b"\xff\xfe", b'{"sentence": "a",}'])
def test_malformed_json_is_400(client, raw):
    doc = problem(client.post("/trace", data=raw, content_type="application/json"), 400)
    assert doc["type"].endswith("malformed-json")


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_body_that_is_not_json_is_415(client, content_type):
    kwargs = {"content_type": content_type} if content_type else {}
    doc = problem(client.post("/trace", data=b'{"sentence": "a"}', **kwargs), 415)
    assert "application/json" in doc["detail"]


def test_json_with_charset_and_vendor_suffix_is_accepted(client):
    for ct in ("application/json; charset=utf-8", "application/vnd.trace+json"):
        assert client.post("/trace", data=b'{"sentence": "a"}', content_type=ct).status_code == 200


def test_body_over_the_limit_is_413(app_factory):
    small = app_factory(max_body_bytes=1000).test_client()
    doc = problem(small.post("/trace", data=b'{"sentence": "' + b"a " * 1000 + b'"}',
                             content_type="application/json"), 413)
    assert "1000 bytes" in doc["detail"]
    assert small.post("/trace", json={"sentence": "a"}).status_code == 200  # the next request is fine


def test_unknown_path_is_404_json(client):
    doc = problem(client.get("/nope"), 404)
    assert "/nope" in doc["detail"]


@pytest.mark.parametrize(("method", "path"), [("get", "/trace"), ("put", "/trace"), ("delete", "/health"),
                                              ("post", "/version")])
def test_wrong_method_is_405_with_allow(client, method, path):
    resp = getattr(client, method)(path)
    problem(resp, 405)
    assert "Allow" in resp.headers


def test_unexpected_error_is_generic_500(app_factory, monkeypatch):
    app = app_factory()
    app.config["PROPAGATE_EXCEPTIONS"] = False
    import service.routes.trace

    def boom(*a, **k):
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(service.routes.trace, "render_trace", boom)
    resp = app.test_client().post("/trace", json={"sentence": "a"})
    doc = problem(resp, 500)
    assert "secret" not in resp.get_data(as_text=True)
    assert doc["type"].endswith("internal-error")


# ------------------------------------------------------- /health /version /openapi.yaml


def test_health(client):
    resp = client.get("/health")
    assert resp.status_code == 200 and resp.get_json() == {"status": "ok"}


def test_version_reports_versions_and_limits(app_factory):
    doc = app_factory(max_tokens=7).test_client().get("/version").get_json()
    assert doc["engine_version"] == engine.ENGINE_VERSION
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["limits"]["max_tokens"] == 7
    assert set(doc["libraries"]) == {"python", "numpy", "pydantic", "orjson", "regex"}  # no framework/server banner
    assert doc["stage_ids"] == list(engine.ALL_STAGE_IDS)


def test_openapi_is_served_as_committed(client):
    from conftest import ROOT

    resp = client.get("/openapi.yaml")
    assert resp.status_code == 200 and resp.mimetype == "application/yaml"
    assert resp.get_data() == (ROOT / "openapi.yaml").read_bytes()


# ------------------------------------------------------------- headers


def test_security_headers_and_request_id(client):
    resp = client.get("/health", headers={"X-Request-ID": "grader-42"})
    assert resp.headers["X-Request-ID"] == "grader-42"
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
    generated = client.get("/health", headers={"X-Request-ID": "bad id\twith spaces" * 20}).headers["X-Request-ID"]
    assert generated != "bad id" and len(generated) == 32
    err = client.get("/nope")
    assert err.headers["X-Request-ID"] and err.headers["X-Content-Type-Options"] == "nosniff"


def test_the_service_headers_replace_or_defer_to_a_routes_own_as_documented():
    """X-Request-ID, X-Content-Type-Options and Referrer-Policy are the service's, whatever a route set (one
    value each, in the route's place); a route's own Content-Security-Policy and Cache-Control are kept; an
    answer that sets none gets them appended in the documented order. The hook reads the route's header names
    once, so each rule is checked here against a route that sets the names in another case."""
    from flask import Response

    from service import API_CSP, SECURITY_HEADERS, create_app
    from service.settings import Settings

    app = create_app(Settings(response_cache_bytes=0))

    @app.get("/own")
    def own() -> Response:
        return Response(b"{}", mimetype="application/json", headers=[
            ("x-request-id", "route"), ("X-CONTENT-TYPE-OPTIONS", "sniff"), ("content-security-policy", "route-csp"),
            ("referrer-policy", "origin"), ("cache-control", "max-age=60")])

    own_headers = app.test_client().get("/own", headers={"X-Request-ID": "req-7"}).headers
    for name, value in [("X-Request-ID", "req-7"), ("X-Content-Type-Options", "nosniff"),
                        ("Content-Security-Policy", "route-csp"), ("Referrer-Policy", "no-referrer"),
                        ("Cache-Control", "max-age=60")]:
        assert own_headers.getlist(name) == [value], name
    names = [k.lower() for k, _ in own_headers.items()]
    assert names[:5] == ["x-request-id", "x-content-type-options", "content-security-policy", "referrer-policy",
                          "cache-control"]  # replaced where the route put them

    plain = app.test_client().get("/health", headers={"X-Request-ID": "req-8"}).headers
    ours = [(k, v) for k, v in plain.items() if k in ("X-Request-ID", *(n for n, _, _ in SECURITY_HEADERS))]
    assert ours == [("X-Request-ID", "req-8"), ("X-Content-Type-Options", "nosniff"),
                    ("Content-Security-Policy", API_CSP), ("Referrer-Policy", "no-referrer"), ("Cache-Control", "no-store")]


@pytest.mark.parametrize("origins", [("*",), ("https://class.example",),
                                     ("https://class.example", "https://lab.example")])
def test_cors_headers_are_flask_cors_own_answer(app_factory, origins):
    """The app copies flask-cors's answer where it is always the same (computed once, at start) and asks
    flask-cors otherwise: every request of the matrix gets exactly the CORS headers that flask-cors alone,
    configured as the service configures it, gives a Flask app answering the same statuses."""
    from flask import Flask
    from flask_cors import CORS

    from service import CORS_HEADERS, CORS_METHODS

    ref = Flask("cors_reference")
    CORS(ref, origins=list(origins), supports_credentials=False, send_wildcard=origins == ("*",),
         methods=list(CORS_METHODS), allow_headers=list(CORS_HEADERS), expose_headers=["X-Request-ID"], max_age=600)
    ref.add_url_rule("/health", "health", lambda: {"status": "ok"})
    ref.add_url_rule("/trace", "trace", lambda: ({"x": 1}, 422 if "bad" in request.args else 200),
                     methods=["POST"])
    ours = app_factory(cors_origins=origins).test_client()
    theirs = ref.test_client()

    def cors_headers(resp) -> list[tuple[str, str]]:
        return [(k, v) for k, v in resp.headers.items() if k.startswith("Access-Control-")]

    def vary(resp) -> set[str]:
        return {v.strip() for value in resp.headers.get_all("Vary") for v in value.split(",")}

    requests_ = [("GET", "/health", {}), ("POST", "/trace", {}), ("POST", "/trace?bad=1", {}), ("GET", "/nope", {}),
                 ("OPTIONS", "/trace", {"Access-Control-Request-Method": "POST",
                                        "Access-Control-Request-Headers": "content-type"})]
    origin_headers = [{}, {"Origin": "https://class.example"}, {"Origin": "https://lab.example"},
                      {"Origin": "https://evil.example"},
                      {"Origin": "https://class.example", "Access-Control-Request-Private-Network": "true"}]
    for method, path, extra in requests_:
        for origin in origin_headers:
            headers = {**extra, **origin}
            body = {"sentence": "a"} if "bad" not in path else {"sentence": "a", "d_model": 8, "num_heads": 3}
            kw = {"json": body} if method == "POST" else {}
            a = ours.open(path, method=method, headers=headers, **kw)
            b = theirs.open(path, method=method, headers=headers, **kw)
            assert a.status_code == b.status_code or path == "/trace" and method == "OPTIONS", (method, path, headers)
            assert cors_headers(a) == cors_headers(b), (method, path, headers)
            assert vary(b) <= vary(a), (method, path, headers)


def test_cors_allows_origins_but_never_credentials(client, app_factory):
    resp = client.options("/trace", headers={"Origin": "https://class.example", "Access-Control-Request-Method": "POST",
                                             "Access-Control-Request-Headers": "content-type"})
    assert resp.headers["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Credentials" not in resp.headers
    only = app_factory(cors_origins=("https://class.example",)).test_client()
    ok = only.post("/trace", json={"sentence": "a"}, headers={"Origin": "https://class.example"})
    assert ok.headers["Access-Control-Allow-Origin"] == "https://class.example"
    other = only.post("/trace", json={"sentence": "a"}, headers={"Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in other.headers
