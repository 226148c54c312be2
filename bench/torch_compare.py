"""The attention core against PyTorch's ``nn.MultiheadAttention``, same shapes, same weights.

The engine's W_Q/W_K/W_V are [h, d_k, d_model]; stacking the heads gives
[h·d_k, d_model] = [d_model, d_model] each, and torch's ``in_proj_weight`` is
those three stacked, [3·d_model, d_model] (torch splits the projected width
into heads in the same contiguous order). W_O [d_model, h·d_k] is
``out_proj.weight``. bias=False, float64, batch_first, batch of one, and
``need_weights=True, average_attn_weights=False`` so torch returns every head's
weights as the engine does. torch always scales by 1/√d_k, so the engine is
run with scale on and no mask.

torch is a benchmark-only dependency (bench/requirements.txt); where it is not
installed the column is skipped with a message.
"""

from __future__ import annotations

from typing import Any

import numpy as np

TOLERANCE = 1e-12

_torch: Any = None
_why_not: str | None = None


def load() -> tuple[Any, str | None]:
    """(torch module or None, reason it is unavailable)."""
    global _torch, _why_not
    if _torch is None and _why_not is None:
        try:
            import torch

            torch.set_num_threads(1)
            try:
                torch.set_num_interop_threads(1)
            except RuntimeError:  # already set, or parallel work already started
                pass
            _torch = torch
        except ImportError as e:
            _why_not = (f"torch is not installed ({e}); install the benchmark pins with "
                        "`.venv/bin/pip install -r bench/requirements.txt` to get this column")
    return _torch, _why_not


def version() -> str:
    torch, why = load()
    if torch is None:
        return "not installed"
    blas = "MKL" if torch.backends.mkl.is_available() else "no MKL"
    return f"{torch.__version__} ({blas}, {torch.get_num_threads()} thread)"


class TorchMHA:
    """torch's multi-head attention loaded with the engine's weights."""

    def __init__(self, params: Any) -> None:
        torch, why = load()
        if torch is None:
            raise RuntimeError(why)
        self.torch = torch
        h, d_k, d_model = params.W_Q.shape
        m = torch.nn.MultiheadAttention(d_model, h, bias=False, batch_first=True, dtype=torch.float64)
        m.eval()
        in_proj = np.concatenate([params.W_Q.reshape(h * d_k, d_model),
                                  params.W_K.reshape(h * d_k, d_model),
                                  params.W_V.reshape(h * d_k, d_model)])  # [3·d_model, d_model]
        with torch.no_grad():
            m.in_proj_weight.copy_(torch.from_numpy(in_proj))
            m.out_proj.weight.copy_(torch.from_numpy(np.array(params.W_O)))
        self.module = m

    def prepare(self, x: np.ndarray) -> Any:
        return self.torch.from_numpy(np.ascontiguousarray(x))[None]  # [1, n, d_model]

    def __call__(self, xt: Any) -> tuple[Any, Any]:
        with self.torch.inference_mode():
            return self.module(xt, xt, xt, need_weights=True, average_attn_weights=False)

    def check(self, x: np.ndarray, core: dict[str, np.ndarray]) -> tuple[float, float]:
        """Max |difference| of output and weights against the engine's; raises above TOLERANCE."""
        out, weights = self(self.prepare(x))
        d_out = float(np.max(np.abs(out[0].numpy() - core["output"])))
        d_w = float(np.max(np.abs(weights[0].numpy() - core["weights"])))
        if not (d_out <= TOLERANCE and d_w <= TOLERANCE):
            raise AssertionError(f"torch and the engine disagree: output by {d_out:.3g}, weights by {d_w:.3g} "
                                 f"(tolerance {TOLERANCE:g})")
        return d_out, d_w


def load_gpt2_block(block: Any, p: Any, d_model: int, tensor: Any) -> None:
    """Copy one engine layer's weights (``engine.params.LayerParameters``) into transformers' ``GPT2Block``:
    its Conv1D layers keep their weight as [in, out], the transpose of torch.nn.Linear's, and every bias is 0
    (the engine has none). ``tensor`` turns a numpy array into a float64 tensor. The block reference test
    (tests/test_block_torch.py) and the block benchmark (bench/block_bench.py) both load it this way."""
    import torch

    a = p.attention
    with torch.no_grad():
        block.attn.c_attn.weight.copy_(tensor(np.concatenate([W.reshape(-1, d_model) for W in (a.W_Q, a.W_K, a.W_V)]).T))
        block.attn.c_proj.weight.copy_(tensor(a.W_O.T))
        block.mlp.c_fc.weight.copy_(tensor(p.W_1.T))
        block.mlp.c_proj.weight.copy_(tensor(p.W_2.T))
        for conv in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj):
            conv.bias.zero_()
        for ln, w in ((block.ln_1, p.norm1), (block.ln_2, p.norm2)):
            ln.weight.copy_(tensor(w.gamma))
            ln.bias.copy_(tensor(w.beta))
