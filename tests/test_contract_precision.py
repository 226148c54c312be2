"""Where the documents and the service must say the same thing: the context's characters, the variants'
error types (one case per row of docs/engine.md's table), every conflict at once, the stages an
explicit input skips, and the decoding step's k.

Each test here failed before the behaviour (or the document) it checks was fixed.
"""

from __future__ import annotations

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
