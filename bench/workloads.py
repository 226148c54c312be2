"""The benchmark workloads: S, M, L, XL, and the token-doubling series.

S   "the cat sat", d_model 24, 4 heads (the classroom trace)
M   16 tokens, d_model 64, 4 heads
L   128 tokens, d_model 512, 8 heads (the frontend's paragraph)
XL  the largest trace the default limits allow, by tokens at L's shape
    (d_model = max_d_model, 8 heads), counted with the service's own
    trace_value_count: 240 tokens, 2,492,160 of 2,500,000 numbers. (The
    exhaustive maximum over heads/causal/parameters, 90 tokens with 64 causal
    heads, is only 0.3% more numbers, and mostly nulls.)

Sentences are cut from a fixed paragraph (words and punctuation), so that
every run sends the same bytes and repeated words exercise the embedding cache
as real text does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from engine.layer import TraceConfig, trace_value_count
from engine.tokenize import tokenize
from service.settings import Settings

def numbers(n: int, d_model: int, num_heads: int, causal: bool, with_parameters: bool) -> int:
    """What the service counts against max_trace_values (the engine's own trace_value_count)."""
    config = TraceConfig(d_model=d_model, num_heads=num_heads, causal=causal)
    return trace_value_count(config, n, with_parameters=with_parameters)


PARAGRAPH = (
    "Attention lets every token look at every other token, weigh how relevant each one is, and blend "
    "their values into a new vector. The queries ask, the keys answer, and the values carry what is "
    "passed on; dividing the scores by the square root of the key width keeps the softmax from "
    "saturating. With several heads, each head learns its own notion of relevance: one may follow "
    "syntax, another may track who did what to whom. The cat sat on the mat because it was warm, "
    "and the dog, which had been sleeping by the door, watched it closely."
)


def sentence_of(n: int) -> str:
    """A sentence of exactly n tokens, cycling through PARAGRAPH's tokens."""
    base = [t.text for t in tokenize(PARAGRAPH)]
    words = [base[i % len(base)] for i in range(n)]
    s = " ".join(words)
    got = len(tokenize(s))
    if got != n:  # pragma: no cover - the tokenizer's rules changed under us
        raise RuntimeError(f"sentence_of({n}) has {got} tokens")
    return s


@dataclass(frozen=True)
class Workload:
    name: str
    n_tokens: int
    d_model: int
    num_heads: int
    causal: bool = False
    include_parameters: bool = False
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # other request fields, e.g. stages/precision

    @property
    def d_k(self) -> int:
        return self.d_model // self.num_heads

    @property
    def body(self) -> dict[str, Any]:
        b: dict[str, Any] = {
            "sentence": "the cat sat" if self.name == "S" else sentence_of(self.n_tokens),
            "d_model": self.d_model,
            "num_heads": self.num_heads,
        }
        if self.causal:
            b["causal"] = True
        if self.include_parameters:
            b["include_parameters"] = True
        b.update(self.extra)
        return b

    @property
    def body_bytes(self) -> bytes:
        return orjson.dumps(self.body)

    @property
    def numbers(self) -> int:
        return numbers(self.n_tokens, self.d_model, self.num_heads, self.causal, self.include_parameters)

    @property
    def shape(self) -> str:
        s = f"n={self.n_tokens}, d_model={self.d_model}, h={self.num_heads}"
        if self.causal:
            s += ", causal"
        if self.include_parameters:
            s += ", +parameters"
        return s


def max_tokens_allowed(d_model: int, num_heads: int, causal: bool = False, params: bool = False,
                       settings: Settings | None = None) -> int:
    """Most tokens a request of this shape may have under the limits (0 if none)."""
    s = settings or Settings()
    best = 0
    for n in range(1, s.max_tokens + 1):
        if numbers(n, d_model, num_heads, causal, params) > s.max_trace_values:
            break
        best = n
    return best


def largest_allowed(settings: Settings | None = None) -> Workload:
    """XL: L's shape (d_model = max_d_model, 8 heads) with as many tokens as the limits allow."""
    s = settings or Settings()
    d, h = s.max_d_model, 8
    n = max_tokens_allowed(d, h, settings=s)
    count = numbers(n, d, h, False, False)
    return Workload("XL", n, d, h, note=f"most tokens allowed at d_model {d}, 8 heads: "
                                         f"{count:,} of {s.max_trace_values:,} numbers")


def most_numbers_allowed(settings: Settings | None = None) -> tuple[int, int, int, bool, bool]:
    """(count, n, h, causal, params): the request with the most numbers at d_model = max_d_model,
    over every head count, causal or not, with or without parameters (for the record)."""
    s = settings or Settings()
    d = s.max_d_model
    best = (0, 0, 0, False, False)
    for h in (h for h in range(1, min(s.max_heads, d) + 1) if d % h == 0):
        for causal in (False, True):
            for params in (False, True):
                n = max_tokens_allowed(d, h, causal, params, s)
                if n:
                    count = numbers(n, d, h, causal, params)
                    best = max(best, (count, n, h, causal, params))
    return best


def workloads() -> list[Workload]:
    return [
        Workload("S", 3, 24, 4, note='"the cat sat"'),
        Workload("M", 16, 64, 4),
        Workload("L", 128, 512, 8),
        largest_allowed(),
    ]


def distinct_small() -> Workload:
    """S with a new third word in every request ("sat1", "sat2", …: one token each), for HTTP only.

    An autograder's reference requests repeat; students' sentences do not. This
    is S with nothing to reuse but the weights: no two requests have the same
    body, so a per-body response cache would miss, and each third word is an
    embedding not seen before.
    """
    return Workload("S*", 3, 24, 4, note='"the cat sat<N>", N new per request',
                    extra={"sentence": "the cat sat__N__"})


def by_name() -> dict[str, Workload]:
    return {w.name: w for w in workloads()}


#: the doubling series: d_model 512 and 4 heads is the widest config whose 256-token trace is allowed
SCALING_D_MODEL = 512
SCALING_HEADS = 4


#: the whole-stack series: time per byte from 32 to 256 tokens at d_model 64 (where the fixed cost per request shows)
NARROW_D_MODEL = 64


def scaling_series(max_tokens: int | None = None, d_model: int = SCALING_D_MODEL, start: int = 8) -> list[Workload]:
    """Token counts doubling from ``start`` up to the limit, at ``d_model`` with 4 heads."""
    top = max_tokens or Settings().max_tokens
    prefix = "" if d_model == SCALING_D_MODEL else f"d{d_model} "
    out, n = [], start
    while n <= top:
        out.append(Workload(f"{prefix}n={n}", n, d_model, SCALING_HEADS))
        n *= 2
    return out
