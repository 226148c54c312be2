"""A float32 implementation against the float64 reference on many seeds, in this process (no sandbox): the
measurement behind the courses' tolerance (grader/README.md, "Fair on every seed").

For every configuration of every shipped course file, each function graded there is computed in float32 as
``grader/students/block/float32.py`` computes it (the language-model head: ``grader/students/block_lm/float32.py``;
every array cast to float32 on the way in) from the reference's own inputs, for a whole batch of seeds at once, and
compared with the float64 reference by the grader's rule with that configuration's tolerance
(``grader.reference.configuration_check``). The weights and embeddings are the engine's own, seed by seed (its
SHAKE-256 streams; a tied head's W_U the vocabulary's token embeddings in ``engine.lm.vocabulary``'s order); the
float64 reference is recomputed here in batches and checked against the engine's trace (``grader.block.reference``)
on the first seeds of every configuration, so it is the reference the grader uses.

A *figure* is the largest |float32 − float64| of a stage as a multiple of what the tolerance allows there
(``engine.checking.compare``'s ``figure``: a stage fails above 1); the margin is 1 / the worst figure.

    PYTHONPATH=$PWD .venv/bin/python -m tests.float32_sweep [SEEDS]   # each course's worst figures and seeds
"""

from __future__ import annotations

import hashlib
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine import params as P
from engine.attention import sinusoidal_positional_encoding
from engine.lm import vocabulary
from grader import block as block_mod
from grader import config as grader_config
from grader import diagnosis
from grader.assignment import reference_from_engine
from grader.reference import configuration_check, tolerance_of

ROOT = Path(__file__).resolve().parent.parent
COURSES = sorted((ROOT / "grader").glob("course*.toml"))
F32 = np.float32
CHUNK = 1000  # seeds computed together: [1000, 256, 28] float64 is 57 MB
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def draw_seeds(count: int) -> list[int]:
    """``count`` seeds in [0, 2³²), the same on every run."""
    return [int(s) for s in np.random.default_rng(20261205).integers(0, 2**32, count, dtype=np.uint64)]


# ----------------------------------------------------------------- the engine's weights, seed by seed


def streams(keys: list[str], count: int, variance: float) -> np.ndarray:
    """``engine.params._scaled(key, count, variance)`` for many keys at once: [len(keys), count]. The same
    arithmetic (``uniform_stream``) on the digests joined end to end, so one numpy pass instead of one per key."""
    raw = b"".join(hashlib.shake_256(k.encode("utf-8", "surrogatepass")).digest(8 * count) for k in keys)
    b = (np.frombuffer(raw, dtype="<u8") >> np.uint64(11)).astype(np.float64)  # < 2^53: exact
    z = (2.0 * b + (1.0 - 2.0**53)) / 2.0**53  # each step exact, as the engine's integer arithmetic
    return (z * np.sqrt(3.0 * variance)).reshape(len(keys), count)


class Weights:
    """The engine's weights and embeddings for a batch of seeds, each array generated once (courses share
    configurations: the attention's weights depend on d_model, num_heads and the seed only)."""

    def __init__(self, seeds: list[int]) -> None:
        self.seeds = seeds
        self._made: dict[tuple, np.ndarray] = {}

    def _get(self, key: tuple, make: Callable[[], np.ndarray]) -> np.ndarray:
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def embeddings(self, d: int, tokens: tuple[str, ...]) -> np.ndarray:
        texts = sorted(set(tokens))

        def make() -> np.ndarray:
            keys = [P.stream_key("embedding", seed=s, d_model=d, text=t) for s in self.seeds for t in texts]
            return streams(keys, d, P.EMBEDDING_VARIANCE).reshape(len(self.seeds), len(texts), d)

        table = self._get(("embedding", d, tuple(texts)), make)
        return table[:, [texts.index(t) for t in tokens]]  # [S, n, d]

    def attention(self, d: int, h: int) -> dict[str, np.ndarray]:
        dk = d // h
        out = {}
        for kind in ("W_Q", "W_K", "W_V"):
            out[kind] = self._get(
                (kind, d, h),
                lambda kind=kind: streams(
                    [P.stream_key(kind, seed=s, d_model=d, num_heads=h, head=i) for s in self.seeds for i in range(h)],
                    dk * d,
                    1.0 / d,
                ).reshape(len(self.seeds), h, dk, d),
            )
        out["W_O"] = self._get(
            ("W_O", d, h),
            lambda: streams(
                [P.stream_key("W_O", seed=s, d_model=d, num_heads=h) for s in self.seeds], d * d, 1.0 / d
            ).reshape(len(self.seeds), d, d),
        )
        return out

    def norm(self, kind: str, d: int, layer: int | None) -> np.ndarray:
        where = {} if layer is None else {"layer": layer}
        z = self._get(
            (kind, d, layer),
            lambda: streams(
                [P.stream_key(kind, seed=s, d_model=d, **where) for s in self.seeds], d, P.NORM_WEIGHT_VARIANCE
            ),
        )
        return 1.0 + z if kind.endswith("_gamma") else z

    def unembedding(self, d: int, vocab: tuple[str, ...]) -> np.ndarray:
        """An untied head's W_U (``engine.lm.seeded_unembedding``): [S, vocab, d]."""
        return self._get(
            ("lm_head", d, vocab),
            lambda: streams(
                [P.stream_key("lm_head", seed=s, d_model=d, text=t) for s in self.seeds for t in vocab], d, 1.0 / d
            ).reshape(len(self.seeds), len(vocab), d),
        )

    def ffn(self, kind: str, d: int, f: int, rows: int, cols: int) -> np.ndarray:
        return self._get(
            (kind, d, f),
            lambda: streams(
                [P.stream_key(kind, seed=s, d_model=d, d_ff=f, layer=0) for s in self.seeds], rows * cols, 1.0 / cols
            ).reshape(len(self.seeds), rows, cols),
        )


def inputs(c: grader_config.Configuration, w: Weights, needs_ffn: bool) -> dict[str, np.ndarray]:
    """Every array a configuration's reference starts from, for each seed: [S, ...]."""
    d, h = c.d_model, c.num_heads
    out = {"E": w.embeddings(d, tuple(c.tokens or ())), **{k: v * c.weight_scale for k, v in w.attention(d, h).items()}}
    if c.block is None:
        return out
    tc = c.trace_config(0)
    bias = tc.norm_kind == "layer_norm"
    for which in ["norm1", "norm2"] + (["final_norm"] if tc.final_norm else []):
        layer = None if which == "final_norm" else 0
        S = len(w.seeds)
        out[f"{which}_gamma"] = w.norm(f"{which}_gamma", d, layer) if tc.seeded_norm else np.ones((S, d))
        if bias:
            out[f"{which}_beta"] = w.norm(f"{which}_beta", d, layer) if tc.seeded_norm else np.zeros((S, d))
    if tc.lm_head is not None:  # W_U [S, vocab, d]: the vocabulary in its documented order (engine.lm.vocabulary)
        vocab = tuple(vocabulary(list(c.tokens or ())))
        out["W_U"] = w.embeddings(d, vocab) if tc.lm_head == "tied" else w.unembedding(d, vocab)
    if needs_ffn:
        f = tc.ff_width
        out["W_1"] = w.ffn("W_1", d, f, f, d)
        out["W_2"] = w.ffn("W_2", d, f, d, f)
        if tc.gated:
            out["W_3"] = w.ffn("W_3", d, f, f, d)
    return out


# ----------------------------------------------------------------- the same functions, float64 or float32


class Ops:
    """The assignment's functions over a leading axis of seeds, in ``dtype``: float64 (the reference) or float32
    (the student: every array cast on the way in, as students/block/float32.py)."""

    def __init__(self, dtype: type) -> None:
        self.t = dtype

    def a(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=self.t)

    def positional(self, E: np.ndarray) -> np.ndarray:
        n, d = E.shape[-2:]
        return self.a(E) + self.a(sinusoidal_positional_encoding(n, d))

    def project(self, x: np.ndarray, W: np.ndarray) -> np.ndarray:
        return self.a(x)[:, None] @ self.a(W).swapaxes(-1, -2)  # [S, 1, n, d] @ [S, h, d, d_k] -> [S, h, n, d_k]

    def scores(self, q: np.ndarray, k: np.ndarray) -> np.ndarray:
        return self.a(q) @ self.a(k).swapaxes(-1, -2)  # -> [S, h, n, n]

    def scale(self, s: np.ndarray, d_k: int) -> np.ndarray:
        return self.a(s) / self.t(math.sqrt(d_k))

    def mask(self, s: np.ndarray) -> np.ndarray:
        n = s.shape[-1]
        return np.where(np.triu(np.ones((n, n), dtype=bool), 1), -np.inf, self.a(s)).astype(self.t)

    def softmax(self, s: np.ndarray) -> np.ndarray:
        s = self.a(s)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def attend(self, w: np.ndarray, v: np.ndarray) -> np.ndarray:
        return self.a(w) @ self.a(v)

    def concat(self, ctx: np.ndarray) -> np.ndarray:
        S, h, n, dk = ctx.shape
        return self.a(ctx).transpose(0, 2, 1, 3).reshape(S, n, h * dk)

    def output(self, cat: np.ndarray, W_O: np.ndarray) -> np.ndarray:
        return self.a(cat) @ self.a(W_O).swapaxes(-1, -2)

    def attention(self, x: np.ndarray, p: dict[str, np.ndarray], causal: bool) -> dict[str, np.ndarray]:
        """The whole layer, with every stage it computes."""
        q, k, v = (self.project(x, p[w]) for w in ("W_Q", "W_K", "W_V"))
        st = {"q": q, "k": k, "v": v, "scores": self.scores(q, k)}
        st["scaled_scores"] = self.scale(st["scores"], q.shape[-1])
        st["softmax_input"] = self.mask(st["scaled_scores"]) if causal else st["scaled_scores"]
        if causal:
            st["masked_scores"] = st["softmax_input"]
        st["weights"] = self.softmax(st["softmax_input"])
        st["context"] = self.attend(st["weights"], v)
        st["concat"] = self.concat(st["context"])
        st["output"] = self.output(st["concat"], p["W_O"])
        return st

    def norm(self, kind: str, x: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, eps: float) -> np.ndarray:
        x, g, e = self.a(x), self.a(gamma)[:, None, :], self.t(eps)
        if kind == "rms_norm":
            return g * x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + e)
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        return g * (x - mu) / np.sqrt(var + e) + self.a(beta)[:, None, :]

    def ffn(self, kind: str, x: np.ndarray, W_1: np.ndarray, W_2: np.ndarray, W_3: np.ndarray | None) -> np.ndarray:
        x = self.a(x)
        z = x @ self.a(W_1).swapaxes(-1, -2)  # [S, n, d_ff]
        if kind == "relu":
            act = np.maximum(z, 0)
        elif kind == "gelu_tanh":
            act = 0.5 * z * (1 + np.tanh(self.t(_SQRT_2_OVER_PI) * (z + self.t(0.044715) * z**3)))
        elif kind == "gelu":
            erf = np.frompyfunc(math.erf, 1, 1)
            act = (0.5 * z * (1 + erf(z * self.t(math.sqrt(0.5))).astype(self.t))).astype(self.t)
        else:  # swiglu
            act = z / (1 + np.exp(-z)) * (x @ self.a(W_3).swapaxes(-1, -2))
        return act @ self.a(W_2).swapaxes(-1, -2)

    def block(self, c: grader_config.Configuration, x: np.ndarray, p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One block from x, with every stage a function is graded on and every input it is given."""
        tc = c.trace_config(0)
        kind, eps = tc.norm_kind, tc.eps

        def norm(which: str, v: np.ndarray) -> np.ndarray:
            return self.norm(kind, v, p[f"{which}_gamma"], p.get(f"{which}_beta"), eps)

        x = self.a(x)
        st: dict[str, np.ndarray] = {"block_input": x}
        if tc.pre_norm:
            st["norm1_input"] = x
            st["norm1"] = norm("norm1", x)
            st["attention_input"] = st["norm1"]
            att = self.attention(st["attention_input"], p, c.causal)
            st["norm2_input"] = x + att["output"]
            st["norm2"] = norm("norm2", st["norm2_input"])
            st["ffn_input"] = st["norm2"]
            if "W_1" in p:
                st["ffn_output"] = self.ffn(tc.ffn_kind, st["ffn_input"], p["W_1"], p["W_2"], p.get("W_3"))
                st["final_norm_input"] = st["norm2_input"] + st["ffn_output"]
                st["final_norm"] = norm("final_norm", st["final_norm_input"])
                st["block_output"] = st["final_norm"]
        else:
            st["attention_input"] = x
            att = self.attention(x, p, c.causal)
            st["norm1_input"] = x + att["output"]
            st["norm1"] = norm("norm1", st["norm1_input"])
            st["ffn_input"] = st["norm1"]
            if "W_1" in p:
                st["ffn_output"] = self.ffn(tc.ffn_kind, st["ffn_input"], p["W_1"], p["W_2"], p.get("W_3"))
                st["norm2_input"] = st["norm1"] + st["ffn_output"]
                st["norm2"] = norm("norm2", st["norm2_input"])
                st["block_output"] = st["norm2"]
        return {**att, **st}

    def lm_head(self, h: np.ndarray, W_U: np.ndarray) -> np.ndarray:
        return self.a(h) @ self.a(W_U).swapaxes(-1, -2)  # [S, n, d] @ [S, d, vocab] -> [S, n, vocab]

    def next_token_probs(self, logits: np.ndarray, temperature: float) -> np.ndarray:
        return self.softmax(self.a(logits)[:, -1] / self.t(temperature))  # [S, n, vocab] -> [S, vocab]


F64, F32OPS = Ops(np.float64), Ops(np.float32)


# ----------------------------------------------------------------- what a course grades, in float32


def graded(course: grader_config.Course) -> dict[str, dict[str, set[str]]]:
    """configuration -> function -> the stages graded there."""
    out: dict[str, dict[str, set[str]]] = {}
    for t in course.tests:
        from grader.assignment import ALL_FUNCTIONS

        stages = (
            {t.stage}
            if t.stage
            else (set(ALL_FUNCTIONS[t.function].stages) if t.function != "multi_head_attention" else {"output"})
        )
        for c in t.configurations:
            if t.function == "mask" and not course.configurations[c].causal:
                continue
            out.setdefault(c, {}).setdefault(t.function, set()).update(stages)
    return out


def float32_answers(
    c: grader_config.Configuration,
    functions: dict[str, set[str]],
    ref: dict[str, np.ndarray],
    inp: dict[str, np.ndarray],
) -> Iterator[tuple[str, str, np.ndarray]]:
    """(function, stage, float32 answer) for every graded stage: each function given the reference's inputs."""
    o = F32OPS
    p = {k: v for k, v in inp.items() if k != "E"}
    for fn, stages in functions.items():
        if fn == "multi_head_attention":
            got = o.attention(ref["attention_input"], p, c.causal)
        elif fn == "block":
            got = {"block_output": o.block(c, ref["block_input"], p)["block_output"]}
        elif fn == "add_positional_encoding":
            got = {"input": o.positional(inp["E"])}
        elif fn == "project":
            got = {w.lower()[-1]: o.project(ref["attention_input"], p[w]) for w in ("W_Q", "W_K", "W_V")}
        elif fn == "scores":
            got = {"scores": o.scores(ref["q"], ref["k"])}
        elif fn == "scale":
            got = {"scaled_scores": o.scale(ref["scores"], ref["q"].shape[-1])}
        elif fn == "mask":
            got = {"masked_scores": o.mask(ref["scaled_scores"])}
        elif fn == "softmax":
            got = {"weights": o.softmax(ref["softmax_input"])}
        elif fn == "attend":
            got = {"context": o.attend(ref["weights"], ref["v"])}
        elif fn == "concat":
            got = {"concat": o.concat(ref["context"])}
        elif fn == "output":
            got = {"output": o.output(ref["concat"], p["W_O"])}
        elif fn in ("layer_norm", "rms_norm"):
            kind, eps = fn, c.trace_config(0).eps
            got = {
                s: o.norm(kind, ref[f"{s}_input"], p[f"{s}_gamma"], p.get(f"{s}_beta"), eps)
                for s in ("norm1", "norm2", "final_norm")
                if f"{s}_input" in ref
            }
        elif fn == "ffn":
            got = {"ffn_output": o.ffn(c.trace_config(0).ffn_kind, ref["ffn_input"], p["W_1"], p["W_2"], p.get("W_3"))}
        elif fn == "lm_head":
            got = {"logits": o.lm_head(ref["lm_input"], ref["unembedding"])}
        elif fn == "next_token_probs":
            got = {"next_token_probs": o.next_token_probs(ref["logits"], c.trace_config(0).temperature)}
        else:
            raise AssertionError(fn)
        for s in stages:
            if s in got:
                yield fn, s, got[s]


def figures(expected: np.ndarray, got: np.ndarray, atol: np.ndarray, rtol: float, stage_rtol: np.ndarray) -> np.ndarray:
    """Per seed: the largest |got − expected| as a multiple of what the tolerance allows (the grader's rule,
    ``engine.checking.compare``); masked entries (-inf in both) left out, inf where got is not finite."""
    S = expected.shape[0]
    e = expected.reshape(S, -1)
    g = got.astype(np.float64).reshape(S, -1)
    masked = np.isneginf(e)
    e0 = np.where(masked, 0.0, e)
    with np.errstate(invalid="ignore"):
        bad = ~masked & ~np.isfinite(g) | (masked != np.isneginf(g))
        scale = np.abs(e0).max(axis=1, keepdims=True)
        allowed = atol[:, None] + rtol * np.abs(e0) + stage_rtol[:, None] * scale
        diff = np.where(masked | bad, 0.0, np.abs(g - e0))
        fig = (diff / allowed).max(axis=1)
    return np.where(bad.any(axis=1), np.inf, fig)


@dataclass
class Worst:
    figure: float
    seed: int
    error: float  # the largest |float32 − float64| on that seed
    allowed: str  # the tolerance there


def reference(c: grader_config.Configuration, inp: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    x = F64.positional(inp["E"])
    p = {k: v for k, v in inp.items() if k not in ("E", "W_U")}
    if c.block is not None:
        st = F64.block(c, x, p)
        if "W_U" in inp:  # the head reads the block's output (the final norm's in pre-norm)
            st.update(lm_input=st["block_output"], unembedding=inp["W_U"])
            st["logits"] = F64.lm_head(st["lm_input"], st["unembedding"])
            st["next_token_probs"] = F64.next_token_probs(st["logits"], c.trace_config(0).temperature)
        return st
    return {"input": x, "attention_input": x, **F64.attention(x, p, c.causal)}


def logit_scales(c: grader_config.Configuration, ref: dict[str, np.ndarray]) -> np.ndarray:
    """Per seed, ``grader.reference.logit_scale``: the largest |logit| a softmax of the configuration reads (the
    attention's scaled scores, masked keys left out; with a head, also the last position's logits / T)."""
    S = ref["softmax_input"].shape[0]
    s = np.where(np.isneginf(ref["softmax_input"]), 0.0, np.abs(ref["softmax_input"])).reshape(S, -1).max(axis=1)
    if "logits" in ref:
        s = np.maximum(s, np.abs(ref["logits"][:, -1]).max(axis=1) / c.trace_config(0).temperature)
    return s


def agrees_with_engine(c: grader_config.Configuration, seeds: list[int], ref: dict[str, np.ndarray]) -> None:
    """The batched reference is the engine's (the grader's reference) on these seeds."""
    names = {
        "scores",
        "scaled_scores",
        "weights",
        "context",
        "concat",
        "output",
        "q",
        "k",
        "v",
        "norm1",
        "norm2",
        "final_norm",
        "ffn_output",
        "block_output",
        "input",
        "lm_input",
        "unembedding",
        "logits",
        "next_token_probs",
    }
    for i, seed in enumerate(seeds):
        want = (
            block_mod.reference(c, seed)
            if c.block is not None
            else reference_from_engine(diagnosis.engine_trace(c, seed))
        ).arrays
        for name in names & set(want) & set(ref):
            if c.block is not None and name == "input":
                continue  # a block's attention input, not its x
            np.testing.assert_allclose(ref[name][i], want[name], rtol=1e-9, atol=1e-12, err_msg=f"{c.name} {name}")


def sweep(courses: list[grader_config.Course], seeds: list[int]) -> list[dict[tuple[str, str, str], Worst]]:
    """For each course, (configuration, function, stage) -> the worst of ``seeds`` for a float32 implementation."""
    worst: list[dict[tuple[str, str, str], Worst]] = [{} for _ in courses]
    for start in range(0, len(seeds), CHUNK):
        chunk = seeds[start : start + CHUNK]
        weights = Weights(chunk)
        for course, found in zip(courses, worst):
            base = tolerance_of(course.check)
            for cname, functions in graded(course).items():
                c = course.configurations[cname]
                inp = inputs(c, weights, bool({"ffn", "block", "lm_head", "next_token_probs"} & set(functions)))
                ref = reference(c, inp)
                agrees_with_engine(c, chunk[:1], ref)
                tols = [tolerance_of(configuration_check(course.check, float(L))) for L in logit_scales(c, ref)]
                atol = np.array([t.atol for t in tols])
                stage_rtol = np.array([t.stage_rtol for t in tols])
                for fn, stage, got in float32_answers(c, functions, ref, inp):
                    expected = ref["softmax_input"] if stage == "masked_scores" else ref[stage]
                    fig = figures(expected, got, atol, base.rtol, stage_rtol)
                    i = int(np.argmax(fig))
                    k = (cname, fn, stage)
                    if k not in found or fig[i] > found[k].figure:
                        e, g = (np.where(np.isneginf(a[i]), 0.0, a[i]) for a in (expected, got))
                        found[k] = Worst(float(fig[i]), chunk[i], float(np.max(np.abs(e - g))), tols[i].describe())
    return worst


def main(count: int) -> None:
    t0 = time.perf_counter()
    courses = [grader_config.load(p) for p in COURSES]
    worst = sweep(courses, draw_seeds(count))
    print(f"{len(courses)} courses, {count} seeds each, {time.perf_counter() - t0:.1f} s")
    for path, found in zip(COURSES, worst):
        print(path.name)
        for (cname, fn, stage), w in sorted(found.items(), key=lambda kv: -kv[1].figure)[:6]:
            print(
                f"  {cname:22s} {fn:22s} {stage:14s} figure {w.figure:.3f} (margin {1 / w.figure:.1f}) "
                f"error {w.error:.3g} at seed {w.seed}; tolerance {w.allowed}"
            )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
