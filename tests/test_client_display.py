"""The client's results in a notebook: a short repr, the command line's text for print(), a trace drawn inline as the
viewer's offline page (``_repr_html_``), and the weights subscriptable like the stages, in either layout.

In process (LocalClient), no server and no Jupyter: tests/test_standalone.py opens ``_repr_html_``'s output in
Chromium.
"""

from __future__ import annotations

import contextlib
import html
import io
import json
import re

import numpy as np
import pytest

from attention_trace import LocalClient, Parameters, Trace
from attention_trace.cli import main, render_check, render_walkthrough
from attention_trace.explain_cli import render_explanation
from viewer.offline_page import comparison_request, render_html

BODY = {"sentence": "the cat sat on the mat", "d_model": 24, "num_heads": 4, "causal": True}


@pytest.fixture(scope="module")
def local() -> LocalClient:
    return LocalClient()


def cli_stdout(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(argv)) in (0, 1)
    return out.getvalue()


def test_a_trace_has_a_one_line_repr_and_prints_the_command_lines_table(local):
    t = local.trace(BODY)
    text = repr(t)
    assert text == ("<Trace of 'the cat sat on the mat': 6 tokens, d_model 24, 4 heads of d_k 6, seed 0, causal, "
                    f"{len(t.stages)} stages>")
    assert "\n" not in text and len(text) < 200 and "array(" not in text
    # print(t) is `attention-trace "the cat sat on the mat" --heads 4 --causal`, character for character.
    assert str(t) == render_walkthrough(t, 1, range(4), sentence=BODY["sentence"])
    assert str(t) + "\n" == cli_stdout("trace", BODY["sentence"], "--heads", "4", "--causal", "--color", "never")
    # A trace of some stages only has no table: its repr.
    partial = local.trace(BODY, stages=["tokens", "weights"])
    assert str(partial) == repr(partial)
    assert repr(local.trace(tokens=["a", "b"], d_model=8, num_heads=2, scale=False)) == \
        "<Trace of 'a b': 2 tokens, d_model 8, 2 heads of d_k 4, seed 0, not scaled, 13 stages>"


def test_an_explanation_and_a_check_print_as_the_command_line_does(local):
    e = local.explain(BODY, head=2, query=5, key=1)
    assert repr(e) == (f"<Explanation of head 2, query 5 'mat' → key 1 'cat': weight {e.step('weight')['value']:.4f} "
                       f"({100 * e.step('weight')['value']:.2f}%)>")
    assert str(e) == render_explanation(e)
    masked = local.explain(BODY, head=0, query=1, key=3)
    assert repr(masked) == "<Explanation of head 0, query 1 'cat' → key 3 'on': masked>"
    assert "masked" in str(masked).splitlines()[1]

    t = local.trace(BODY)
    good = local.check(BODY, submission={"weights": t.array("weights")})
    assert repr(good) == "<CheckResult: passed, 1 stage checked>"
    wrong = local.check(BODY, submission={"scaled_scores": t.array("scores")})
    assert repr(wrong).startswith("<CheckResult: not passed; first wrong stage 'scaled_scores' (step 7)")
    assert str(wrong) == render_check(wrong, "the submission")
    assert "Result:" in str(wrong) and "not passed" in str(wrong)


def test_the_parameters_are_subscriptable_in_either_layout(local):
    t = local.trace(BODY, include_parameters=True)
    p = t.parameters
    assert list(p) == ["W_Q", "W_K", "W_V", "W_O"] and "W_O" in p
    assert p["W_Q"] is p.W_Q and p["W_Q"].shape == (4, 6, 24) and p["W_O"].shape == (24, 24)
    with pytest.raises(KeyError, match="no parameter 'W_X'; the parameters are W_Q, W_K, W_V, W_O"):
        p["W_X"]
    # parameters_layout "torch" (torch.nn.MultiheadAttention's state_dict): read, and split back into heads.
    torch = local.trace(BODY, include_parameters=True, parameters_layout="torch")
    q = torch.parameters
    assert q.layout == "torch" and list(q) == ["W_Q", "W_K", "W_V", "W_O", "in_proj_weight", "out_proj.weight"]
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        assert np.array_equal(q[name], p[name]), name
    assert q["in_proj_weight"].shape == (72, 24)
    assert np.array_equal(q["in_proj_weight"][24:48], p.W_K.reshape(24, 24))
    assert np.array_equal(q["out_proj.weight"], p.W_O)
    again = Trace.from_json(torch.raw).parameters  # from JSON alone, as a file would be read
    assert again.layout == "torch" and all(np.array_equal(again[k], q[k]) for k in q)
    assert Parameters(p.W_Q, p.W_K, p.W_V, p.W_O)["W_V"] is p.W_V  # the four arrays, positionally, as before


def test_a_trace_draws_itself_as_the_viewers_offline_page(local, client):
    t = local.trace(BODY)
    output = t._repr_html_()
    m = re.fullmatch(r'<iframe srcdoc="([^"]*)" sandbox="allow-scripts allow-downloads" '
                     r'title="attention-trace: &#x27;the cat sat on the mat&#x27;" loading="lazy" style="[^"]*"></iframe>',
                     output)
    assert m, output[:300]
    # The page inside is the service's offline page of this trace, for the request as sent.
    assert html.unescape(m.group(1)) == t.html() == render_html(t.raw, BODY)
    # With the comparison trace, it is POST /trace/html's file, byte for byte.
    alt = local.trace(comparison_request(BODY))
    route = client.post("/trace/html", data=json.dumps(BODY), content_type="application/json")  # BODY's key order
    assert t.html(comparison=alt).encode("utf-8") == route.data
    # A trace of some stages only cannot be drawn: Jupyter then shows the text repr.
    assert local.trace(BODY, stages=["weights"])._repr_html_() is None


def test_a_trace_read_from_json_draws_itself_too(local):
    t = local.trace(BODY)
    again = Trace.from_json(t.raw)  # no request known: one that asks for the same, from the tokens and config
    assert again.request is None
    body = again.request_body()
    assert body == {"tokens": t.texts, "d_model": 24, "num_heads": 4, "seed": 0, "scale": True, "causal": True,
                    "positional_encoding": "sinusoidal"}
    assert local.trace(body).raw["stages"] == t.raw["stages"]
    assert again._repr_html_().startswith("<iframe srcdoc=")
    cross = local.trace(sentence="the cat", context_tokens=["le", "chat"], d_model=8, num_heads=2)
    assert Trace.from_json(cross.raw).request_body()["context_tokens"] == ["le", "chat"]
    rope = local.trace(sentence="the cat", d_model=8, num_heads=2, positional_encoding="rope", causal=True, window=1)
    assert {k: v for k, v in Trace.from_json(rope.raw).request_body().items() if k.startswith(("rope", "window"))} == \
        {"rope_base": 10000, "rope_pairing": "rotate_half", "window": 1}
