"""Constructed heads: attention heads with a known job, their weights written by hand in closed form.

A trace's heads are ``seeded`` (random weights from SHAKE-256, ``engine.params``) unless ``TraceConfig.head_weights``
names a job for them, as tracr compiles a program into weights:

* ``previous_token``: each query attends to the token before it;
* ``same_token``: each query attends to the earlier occurrences of its own token;
* ``first_token``: every query attends to position 0 (an attention sink);
* ``induction``: two layers. Layer 0's head is a previous-token head that writes "my previous token" into the
  residual stream; layer 1's matches the query's token against it, so on "A B … A" the last A attends to the B
  after the first A, and the head's output copies B's embedding. A query with no earlier copy of its token
  attends to the first token (an attention sink), as trained induction heads do.

Why a layout. The seeded input x = E + PE mixes token and position in every coordinate, with the same
magnitude: a linear head on it sees both, and the cross terms are as large as the signal (measured:
previous-token ≥ 0.9 on under 11 % of queries, same-token never; docs/engine.md, "Constructed heads"). So a
trace with a constructed head lays x out as tracr does, the residual stream split into named subspaces
(``Layout``), each written by one thing:

    x = [ token (t) | previous token (t), previous parity (1): induction only | 0 | position code (2·P) | 1 ]

* token: the seeded embedding of width t (the stream of a d_model = t trace), scaled to unit length;
* position code: pairs ε_f·(sin(ω_f·pos), cos(ω_f·pos)) with ω_f = π/2^f, f < P = 8 (a sinusoidal encoding
  whose frequencies halve, like the bits of pos), so K(δ) = PE(p)·PE(p + δ) = Σ_f cos(π·δ/2^f) is P at δ = 0
  and at most P − 2 for every other |δ| < 2^P = 256. The signs ε_f (``SIGNS``) change no dot product; they keep
  the code's coordinate sum small at every position (0 at position 0, |·| ≤ 7.2), so that a LayerNorm divides
  every position by about the same σ;
* 0: a coordinate left empty, which every constructed row reads with minus the row's sum, so that a
  LayerNorm's centring (a stack's norms) leaves every constructed score unchanged;
* 1: a constant coordinate, the bias a query reads when it asks for a fixed position;
* previous parity (induction only): empty in x; layer 0 copies the previous token's parity (−1)^(j − 1), the code's
  fastest cos coordinate, there. Beside the token's own parity (−1)^j it sums to 0 at every position but the first,
  where there is no previous token and layer 0 copies position 0's own: 2. Layer 1 reads the sum as its attention
  sink, which a linear head could not otherwise tell apart from the rest of the code.

Under RoPE nothing is added to x: x = [ token | 0 | 1 ], and a previous-token head is the rotation's own
construction (``rope_previous_token_head``); the other kinds need the code and are refused.

Seeded heads of the same trace keep their seeded weights and read that x. Seeded requests never get here:
their input and weights are engine 1.0's, bit for bit.

Every matrix below is [d_k, d_model] (W_Q, W_K, W_V of one head) or the head's [d_model, d_k] block of W_O.
``gain`` is sharpness × the divisor of stage 7 (√d_k, or 1 without scaling), so the scaled scores are
sharpness × the closed form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .errors import EngineError, InvalidSizeError, VariantConflictError
from .params import (
    BlockParameters,
    LayerParameters,
    Parameters,
    generate_parameters,
    parameters_digest,
    token_embedding_vector,
)

SEEDED = "seeded"
HEAD_KINDS: tuple[str, ...] = (SEEDED, "previous_token", "same_token", "first_token", "induction")
#: pairs of the position code: positions 0 … 2^P − 1 are told apart (P = 8: the engine's default 256 tokens)
POSITION_PAIRS = 8
#: how many coordinates of the token subspace a token-matching head must read at least (below it seeded
#: embeddings are too far from orthogonal to tell tokens apart)
MIN_MATCH_DIMS = 12
#: a token match (a cosine, 1 for the same token) counts this many times a unit of the position code (K/2),
#: so that it outweighs the position term's spread (P − 1 units) in a same-token head
TOKEN_GAIN = 4.0 * POSITION_PAIRS
DEFAULT_SHARPNESS = 10.0
#: an induction head's score for the first token (the sink), in units of a token match: between no match (0) and
#: a match (1), a little above half way, since an unmatched query's other keys score the difference of two
#: cosines of unrelated unit vectors (about N(0, 2/t)) and a matched key only one (N(0, 1/t))
SINK = 0.6
#: below this token width the induction head's subtraction of the key's own token is scaled down by c = t/SINK_WIDTH
#: and its sink by c² (``sink_scale``): unrelated tokens' cosines (about N(0, 1/t)) are then too wide for a sink to
#: hold, and the subtraction doubles the noise every match must beat (measured at d_model 64, t = 22: in full the
#: last A of "… A B … A" found B on 186 of 200 sentences, scaled on 199–200; docs/engine.md, "Measured")
SINK_WIDTH = 48
#: the position code's fastest cos coordinate, (−1)^pos (pair 0: ω_0 = π, ε_0 = +1), a token's parity
PARITY = 1
#: the smallest RoPE margin (rope_margin) a previous-token head is built on: below it the scores would be huge
#: differences of huge numbers
MIN_ROPE_MARGIN = 1e-3
SHARPNESS_MAX = 1000.0


# ------------------------------------------------------------------ the layout of x


@dataclass(frozen=True)
class Layout:
    """Where each named subspace of x lives (column ranges of d_model)."""

    d_model: int
    t: int  # width of the token subspace (and of the previous-token one)
    previous: bool  # whether there is a previous-token subspace (a trace with an induction head)
    #: under RoPE, (rope_pairing, rope_base): no position code in x, the rotation carries position
    rope: tuple[str, float] | None = None

    @property
    def code_width(self) -> int:
        """Coordinates of the position code: 2·P, none under RoPE."""
        return 0 if self.rope else 2 * POSITION_PAIRS

    @property
    def token(self) -> slice:
        return slice(0, self.t)

    @property
    def previous_token(self) -> slice:
        return slice(self.t, 2 * self.t)

    @property
    def previous_parity(self) -> int:
        """Where layer 0 of an induction head writes the previous token's parity (induction only)."""
        return 2 * self.t

    @property
    def zero(self) -> int:
        """A coordinate x leaves at 0: each constructed row reads it with minus the row's sum, so a row adds
        nothing for a constant vector, and LayerNorm's centring (x − μ·1) changes no score."""
        return self.d_model - 2 - self.code_width

    @property
    def position(self) -> slice:
        return slice(self.d_model - 1 - self.code_width, self.d_model - 1)

    @property
    def one(self) -> int:
        return self.d_model - 1


def layout(d_model: int, kinds: tuple[str, ...], rope: tuple[str, float] | None = None) -> Layout:
    """The layout of a trace whose heads are ``kinds``: the position code and the 1 at the end, the rest shared
    by the token subspace and, with an induction head, the previous-token subspace.

    t is as wide as fits, but no wider than every head can read whole (d_k, or d_k − 2P beside a same-token
    head's position coordinates): then a token match is a cosine of unit vectors, exactly 1 for the same token."""
    previous = "induction" in kinds
    free = (d_model - (0 if rope else 2 * POSITION_PAIRS) - 2 - previous) // (2 if previous else 1)
    d_k = d_model // len(kinds)
    readable = min([d_k] + [d_k - _POSITION_ROWS[k] for k in kinds if k in _POSITION_ROWS])
    return Layout(d_model, max(min(free, readable), 0), previous, rope)


#: coordinates a token-matching head spends on position beside its token match (see same_token_head and
#: induction_match_head): the rest of d_k reads the token subspace
_POSITION_ROWS = {"same_token": 2 * POSITION_PAIRS, "induction": POSITION_PAIRS}


#: each pair's sign in the position code: of the patterns whose coordinate sum is 0 at position 0, one whose
#: largest sum in size over positions 0 … 255 is smallest (7.2; unsigned it is 8 at position 0, −5.5 … 7.1 elsewhere)
SIGNS = np.array([1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 1.0, -1.0])


def omegas() -> np.ndarray:
    """The position code's frequencies ω_f = π/2^f, f < P."""
    return math.pi / 2.0 ** np.arange(POSITION_PAIRS)  # [P]


def position_kernel(delta: np.ndarray) -> NDArray[np.float64]:
    """K(δ) = PE(p)·PE(p + δ) = Σ_f cos(π·δ/2^f): P at δ = 0, at most P − 2 for 0 < |δ| < 2^P."""
    d = np.asarray(delta, dtype=np.float64)[..., None]  # [..., 1]
    kernel: NDArray[np.float64] = np.cos(d * omegas()).sum(axis=-1)  # [..., P] -> [...]
    return kernel


def position_code(n: int) -> np.ndarray:
    """ε_f·(sin(ω_f·pos), cos(ω_f·pos)) for f < P, interleaved, positions 0 … n − 1."""
    pos = np.arange(n)[:, None]  # [n, 1]
    period = 2 ** (np.arange(POSITION_PAIRS) + 1)  # [P]: ω_f·pos repeats every 2^(f+1) positions
    angle = np.mod(pos, period) * omegas()  # [n, P], reduced exactly first so large pos loses no bits
    code = np.empty((n, 2 * POSITION_PAIRS))  # [n, 2P]
    code[:, 0::2], code[:, 1::2] = SIGNS * np.sin(angle), SIGNS * np.cos(angle)
    return code


def layout_token_embeddings(seed: int, lay: Layout, texts: list[str]) -> np.ndarray:
    """Stage 2 in the layout: each token's seeded vector of width t, at unit length, in the token subspace (under
    RoPE, where nothing is added to x, with the constant 1 too)."""
    out = np.zeros((len(texts), lay.d_model))  # [n, d_model]
    for i, text in enumerate(texts):  # per token: the seeded vectors are cached
        e = token_embedding_vector(seed, lay.t, text)  # [t]
        out[i, lay.token] = e / np.linalg.norm(e)
    if lay.rope:
        out[:, lay.one] = 1.0
    return out


def layout_positional_encoding(n: int, lay: Layout) -> np.ndarray:
    """Stage 3 in the layout: the position code in its subspace, and the constant 1."""
    out = np.zeros((n, lay.d_model))  # [n, d_model]
    out[:, lay.position] = position_code(n)  # [n, 2P]
    out[:, lay.one] = 1.0
    return out


# ------------------------------------------------------------------ one head each: (W_Q, W_K, W_V, W_O block)


def _copy_values(lay: Layout, d_k: int, into: slice) -> tuple[np.ndarray, np.ndarray]:
    """The OV circuit every constructed head has: V reads the token subspace (its first min(t, d_k)
    coordinates), W_O writes them back into ``into`` (the token subspace, or the previous-token one)."""
    m = min(lay.t, d_k)
    W_V = np.zeros((d_k, lay.d_model))  # [d_k, d_model]
    W_V[np.arange(m), np.arange(lay.token.start, lay.token.start + m)] = 1.0
    W_O = np.zeros((lay.d_model, d_k))  # [d_model, d_k]: this head's columns of W_O
    W_O[np.arange(into.start, into.start + m), np.arange(m)] = 1.0
    return W_V, W_O


def previous_token_head(lay: Layout, d_k: int, gain: float, into: slice | None = None) -> tuple[np.ndarray, ...]:
    """Scores sharpness·K(i − 1 − j)/2: key i − 1 has the query's position code turned back by one step.

    PE(p − 1) = R_f·PE(p) in each pair, R_f = [[cos ω_f, −sin ω_f], [sin ω_f, cos ω_f]] acting on (sin, cos):
    W_Q applies R_f, W_K reads the code (each with the pair's sign, undone), so qᵢ·kⱼ = PE(i − 1)·PE(j)."""
    W_Q = np.zeros((d_k, lay.d_model))  # [d_k, d_model]
    W_K = np.zeros((d_k, lay.d_model))  # [d_k, d_model]
    p0 = lay.position.start
    for f, w in enumerate(omegas()):  # one 2×2 block per frequency pair
        rows, cols = slice(2 * f, 2 * f + 2), slice(p0 + 2 * f, p0 + 2 * f + 2)
        turn = np.array([[math.cos(w), -math.sin(w)], [math.sin(w), math.cos(w)]])  # R_f
        W_Q[rows, cols] = SIGNS[f] * gain / 2.0 * turn
        W_K[rows, cols] = SIGNS[f] * np.eye(2)
    W_V, W_O = _copy_values(lay, d_k, lay.token if into is None else into)
    if into is not None:  # induction's layer 0: the previous token's parity too, into previous_parity
        m = min(lay.t, d_k)
        W_V[m, p0 + PARITY] = SIGNS[0]
        W_O[lay.previous_parity, m] = 1.0
    return W_Q, W_K, W_V, W_O


def rope_frequencies(d_k: int, base: float) -> np.ndarray:
    """RoPE's θ_p = 1/base^(2p/d_k), p < d_k/2, computed as ``engine.attention.rope_angles`` does."""
    return 1.0 / np.power(float(base), np.arange(0, d_k, 2, dtype=np.float64) / d_k)  # [d_k/2]


def rope_kernel(delta: np.ndarray, d_k: int, base: float) -> NDArray[np.float64]:
    """K(δ) = mean over the pairs of cos(δ·θ_p): 1 at δ = 0."""
    d = np.asarray(delta, dtype=np.float64)[..., None]  # [..., 1]
    kernel: NDArray[np.float64] = np.cos(d * rope_frequencies(d_k, base)).mean(axis=-1)  # [..., d_k/2] -> [...]
    return kernel


@lru_cache(maxsize=64)
def rope_margin(d_k: int, base: float) -> float:
    """1 − max K(δ) over 0 < |δ| ≤ 256: how much less than the right key any other key of a sentence of up to 256
    tokens scores, before the previous-token head divides by it."""
    return float(1.0 - rope_kernel(np.arange(1, 2**POSITION_PAIRS + 1), d_k, base).max())


def rope_previous_token_head(lay: Layout, d_k: int, gain: float) -> tuple[np.ndarray, ...]:
    """Under RoPE, scores sharpness·K(j − i + 1)/margin: the rotation's own construction.

    W_Q reads the constant 1 into the first coordinate a_p of each pair, u = (1, 0); W_K reads it as
    (cos θ_p, sin θ_p), u turned by one position. RoPE turns qᵢ by i·θ_p and kⱼ by j·θ_p, so
    qᵢ·kⱼ = Σ_p cos((j − i + 1)·θ_p): every pair at its peak for j = i − 1."""
    assert lay.rope is not None  # built under RoPE only (the layout of a RoPE trace carries it)
    pairing, base = lay.rope
    half = d_k // 2
    theta = rope_frequencies(d_k, base)  # [d_k/2]
    a = 2 * np.arange(half) if pairing == "interleaved" else np.arange(half)  # [d_k/2]: each pair's first
    b = a + 1 if pairing == "interleaved" else a + half  # and second coordinate
    W_Q = np.zeros((d_k, lay.d_model))  # [d_k, d_model]
    W_K = np.zeros((d_k, lay.d_model))  # [d_k, d_model]
    W_Q[a, lay.one] = gain / (half * rope_margin(d_k, base))
    W_K[a, lay.one], W_K[b, lay.one] = np.cos(theta), np.sin(theta)
    W_V, W_O = _copy_values(lay, d_k, lay.token)
    return W_Q, W_K, W_V, W_O


def first_token_head(lay: Layout, d_k: int, gain: float) -> tuple[np.ndarray, ...]:
    """Scores sharpness·K(j)/2: the query reads the constant 1 into P coordinates, the key the cos of each pair,
    so qᵢ·kⱼ = Σ_f cos(ω_f·j), largest at j = 0 whatever the query."""
    W_Q = np.zeros((d_k, lay.d_model))  # [d_k, d_model]
    W_K = np.zeros((d_k, lay.d_model))  # [d_k, d_model]
    f = np.arange(POSITION_PAIRS)  # [P]
    W_Q[f, lay.one] = gain / 2.0
    W_K[f, lay.position.start + 2 * f + 1] = SIGNS
    W_V, W_O = _copy_values(lay, d_k, lay.token)
    return W_Q, W_K, W_V, W_O


def same_token_head(lay: Layout, d_k: int, gain: float) -> tuple[np.ndarray, ...]:
    """Scores sharpness·(TOKEN_GAIN·Eᵢ·Eⱼ − K(i − j)/2) on m = min(t, d_k − 2P) token coordinates.

    The token term is the same for the query itself and every copy of its token; the position term takes
    one unit more from the query itself than from any other key, so the earlier copies win (under the causal
    mask; without it, every other copy)."""
    m = min(lay.t, d_k - 2 * POSITION_PAIRS)
    W_Q = np.zeros((d_k, lay.d_model))  # [d_k, d_model]
    W_K = np.zeros((d_k, lay.d_model))  # [d_k, d_model]
    tok = np.arange(m)  # [m]
    W_Q[tok, lay.token.start + tok] = gain * TOKEN_GAIN
    W_K[tok, lay.token.start + tok] = 1.0
    pos = np.arange(2 * POSITION_PAIRS)  # [2P]
    W_Q[m + pos, lay.position.start + pos] = -gain / 2.0
    W_K[m + pos, lay.position.start + pos] = 1.0
    W_V, W_O = _copy_values(lay, d_k, lay.token)
    return W_Q, W_K, W_V, W_O


def sink_scale(t: int) -> float:
    """c = min(1, t/SINK_WIDTH): how much of its own token an induction key subtracts (key 0 adds c²·SINK)."""
    return min(1.0, t / SINK_WIDTH)


def induction_match_head(lay: Layout, d_k: int, gain: float) -> tuple[np.ndarray, ...]:
    """Layer 1 of an induction head: scores sharpness·(Eᵢ·(Pⱼ − c·Eⱼ) + c²·SINK·sⱼ/2) on m = min(t, d_k − P) token
    rows and one sink row, c = ``sink_scale(t)`` (1 from t = SINK_WIDTH on).

    The match: the query's token against the key's previous token Pⱼ (written by layer 0), less the key's own token.
    Key 0 has no previous token (under the causal mask layer 0 copies its own there, P₀ = E₀), so its match is
    exactly 0, and on "A B … A" with A first, B wins over the A at position 0. The sink: sⱼ = the key's parity plus
    the parity layer 0 copied from its previous token, 2 at key 0 and 0 at every other key, read by the query's
    constant 1. A query with an earlier copy of its token finds 1 at the key after it and SINK at key 0; a query
    without one finds SINK at key 0 and only the cosines of unrelated unit vectors (about N(0, 2/t)) elsewhere.
    Below SINK_WIDTH the subtraction is scaled by c and the sink by c²: key 0's match is then (1 − c)·Eᵢ·E₀, and a
    query whose token is the first one still scores key 1 about c·(1 − c·SINK) above key 0 (0.33 at t = 22), so
    that little of its weight copies the first token back.
    V copies the key's own token."""
    m = min(lay.t, d_k - POSITION_PAIRS)
    W_Q = np.zeros((d_k, lay.d_model))  # [d_k, d_model]
    W_K = np.zeros((d_k, lay.d_model))  # [d_k, d_model]
    r = np.arange(m)  # [m]
    W_Q[r, lay.token.start + r] = gain
    W_K[r, lay.previous_token.start + r] = 1.0
    c = sink_scale(lay.t)
    W_K[r, lay.token.start + r] = -c
    W_Q[m, lay.one] = gain * c * c * SINK / 2.0
    W_K[m, lay.position.start + PARITY] = SIGNS[0]
    W_K[m, lay.previous_parity] = 1.0
    W_V, W_O = _copy_values(lay, d_k, lay.token)
    return W_Q, W_K, W_V, W_O


def head_weights(kind: str, layer: int, lay: Layout, d_k: int, gain: float) -> tuple[np.ndarray, ...]:
    """One constructed head's W_Q, W_K, W_V [d_k, d_model] and W_O block [d_model, d_k], in layer ``layer``,
    each row of W_Q, W_K, W_V made blind to constant vectors (``centred``)."""
    if kind == "previous_token" and lay.rope:
        W_Q, W_K, W_V, W_O = rope_previous_token_head(lay, d_k, gain)
    elif kind == "previous_token":
        W_Q, W_K, W_V, W_O = previous_token_head(lay, d_k, gain)
    elif kind == "first_token":
        W_Q, W_K, W_V, W_O = first_token_head(lay, d_k, gain)
    elif kind == "same_token":
        W_Q, W_K, W_V, W_O = same_token_head(lay, d_k, gain)
    elif layer == 0:  # induction, layer 0: a previous-token head writing into the previous-token subspace
        W_Q, W_K, W_V, W_O = previous_token_head(lay, d_k, gain, into=lay.previous_token)
    else:
        W_Q, W_K, W_V, W_O = induction_match_head(lay, d_k, gain)
    return centred(W_Q, lay), centred(W_K, lay), centred(W_V, lay), W_O


def centred(W: np.ndarray, lay: Layout) -> np.ndarray:
    """W with column ``zero`` set to minus each row's sum: W·1 = 0, so W·(x − μ·1) = W·x for any μ (x's zero
    coordinate is 0, so W·x itself is unchanged)."""
    W[:, lay.zero] = -W.sum(axis=1)  # [d_k]
    return W


def constructed_attention(seeded: Parameters, kinds: tuple[str, ...], layer: int, lay: Layout,
                          gain: float, value_scale: float = 1.0) -> Parameters:
    """A layer's attention weights: the seeded ones, with each constructed head's W_Qᵢ, W_Kᵢ, W_Vᵢ and its
    columns of W_O replaced (W_Vᵢ × ``value_scale``: σ under a norm, so that a head copies x's vectors at their
    own length; not an induction head's match, layer 1 on, whose copy of B must outweigh the query's own token in
    the stream: pre-norm it is read from the normalised stream, 1/σ (×2.3 at d_model 64) longer than A's embedding
    in the raw one; a tied head then predicts B)."""
    W_Q, W_K, W_V, W_O = (np.array(a) for a in (seeded.W_Q, seeded.W_K, seeded.W_V, seeded.W_O))  # writable copies
    d_k = seeded.d_k
    for i, kind in enumerate(kinds):
        if kind == SEEDED:
            continue
        W_Q[i], W_K[i], W_V[i], W_O[:, i * d_k:(i + 1) * d_k] = head_weights(kind, layer, lay, d_k, gain)
        if not (kind == "induction" and layer > 0):  # the match's copy keeps the norm's gain (docstring)
            W_V[i] *= value_scale
    for a in (W_Q, W_K, W_V, W_O):
        a.setflags(write=False)
    return Parameters(W_Q, W_K, W_V, W_O)


@lru_cache(maxsize=16)  # per configuration: the weights and their digest are asked for on every trace
def constructed_parameters(seed: int, d_model: int, num_heads: int, kinds: tuple[str, ...], gain: float,
                           lay: Layout) -> Parameters:
    """One attention layer's weights with constructed heads, for x laid out as ``lay``."""
    return constructed_attention(generate_parameters(seed, d_model, num_heads), kinds, 0, lay, gain)


def constructed_block_parameters(seeded: BlockParameters, kinds: tuple[str, ...], gain: float,
                                 lay: Layout, pre_norm: bool) -> BlockParameters:
    """A stack's weights with constructed heads: each layer's attention as ``constructed_attention``, and every
    feed-forward network zero (W_1 = W_2 (= W_3) = 0), as tracr's attention-only layers: a seeded FFN would add
    noise as large as the signal to every subspace. The norms stay the configuration's.

    A layer whose attention reads a norm's output (every layer pre-norm, every layer after the first post-norm)
    sees x/σ, so its q, k and v are each 1/σ larger than the closed form's: its gain is multiplied by
    ``norm_scale``, the σ² the layout gives x, and its W_V by σ, so that its scores stay about sharpness × the
    closed form (uncorrected, 1/σ² is about d_model/10: an induction head's raw scores were in the tens of
    thousands) and what it copies has the length it had in x (an induction head's layer 1 subtracts the key's own
    token from the previous token layer 0 copied). An induction head's layer 1 and later keep their W_V
    (``constructed_attention`` says why)."""
    layers = []
    for i, p in enumerate(seeded.layers):
        zero = {name: _zeros(W.shape) for name, W in (("W_1", p.W_1), ("W_2", p.W_2), ("W_3", p.W_3))
                if W is not None}
        s2 = norm_scale(lay, i) if pre_norm or i > 0 else 1.0
        layers.append(LayerParameters(constructed_attention(p.attention, kinds, i, lay, gain * s2, math.sqrt(s2)),
                                      p.norm1, p.norm2, **zero))
    return BlockParameters(tuple(layers), seeded.final_norm)


def norm_scale(lay: Layout, layer: int) -> float:
    """σ² of x laid out as ``lay`` at the input of ``layer``, as a norm computes it (‖x‖²/d_model; the code's
    coordinates sum to about 0, so μ is small): a unit token vector, the code's P unit pairs and the constant 1,
    and from layer 1 on an induction head's previous token and parity. Other heads' outputs are left out: the
    norm divides by a σ up to a few tens of per cent larger, and the pattern is only less sharp."""
    squares = 1.0 + lay.code_width / 2 + 1.0 + (2.0 if lay.previous and layer > 0 else 0.0)
    return squares / lay.d_model


def _zeros(shape: tuple[int, ...]) -> np.ndarray:
    a = np.zeros(shape)
    a.setflags(write=False)
    return a


# ------------------------------------------------------------------ the rules


def min_d_k(kind: str, rope: bool = False) -> int:
    """How many coordinates a head of this kind needs (d_k = d_model / num_heads at least this)."""
    if rope and kind == "previous_token":
        return 2  # one rotation pair
    return {"previous_token": 2 * POSITION_PAIRS, "first_token": POSITION_PAIRS,
            "same_token": 2 * POSITION_PAIRS + MIN_MATCH_DIMS,
            "induction": max(2 * POSITION_PAIRS, POSITION_PAIRS + MIN_MATCH_DIMS)}.get(kind, 0)


def min_d_model(kinds: tuple[str, ...], rope: bool = False) -> int:
    """The smallest d_model whose layout holds the position code (not under RoPE), the 0, the 1 and a token
    subspace of MIN_MATCH_DIMS (two of them and the previous parity with an induction head)."""
    induction = "induction" in kinds
    return (0 if rope else 2 * POSITION_PAIRS) + 2 + (MIN_MATCH_DIMS * 2 + 1 if induction else MIN_MATCH_DIMS)


def sharpness_problems(sharpness: Any) -> list[EngineError]:
    """sharpness: a finite number in (0, SHARPNESS_MAX]."""
    if isinstance(sharpness, (int, float)) and not isinstance(sharpness, bool) and math.isfinite(sharpness) \
            and 0 < sharpness <= SHARPNESS_MAX:
        return []
    return [InvalidSizeError(f"sharpness must be a number above 0 and at most {SHARPNESS_MAX:g}, got "
                             f"{repr(sharpness)[:64]}", field="sharpness")]


def kind_problems(head_weights: Any) -> list[EngineError]:
    """head_weights: None, or a list of known head kinds (its length is checked with num_heads)."""
    if head_weights is None:
        return []
    if not isinstance(head_weights, (tuple, list)) or not all(isinstance(k, str) for k in head_weights):
        return [InvalidSizeError("head_weights must be a list of head kinds, one per head", field="head_weights")]
    options = ", ".join(f'"{k}"' for k in HEAD_KINDS)
    return [InvalidSizeError(f"head_weights[{i}] must be one of {options}, got {kind[:64]!r}",
                             field=f"head_weights/{i}", code="unknown_head_kind")
            for i, kind in enumerate(head_weights) if kind not in HEAD_KINDS]


def head_conflicts(head_weights: Any, sharpness: Any, *, d_model: int, num_heads: int, num_layers: int, block: bool,
                   rope: bool, grouped: bool, rope_base: float = 10000.0) -> list[EngineError]:
    """Every problem with ``head_weights`` (None: all seeded) and ``sharpness``, in the order a reader fixes them."""
    problems = [*sharpness_problems(sharpness), *kind_problems(head_weights)]
    if head_weights is None or any(p.field == "head_weights" for p in problems):
        return problems
    if len(head_weights) != num_heads:
        problems.append(InvalidSizeError(
            f"head_weights names {len(head_weights)} head kinds but num_heads is {num_heads}: give one kind per head "
            '("seeded" for a head with seeded weights)', field="head_weights", code="heads_length"))
    if problems:
        return problems
    kinds = head_weights
    if all(k == SEEDED for k in kinds):
        return []
    d_k = d_model // num_heads
    if rope:
        problems += [VariantConflictError(
            f'head_weights[{i}] ({kind}) reads the position code added to x, and with positional_encoding "rope" '
            "nothing is added: under RoPE a query sees no absolute position, and a token match turns with the "
            'rotation. Under RoPE only "previous_token" (the rotation\'s own construction) and "seeded" heads are '
            'built; use "sinusoidal" (the default) for this one', field=f"head_weights/{i}",
            code="constructed_needs_pe") for i, kind in enumerate(kinds) if kind not in (SEEDED, "previous_token")]
        if "previous_token" in kinds and d_k % 2 == 0 and rope_margin(d_k, rope_base) < MIN_ROPE_MARGIN:
            problems.append(InvalidSizeError(
                f"with rope_base {rope_base:g} and d_k {d_k}, RoPE's frequencies barely tell positions apart (a key "
                f"other than the previous token scores within {rope_margin(d_k, rope_base):.2g} of it, out of 1): "
                "a previous-token head cannot be built; give it a wider d_k (fewer heads) or a rope_base nearer "
                "10000", field="rope_base",
                code="rope_base_blurs_positions"))
    if grouped:
        problems.append(VariantConflictError(
            "constructed heads have their own W_K and W_V, so K/V heads cannot be shared: drop num_kv_heads",
            field="head_weights", code="constructed_needs_mha"))
    if "induction" in kinds and num_layers < 2:
        problems.append(VariantConflictError(
            "an induction head takes two layers (a previous-token head in layer 0, the match in layer 1): give "
            'num_layers 2 or more with a block (e.g. block "vaswani2017")', field="head_weights",
            code="induction_needs_layers"))
    if d_model < min_d_model(kinds, rope):
        tokens = "two token subspaces" if "induction" in kinds else "a token subspace"
        problems.append(InvalidSizeError(
            f"d_model {d_model} is too small for these constructed heads: x holds "
            f"{'' if rope else f'a position code of {2 * POSITION_PAIRS}, '}a constant 1, an empty coordinate and "
            f"{tokens} of at least {MIN_MATCH_DIMS} coordinates{' (and one for the previous token' + chr(39) + 's parity)' if 'induction' in kinds else ''}, so d_model must be at least "
            f"{min_d_model(kinds, rope)}",
            field="d_model", code="d_model_too_small"))
    short = [(i, k) for i, k in enumerate(kinds) if d_k < min_d_k(k, rope)]
    for i, kind in short:
        problems.append(InvalidSizeError(
            f"head_weights[{i}] ({kind}) needs d_k ≥ {min_d_k(kind, rope)}, and d_k = d_model / num_heads = {d_k}: use "
            "fewer heads or a larger d_model", field=f"head_weights/{i}", code="d_k_too_small"))
    return problems


def trace_conflicts(*, constructed: bool, input_given: bool, parameters_given: bool,
                    cross: bool) -> list[EngineError]:
    """What a trace with constructed heads cannot take: its weights and x are the construction's."""
    if not constructed:
        return []
    problems: list[EngineError] = []
    if input_given:
        problems.append(VariantConflictError(
            "constructed heads read x laid out in subspaces (token, position code, 1), which the engine builds from "
            "the tokens: drop input, or make every head \"seeded\"", field="input", code="constructed_input"))
    if parameters_given:
        problems.append(VariantConflictError(
            "constructed heads come with their own weights: drop parameters, or make every head \"seeded\"",
            field="parameters", code="constructed_parameters"))
    if cross:
        problems.append(VariantConflictError(
            "constructed heads are self-attention heads: drop the context, or make every head \"seeded\"",
            field="head_weights", code="constructed_cross"))
    return problems


def gain_of(sharpness: float, scale_factor: float) -> float:
    """What W_Q multiplies its closed form by: sharpness, and stage 7's divisor undone."""
    return float(sharpness) * scale_factor


@lru_cache(maxsize=16)
def constructed_parameters_digest(seed: int, d_model: int, num_heads: int, kinds: tuple[str, ...],
                                  gain: float, lay: Layout) -> str:
    """``parameters_digest`` of ``constructed_parameters``, once per configuration."""
    return parameters_digest(constructed_parameters(seed, d_model, num_heads, kinds, gain, lay))
