"""Service configuration, read from the environment (12-factor style).

Every limit has a safe default, is documented in README.md and openapi.yaml,
and is reported by ``GET /version``. Tests build apps with other values
through ``create_app(Settings(...))``.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

ENV_PREFIX = "ATTENTION_TRACE_"
#: the paths whose bodies may be as large as max_check_body_bytes (a whole submission)
CHECK_PATHS = frozenset({"/check", "/check/batch"})


@dataclass(frozen=True)
class Settings:
    #: most tokens a sentence (or token list) may have
    max_tokens: int = 256
    #: largest d_model
    max_d_model: int = 512
    #: most heads
    max_heads: int = 64
    #: most numbers one trace may return (all stages, plus parameters if asked);
    #: bounds response size (~20 bytes a number) and memory before any array exists
    max_trace_values: int = 2_500_000
    #: largest request body in bytes (413 above it), except /check and /check/batch
    max_body_bytes: int = 4 * 1024 * 1024
    #: largest /check and /check/batch body in bytes (413 above it): a submission of
    #: every stage at d_model 512, 64 tokens, 8 heads is ~7.5 MiB as compact JSON and
    #: ~7.9 MiB with ", " separators; every stage of the largest trace the limits allow
    #: (d_model 512, 240 tokens, 8 heads) is ~19 MiB as an npz body (docs/checking.md).
    #: An npz body may also unpack to at most this much.
    max_check_body_bytes: int = 24 * 1024 * 1024
    #: most JSON values (numbers, nulls, strings, lists, objects) a /check or
    #: /check/batch body may hold, counted from its commas and brackets before it is
    #: parsed (413 above it): parsing costs up to ~140 bytes of memory per value, so
    #: this bounds a request's memory, whatever the body holds. Every stage at d_model
    #: 512, 64 tokens, 8 heads is ~430 000 values.
    max_check_json_values: int = 1_000_000
    #: most items in one /trace/batch or /check/batch request; their traces
    #: together may hold at most max_trace_values numbers
    max_batch_items: int = 32
    #: longest sentence, in characters
    max_sentence_chars: int = 65_536
    #: browser origins allowed by CORS; "*" for any (credentials are never allowed)
    cors_origins: tuple[str, ...] = field(default=("*",))
    #: response encodings offered, in order of preference ("br", "gzip"; empty or
    #: "off" for none). brotli quality 1 pays for its CPU below ~450 Mbit/s;
    #: gzip level 1 is slower for less (docs/performance.md), so it is opt-in.
    compression: tuple[str, ...] = field(default=("br",))
    #: smallest JSON body worth compressing, in bytes
    compress_min_bytes: int = 16384
    #: bytes of /trace answers each worker keeps, keyed by the exact request
    #: body (answers up to 256 KiB); 0 turns the cache off
    response_cache_bytes: int = 32 * 1024 * 1024
    #: bytes of generated weight sets each worker keeps (4·d_model²·8 bytes a set:
    #: 8 MiB at d_model 512, so 4 of those by default); bounds the worker's memory
    weight_cache_bytes: int = 32 * 1024 * 1024

    @property
    def max_request_cost(self) -> int:
        """The work budget of one request, batches included, in numbers (service/budget.py):
        the most one single trace may cost, max_trace_values plus one weight set of
        4·max_d_model² generated numbers."""
        return self.max_trace_values + 4 * self.max_d_model ** 2

    @classmethod
    def from_env(cls, environ: os._Environ[str] | dict[str, str] | None = None) -> Settings:
        """Read ATTENTION_TRACE_<FIELD> variables; unset ones keep their defaults."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None or raw.strip() == "":
                continue
            if f.name in ("cors_origins", "compression"):
                items = tuple(o.strip() for o in raw.split(",") if o.strip() and o.strip() != "off")
                if f.name == "compression" and not set(items) <= {"br", "gzip"}:
                    raise ValueError(f"{ENV_PREFIX}COMPRESSION must list br and/or gzip, or be off; got {raw!r}")
                values[f.name] = items
                continue
            try:
                number = int(raw)
            except ValueError:
                raise ValueError(f"{ENV_PREFIX}{f.name.upper()} must be an integer, got {raw!r}") from None
            if number < (0 if f.name == "response_cache_bytes" else 1):
                raise ValueError(f"{ENV_PREFIX}{f.name.upper()} must be at least 1, got {number}")
            values[f.name] = number
        return cls(**values)

    def body_limit(self, path: str) -> int:
        """The body limit of a request path: max_check_body_bytes for /check and /check/batch."""
        return self.max_check_body_bytes if path in CHECK_PATHS else self.max_body_bytes

    def limits(self) -> dict[str, object]:
        """The limits in force, as reported by GET /version."""
        d = asdict(self)
        d["cors_origins"] = list(self.cors_origins)
        d["compression"] = list(self.compression)
        d["max_request_cost"] = self.max_request_cost
        return d
