"""The course configuration: one TOML file (stdlib ``tomllib``) that says what is graded and how.

See ``course.toml`` next to this file for a complete, commented example. Every
mistake in it is reported with where it is (``ConfigError``), when the grader
loads it, before any student code runs; ``attention-trace-grade selftest`` loads it
and grades the shipped students with it.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .assignment import ALL_FUNCTIONS, BLOCK_FUNCTIONS, STAGES_OF_CONFIG
from .sandbox import Limits

VISIBILITIES = ("visible", "after_due_date", "after_published", "hidden")
#: /check's tolerance fields a course may set in [check], with the largest value /check accepts
CHECK_FIELDS = ("metric", "rtol", "atol", "stage_rtol", "threshold")
CHECK_BOUNDS = {"rtol": 1.0, "atol": 1e6, "stage_rtol": 1.0, "threshold": 1.0}
MAX_SEED = 2**32 - 1
#: the largest weight_scale: 100 makes the scores 10⁴ times larger, far past where exp() overflows
MAX_WEIGHT_SCALE = 100.0


class ConfigError(ValueError):
    """The course configuration is wrong; the message says where and how."""


#: the [block] table's keys besides ``preset``: the engine's block fields a course may override
BLOCK_OVERRIDES = ("norm", "norm_position", "ffn", "d_ff", "norm_eps", "norm_weights", "lm_head", "temperature")


@dataclass(frozen=True)
class Block:
    """A block course's Transformer block (``[block]``): an engine preset and the fields it overrides. Every
    configuration is one block (num_layers 1) around plain multi-head attention with the sinusoidal encoding
    (no RoPE, no shared K/V heads, whatever the preset): the attention is the students' own."""

    preset: str
    overrides: tuple[tuple[str, Any], ...] = ()

    def fields(self) -> dict[str, Any]:
        """The engine's TraceConfig fields of this block (and of one layer, the sinusoidal encoding)."""
        return {"block": self.preset, "num_layers": 1, "positional_encoding": "sinusoidal", **dict(self.overrides)}

    def trace_config(self, d_model: int, num_heads: int, causal: bool, seed: int = 0) -> Any:
        from engine import TraceConfig

        return TraceConfig(d_model=d_model, num_heads=num_heads, causal=causal, seed=seed, **self.fields())


@dataclass(frozen=True)
class Configuration:
    """One input the students' functions are graded on: a trace request of the service."""

    name: str
    d_model: int
    num_heads: int
    causal: bool
    seed: int | None  # None: drawn for each submission
    tokens: tuple[str, ...] | None = None
    sentence: str | None = None
    weight_scale: float = 1.0  # the seeded W_Q, W_K, W_V and W_O times this: scores grow by its square
    block: Block | None = None  # a block course's block: the configuration is one Transformer block

    @property
    def d_k(self) -> int:
        return self.d_model // self.num_heads

    def trace_config(self, seed: int = 0) -> Any:
        """The engine's TraceConfig of this configuration (a block's, in a block course)."""
        if self.block is not None:
            return self.block.trace_config(self.d_model, self.num_heads, self.causal, seed)
        from engine import TraceConfig

        return TraceConfig(d_model=self.d_model, num_heads=self.num_heads, causal=self.causal, seed=seed)

    def parameters(self, seed: int) -> Any:
        """The weights of this configuration with that seed: the seeded ones, times ``weight_scale``
        (an ``engine.Parameters``), or None when they are the seeded ones as they are."""
        if self.weight_scale == 1.0:
            return None
        import engine

        p = engine.generate_parameters(seed, self.d_model, self.num_heads)
        s = self.weight_scale
        return engine.Parameters(W_Q=p.W_Q * s, W_K=p.W_K * s, W_V=p.W_V * s, W_O=p.W_O * s)

    def request(self, seed: int) -> dict[str, Any]:
        """The trace request for this configuration with that seed (with the scaled weights as explicit
        ``parameters`` when ``weight_scale`` is not 1: a service computes the same reference)."""
        body: dict[str, Any] = {"d_model": self.d_model, "num_heads": self.num_heads, "causal": self.causal,
                                "seed": seed}
        if self.tokens is not None:
            body["tokens"] = list(self.tokens)
        else:
            body["sentence"] = self.sentence
        params = self.parameters(seed)
        if params is not None:
            body["parameters"] = {name: getattr(params, name).tolist() for name in ("W_Q", "W_K", "W_V", "W_O")}
        return body


@dataclass(frozen=True)
class Test:
    name: str
    function: str
    configurations: tuple[str, ...]
    points: float
    visibility: str
    stage: str | None = None  # multi_head_attention returning a dict: the stage this test grades

    @property
    def hidden(self) -> bool:
        return self.visibility == "hidden"


@dataclass(frozen=True)
class Course:
    path: Path | None
    file: str
    form: str  # "functions" | "single"
    url: str  # "local" or http(s)://
    retries: int
    timeout_seconds: float
    check: dict[str, Any]
    limits: Limits
    configurations: dict[str, Configuration]
    tests: tuple[Test, ...]
    gradescope: dict[str, Any] = field(default_factory=dict)
    prairielearn: dict[str, Any] = field(default_factory=dict)
    hide: tuple[str, ...] = ()
    runtime: str | None = None
    seeds: str = "random"  # "random": drawn per submission; "student": derived from the student and a secret
    secret_file: str | None = None  # [seeds] secret_file, absolute (relative ones are the course file's)
    block: Block | None = None  # [block]: a block course (every configuration is one Transformer block)

    @property
    def max_score(self) -> float:
        return sum(t.points for t in self.tests)


def _get(table: dict, key: str, kind: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
    if key not in table:
        if default is ...:
            raise ConfigError(f"{where}: `{key}` is missing")
        return default
    value = table[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ConfigError(f"{where}: `{key}` must be a {names}, got {value!r}")
    return value


def _no_extra(table: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(repr, extra))}; "
                          f"allowed: {', '.join(sorted(allowed))}")


def _configuration(t: dict, i: int) -> Configuration:
    where = f"[[configuration]] #{i + 1}"
    _no_extra(t, {"name", "tokens", "sentence", "d_model", "num_heads", "causal", "seed", "weight_scale"}, where)
    name = _get(t, "name", str, where)
    where = f"configuration {name!r}"
    d_model = _get(t, "d_model", int, where)
    heads = _get(t, "num_heads", int, where)
    if d_model < 1 or heads < 1 or d_model % heads:
        raise ConfigError(f"{where}: d_model ({d_model}) must be a positive multiple of num_heads ({heads})")
    causal = _get(t, "causal", bool, where, False)
    seed = t.get("seed", "random")
    if seed == "random":
        seed = None
    elif isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f'{where}: `seed` must be "random" or an integer from 0 to 2^32 - 1, got {seed!r}')
    tokens = t.get("tokens")
    sentence = t.get("sentence")
    if (tokens is None) == (sentence is None):
        raise ConfigError(f"{where}: give exactly one of `tokens` (a list of strings) or `sentence`")
    if tokens is not None:
        if not isinstance(tokens, list) or not tokens or not all(isinstance(x, str) and x.strip() for x in tokens):
            raise ConfigError(f"{where}: `tokens` must be a non-empty list of non-blank strings")
        tokens = tuple(tokens)
    elif not isinstance(sentence, str) or not sentence.strip():
        raise ConfigError(f"{where}: `sentence` must be a non-blank string")
    weight_scale = _get(t, "weight_scale", float, where, 1.0)
    if not math.isfinite(weight_scale) or not 0 < weight_scale <= MAX_WEIGHT_SCALE:
        raise ConfigError(f"{where}: `weight_scale` must be a number above 0 and at most {MAX_WEIGHT_SCALE:g}, "
                          f"got {weight_scale!r}")
    return Configuration(name, d_model, heads, causal, seed, tokens, sentence, weight_scale)


def _names(value: Any, sets: dict[str, list[str]], where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: `configurations` must be a configuration name, a set name (\"@set\"), "
                          "or a non-empty list of them")
    out: list[str] = []
    for v in value:
        if v.startswith("@"):
            if v[1:] not in sets:
                raise ConfigError(f"{where}: no set {v[1:]!r} in [sets] (there are: {', '.join(sets) or 'none'})")
            out += sets[v[1:]]
        else:
            out.append(v)
    return list(dict.fromkeys(out))


def parse(doc: dict[str, Any], path: Path | None = None) -> Course:
    """A Course from the parsed TOML document (ConfigError on any mistake)."""
    _no_extra(doc, {"assignment", "service", "check", "limits", "sandbox", "sets", "configuration", "test",
                    "gradescope", "prairielearn", "seeds", "block"}, "the course file")
    a = doc.get("assignment", {})
    _no_extra(a, {"file", "form"}, "[assignment]")
    file = _get(a, "file", str, "[assignment]", "attention.py")
    if "/" in file or not file.endswith(".py"):
        raise ConfigError(f"[assignment]: `file` must be a plain .py file name, got {file!r}")
    form = _get(a, "form", str, "[assignment]", "functions")
    if form not in ("functions", "single"):
        raise ConfigError(f'[assignment]: `form` must be "functions" or "single", got {form!r}')

    s = doc.get("service", {})
    _no_extra(s, {"url", "retries", "timeout_seconds"}, "[service]")
    url = _get(s, "url", str, "[service]", "local")
    if url != "local" and not url.startswith(("http://", "https://")):
        raise ConfigError(f'[service]: `url` must be "local" or an http(s):// URL, got {url!r}')
    retries = _get(s, "retries", int, "[service]", 3)
    timeout = _get(s, "timeout_seconds", float, "[service]", 60.0)

    check = dict(doc.get("check", {}))
    _no_extra(check, set(CHECK_FIELDS), "[check]")
    for k, v in check.items():
        if k == "metric":
            if v not in ("allclose", "rel_error"):
                raise ConfigError(f'[check]: `metric` must be "allclose" or "rel_error", got {v!r}')
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"[check]: `{k}` must be a non-negative number, got {v!r}")
        elif v > CHECK_BOUNDS[k]:
            raise ConfigError(f"[check]: `{k}` must be at most {CHECK_BOUNDS[k]:g}, got {v!r}")
        else:
            check[k] = float(v)
    allclose = [k for k in ("rtol", "atol", "stage_rtol") if k in check]
    if check.get("metric") == "rel_error" and allclose:
        raise ConfigError(f'[check]: `{allclose[0]}` belongs to metric "allclose"; metric "rel_error" takes '
                          "`threshold`")
    if check.get("metric") != "rel_error" and "threshold" in check:
        raise ConfigError('[check]: `threshold` belongs to metric "rel_error"; add metric = "rel_error", or give '
                          "rtol, atol and stage_rtol for allclose")

    lim = doc.get("limits", {})
    defaults = Limits()
    allowed = {"call_seconds", "total_seconds", "memory_mb", "processes", "file_size_mb", "open_files",
               "output_keep_bytes", "output_max_bytes", "restarts", "scratch_mb"}
    _no_extra(lim, allowed, "[limits]")
    values = {}
    for k in allowed:
        kind = float if k.endswith("seconds") else int
        v = _get(lim, k, kind, "[limits]", getattr(defaults, k))
        if v <= 0 and k != "restarts" or v < 0:
            raise ConfigError(f"[limits]: `{k}` must be positive, got {v!r}")
        values[k] = v
    limits = Limits(**values)
    if limits.memory_mb < 256:
        raise ConfigError("[limits]: `memory_mb` below 256 leaves no room for numpy")

    sb = doc.get("sandbox", {})
    _no_extra(sb, {"hide", "runtime"}, "[sandbox]")
    hide = _get(sb, "hide", list, "[sandbox]", [])
    if not all(isinstance(h, str) and h.startswith("/") for h in hide):
        raise ConfigError("[sandbox]: `hide` must be a list of absolute paths")
    runtime = _get(sb, "runtime", str, "[sandbox]", None)

    sets = doc.get("sets", {})
    if not isinstance(sets, dict) or not all(isinstance(v, list) and all(isinstance(x, str) for x in v)
                                             for v in sets.values()):
        raise ConfigError("[sets]: each set must be a list of configuration names")

    block = _block(doc.get("block"), form, url)
    raw_configs = doc.get("configuration", [])
    if not isinstance(raw_configs, list) or not raw_configs:
        raise ConfigError("the course file has no [[configuration]]")
    configs: dict[str, Configuration] = {}
    for i, t in enumerate(raw_configs):
        c = _configuration(t, i)
        if block is not None:
            c = replace(c, block=block)
            try:
                c.trace_config()
            except ValueError as e:  # the engine's EngineError: a choice the engine refuses for this configuration
                raise ConfigError(f"configuration {c.name!r} with [block]: {getattr(e, 'message', e)}") from None
        if c.name in configs:
            raise ConfigError(f"configuration {c.name!r} is defined twice")
        configs[c.name] = c
    for sname, members in sets.items():
        for m in members:
            if m not in configs:
                raise ConfigError(f"[sets] {sname}: no configuration named {m!r}")

    raw_tests = doc.get("test", [])
    if not isinstance(raw_tests, list) or not raw_tests:
        raise ConfigError("the course file has no [[test]]")
    tests: list[Test] = []
    for i, t in enumerate(raw_tests):
        where = f"[[test]] #{i + 1}"
        _no_extra(t, {"name", "function", "configurations", "points", "visibility", "stage"}, where)
        function = _get(t, "function", str, where)
        if function not in ALL_FUNCTIONS:
            raise ConfigError(f"{where}: unknown function {function!r}; the functions are {', '.join(ALL_FUNCTIONS)}")
        _block_function(function, block, where)
        if form == "single" and function != "multi_head_attention":
            raise ConfigError(f'{where}: with form = "single" every test grades multi_head_attention')
        name = _get(t, "name", str, where, function)
        where = f"test {name!r}"
        names = _names(t.get("configurations"), sets, where)
        for n in names:
            if n not in configs:
                raise ConfigError(f"{where}: no configuration named {n!r}")
        if ALL_FUNCTIONS[function].causal_only:
            names = [n for n in names if configs[n].causal]
            if not names:
                raise ConfigError(f"{where}: {function} is graded on causal configurations only, and none is listed")
        points = _get(t, "points", float, where)
        if not math.isfinite(points) or points < 0:
            raise ConfigError(f"{where}: `points` must be a non-negative number")
        visibility = _get(t, "visibility", str, where, "visible")
        if visibility not in VISIBILITIES:
            raise ConfigError(f"{where}: `visibility` must be one of {', '.join(VISIBILITIES)}, got {visibility!r}")
        stage = _get(t, "stage", str, where, None)
        if stage is not None:
            if function != "multi_head_attention":
                raise ConfigError(f"{where}: `stage` applies to multi_head_attention tests only")
            if stage not in STAGES_OF_CONFIG:
                raise ConfigError(f"{where}: unknown stage {stage!r}; stages: {', '.join(STAGES_OF_CONFIG)}")
            if stage == "masked_scores":
                names = [n for n in names if configs[n].causal]
                if not names:
                    raise ConfigError(f"{where}: masked_scores exists on causal configurations only")
        tests.append(Test(name, function, tuple(names), points, visibility, stage))
    if len({t.name for t in tests}) != len(tests):
        raise ConfigError("two tests have the same name; give each a distinct `name`")

    gs = doc.get("gradescope", {})
    _no_extra(gs, {"visibility", "stdout_visibility"}, "[gradescope]")
    for k in gs:
        if gs[k] not in VISIBILITIES:
            raise ConfigError(f"[gradescope]: `{k}` must be one of {', '.join(VISIBILITIES)}")
    pl = doc.get("prairielearn", {})
    _no_extra(pl, set(), "[prairielearn]")
    sd = doc.get("seeds", {})
    _no_extra(sd, {"derive", "secret_file"}, "[seeds]")
    derive = _get(sd, "derive", str, "[seeds]", "random")
    if derive not in ("random", "student"):
        raise ConfigError(f'[seeds]: `derive` must be "random" or "student", got {derive!r}')
    secret_file = _get(sd, "secret_file", str, "[seeds]", None)
    if secret_file is not None and not Path(secret_file).is_absolute():
        secret_file = str((path.parent if path is not None else Path.cwd()) / secret_file)
    return Course(path, file, form, url, retries, timeout, check, limits, configs, tuple(tests), dict(gs), dict(pl),
                  tuple(hide), runtime, derive, secret_file, block)


def _block(table: Any, form: str, url: str) -> Block | None:
    """``[block]``: a block course's preset and overrides, checked by the engine itself."""
    if table is None:
        return None
    where = "[block]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    _no_extra(table, {"preset", *BLOCK_OVERRIDES}, where)
    from engine.layer import BLOCK_PRESETS

    preset = _get(table, "preset", str, where)
    if preset not in BLOCK_PRESETS:
        raise ConfigError(f"{where}: `preset` must be one of {', '.join(BLOCK_PRESETS)}, got {preset!r}")
    if form != "functions":
        raise ConfigError(f'{where}: a block course has form = "functions" (layer_norm, ffn, block, ...)')
    if url != "local":
        raise ConfigError(f'{where}: a block course computes its references with the engine: [service] url = "local"')
    overrides = tuple((k, float(table[k]) if k == "norm_eps" and isinstance(table[k], int) else table[k])
                      for k in BLOCK_OVERRIDES if k in table)
    block = Block(preset, overrides)
    try:
        block.trace_config(8, 1, False)
    except ValueError as e:
        raise ConfigError(f"{where}: {getattr(e, 'message', e)}") from None
    return block


def _block_function(function: str, block: Block | None, where: str) -> None:
    """A block function needs [block]; the norm graded is the block's; x is given to a block course's attention."""
    fn = ALL_FUNCTIONS[function]
    if block is None:
        if function in BLOCK_FUNCTIONS:
            raise ConfigError(f"{where}: {function} is a function of the block assignment; add a [block] table "
                              "(preset = \"vaswani2017\", \"gpt2\" or \"llama\") to grade it")
        return
    if function == "add_positional_encoding":
        raise ConfigError(f"{where}: in a block course the block is given x with the positional encoding added; "
                          "grade add_positional_encoding in an attention course")
    if function in ("lm_head", "next_token_probs") and dict(block.overrides).get("lm_head") is None:
        raise ConfigError(f"{where}: {function} is a function of the language-model head; add lm_head = \"tied\" "
                          "(or \"seeded\") to [block] to grade it")
    norm = block.trace_config(8, 1, False).norm_kind
    if fn.norm is not None and fn.norm != norm:
        raise ConfigError(f"{where}: this block's norm is {norm} ([block]), so grade {norm}, not {function}")


def load(path: str | Path) -> Course:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read: {e.strerror}") from None
    try:
        return parse(doc, path.resolve())
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
