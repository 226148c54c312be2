"""Where the documents and the service must say the same thing: the context's characters, the variants'
error types (one case per row of docs/engine.md's table), every conflict at once, the stages an
explicit input skips, and the decoding step's k.

Each test here failed before the behaviour (or the document) it checks was fixed.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import engine
from engine import TraceConfig

SENTENCE = "the cat sat"
CONTEXT = "le chat"


def _errors(client, body, path="/trace") -> list[dict]:
    resp = client.post(path, json=body)
    assert resp.status_code == 422 and resp.mimetype == "application/problem+json", resp.get_data(as_text=True)
    return resp.get_json()["errors"]


# ----------------------------------------------------------- control characters in the context


@pytest.mark.parametrize("field, value, pointer, message", [
    ("sentence", "a\u0001b\u0000c\u007f", "/sentence",
     "the sentence contains a control character U+0001 at character 1; remove it"),
    ("context_sentence", "a\u0001b\u0000c\u007f", "/context_sentence",
     "the context sentence contains a control character U+0001 at character 1; remove it"),
    ("tokens", ["a", "a\u0001b"], "/tokens", "tokens[1] contains a control character U+0001 at character 1; remove it"),
    ("context_tokens", ["a\u0001b"], "/context_tokens",
     "context_tokens[0] contains a control character U+0001 at character 1; remove it"),
    ("context_tokens", ["le", "\u009fx"], "/context_tokens",
     "context_tokens[1] contains a control character U+009F at character 0; remove it"),
])
def test_the_context_refuses_control_characters_as_the_sentence_does(client, field, value, pointer, message):
    # The context answered 200 with "\u0001", "\u0000" and "\u007f" as tokens.
    body = {"sentence": SENTENCE, "d_model": 8, "num_heads": 2}
    if field in ("sentence", "tokens"):
        body.pop("sentence")
    body[field] = value
    assert _errors(client, body) == [{"pointer": pointer, "type": "bad_character", "message": message}]


def test_the_context_has_the_sentences_character_limit(app_factory):
    client = app_factory(max_sentence_chars=10).test_client()
    body = {"sentence": "the cat", "context_sentence": "le chat était assis"}
    assert _errors(client, body) == [{"pointer": "/context_sentence", "type": "sentence_too_long",
                                      "message": "the context sentence has 19 characters; the limit is 10"}]


def test_tab_newline_and_carriage_return_stay_allowed_in_the_context(client):
    doc = client.post("/trace", json={"sentence": SENTENCE, "d_model": 8, "num_heads": 2,
                                      "context_sentence": "le\tchat\r\nnoir"}).get_json()
    assert [t["text"] for t in doc["context_tokens"]] == ["le", "chat", "noir"]


# ------------------------------------------------- the variants' errors: one case per row of the table

X3 = [[0.0] * 8] * 3  # your own x for "the cat sat" at d_model 8
X2 = [[0.0] * 8] * 2  # ... and for the context "le chat"


def _engine(call) -> list[tuple[str, str, str]]:
    with pytest.raises(engine.EngineError) as exc:
        call()
    return [(e.pointer, e.code, e.message) for e in exc.value.errors]


def _trace(**kw):
    config = {k: kw.pop(k) for k in list(kw) if k in TraceConfig.__dataclass_fields__}
    return lambda: engine.trace(TraceConfig(**{"d_model": 8, "num_heads": 2, **config}), **kw)


def _decode(**kw):
    return lambda: engine.decode(_trace(**kw)())


# (code, pointer) -> (the request's fields besides "the cat sat" at d_model 8 with 2 heads, the engine's call;
# None for a rule the service checks before the engine)
TABLE_CASES = {
    ("kv_head_division", "/num_kv_heads"): ({"num_heads": 4, "num_kv_heads": 3}, _trace(num_heads=4, num_kv_heads=3)),
    ("invalid_size", "/num_kv_heads"): ({"num_kv_heads": 0}, _trace(num_kv_heads=0)),
    ("rope_odd_d_k", "/positional_encoding"): ({"d_model": 6, "positional_encoding": "rope"},
                                               _trace(d_model=6, positional_encoding="rope")),
    ("invalid_size", "/rope_base"): ({"rope_base": 1}, _trace(rope_base=1)),
    ("invalid_size", "/rope_pairing"): ({"rope_pairing": "interleave"}, _trace(rope_pairing="interleave")),
    ("invalid_size", "/window"): ({"causal": True, "window": 0}, _trace(causal=True, window=0)),
    ("window_needs_causal", "/window"): ({"window": 2}, _trace(window=2)),
    ("cross_attention_causal", "/causal"): ({"context_sentence": CONTEXT, "causal": True},
                                            _trace(causal=True, sentence=SENTENCE, context_sentence=CONTEXT)),
    ("cross_attention_rope", "/positional_encoding"): (
        {"context_sentence": CONTEXT, "positional_encoding": "rope"},
        _trace(positional_encoding="rope", sentence=SENTENCE, context_sentence=CONTEXT)),
    ("context_input_without_context", "/context_input"): (
        {"context_input": X2}, _trace(sentence=SENTENCE, context_input=np.zeros((2, 8)))),
    ("explicit_input_pair", "/context_input"): (
        {"context_sentence": CONTEXT, "input": X3},
        _trace(sentence=SENTENCE, context_sentence=CONTEXT, input=np.zeros((3, 8)))),
    ("explicit_input_pair", "/input"): (
        {"context_sentence": CONTEXT, "context_input": X2},
        _trace(sentence=SENTENCE, context_sentence=CONTEXT, context_input=np.zeros((2, 8)))),
    ("context_sentence_xor_tokens", ""): ({"context_sentence": CONTEXT, "context_tokens": ["le"]},
                                          _trace(sentence=SENTENCE, context_sentence=CONTEXT, context_tokens=["le"])),
    ("empty_sentence", "/context_sentence"): ({"context_sentence": ""}, _trace(sentence=SENTENCE, context_sentence="")),
    ("empty_tokens", "/context_tokens"): ({"context_tokens": []}, _trace(sentence=SENTENCE, context_tokens=[])),
    ("blank_token", "/context_tokens/<i>"): ({"context_tokens": ["le", " "]},
                                             _trace(sentence=SENTENCE, context_tokens=["le", " "])),
    ("too_many_tokens", "/context_sentence"): ({"context_sentence": "x " * 257},
                                               _trace(sentence=SENTENCE, context_sentence="x " * 257)),
    ("too_many_tokens", "/context_tokens"): ({"context_tokens": ["x"] * 257},
                                             _trace(sentence=SENTENCE, context_tokens=["x"] * 257)),
    ("bad_character", "/context_sentence"): ({"context_sentence": "le\u0000chat"}, None),
    ("bad_character", "/context_tokens"): ({"context_tokens": ["le\u0000"]}, None),
    ("decode_needs_causal", "/decode"): ({"decode": True}, _decode(sentence=SENTENCE)),
    ("decode_cross_attention", "/decode"): ({"decode": True, "context_sentence": CONTEXT},
                                            _decode(sentence=SENTENCE, context_sentence=CONTEXT)),
    ("decode_with_bug", "/decode"): ({"decode": True, "causal": True, "inject_bug": "no_scale"},
                                     _decode(sentence=SENTENCE, causal=True, bug="no_scale")),
}


def _documented_rows() -> set[tuple[str, str]]:
    """(code, pointer) of every row of docs/engine.md's "Errors of the variants", each field its own."""
    from conftest import ROOT

    text = (ROOT / "docs" / "engine.md").read_text(encoding="utf-8")
    table = text.split("### Errors of the variants", 1)[1].split("\n\n", 2)[1]
    rows = set()
    for line in table.splitlines()[2:]:
        rule, cls, code, fields = [c.strip() for c in line.strip("|").split("|")]
        pointers = ["/" + f for f in re.findall(r"`([^`]+)`", fields)] or [""]
        rows |= {(code.strip("`"), p) for p in pointers}
    return rows


def test_the_table_lists_exactly_the_cases_tested_here():
    assert _documented_rows() == set(TABLE_CASES)


@pytest.mark.parametrize("code, pointer", list(TABLE_CASES))
def test_each_rule_of_the_table_answers_its_type_the_same_over_http_and_in_the_engine(client, code, pointer):
    # num_kv_heads 0 answered greater_than_equal, rope_base 1 greater_than, an unknown rope_pairing
    # literal_error, window 0 greater_than_equal, where the table promises invalid_size.
    fields, call = TABLE_CASES[(code, pointer)]
    body = {"sentence": SENTENCE, "d_model": 8, "num_heads": 2, **fields}
    errors = _errors(client, body)
    assert len(errors) == 1, errors
    got = errors[0]
    assert got["type"] == code and re.fullmatch(pointer.replace("<i>", r"\d+"), got["pointer"]), got
    if call is not None:
        assert _engine(call) == [(got["pointer"], got["type"], got["message"])]


KV_HEADS = "num_kv_heads must be a positive integer (or null for num_heads),"


@pytest.mark.parametrize("fields, pointer, message", [
    ({"num_kv_heads": True}, "/num_kv_heads", f"{KV_HEADS} got True"),
    ({"num_kv_heads": "2"}, "/num_kv_heads", f"{KV_HEADS} got '2'"),
    ({"num_kv_heads": 2.0}, "/num_kv_heads", f"{KV_HEADS} got 2.0"),
    ({"window": True, "causal": True}, "/window",
     "window must be a positive integer (how many keys a query sees, its own included) or null, got True"),
    ({"rope_base": 1e13}, "/rope_base", "rope_base must be a finite number greater than 1 and at most 1e+12 (10000 in "
                                        "RoFormer and Llama 2, 500000 in Llama 3), got 10000000000000.0"),
    ({"rope_base": "x" * 100}, "/rope_base", "rope_base must be a finite number greater than 1 and at most 1e+12 "
     "(10000 in RoFormer and Llama 2, 500000 in Llama 3), got '" + "x" * 63 + "…"),
    ({"rope_pairing": None}, "/rope_pairing", 'rope_pairing must be "rotate_half" or "interleaved", got None'),
])
def test_a_wrong_type_in_a_variants_field_is_invalid_size_too(client, fields, pointer, message):
    assert _errors(client, {"sentence": "a", **fields}) == [{"pointer": pointer, "type": "invalid_size",
                                                             "message": message}]


@pytest.mark.parametrize("literal, shown", [(b"1e400", "inf"), (b"NaN", "nan"), (b"-Infinity", "-inf"),
                                            (b"1" + b"0" * 400, "an integer of 401 digits")])
def test_rope_base_beyond_float64_is_invalid_size(client, literal, shown):
    resp = client.post("/trace", data=b'{"sentence": "a", "rope_base": ' + literal + b"}",
                       content_type="application/json")
    assert resp.status_code == 422
    assert resp.get_json()["errors"] == [{"pointer": "/rope_base", "type": "invalid_size", "message": (
        "rope_base must be a finite number greater than 1 and at most 1e+12 (10000 in RoFormer and Llama 2, "
        f"500000 in Llama 3), got {shown}")}]


# ----------------------------------------------------------- rope_base and rope_pairing without RoPE


@pytest.mark.parametrize("encoding", ["sinusoidal", "none"])
def test_rope_settings_are_checked_with_any_encoding_and_change_nothing_without_rope(client, encoding):
    body = {"sentence": SENTENCE, "d_model": 8, "num_heads": 2, "positional_encoding": encoding}
    for fields, pointer in (({"rope_base": 0.5}, "/rope_base"), ({"rope_pairing": "halves"}, "/rope_pairing")):
        (err,) = _errors(client, {**body, **fields})
        assert err["pointer"] == pointer and err["type"] == "invalid_size"
        assert (err["pointer"], err["type"], err["message"]) == _engine(
            lambda: TraceConfig(d_model=8, num_heads=2, positional_encoding=encoding, **fields))[0]
    plain = client.post("/trace", json=body).get_data()
    with_rope_settings = client.post("/trace", json={**body, "rope_base": 500000, "rope_pairing": "interleaved"})
    assert with_rope_settings.get_data() == plain  # not a number changes, and config does not echo them


# ----------------------------------------------------------------------- every conflict at once


@pytest.mark.parametrize("fields, expected", [
    ({"context_sentence": CONTEXT, "causal": True, "positional_encoding": "rope"},
     [("/causal", "cross_attention_causal"), ("/positional_encoding", "cross_attention_rope")]),
    ({"context_sentence": CONTEXT, "window": 2, "positional_encoding": "rope", "d_model": 6},
     [("/positional_encoding", "rope_odd_d_k"), ("/window", "window_needs_causal"),
      ("/positional_encoding", "cross_attention_rope")]),
    ({"context_sentence": CONTEXT, "causal": True, "decode": True, "inject_bug": "no_scale"},
     [("/causal", "cross_attention_causal"), ("/decode", "decode_cross_attention"), ("/decode", "decode_with_bug")]),
    ({"context_input": X2, "window": 3}, [("/window", "window_needs_causal"),
                                          ("/context_input", "context_input_without_context")]),
    ({"decode": True, "inject_bug": "no_scale"}, [("/decode", "decode_needs_causal"), ("/decode", "decode_with_bug")]),
    ({"parameters_layout": "torch", "num_kv_heads": 1}, [("/parameters_layout", "layout_needs_parameters"),
                                                          ("/parameters_layout", "layout_needs_all_kv_heads")]),
    ({"stages": ["weights", "masked_scores", "k_rotated", "context_input"]},
     [("/stages", "stage_needs_context"), ("/stages", "stage_needs_rope"), ("/stages", "stage_needs_causal")]),
])
def test_every_variant_conflict_is_reported_not_only_the_first(client, fields, expected):
    # cross-attention + causal + RoPE reported only cross_attention_causal.
    errors = _errors(client, {"sentence": SENTENCE, "d_model": 8, "num_heads": 2, **fields})
    assert [(e["pointer"], e["type"]) for e in errors] == expected
    detail = client.post("/trace", json={"sentence": SENTENCE, "d_model": 8, "num_heads": 2, **fields}).get_json()
    assert detail["detail"].startswith(f"{errors[0]['pointer']}: {errors[0]['message']}")


def test_the_engine_reports_the_conflicts_it_can_see_together_with_the_same_words(client):
    cross = {"context_sentence": CONTEXT, "causal": True, "positional_encoding": "rope"}
    http = [(e["pointer"], e["type"], e["message"])
            for e in _errors(client, {"sentence": SENTENCE, "d_model": 8, "num_heads": 2, **cross})]
    assert _engine(_trace(sentence=SENTENCE, **cross)) == http
    own = {"window": 2, "positional_encoding": "rope", "d_model": 6}
    http = [(e["pointer"], e["type"], e["message"])
            for e in _errors(client, {"sentence": SENTENCE, "num_heads": 2, **own})]
    assert _engine(lambda: TraceConfig(num_heads=2, **own)) == http
    decode = {"decode": True, "inject_bug": "no_scale"}
    http = [(e["pointer"], e["type"], e["message"])
            for e in _errors(client, {"sentence": SENTENCE, "d_model": 8, "num_heads": 2, **decode})]
    t = engine.trace(TraceConfig(d_model=8, num_heads=2), sentence=SENTENCE)
    assert _engine(lambda: engine.decode(engine.recompute(t, engine.BUGS["no_scale"]))) == http


def test_a_batch_item_lists_every_conflict_under_its_pointer(client):
    body = {"sentence": SENTENCE, "d_model": 8, "num_heads": 2, "context_sentence": CONTEXT, "causal": True,
            "positional_encoding": "rope"}
    item = client.post("/trace/batch", json={"items": [body]}).get_json()["results"][0]
    assert [e["pointer"] for e in item["problem"]["errors"]] == ["/items/0/causal", "/items/0/positional_encoding"]


# ------------------------------------------------------------- stages that your own input skips


@pytest.mark.parametrize("stage", ["token_embedding", "positional_encoding"])
def test_stages_asks_for_a_stage_an_explicit_input_skips_and_gets_the_422_not_nothing(client, stage):
    # /trace answered 200 without the stage (and with "stages": [] in config) when input was given.
    body = {"sentence": SENTENCE, "d_model": 8, "num_heads": 2, "input": X3, "stages": [stage, "weights"]}
    (err,) = _errors(client, body)
    assert err == {"pointer": "/stages", "type": "stage_not_computed", "message": (
        f"{stage} is not computed when you give your own input: x is taken as given, not made from embeddings "
        "and positional encodings; drop it from stages")}
    # /check says the same of the same stage, at the stage's own pointer
    (check,) = _errors(client, {**{k: v for k, v in body.items() if k != "stages"},
                                "submission": {stage: [[0.0] * 8] * 3}}, path="/check")
    assert check == {**err, "pointer": f"/submission/{stage}",
                     "message": err["message"].replace("from stages", "from submission")}
    # as RoPE does for the positional encoding it never adds
    rope = _errors(client, {"sentence": SENTENCE, "d_model": 8, "num_heads": 2, "positional_encoding": "rope",
                            "stages": ["positional_encoding"]})
    assert [(e["pointer"], e["type"]) for e in rope] == [("/stages", "stage_not_computed")]
    # the stages it computes are still there
    doc = client.post("/trace", json={**body, "stages": ["input", "weights"]}).get_json()
    assert list(doc["stages"]) == ["input", "weights"] and doc["stages"]["input"]["values"] == X3


def test_cross_attention_with_both_inputs_refuses_the_context_stages_it_skips(client):
    body = {"sentence": SENTENCE, "d_model": 8, "num_heads": 2, "context_sentence": CONTEXT, "input": X3,
            "context_input": X2, "stages": ["context_token_embedding", "context_input"]}
    (err,) = _errors(client, body)
    assert err["type"] == "stage_not_computed" and err["message"].startswith(
        "context_token_embedding is not computed when you give your own context_input")


# ------------------------------------------------------------------ a decoding step's k


def test_a_decoding_steps_k_is_the_unrotated_key_and_the_cache_holds_k_rotated(client, spec):
    # openapi.yaml said k was "appended to the key cache (rotated first under RoPE)".
    described = spec["components"]["schemas"]["DecodeStepOut"]["properties"]
    assert "unrotated" in described["k"]["description"] and "rotated first" not in described["k"]["description"]
    assert "appended to the key cache" in described["k_rotated"]["description"]
    doc = client.post("/trace", json={"sentence": SENTENCE, "d_model": 8, "num_heads": 2, "causal": True,
                                      "positional_encoding": "rope", "decode": True}).get_json()
    k, k_rotated = (np.array(doc["stages"][s]["values"]) for s in ("k", "k_rotated"))
    for step in doc["decode"]:
        t = step["position"]
        np.testing.assert_allclose(step["k"], k[:, t], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(step["k_rotated"], k_rotated[:, t], rtol=1e-12, atol=1e-15)
        np.testing.assert_array_equal(np.array(step["k_cache"])[:, -1], step["k_rotated"])
        if t:  # position 0 turns by 0: only later keys tell the two apart
            assert not np.allclose(step["k"], step["k_rotated"])
    plain = client.post("/trace", json={"sentence": SENTENCE, "d_model": 8, "num_heads": 2, "causal": True,
                                        "decode": True}).get_json()
    for step in plain["decode"]:
        assert step["k_rotated"] is None and step["q_rotated"] is None
        np.testing.assert_array_equal(np.array(step["k_cache"])[:, -1], step["k"])


# ---------------------------------------------------------------- the size limit and decoding


def test_the_size_limit_counts_the_decoding_steps_and_says_so(app_factory):
    client = app_factory(max_trace_values=20_000).test_client()
    body = {"tokens": ["a"] * 16, "d_model": 32, "num_heads": 4, "causal": True}
    trace_only = engine.layer.trace_value_count(TraceConfig(d_model=32, num_heads=4, causal=True), 16,
                                                with_parameters=False)
    decoding = engine.decoding.decode_value_count(TraceConfig(d_model=32, num_heads=4, causal=True), 16)
    assert trace_only <= 20_000 < trace_only + decoding
    assert client.post("/trace", json=body).status_code == 200
    (err,) = _errors(client, {**body, "decode": True})
    assert err == {"pointer": "", "type": "trace_too_large", "message": (
        f"this trace would return {trace_only + decoding} numbers (16 tokens, d_model 32, 4 heads; {decoding} of "
        "them in the decoding steps), above the limit of 20000; use fewer tokens, a smaller d_model or fewer "
        "heads, or drop decode")}
    # stages filters what is returned, not what is counted: the limit bounds the work
    (err,) = _errors(client, {**body, "decode": True, "stages": ["weights"]})
    assert err["type"] == "trace_too_large"


def test_stages_does_not_filter_decoding_and_precision_rounds_it(client):
    doc = client.post("/trace", json={"sentence": SENTENCE, "d_model": 8, "num_heads": 2, "causal": True,
                                      "decode": True, "stages": ["weights"], "precision": 3}).get_json()
    assert list(doc["stages"]) == ["weights"] and len(doc["decode"]) == 3
    step = doc["decode"][2]
    assert list(step) == ["position", "token", "cache_positions", "q", "k", "v", "q_rotated", "k_rotated",
                          "k_cache", "v_cache", "scores", "scaled_scores", "weights", "context", "output"]
    assert (step["position"], step["token"], step["q_rotated"], step["k_rotated"]) == (2, "sat", None, None)
    assert all(round(w, 3) == w for row in step["weights"] for w in row)


def test_the_cache_keeps_the_last_window_positions_oldest_first(client):
    doc = client.post("/trace", json={"sentence": "the cat sat on the mat", "d_model": 8, "num_heads": 2,
                                      "causal": True, "window": 2, "decode": True}).get_json()
    assert [s["cache_positions"] for s in doc["decode"]] == [[0], [0, 1], [1, 2], [2, 3], [3, 4], [4, 5]]
    k = np.array(doc["stages"]["k"]["values"])
    for s in doc["decode"]:  # row i of the cache is position cache_positions[i], not slot t mod window
        np.testing.assert_allclose(np.array(s["k_cache"]), k[:, s["cache_positions"]], rtol=1e-12, atol=1e-15)


# ------------------------------------------------------------------ the documented check values


def test_the_check_values_docs_engine_md_gives_for_layouts_gqa_and_config_echoes(client):
    from conftest import ROOT

    doc = (ROOT / "docs" / "engine.md").read_text(encoding="utf-8")

    def trace(**body):
        resp = client.post("/trace", json={"sentence": SENTENCE, **body})
        assert resp.status_code == 200, resp.get_json()
        return resp.get_json()

    torch_doc = trace(d_model=24, num_heads=4, include_parameters=True, parameters_layout="torch")
    per_head = trace(d_model=24, num_heads=4, include_parameters=True)
    stacked, p = np.array(torch_doc["parameters"]["in_proj_weight"]), per_head["parameters"]
    assert stacked.shape == (72, 24) and np.array_equal(np.array(torch_doc["parameters"]["out_proj.weight"]), p["W_O"])
    for row, (name, head) in ((0, ("W_Q", 0)), (6, ("W_Q", 1)), (24, ("W_K", 0))):
        value = p[name][head][0][0]
        assert stacked[row][0] == value and f"`{value!r}`" in doc
    assert np.array_equal(stacked, np.concatenate([np.array(p[n]).reshape(-1, 24) for n in ("W_Q", "W_K", "W_V")]))
    assert torch_doc["parameters_digest"] == per_head["parameters_digest"]
    assert torch_doc["config"]["parameters_layout"] == "torch" and "parameters_layout" not in per_head["config"]

    gqa = trace(d_model=8, num_heads=4, num_kv_heads=2)
    assert f"`{gqa['parameters_digest']}`" in doc and gqa["stages"]["k"]["axes"] == ["kv_head", "token", "d_k"]
    same = trace(d_model=8, num_heads=2, num_kv_heads=2)
    assert same["parameters_digest"] == trace(d_model=8, num_heads=2)["parameters_digest"]
    assert f"`{same['parameters_digest']}`" in doc and same["stages"]["k"]["axes"] == ["head", "token", "d_k"]
    assert (same["config"]["num_kv_heads"], same["config"]["query_heads_of_kv_head"],
            same["config"]["kv_cache_bytes_per_token"]) == (2, [[0], [1]], {"float16": 32, "float32": 64,
                                                                              "float64": 128})
    cross = trace(d_model=8, num_heads=2, context_sentence=CONTEXT)
    assert list(cross["stages"])[:9] == ["tokens", "token_embedding", "positional_encoding", "input",
                                         "context_tokens", "context_token_embedding", "context_positional_encoding",
                                         "context_input", "q"]
    assert [cross["stages"][s]["step"] for s in list(cross["stages"])[4:8]] == [1, 2, 3, 4]
    assert cross["stages"]["context_input"]["axis_tokens"] == ["context_tokens", None]
