"""An independent, deliberately naive reference for the engine (test helper, not a test).

Everything here is written the way the 'the cat sat' walkthrough's JavaScript is:
plain Python lists, ``for`` loops, ``math`` and ``hashlib``. Nothing is
imported from ``engine``; numpy is not used either, so agreement with the
engine cannot come from sharing a helper, a broadcasting rule or a BLAS call.

* ``reference_parameters`` / ``reference_embedding`` re-derive the seeded
  numbers from the algorithm in ``engine/params.py``'s docstring alone, to
  show the documentation is precise enough to port to another language.
* ``reference_positional_encoding`` is the sinusoidal table, loop by loop.
* ``reference_attention`` is multi-head self-attention: per head, per query,
  a dot product with each key, divide, stable softmax, weighted sum of values;
  then per token concat the heads and multiply by W_O. The variants are
  written from their papers, not from the engine's code:

  - RoPE (Su et al., "RoFormer", 2021, eq. 34): each pair of coordinates is
    multiplied by the 2×2 rotation matrix of angle m·θᵢ, θᵢ = base^(−2i/d),
    at position m; the pairs are (2i, 2i+1) in RoFormer ("interleaved") and
    (i, i + d/2) in GPT-NeoX and Llama ("rotate_half");
  - grouped-query attention (Ainslie et al., "GQA", 2023): the h query
    heads form g groups of h/g consecutive heads, group j sharing K/V head j;
  - the sliding window (Beltagy et al., "Longformer", 2020; Jiang et al.,
    "Mistral 7B", 2023): query i sees keys i − w + 1 … i;
  - cross-attention (Vaswani et al., 2017, §3.2.3): queries from the
    decoder's sequence, keys and values from the encoder's (here: the context).

Shapes follow the engine's conventions: ``W_Q[i]`` is ``[d_k][d_model]`` (so
``q = x·W_Qᵢᵀ``) and ``W_O`` is ``[d_model][h·d_k]`` (so ``out = concat·W_Oᵀ``).
"""

from __future__ import annotations

import hashlib
import math

Matrix = list[list[float]]

# ---------------------------------------------------------------------------
# Seeded numbers, from the documented algorithm (engine/params.py docstring)
# ---------------------------------------------------------------------------

KEY_PREFIX = "attention-trace:v1"
TWO_53 = 2**53


def reference_stream_key(kind: str, *, seed: int, d_model: int, num_heads: int | None = None,
                         head: int | None = None, text: str | None = None, num_kv_heads: int | None = None) -> str:
    """Step 1: ``attention-trace:v1:<kind>:seed=..:d_model=..[:num_heads=..[:num_kv_heads=..]:head=..][:text=..]``."""
    key = f"{KEY_PREFIX}:{kind}:seed={seed}:d_model={d_model}"
    if num_heads is not None:
        key += f":num_heads={num_heads}"
    if num_kv_heads is not None:
        key += f":num_kv_heads={num_kv_heads}"  # W_K and W_V only, and only when it differs from num_heads
    if head is not None:
        key += f":head={head}"  # heads are numbered from 0 (the docstring does not say; see report)
    if text is not None:
        key += f":text={text}"
    return key


def reference_uniform(key: str, count: int) -> list[float]:
    """Steps 2–3: SHAKE-256 bytes -> little-endian u64 -> top 53 bits -> exact float on (−1, 1)."""
    raw = hashlib.shake_256(key.encode("utf-8", "surrogatepass")).digest(8 * count)
    out = []
    for i in range(count):
        r = int.from_bytes(raw[8 * i: 8 * i + 8], "little")
        b = r >> 11
        # Python int / int is correctly rounded; here it is exact (|numerator| < 2^53, divisor 2^53).
        out.append((2 * b + 1 - TWO_53) / TWO_53)
    return out


def reference_values(key: str, count: int, var: float) -> list[float]:
    """Step 4: value = z · sqrt(3·var), one correctly rounded multiply per value."""
    factor = math.sqrt(3 * var)
    return [z * factor for z in reference_uniform(key, count)]


def reference_embedding(seed: int, d_model: int, text: str) -> list[float]:
    """A token's embedding: var = 1/2, key uses seed, d_model and text."""
    return reference_values(reference_stream_key("embedding", seed=seed, d_model=d_model, text=text), d_model, 0.5)


def _rows(flat: list[float], n_rows: int, n_cols: int) -> Matrix:
    """Step 5: fill row-major (C order)."""
    return [flat[r * n_cols:(r + 1) * n_cols] for r in range(n_rows)]


def reference_parameters(seed: int, d_model: int, num_heads: int, num_kv_heads: int | None = None) -> dict[str, list]:
    """W_Q as h × [d_k][d_model], W_K/W_V as g × [d_k][d_model], W_O as [d_model][h·d_k], var = 1/d_model."""
    d_k = d_model // num_heads
    var = 1 / d_model
    g = num_heads if num_kv_heads is None else num_kv_heads
    kv_key = None if g == num_heads else g
    params: dict[str, list] = {}
    for kind, count, extra in (("W_Q", num_heads, None), ("W_K", g, kv_key), ("W_V", g, kv_key)):
        params[kind] = [
            _rows(reference_values(reference_stream_key(kind, seed=seed, d_model=d_model, num_heads=num_heads,
                                                        num_kv_heads=extra, head=i),
                                   d_k * d_model, var), d_k, d_model)
            for i in range(count)
        ]
    params["W_O"] = _rows(
        reference_values(reference_stream_key("W_O", seed=seed, d_model=d_model, num_heads=num_heads),
                         d_model * num_heads * d_k, var),
        d_model, num_heads * d_k,
    )
    return params


# ---------------------------------------------------------------------------
# Positional encoding
# ---------------------------------------------------------------------------

def reference_positional_encoding(n: int, d_model: int) -> Matrix:
    """PE[pos][j]: sin on even j, cos on odd j, angle pos / 10000^(2·⌊j/2⌋ / d_model).

    An odd d_model ends on a sin column whose partner cos column does not exist.
    """
    table = []
    for pos in range(n):
        row = []
        for j in range(d_model):
            angle = pos / 10000.0 ** ((2 * (j // 2)) / d_model)
            row.append(math.sin(angle) if j % 2 == 0 else math.cos(angle))
        table.append(row)
    return table


# ---------------------------------------------------------------------------
# Attention, the way the seed's JavaScript computes it
# ---------------------------------------------------------------------------

def dot(a: list[float], b: list[float]) -> float:
    s = 0.0
    for ai, bi in zip(a, b, strict=True):
        s += ai * bi
    return s


def mat_vec(W: Matrix, x: list[float]) -> list[float]:
    """W · x, i.e. the row vector x · Wᵀ."""
    return [dot(row, x) for row in W]


def reference_softmax(scores: list[float], masked: list[bool] | None = None) -> list[float]:
    """Stable softmax: subtract the row max (over unmasked keys); masked keys get exactly 0."""
    masked = masked or [False] * len(scores)
    m = max(s for s, off in zip(scores, masked) if not off)
    e = [0.0 if off else math.exp(s - m) for s, off in zip(scores, masked)]
    total = 0.0
    for ej in e:
        total += ej
    return [ej / total for ej in e]


def reference_rope(rows: Matrix, base: float, pairing: str) -> Matrix:
    """Rotate row m (position m) of one head's [n][d] queries or keys, pair by pair (RoFormer eq. 34).

    Pair i (i < d/2) is (2i, 2i+1) when ``pairing`` is "interleaved" and
    (i, i + d/2) when it is "rotate_half"; both turn by the angle m·θᵢ with
    θᵢ = base^(−2i/d), through the 2×2 matrix [[cos, −sin], [sin, cos]].
    """
    out = []
    for m, row in enumerate(rows):
        d = len(row)
        new = [0.0] * d
        for i in range(d // 2):
            a, b = (2 * i, 2 * i + 1) if pairing == "interleaved" else (i, i + d // 2)
            angle = m * base ** (-2 * i / d)
            c, s = math.cos(angle), math.sin(angle)
            new[a] = c * row[a] - s * row[b]
            new[b] = s * row[a] + c * row[b]
        out.append(new)
    return out


def reference_attention(x: Matrix, params: dict[str, list], *, scale: bool, causal: bool, window: int | None = None,
                        context: Matrix | None = None, rope: tuple[float, str] | None = None) -> dict[str, list]:
    """Every stage from q/k/v to output, for input rows ``x`` ([n][d_model]).

    ``context`` ([m][d_model]): cross-attention, keys and values from these rows.
    ``window``: with ``causal``, query i sees keys i − window + 1 … i only.
    ``rope``: (base, pairing), q and k rotated by their positions before the scores.
    W_K and W_V may have fewer heads than W_Q (grouped-query attention).
    """
    keys_x = x if context is None else context
    n, m = len(x), len(keys_x)
    h = len(params["W_Q"])
    g = len(params["W_K"])
    group = h // g  # query heads per K/V head
    d_k = len(params["W_Q"][0])
    divisor = math.sqrt(d_k) if scale else 1.0
    out: dict[str, list] = {k: [] for k in ("q", "k", "v", "q_rotated", "k_rotated", "scores", "scaled_scores",
                                            "masked_scores", "mask", "weights", "context")}
    for j in range(g):  # the K/V heads
        K = [mat_vec(params["W_K"][j], xt) for xt in keys_x]
        out["k"].append(K)
        out["v"].append([mat_vec(params["W_V"][j], xt) for xt in keys_x])
        if rope is not None:
            out["k_rotated"].append(reference_rope(K, *rope))
    for i in range(h):
        Q = [mat_vec(params["W_Q"][i], xt) for xt in x]
        out["q"].append(Q)
        if rope is not None:
            out["q_rotated"].append(reference_rope(Q, *rope))
            Q = out["q_rotated"][i]
        j = i // group  # this query head's K/V head
        K = out["k_rotated"][j] if rope is not None else out["k"][j]
        V = out["v"][j]
        raw_h, scaled_h, masked_h, mask_h, w_h, ctx_h = [], [], [], [], [], []
        for qi in range(n):
            raw = [dot(Q[qi], K[kj]) for kj in range(m)]
            scaled = [s / divisor for s in raw]
            mask = [causal and (kj > qi or (window is not None and qi - kj >= window)) for kj in range(m)]
            w = reference_softmax(scaled, mask)
            ctx = []
            for d in range(d_k):
                acc = 0.0
                for kj in range(m):
                    acc += w[kj] * V[kj][d]
                ctx.append(acc)
            raw_h.append(raw)
            scaled_h.append(scaled)
            masked_h.append([0.0 if off else s for s, off in zip(scaled, mask)])
            mask_h.append(mask)
            w_h.append(w)
            ctx_h.append(ctx)
        for name, val in (("scores", raw_h), ("scaled_scores", scaled_h), ("masked_scores", masked_h),
                          ("mask", mask_h), ("weights", w_h), ("context", ctx_h)):
            out[name].append(val)
    if rope is None:
        del out["q_rotated"], out["k_rotated"]
    # Per token: lay the heads side by side, then mix them with W_O.
    out["concat"] = [[c for i in range(h) for c in out["context"][i][t]] for t in range(n)]
    out["output"] = [mat_vec(params["W_O"], row) for row in out["concat"]]
    out["entropy"] = [[-sum(w * math.log(w) for w in row if w > 0) for row in head] for head in out["weights"]]
    out["max_weight"] = [[max(row) for row in head] for head in out["weights"]]
    return out


def _embed(texts: list[str], *, seed: int, d_model: int,
           positional_encoding: str) -> tuple[Matrix, Matrix | None, Matrix]:
    """E, PE (None under RoPE: nothing is added) and x for one token list, positions from 0."""
    n = len(texts)
    E = [reference_embedding(seed, d_model, t) for t in texts]
    if positional_encoding == "rope":
        return E, None, [list(row) for row in E]
    PE = reference_positional_encoding(n, d_model) if positional_encoding == "sinusoidal" else \
        [[0.0] * d_model for _ in range(n)]
    x = [[e + p for e, p in zip(er, pr)] for er, pr in zip(E, PE)]
    return E, PE, x


def reference_trace(texts: list[str], *, d_model: int, num_heads: int, seed: int, scale: bool, causal: bool,
                    positional_encoding: str, num_kv_heads: int | None = None, window: int | None = None,
                    rope_base: float = 10000.0, rope_pairing: str = "rotate_half",
                    context_texts: list[str] | None = None) -> dict[str, list]:
    """The full generated pipeline for pre-split tokens: embedding, PE, input, then attention.

    ``context_texts``: cross-attention; the context gets its own embeddings and
    its own positions 0 … m − 1 under the same encoding.
    """
    E, PE, x = _embed(texts, seed=seed, d_model=d_model, positional_encoding=positional_encoding)
    out: dict[str, list] = {"token_embedding": E, "input": x}
    if PE is not None:
        out["positional_encoding"] = PE
    context = None
    if context_texts is not None:
        E_c, PE_c, context = _embed(context_texts, seed=seed, d_model=d_model, positional_encoding=positional_encoding)
        out.update(context_token_embedding=E_c, context_positional_encoding=PE_c, context_input=context)
    rope = (rope_base, rope_pairing) if positional_encoding == "rope" else None
    stages = reference_attention(x, reference_parameters(seed, d_model, num_heads, num_kv_heads), scale=scale,
                                 causal=causal, window=window, context=context, rope=rope)
    return {**out, **stages}
