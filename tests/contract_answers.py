"""Real answers of every JSON endpoint, the variants and every kind of problem: what the contract tests
(tests/test_openapi.py, tests/test_openapi_typescript.py) hold openapi.yaml's response schemas against."""

from __future__ import annotations


def answers(client) -> list[tuple[str, str, str, int, str, object]]:
    """(name, path, method, status, media type, body) of real answers, at least one per JSON endpoint
    and every kind of problem; each is also validated against openapi.yaml by the client."""
    base = {"sentence": "the cat sat", "d_model": 8, "num_heads": 2}
    out = []

    def post(name, path, body, status=200, **kw):
        resp = client.post(path, json=body, **kw) if body is not None else client.post(path, **kw)
        assert resp.status_code == status, (name, resp.get_data(as_text=True)[:500])
        out.append((name, path, "post", status, resp.mimetype, resp.get_json()))
        return resp.get_json()

    def get(name, path, status=200):
        resp = client.get(path)
        assert resp.status_code == status, name
        out.append((name, path, "get", status, resp.mimetype, resp.get_json()))

    post("trace", "/trace", base)
    post("trace, causal, parameters, rounded", "/trace", {**base, "causal": True, "include_parameters": True,
                                                          "precision": 4, "stages": ["weights", "masked_scores"]})
    post("trace, torch layout", "/trace", {**base, "include_parameters": True, "parameters_layout": "torch"})
    post("trace, variants", "/trace", {**base, "d_model": 16, "num_heads": 4, "num_kv_heads": 2, "causal": True,
                                       "window": 2, "positional_encoding": "rope", "decode": True})
    post("trace, decode", "/trace", {**base, "causal": True, "decode": True})
    post("trace, cross-attention", "/trace", {**base, "context_sentence": "le chat"})
    post("trace, injected bug", "/trace", {**base, "inject_bug": "no_scale"})
    post("trace, constructed heads", "/trace", {"sentence": "the cat sat", "d_model": 32, "num_heads": 2,
                                                "head_weights": ["previous_token", "seeded"], "sharpness": 5.0})
    ref = post("trace, reference for check", "/trace", {**base, "causal": True})
    stages = {sid: st["values"] for sid, st in ref["stages"].items()}
    post("check, passed", "/check", {**base, "causal": True, "submission": stages})
    wrong = post("trace, wrong", "/trace", {**base, "causal": True, "inject_bug": "no_scale"})
    post("check, a known bug", "/check", {**base, "causal": True, "submission": {
        sid: wrong["stages"][sid]["values"] for sid in ("scaled_scores", "weights")}})
    post("check, hints and NaN", "/check", {**base, "submission": {"weights": [[[0.5, 0.5, 0.5]] * 3] * 2,
                                                                   "scores": [[["NaN", 1, 2]] * 3] * 2}})
    post("check, wrong shape and tokens", "/check", {**base, "submission": {"tokens": ["the", "dog"],
                                                                            "weights": [[1.0]]}})
    post("check, rel_error", "/check", {**base, "metric": "rel_error", "submission": {"tokens": ["the", "cat", "sat"]}})
    post("trace batch", "/trace/batch", {"items": [base, {"sentence": ""}]})
    post("check batch", "/check/batch", {"items": [{**base, "submission": {"tokens": ["the", "cat", "sat"]}},
                                                   {"sentence": "a"}]})
    post("explain", "/explain", {**base, "head": 1, "query": 2, "key": 0})
    post("explain, variants", "/explain", {**base, "d_model": 16, "num_heads": 4, "num_kv_heads": 2, "causal": True,
                                           "positional_encoding": "rope", "decode": True, "head": 3, "query": 2,
                                           "key": 1})
    post("explain, masked cell", "/explain", {**base, "causal": True, "head": 0, "query": 0, "key": 2})
    for fmt in ("bertviz", "circuitsvis", "transformer-explainer"):
        post(f"export {fmt}", "/export", {**base, "causal": True, "format": fmt})
    post("export bertviz, cross-attention", "/export", {**base, "context_sentence": "le chat", "format": "bertviz"})
    post("check, cross-attention", "/check", {**base, "context_sentence": "le chat", "submission": {
        "context_tokens": ["le", "chien"], "weights": [[[0.5, 0.5]] * 3] * 2}})
    post("explain, cross-attention", "/explain", {**base, "context_sentence": "le chat", "head": 0, "query": 1,
                                                  "key": 1})
    post("export, injected bug", "/export", {**base, "causal": True, "inject_bug": "no_scale",
                                             "format": "transformer-explainer"})
    post("trace, stack of blocks", "/trace", {**base, "block": "gpt2", "num_layers": 2, "include_parameters": True,
                                              "norm_weights": "seeded"})
    post("trace, llama stack", "/trace", {**base, "block": "llama", "num_kv_heads": 1, "d_ff": 16,
                                          "include_parameters": True})
    post("trace, a block without a preset", "/trace", {**base, "norm": "rms_norm", "include_parameters": True,
                                                       "stages": ["weights", "norm1"]})
    post("trace, language-model head, sampled", "/trace", {**base, "block": "gpt2", "lm_head": "tied",
                                                            "candidates": ["dog"], "temperature": 0.7, "generate": 2,
                                                            "top_k": 3, "top_p": 0.9, "sample_seed": 1})
    post("trace, language-model head, greedy", "/trace", {**base, "block": "gpt2", "lm_head": "seeded",
                                                           "generate": 1})
    post("explain, a logit", "/explain", {**base, "block": "gpt2", "lm_head": "tied", "cell": "logit", "token": 2,
                                           "column": 1})
    post("trace, interventions with a patch", "/trace", {**base, "block": "gpt2", "num_layers": 2, "lm_head": "tied",
                                                         "stages": ["next_token_probs"], "patch_sentence": "a dog ran",
                                                         "interventions": [
                                                             {"target": "head_output", "layer": 0, "head": 1},
                                                             {"target": "mlp_output", "layer": 1, "kind": "patch",
                                                              "positions": [2]}]})
    post("trace, an intervention in one layer", "/trace", {**base, "interventions": [
        {"target": "head_pattern", "layer": 0, "head": 0, "kind": "mean"}], "stages": ["weights"]})
    stack = post("trace, reference stack", "/trace", {**base, "block": "gpt2", "stages": ["norm1", "weights"]})
    post("check, a stack's stages", "/check", {**base, "block": "gpt2", "submission": {
        "norm1": stack["stages"]["norm1"]["values"], "weights": [[[[0.5] * 3] * 3] * 2]}})
    post("explain, a stack's layer", "/explain", {**base, "block": "gpt2", "num_layers": 2, "layer": 1, "head": 0,
                                                  "query": 2, "key": 1})
    post("explain, a LayerNorm value", "/explain", {**base, "block": "gpt2", "num_layers": 2, "cell": "norm2",
                                                    "layer": 1, "token": 2, "feature": 3})
    post("explain, the final RMSNorm", "/explain", {**base, "block": "llama", "d_ff": 16, "cell": "final_norm",
                                                    "token": 0, "feature": 1})
    post("explain, a SwiGLU unit", "/explain", {**base, "block": "llama", "d_ff": 16, "cell": "ffn", "token": 1,
                                                "unit": 2})
    post("explain, a ReLU unit", "/explain", {**base, "block": "vaswani2017", "cell": "ffn", "token": 1, "unit": 2})
    post("export bertviz, a stack", "/export", {**base, "block": "gpt2", "num_layers": 2, "format": "bertviz"})
    get("health", "/health")
    get("version", "/version")
    post("422", "/trace", {"sentence": "a", "num_heads": 5}, status=422)
    post("400", "/trace", None, status=400, data=b"{", content_type="application/json")
    post("415", "/trace", None, status=415, data=b"{}", content_type="text/plain")
    post("413", "/trace", None, status=413, data=b" " * (4 * 2**20 + 1), content_type="application/json")
    get("404", "/nope", status=404)
    get("405", "/trace", status=405)
    return out
