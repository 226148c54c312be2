"""/check summarises, it does not echo: whatever a submission holds, its answer stays small.

A 3.2 MB submission of tokens answered 7.0 MB: the token stage's message (repeated in the overall
message) listed every expected and every received token. Now the answer names how many differ and
the first one, cut to 64 characters, and is at most ANSWER_MAX_BYTES for any body, so a body of
a megabyte or more gets an answer far below 1.2 times its own size.
"""

from __future__ import annotations

import orjson
import pytest

SMALL = {"sentence": "the cat sat", "d_model": 8, "num_heads": 2}
#: the largest /check answer: one entry per stage (at most 19), the config, the diagnosis and its hints
ANSWER_MAX_BYTES = 64 * 1024


def _bodies():
    yield "400 000 tokens", {**SMALL, "submission": {"tokens": [f"token{i}" for i in range(400_000)]}}
    yield "one 3 MB token", {**SMALL, "submission": {"tokens": ["the", "x" * 3_000_000, "sat"]}}
    yield "400 000 context tokens", {**SMALL, "context_sentence": "le chat",
                                     "submission": {"context_tokens": [f"t{i}" for i in range(400_000)]}}
    yield "a wrong shape of 500 000 values", {**SMALL, "submission": {"weights": [[0.5] * 1000] * 500}}
    yield "a ragged stage", {**SMALL, "submission": {"scores": [[[1.0] * 3] * 3, [[1.0] * 300_000]]}}
    yield "NaN everywhere", {**SMALL, "d_model": 64, "num_heads": 8, "tokens": [f"w{i}" for i in range(200)],
                             "sentence": None, "submission": {"scores": [[["NaN"] * 200] * 200] * 8}}
    long = "y" * 1024  # the longest token the request may hold
    yield "every stage wrong, long tokens", {"tokens": [long] * 256, "d_model": 8, "num_heads": 2, "submission": {
        "tokens": [long[:-1] + "z"] * 256, "weights": [[[0.0] * 256] * 256] * 2, "output": [[1.0] * 8] * 256}}


@pytest.mark.parametrize("name, body", list(_bodies()), ids=[name for name, _ in _bodies()])
def test_a_check_answer_never_grows_with_its_submission(client, name, body):
    body = {k: v for k, v in body.items() if v is not None}
    raw = orjson.dumps(body)
    assert len(raw) >= 1_000_000, name
    resp = client.post("/check", data=raw, content_type="application/json")
    assert resp.status_code == 200, resp.get_data(as_text=True)[:300]
    answer = resp.get_data()
    assert len(answer) <= ANSWER_MAX_BYTES and len(answer) < 0.01 * len(raw), (name, len(answer), len(raw))


def test_a_batch_answer_does_not_echo_either(client):
    item = {**SMALL, "submission": {"tokens": [f"token{i}" for i in range(200_000)]}}
    raw = orjson.dumps({"items": [item, item]})
    answer = client.post("/check/batch", data=raw, content_type="application/json").get_data()
    assert len(answer) <= 2 * ANSWER_MAX_BYTES and len(answer) < 0.01 * len(raw)


def test_the_token_stage_says_how_many_differ_and_which_first(client):
    doc = client.post("/check", json={**SMALL, "submission": {"tokens": ["the", "dog", "ran", "far"]}}).get_json()
    entry = doc["stages"]["tokens"]
    assert entry["message"] == "the tokens differ: 2 of 3 differ, the first at index 1: expected 'cat', got 'dog'; " \
                               "expected 3 tokens, got 4"
    assert entry["first_mismatch"] == {"index": [1], "expected": "cat", "received": "dog"}
    assert (entry["mismatches"], entry["received_shape"], entry["shape_ok"]) == (3, [4], False)
    long = "z" * 100
    doc = client.post("/check", json={**SMALL, "submission": {"tokens": ["the", long, "sat"]}}).get_json()
    entry = doc["stages"]["tokens"]
    assert entry["first_mismatch"]["received"] == "z" * 64 + "…"
    assert entry["message"] == f"the tokens differ: 1 of 3 differ, the first at index 1: expected 'cat', got " \
                               f"'{'z' * 64}…'"
    doc = client.post("/check", json={**SMALL, "submission": {"tokens": ["the", "cat"]}}).get_json()
    assert doc["stages"]["tokens"]["message"] == "the tokens differ: expected 3 tokens, got 2"
    assert doc["stages"]["tokens"]["first_mismatch"] is None
    doc = client.post("/check", json={**SMALL, "submission": {"tokens": ["the", "cat", "sat"]}}).get_json()
    assert doc["stages"]["tokens"]["message"] == "the tokens match"
