"""A stack of Transformer blocks from the command line and the Python client: --block, --layers and the single
block options reach the service, the table shows the chosen layer's attention (numbers checked against the trace),
--explain and explain take --layer, --html writes a stack's page, and --url answers as in process. The client
passes the fields through and reads a stack's answers (config, parameters, explanations)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from attention_trace import LocalClient
from attention_trace.client import Trace
from attention_trace.cli import main
from conftest import Gunicorn

SENTENCE = "the cat sat on"
SMALL = ["--d-model", "8", "--heads", "2"]


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def trace_json(capsys, *args: str) -> dict:
    code, out, err = run(capsys, SENTENCE, *SMALL, *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("args, expected", [
    (["--block", "llama", "--kv-heads", "1", "--d-ff", "16", "--layers", "2"],
     {"block": "llama", "num_layers": 2, "norm": "rms_norm", "norm_position": "pre", "ffn": "swiglu", "d_ff": 16,
      "causal": True, "positional_encoding": "rope", "norm_eps": 1e-6}),
    (["--norm", "rms_norm", "--norm-position", "pre", "--ffn", "gelu", "--d-ff", "12", "--norm-eps", "0.001",
      "--norm-weights", "seeded", "--layers", "3"],
     {"block": None, "num_layers": 3, "norm": "rms_norm", "norm_position": "pre", "ffn": "gelu", "d_ff": 12,
      "norm_eps": 0.001, "norm_weights": "seeded", "causal": False}),
    (["--block", "gpt2", "--ffn", "relu"], {"block": "gpt2", "num_layers": 1, "ffn": "relu", "causal": True}),
], ids=["llama", "every-option", "override"])
def test_each_block_option_reaches_the_request(capsys, args, expected):
    doc = trace_json(capsys, *args)
    assert {k: doc["config"][k] for k in expected} == expected
    assert "residual_stream" in doc["stages"] and doc["stages"]["weights"]["axes"][0] == "layer"


def test_the_table_shows_the_chosen_layers_attention(capsys):
    args = ["--block", "gpt2", "--layers", "3"]
    doc = trace_json(capsys, *args)
    weights = np.array(doc["stages"]["weights"]["values"])  # [layer, head, query, key]
    scores = np.array(doc["stages"]["scores"]["values"])
    for layer in (0, 2):
        code, out, err = run(capsys, SENTENCE, *SMALL, *args, "--layer", str(layer), "--head", "1", "--query", "3",
                             "--layout", "table")
        assert code == 0, err
        assert f"3 pre-norm blocks (gpt2: layer_norm, gelu_tanh, d_ff 32), layer {layer}'s attention" in out
        rows = [line.split() for line in out.splitlines() if re.match(r"^\s+\d+\s", line)]
        assert [r[1] for r in rows] == ["the", "cat", "sat", "on"]
        got_scores = [float(r[2]) for r in rows]
        got_weights = [float(r[-1].rstrip("%")) / 100 for r in rows]
        assert np.allclose(got_scores, scores[layer, 1, 3], atol=5e-4)
        assert np.allclose(got_weights, weights[layer, 1, 3], atol=5e-4)
    assert not np.allclose(weights[0, 1, 3], weights[2, 1, 3], atol=5e-3)  # the layers differ, so the check bites


def test_a_causal_preset_shows_the_mask_without_causal(capsys):
    code, out, err = run(capsys, "the cat sat", *SMALL, "--block", "llama", "--d-ff", "16")
    assert code == 0, err
    assert "Mask (causal)" in out and "masked" in out and "RoPE" in out


def test_explain_takes_the_layer(capsys):
    body = ["--block", "gpt2", "--layers", "2"]
    doc = trace_json(capsys, *body)
    code, out, err = run(capsys, "explain", SENTENCE, "on,cat", *SMALL, *body, "--layer", "1", "--head", "1",
                         "--json")
    assert code == 0, err
    e = json.loads(out)
    weight = next(s for s in e["steps"] if s["id"] == "weight")
    assert e["layer"] == 1 and weight["value"] == doc["stages"]["weights"]["values"][1][1][3][1]
    code, out, err = run(capsys, SENTENCE, *SMALL, *body, "--explain", "on,cat", "--layer", "1", "--head", "1")
    assert code == 0, err
    assert "layer 1 of 2" in out


@pytest.mark.parametrize("args, needle", [
    (["--layers", "2"], "--layers (/num_layers)"),
    (["--block", "gpt2", "--d-ff", "0"], "--d-ff (/d_ff)"),
    (["--norm-eps", "2"], "--norm-eps (/norm_eps)"),
    (["--block", "gpt2", "--layers", "2", "--layer", "2"], "--layer 2: the trace has 2 layers (0 to 1)"),
    (["--layer", "1"], "--layer 1: the trace has 1 layer (0 to 0)"),
])
def test_block_errors_exit_2_naming_the_option(capsys, args, needle):
    code, out, err = run(capsys, SENTENCE, *SMALL, *args)
    assert code == 2 and needle in err and "Traceback" not in err


def test_usage_refuses_an_unknown_preset(capsys):
    with pytest.raises(SystemExit) as e:
        main([SENTENCE, "--block", "bert"])
    assert e.value.code == 2 and "invalid choice: 'bert'" in capsys.readouterr().err


def test_html_writes_a_stacks_page(capsys, tmp_path):
    path = tmp_path / "stack.html"
    code, out, err = run(capsys, SENTENCE, *SMALL, "--block", "gpt2", "--layers", "2", "--html", str(path))
    assert code == 0, err
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") or page.lower().startswith("<!doctype html>")
    assert '"num_layers":2' in page and "residual_stream" in page and "final_norm_variance" in page


def test_export_and_html_subcommands_take_the_block_options(capsys, tmp_path):
    code, out, err = run(capsys, "export", SENTENCE, "bertviz", *SMALL, "--block", "gpt2", "--layers", "3")
    assert code == 0, err
    assert len(json.loads(out)["data"]["attention"]) == 3
    code, out, err = run(capsys, "html", SENTENCE, str(tmp_path / "p.html"), *SMALL, "--norm", "rms_norm")
    assert code == 0, err
    assert '"norm":"rms_norm"' in (tmp_path / "p.html").read_text(encoding="utf-8")


# ---------------------------------------------------------------- the client


def test_the_client_passes_the_block_fields_and_reads_a_stack():
    with LocalClient() as client:
        t = client.trace(sentence=SENTENCE, d_model=8, num_heads=2, block="llama", num_kv_heads=1, d_ff=16,
                         num_layers=2, include_parameters=True)
        assert t.config.stack and t.config.num_layers == 2 and t.config.ffn == "swiglu" and t.config.d_ff == 16
        assert t.array("weights").shape == (2, 2, 4, 4) and t.stats.entropy.shape == (2, 2, 4)
        assert t.parameters["W_3"].shape == (2, 16, 8) and t.parameters["W_Q"].shape == (2, 2, 4, 8)
        assert "W_1" in t.parameters and t.parameters["final_norm_gamma"].shape == (8,)
        # a trace read from its JSON alone asks for the same stack (from the resolved settings in its config)
        body = Trace.from_json(t.raw).request_body()
        assert {k: body[k] for k in ("num_layers", "block", "norm", "ffn", "d_ff")} == {
            "num_layers": 2, "block": "llama", "norm": "rms_norm", "ffn": "swiglu", "d_ff": 16}
        again = client.trace(body | {"include_parameters": True})
        assert again.parameters_digest == t.parameters_digest
        assert np.array_equal(again.array("ffn_gated"), t.array("ffn_gated"))
        plain = client.trace(sentence=SENTENCE, d_model=8, num_heads=2)
        assert not plain.config.stack and plain.config.num_layers == 1 and plain.config.norm is None

        e = client.explain(SENTENCE, head=1, query=3, key=0, d_model=8, num_heads=2, block="gpt2", num_layers=2,
                           layer=1)
        assert e.layer == 1 and "layer 1 of 2" in str(e)
        norm = client.explain_norm(SENTENCE, cell="norm2", layer=1, token=2, feature=3, d_model=8, num_heads=2,
                                   block="gpt2", num_layers=2)
        ref = client.trace(sentence=SENTENCE, d_model=8, num_heads=2, block="gpt2", num_layers=2)
        assert norm["steps"][-1]["value"] == ref.array("norm2")[1, 2, 3]
        ffn = client.explain_ffn(SENTENCE, token=2, unit=5, layer=0, d_model=8, num_heads=2, block="gpt2",
                                 num_layers=2)
        assert next(s for s in ffn["steps"] if s["id"] == "activation")["value"] == ref.array("ffn_activation")[0, 2, 5]


# ---------------------------------------------------------------- over HTTP


@pytest.mark.integration
def test_url_answers_a_stack_as_in_process(capsys, gunicorn_server: Gunicorn):
    args = [SENTENCE, *SMALL, "--block", "gpt2", "--layers", "2", "--layer", "1", "--query", "on"]
    code, local, err = run(capsys, *args)
    assert code == 0, err
    code, remote, err = run(capsys, *args, "--url", gunicorn_server.url)
    assert code == 0, err
    assert remote == local
    code, out, err = run(capsys, *args[:-4], "--json", "--url", gunicorn_server.url)
    assert code == 0, err
    assert json.loads(out)["config"]["num_layers"] == 2
