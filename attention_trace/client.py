"""A Python client for the attention-trace service, over HTTP or in-process.

    from attention_trace import Client, LocalClient

    client = Client("http://127.0.0.1:8000")          # or LocalClient(): no server needed
    t = client.trace(sentence="the cat sat", d_model=24, num_heads=4)
    t.stages["weights"].array()                        # numpy, [head, query, key]
    r = client.check(sentence="the cat sat", d_model=24, num_heads=4,
                     submission={"weights": my_weights})   # numpy arrays are fine
    r.passed, r.first_wrong_stage, r.diagnosis.bug, r.message

Requests are JSON objects, given as keyword arguments, as a mapping, or both
(keywords win). Errors the service answers (RFC 9457 problem details) raise
:class:`ProblemError`; a service that cannot be reached, or does not answer
in time, raises :class:`TransportError`.

This module needs only ``requests``, ``numpy`` and the ``engine`` package
(whose ``engine/fields.py`` declares the fields ``Config`` reads), so a grader
can vendor it with the engine. :class:`LocalClient` also needs the service
package (``service``, ``engine``, pydantic), imported when it is created.

In a notebook, results show themselves: ``repr`` is one line, ``print``
gives the command line's text (the walkthrough table of a trace, the verdict
of a check, one cell's numbers), and a trace draws itself as the viewer's
offline page, inline (``Trace._repr_html_``; ``Trace.html()`` is the page).
"""

from __future__ import annotations

import html as _html
import json
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field, make_dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Dict, Generic, TypeVar, Union, cast

import numpy as np
import requests

from engine import fields as _fields

__all__ = [
    "DEFAULT_TIMEOUT", "DEFAULT_RETRIES", "PROBLEM_TYPE_BASE",
    "ClientError", "ProblemError", "TransportError",
    "Client", "LocalClient",
    "Trace", "Stage", "Token", "Config", "Stats", "Parameters", "InjectedBug",
    "CheckResult", "StageCheck", "Mismatch", "NonFinite", "Diagnosis", "Hint", "Tolerance",
    "BatchItem", "Health", "VersionInfo", "encode_json", "encode_npz_check", "Explanation", "Answer",
]

#: (connect, read) seconds. Connecting to a healthy service is quick; a large
#: trace or a /check that tries every known bug may take a few seconds to compute.
DEFAULT_TIMEOUT: tuple[float, float] = (3.05, 60.0)
#: retries after the first attempt, on connection errors and 503 only
DEFAULT_RETRIES = 3
#: statuses retried; every other status, and every 4xx, is final
RETRY_STATUSES = frozenset({503})
PROBLEM_TYPE_BASE = "urn:attention-trace:problem:"

# What the service accepts as a caller's X-Request-ID (it replaces anything else).
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

Request = Mapping[str, Any]


def _client_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return "0+unknown"
    try:
        return version("attention-trace")
    except PackageNotFoundError:  # a vendored copy (e.g. in a Gradescope autograder)
        return "0+vendored"


# --------------------------------------------------------------------- errors


class ClientError(Exception):
    """Base class of every error this client raises."""


class ProblemError(ClientError):
    """The service answered an error: RFC 9457 problem details.

    ``status`` is the HTTP status; ``type`` a ``urn:attention-trace:problem:…``
    URN (``kind`` is its last part, e.g. ``validation-error``); ``errors`` lists
    one ``{"pointer", "message", "type"}`` per problem for validation errors.
    A non-problem error body (say, from a proxy) is wrapped with type
    ``about:blank``.
    """

    def __init__(self, status: int, type: str, title: str, detail: str,
                 errors: list[dict[str, Any]] | None = None, *, instance: str | None = None,
                 request_id: str | None = None, document: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {title}: {detail}")
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.errors = errors
        self.instance = instance
        self.request_id = request_id
        self.document = document if document is not None else self.to_dict()

    @property
    def kind(self) -> str:
        """The problem type without its URN prefix: ``validation-error``, ``not-found``, …"""
        return self.type[len(PROBLEM_TYPE_BASE):] if self.type.startswith(PROBLEM_TYPE_BASE) else self.type

    @classmethod
    def from_document(cls, doc: Mapping[str, Any], *, status: int | None = None,
                      request_id: str | None = None) -> ProblemError:
        errors = doc.get("errors")
        return cls(int(status if status is not None else doc.get("status", 0)), str(doc.get("type", "about:blank")),
                   str(doc.get("title", "")), str(doc.get("detail", "")),
                   list(errors) if isinstance(errors, list) else None,
                   instance=doc.get("instance"), request_id=request_id, document=dict(doc))

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"type": self.type, "title": self.title, "status": self.status,
                               "detail": self.detail, "instance": self.instance}
        if self.errors is not None:
            doc["errors"] = self.errors
        return doc

    def __repr__(self) -> str:
        return f"ProblemError(status={self.status!r}, type={self.type!r}, title={self.title!r}, detail={self.detail!r})"


class TransportError(ClientError):
    """The service could not be reached (after the retries), or did not answer in time.

    ``attempts`` is how many requests were made; ``cause`` the last
    ``requests`` exception.
    """

    def __init__(self, message: str, *, url: str, attempts: int, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.attempts = attempts
        self.cause = cause


# -------------------------------------------------------------------- results


#: GET /health's and GET /version's documents, as received
Health = Dict[str, Any]
VersionInfo = Dict[str, Any]


def _same(a: Any, b: Any) -> bool:
    """Whether two answer documents are equal (numpy arrays, from an npz answer, compared as values)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


class Answer:
    """A JSON object of an answer, read by attribute: ``answer.name`` is the document's member ``name``, so every
    member the service sends (openapi.yaml's components.schemas say which) is there, a new one included, with no
    copy of the schema here. A class names only what the client adds: the members it reads through a Python type
    (``_read``: nested answers, numpy arrays), and what a member an older service, or another configuration,
    leaves out reads as (``_absent``; a callable makes the value). ``raw`` is the document exactly as received.
    Read-only; equal when the documents are."""

    _read: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}
    _absent: ClassVar[Mapping[str, Any]] = {}
    __hash__ = None  # type: ignore[assignment]  # read-only but compared by value: unhashable, as a dict

    def __init__(self, raw: Mapping[str, Any]) -> None:
        object.__setattr__(self, "raw", raw)

    def __getattr__(self, name: str) -> Any:  # only for what is not set yet: a member is read once, then kept
        if name.startswith("_") or name == "raw":
            raise AttributeError(name)
        raw = self.raw
        if name in raw:
            value = raw[name]
            read = self._read.get(name)
            if read is not None and value is not None:
                value = read(value)
        elif name in self._absent:
            value = self._absent[name]
            value = value() if callable(value) else value
        else:
            raise AttributeError(f"{type(self).__name__} has no {name!r}; the answer has {', '.join(raw)}")
        self.__dict__[name] = value
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return getattr(self, "id", None) == getattr(other, "id", None) and _same(self.raw, other.raw)

    def __repr__(self) -> str:
        def short(v: Any) -> bool:  # a scalar, or a few of them (an index, axes)
            return v is None or isinstance(v, (str, int, float)) or (
                isinstance(v, list) and len(v) <= 8 and all(isinstance(x, (str, int, float)) for x in v))

        shown = [f"{k}={v!r}" for k, v in self.raw.items() if short(v)]
        return f"{type(self).__name__}({', '.join(shown)})"


class Token(Answer):
    """One token: ``index``, ``text``, and ``start`` and ``end`` in the sentence (``sentence[start:end] == text``)."""


class _ConfigReader:
    """What every ``Config`` has besides its fields."""

    @property
    def stack(self) -> bool:
        """Whether the trace is a stack of blocks (every per-layer stage has a leading layer axis)."""
        return getattr(self, "norm") is not None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Config:
        # Only the known fields: a newer service may add more; a field with a default may be absent.
        fields = cls.__dataclass_fields__  # type: ignore[attr-defined]  # Config is a dataclass made from the declaration
        return cls(**{f: doc.get(f) for f in fields  # type: ignore[return-value]  # cls is that dataclass
                      if f in doc or fields[f].default is MISSING})


#: what an answer's config holds besides the declared fields: the request's options and the sizes
_ANSWER_SIZES: tuple[tuple[str, Any], ...] = (
    ("include_parameters", bool), ("stages", Union[list[str], None]), ("precision", Union[int, None]),
    ("d_k", int), ("scale_factor", float), ("n_tokens", int), ("n_parameters", int), ("n_matrices", int))
_TYPES = {"int": int, "float": float, "bool": bool, "choice": str, "choices": list[str], "strings": list[str]}


def _config_class() -> type:
    """``Config``: the request's settings with defaults filled in, and the derived sizes. One attribute per
    declared field the answer echoes (engine/fields.py): the attention's own always there, a variant's its
    ``unused`` value (None; num_layers 1) where the trace does not use it."""
    always = [(f.name, _TYPES[f.kind]) for f in _fields.FIELDS if f.echoed and f.echo_description() is None]
    variants = [(f.name, Union[_TYPES[f.kind], None], field(default=f.unused))
                for f in _fields.FIELDS if f.echoed and f.echo_description() is not None]
    cls = make_dataclass("Config", [*always, *_ANSWER_SIZES, *variants], bases=(_ConfigReader,), frozen=True)
    cls.__module__ = __name__
    cls.__doc__ = "The request's settings with defaults filled in, and the derived sizes."
    return cls


if TYPE_CHECKING:
    class Config(_ConfigReader):
        def __getattr__(self, name: str) -> Any: ...
else:
    Config = _config_class()


NPZ = "application/x-npz"


def load_npz(data: bytes) -> Any:
    """A /trace answer sent as ``application/x-npz`` (the service's service/npz.py) back as its JSON
    document, in which each ``{"npz": key}`` is that member's array (NaN where the JSON has null;
    a masked stage's ``mask`` says where)."""
    import io

    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        meta = json.loads(z["metadata.json"])
        arrays = {key: z[key] for key in z.files if key != "metadata.json"}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if node.keys() == {"npz"}:
                return arrays[node["npz"]]
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(meta)


@dataclass(frozen=True)
class _NpzBody:
    """An ``application/x-npz`` answer's bytes, as sent (``trace_npz``), until a caller reads it."""

    content: bytes
    what: str

    def load(self) -> Any:
        try:
            return load_npz(self.content)
        except Exception as e:  # noqa: BLE001 (a truncated or foreign body: say so, not a zipfile traceback)
            raise ClientError(f"{self.what} answered an {NPZ} body that could not be read: "
                              f"{type(e).__name__}: {e}") from None


def _document(answer: Any) -> Any:
    """The JSON document of an answer (an npz answer read back into one)."""
    return answer.load() if isinstance(answer, _NpzBody) else answer


def _to_array(values: Any) -> np.ndarray:
    """Nested lists of numbers (and nulls) as float64; null becomes NaN."""
    return np.array(values, dtype=np.float64)  # None -> nan


class Stage(Answer):
    """One stage of the trace, under its ``id``: ``step``, ``title``, ``formula``, ``axes``, ``shape`` and ``values``,
    the JSON as sent (null where masked), or the float64 array itself (NaN where masked) when the trace came as
    arrays (``trace(..., arrays=True)``); :meth:`array` is numpy."""

    _read = {"axes": tuple, "shape": tuple}

    def __init__(self, id: str, raw: Mapping[str, Any]) -> None:
        super().__init__(raw)
        object.__setattr__(self, "id", id)

    def array(self) -> np.ndarray:
        """The values as a float64 array in ``axes`` order. Masked (null) entries
        of ``masked_scores`` are NaN (see :attr:`mask`); the ``tokens`` stage gives
        an array of strings."""
        if self.id == "tokens":
            return np.array(self.values, dtype=str)
        return _to_array(self.values).reshape(self.shape)

    @property
    def mask(self) -> np.ndarray | None:
        """True where a value is null (masked), for numeric stages; None for ``tokens``."""
        if self.id == "tokens":
            return None
        if isinstance(self.values, np.ndarray):  # an npz answer: its own boolean mask, if the stage is masked
            sent = self.raw.get("mask")
            return sent.copy() if sent is not None else np.zeros(self.shape, dtype=bool)
        # numpy's stubs take no None as an operand; an object array compared with None element by element is meant
        return np.equal(np.array(self.values, dtype=object), None).reshape(self.shape)  # type: ignore[call-overload]

    def __repr__(self) -> str:
        return f"Stage({self.id!r}, step={self.step}, axes={self.axes}, shape={self.shape})"

    @classmethod
    def from_json(cls, sid: str, doc: Mapping[str, Any]) -> Stage:
        return cls(sid, doc)


class _Stages(dict[str, Stage]):
    """A dict of stages whose KeyError says which stages there are."""

    def __missing__(self, key: str) -> Stage:
        raise KeyError(f"stage {key!r} is not in this trace; it has {', '.join(self)}"
                       + (" (ask for it with stages=[...], or drop stages)" if self else ""))


class Stats(Answer):
    """``entropy`` (nats) and ``max_weight`` of each attention row, as arrays in ``axes`` ([head, query]; a stack's
    [layer, head, query])."""

    _read = {"axes": tuple, "entropy": _to_array, "max_weight": _to_array}


_PER_HEAD = ("W_Q", "W_K", "W_V", "W_O")


@dataclass(frozen=True)
class Parameters:
    """The layer's weights (``include_parameters``), per head whatever the layout they were sent in.

    Subscriptable like the stages: ``t.parameters["W_Q"]``; a ``parameters_layout: "torch"`` answer's own arrays
    are there too, ``t.parameters["in_proj_weight"]`` and ``t.parameters["out_proj.weight"]``, and so are a stack of
    blocks' (every array with a leading layer axis: ``t.parameters["W_1"]`` [layer, d_ff, d_model], the norms' γ and
    β, the final norm's).
    """

    W_Q: np.ndarray  # [head, d_k, d_model]
    W_K: np.ndarray  # [kv head, d_k, d_model]
    W_V: np.ndarray  # [kv head, d_k, d_model]
    W_O: np.ndarray  # [d_model, num_heads·d_k]
    layout: str = "per_head"
    #: the arrays under the names the answer gave them (torch: in_proj_weight, out_proj.weight)
    sent: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    def keys(self) -> list[str]:
        return [*_PER_HEAD, *(k for k in self.sent if k not in _PER_HEAD)]

    def __iter__(self) -> Iterator[str]:  # the names, as a dict iterates
        return iter(self.keys())

    def __contains__(self, name: object) -> bool:
        return name in self.keys()

    def __getitem__(self, name: str) -> np.ndarray:
        if name in _PER_HEAD:
            return getattr(self, name)
        if name in self.sent:
            return self.sent[name]
        raise KeyError(f"no parameter {name!r}; the parameters are {', '.join(self.keys())}")

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], config: Mapping[str, Any]) -> Parameters:
        """Either layout of /trace's ``parameters``: per head (W_Q … W_O), or torch's ``in_proj_weight`` (W_Q, W_K
        and W_V, each [h·d_k, d_model], stacked) and ``out_proj.weight``, split back into heads."""
        if "in_proj_weight" in doc:
            d_model, heads, d_k = config["d_model"], config["num_heads"], config["d_k"]
            stacked = _to_array(doc["in_proj_weight"])  # [3·d_model, d_model]
            w_q, w_k, w_v = (stacked[i * heads * d_k:(i + 1) * heads * d_k].reshape(heads, d_k, d_model)
                             for i in range(3))
            w_o = _to_array(doc["out_proj.weight"])
            return cls(w_q, w_k, w_v, w_o, layout="torch", sent={"in_proj_weight": stacked, "out_proj.weight": w_o})
        rest = {k: _to_array(v) for k, v in doc.items() if k not in _PER_HEAD}  # a stack's FFN and norms
        w_q, w_k, w_v, w_o = (_to_array(doc[k]) for k in _PER_HEAD)
        return cls(w_q, w_k, w_v, w_o, sent=rest)


class InjectedBug(Answer):
    """The mistake a trace was computed with (``inject_bug``): ``name``, ``summary`` and ``warning``."""


class Trace(Answer):
    """A /trace answer, read from its document (``raw``, exactly as received): ``config``, ``tokens``, ``stages``
    (stage id -> :class:`Stage`), ``stats``, ``parameters`` (with ``include_parameters``, else None),
    ``injected_bug`` (None for the correct layer), and every other member of the answer as sent."""

    _read = {"config": lambda doc: Config.from_json(doc), "tokens": lambda ts: [Token(t) for t in ts],
             "stages": lambda doc: _Stages((sid, Stage(sid, s)) for sid, s in doc.items()), "stats": Stats,
             "injected_bug": InjectedBug}
    _absent = {"injected_bug": None}

    def __init__(self, raw: Mapping[str, Any], request_id: str | None = None, *,
                 request: Mapping[str, Any] | None = None) -> None:
        super().__init__(raw)
        object.__setattr__(self, "request_id", request_id)
        #: the /trace request that made it, when this client sent it (the notebook's page shows it as typed)
        object.__setattr__(self, "request", None if request is None else dict(request))

    @cached_property
    def parameters(self) -> Parameters | None:
        """The layer's weights (``include_parameters``), per head whatever the layout; None without them."""
        p = self.raw.get("parameters")
        return None if p is None else Parameters.from_json(p, self.raw["config"])

    def array(self, stage_id: str) -> np.ndarray:
        """``trace.stages[stage_id].array()``."""
        return self.stages[stage_id].array()

    @property
    def texts(self) -> list[str]:
        """The tokens' texts, in order."""
        return [t.text for t in self.tokens]

    @property
    def intervention(self) -> dict[str, Any] | None:
        """With ``interventions``: what they changed (the baseline request and its digest, each stage's largest
        change per layer, the target token's logit and probability); None otherwise."""
        return self.raw.get("intervention")

    # -- in a notebook

    def __repr__(self) -> str:
        cfg = self.config
        text = self._subject()
        return (f"<Trace of {text}: {len(self.tokens)} token{'s' if len(self.tokens) != 1 else ''}, d_model "
                f"{cfg.d_model}, {cfg.num_heads} head{'s' if cfg.num_heads != 1 else ''} of d_k {cfg.d_k}, seed "
                f"{cfg.seed}{'' if cfg.scale else ', not scaled'}{', causal' if cfg.causal else ''}, "
                f"{len(self.stages)} stages>")

    def __str__(self) -> str:
        """The command line's walkthrough table: every head, for the second token (the first if there is one)."""
        try:
            from .render import render_walkthrough
        except ImportError:  # a vendored copy of this module alone
            return repr(self)
        try:
            query = 1 if len(self.tokens) > 1 else 0
            return render_walkthrough(self, query, range(self.config.num_heads), sentence=self._sentence())
        except KeyError:  # a trace of some stages only (stages=[...]) has no table
            return repr(self)

    def _sentence(self) -> str | None:
        sentence = (self.request or {}).get("sentence")
        return sentence if isinstance(sentence, str) else None

    def _subject(self) -> str:
        sentence = self._sentence()
        text = sentence if sentence is not None else " ".join(self.texts)
        return repr(text if len(text) <= 60 else text[:59] + "…")

    def request_body(self) -> dict[str, Any]:
        """The /trace request of this trace: as it was sent, or, for a trace read from JSON, one that asks for the
        same (the tokens as given, and the configuration from ``config``)."""
        if self.request is not None:
            return dict(self.request)
        cfg = self.raw["config"]
        body: dict[str, Any] = {"tokens": self.texts}
        # every declared field the answer echoes, as in use (a stack's resolved settings too), and decode
        body |= {f.name: cfg[f.name] for f in _fields.FIELDS if f.echoed and cfg.get(f.name) is not None}
        body |= {"decode": cfg["decode"]} if "decode" in cfg else {}
        if self.raw.get("context_tokens") is not None:
            body["context_tokens"] = [t["text"] for t in self.raw["context_tokens"]]
        return body

    def html(self, comparison: Trace | None = None) -> str:
        """The viewer's offline page of this trace, as ``POST /trace/html`` makes it (one self-contained file: the
        maps, the walkthrough, a cell explained number by number; no network). ``comparison``: the same request with
        ``scale`` flipped, for the "why divide by √d_k" section. Needs the service package (``pip install
        attention-trace``), and a trace with every stage."""
        from viewer.offline_page import render_html

        return render_html(self.raw, self.request_body(), comparison=None if comparison is None else comparison.raw)

    def _repr_html_(self) -> str | None:
        """Jupyter's rich display: the offline page in an iframe (``srcdoc``, sandboxed: its scripts run, nothing
        else). None (so the text repr shows) without the service package or for a trace of some stages only."""
        try:
            page = self.html()
        except (ImportError, ValueError):
            return None
        return (f'<iframe srcdoc="{_html.escape(page, quote=True)}" sandbox="allow-scripts allow-downloads" '
                f'title="attention-trace: {_html.escape(self._subject(), quote=True)}" loading="lazy" '
                'style="width: 100%; height: 720px; border: 1px solid #d7dbe2; border-radius: 8px"></iframe>')

    @classmethod
    def from_json(cls, doc: dict[str, Any], request_id: str | None = None, *,
                  request: Mapping[str, Any] | None = None) -> Trace:
        return cls(doc, request_id, request=request)


class Mismatch(Answer):
    """A stage's first wrong value: ``index``, ``expected`` (None: the reference masks it) and ``received`` (None:
    null was sent; "NaN", "Infinity", "-Infinity": a non-finite value)."""


class NonFinite(Answer):
    """The NaN and ±Infinity values of a submitted stage (schema 1.1.0): ``count``, and ``first``, the first few as
    (index, "NaN" | "Infinity" | "-Infinity")."""

    _read = {"first": lambda values: [(list(v["index"]), v["value"]) for v in values]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | None) -> NonFinite | None:
        return None if doc is None else cls(doc)


class StageCheck(Answer):
    """How one submitted stage, ``id``, compares with the reference: ``passed``, ``shape_ok``, ``mismatches``,
    ``first_mismatch``, ``message`` … as the answer sends them. ``rel_error``, ``abs_tolerance``, ``non_finite``
    and ``treated_as_masked`` are new in schema 1.1.0: None (0 for ``treated_as_masked``) from a 1.0.0 service."""

    _read = {"first_mismatch": Mismatch, "non_finite": NonFinite}
    _absent = {"rel_error": None, "abs_tolerance": None, "non_finite": None, "treated_as_masked": 0}

    def __init__(self, id: str, raw: Mapping[str, Any]) -> None:
        super().__init__(raw)
        object.__setattr__(self, "id", id)

    @classmethod
    def from_json(cls, sid: str, doc: Mapping[str, Any]) -> StageCheck:
        return cls(sid, doc)


class Hint(Answer):
    """What a student's numbers show when no known bug matches (schema 1.1.0): ``code`` and ``message``."""


class Diagnosis(Answer):
    """``bug``, the known mistake that reproduces the submission (or None), its ``summary``, every one that
    ``matches``, the ``message``, and ``hints`` (empty from a 1.0.0 service)."""

    _read = {"matches": list, "hints": lambda hints: [Hint(h) for h in hints]}
    _absent = {"hints": list}


class Tolerance(Answer):
    """How values were compared. ``metric`` is ``allclose`` (``rtol``, ``atol``,
    ``stage_rtol``) or ``rel_error`` (``threshold``); parameters that do not
    apply are None. A 1.0.0 document has only rtol and atol: allclose,
    stage_rtol 0."""

    _absent = {"rtol": None, "atol": None, "metric": "allclose", "stage_rtol": 0.0, "threshold": None}

    def __str__(self) -> str:
        if self.metric == "rel_error":
            return f"rel_error ≤ {self.threshold:g}"
        text = f"rtol {self.rtol:g} · atol {self.atol:g}"
        return text + (f" · stage_rtol {self.stage_rtol:g}" if self.stage_rtol else "")


class CheckResult(Answer):
    """A /check answer, read from its document (``raw``, exactly as received): ``passed``, ``first_wrong_stage``,
    ``diagnosis``, ``message``, ``stages`` (stage id -> :class:`StageCheck`), ``config``, ``tolerance``, and every
    other member as sent."""

    _read = {"diagnosis": Diagnosis, "config": lambda doc: Config.from_json(doc), "tolerance": Tolerance,
             "stages": lambda doc: {sid: StageCheck(sid, s) for sid, s in doc.items()}}

    def __init__(self, raw: Mapping[str, Any], request_id: str | None = None) -> None:
        super().__init__(raw)
        object.__setattr__(self, "request_id", request_id)

    def __repr__(self) -> str:
        if self.passed:
            return f"<CheckResult: passed, {len(self.stages)} stage{'s' if len(self.stages) != 1 else ''} checked>"
        first = self.first_wrong_stage
        step = f" (step {self.stages[first].step})" if first in self.stages else ""
        bug = f"; matches the bug {self.diagnosis.bug!r}" if self.diagnosis.bug else ""
        return f"<CheckResult: not passed; first wrong stage {first!r}{step}{bug}>"

    def __str__(self) -> str:
        """The command line's verdict: a line per stage, the first wrong one, the diagnosis and the message."""
        try:
            from .render import render_check
        except ImportError:  # a vendored copy of this module alone
            return f"{self!r}\n{self.message}"
        return render_check(self, "the submission")

    @classmethod
    def from_json(cls, doc: dict[str, Any], request_id: str | None = None) -> CheckResult:
        return cls(doc, request_id)


class Explanation(Answer):
    """A /explain answer: one cell's ``steps`` (``step("weight")["value"]``), ``head``, ``query``, ``key``, their
    tokens, ``masked`` and ``mask_reason``, ``config``, and every other member as sent; ``layer`` is the layer of
    a stack's cell (None for one attention layer). ``raw`` is the JSON as received."""

    _read = {"config": lambda doc: Config.from_json(doc), "steps": list}
    _absent = {"layer": None}

    def __init__(self, raw: Mapping[str, Any], request_id: str | None = None) -> None:
        super().__init__(raw)
        object.__setattr__(self, "request_id", request_id)

    def step(self, step_id: str) -> dict[str, Any]:
        """The step with this id: products, score, scaled, row_max, exp, denominator, weight, contributions."""
        for s in self.steps:
            if s["id"] == step_id:
                return s
        raise KeyError(f"no step {step_id!r}; the steps are {', '.join(s['id'] for s in self.steps)}")

    def __repr__(self) -> str:
        cell = f"head {self.head}, query {self.query} {self.query_token!r} → key {self.key} {self.key_token!r}"
        if self.masked:
            return f"<Explanation of {cell}: masked>"
        w = self.step("weight")["value"]
        return f"<Explanation of {cell}: weight {w:.4f} ({100 * w:.2f}%)>"

    def __str__(self) -> str:
        """The command line's lines: each step's formula, its numbers and the stage they come from."""
        try:
            from .render import render_explanation
        except ImportError:  # a vendored copy of this module alone
            return repr(self)
        return render_explanation(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any], request_id: str | None = None) -> Explanation:
        return cls(doc, request_id)


R = TypeVar("R")


@dataclass(frozen=True)
class BatchItem(Generic[R]):
    """One item of a batch: ``result`` when ``status`` is 200, else ``problem``."""

    index: int
    status: int
    result: R | None
    problem: ProblemError | None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.result is not None

    def unwrap(self) -> R:
        """The result, or raise the item's ProblemError."""
        if self.problem is not None:
            raise self.problem
        assert self.result is not None
        return self.result


# ------------------------------------------------------------------- requests


def _json_default(o: Any) -> Any:
    if isinstance(o, np.ndarray):
        return o.tolist()  # masked entries of a numpy masked array become None (null)
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, (tuple, set, frozenset)):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable: send numbers, strings, lists, dicts or numpy arrays")


def encode_json(payload: Any) -> bytes:
    """JSON bytes of a request; numpy arrays and scalars become lists and numbers.

    NaN and infinities are written as the literals NaN, Infinity and
    -Infinity (as Python's json does). In a /check ``submission`` the service
    accepts them and fails the stage that holds one, naming where; anywhere
    else (input, parameters, tolerances) it answers a 422 pointing at the
    value, a better message than a client-side encoding error.
    """
    return json.dumps(payload, default=_json_default, separators=(",", ":"), allow_nan=True).encode("utf-8")


#: the submitted stages that are lists of strings: they stay JSON in an npz body's metadata.json
_TOKEN_STAGES = frozenset({"tokens", "context_tokens"})
#: a /check body at most this large is sent as JSON without asking the service for its limits
_JSON_ALWAYS_BYTES = 64 * 1024


def encode_npz_check(payload: Mapping[str, Any]) -> bytes:
    """A /check request as an ``application/x-npz`` body: ``metadata.json`` is the request, each numeric
    stage of its ``submission`` replaced by ``{"npz": "submission/<stage>"}`` and stored as that member,
    float64 (float32 arrays stay float32: the service reads them as float64 exactly). Masked entries (a
    numpy masked array's mask, or None in lists) go as a boolean ``mask`` member, as the npz answers
    carry them. Everything else stays JSON in metadata.json."""
    import io
    import zipfile

    meta = dict(payload)
    submission = dict(meta.get("submission") or {})
    arrays: dict[str, np.ndarray] = {}
    for sid, values in submission.items():
        if sid in _TOKEN_STAGES:
            continue
        key = f"submission/{sid}"
        mask = None
        if isinstance(values, np.ma.MaskedArray):
            mask = np.ma.getmaskarray(values)
            a = values.filled(np.nan).astype(np.float64)
        elif isinstance(values, np.ndarray) and values.dtype in (np.float32, np.float64):
            a = values
        else:
            try:
                a = np.asarray(values, dtype=np.float64)  # None -> NaN
            except (TypeError, ValueError):  # ragged, or not numbers: sent as JSON, the service says why
                continue
            if np.isnan(a).any():  # a null (masked) or a NaN as sent: tell them apart
                nulls = np.equal(np.array(values, dtype=object), None)  # type: ignore[call-overload]  # as above
                mask = nulls if nulls.any() else None
        arrays[key] = np.ascontiguousarray(a)
        submission[sid] = {"npz": key}
        if mask is not None and mask.any():
            arrays[key + "/mask"] = np.ascontiguousarray(mask, dtype=bool)
            submission[sid]["mask"] = {"npz": key + "/mask"}
    meta["submission"] = submission
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        zf.writestr("metadata.json", encode_json(meta))
        for key, a in arrays.items():
            with zf.open(key + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, a, allow_pickle=False)
    return buf.getvalue()


@dataclass(frozen=True)
class _Body:
    """A request body already encoded, with its media type."""

    data: bytes
    content_type: str


def _encode_request(payload: Any, request_id: str | None,
                    accept: str | None = None) -> tuple[bytes | None, dict[str, str]]:
    """The body and headers of one call, the same over HTTP and in-process."""
    headers = {"Accept": f"{accept or 'application/json'}, application/problem+json"}
    data = None
    if isinstance(payload, _Body):
        data = payload.data
        headers["Content-Type"] = payload.content_type
    elif payload is not None:
        data = encode_json(payload)
        headers["Content-Type"] = "application/json"
    if request_id:
        headers["X-Request-ID"] = request_id
    return data, headers


def _merge(body: Request | None, fields: dict[str, Any]) -> dict[str, Any]:
    if body is None:
        return dict(fields)
    if not isinstance(body, Mapping):
        raise TypeError(f"the request must be a mapping (a JSON object), got {type(body).__name__}")
    return {**body, **fields}


RequestId = Union[str, Callable[[], str], None]


def _check_request_id(rid: str | None) -> str | None:
    if rid is not None and not _REQUEST_ID.fullmatch(rid):
        raise ValueError(f"request_id {rid!r} must be 1 to 128 characters of A-Z a-z 0-9 . _ : - "
                         "(the service would replace it)")
    return rid


class _Base:
    """The API shared by Client and LocalClient; subclasses move the bytes."""

    _default_request_id: RequestId = None

    def _request(self, method: str, path: str, payload: Any, request_id: str | None,
                 accept: str | None = None) -> tuple[Any, str | None]:
        raise NotImplementedError

    def _rid(self, request_id: str | None) -> str | None:
        if request_id is None:
            d = self._default_request_id
            request_id = d() if callable(d) else d
        return _check_request_id(request_id)

    def _call(self, method: str, path: str, payload: Any = None, request_id: str | None = None,
              accept: str | None = None) -> tuple[Any, str | None]:
        return self._request(method, path, payload, self._rid(request_id), accept)

    def trace(self, body: Request | None = None, /, *, request_id: str | None = None, arrays: bool = False,
              **fields: Any) -> Trace:
        """POST /trace: every stage of the layer for one sentence (or token list).

        ``arrays=True`` asks for ``application/x-npz``: every stage arrives as the exact float64
        array (no decimal text; faster for large traces), and each Stage's ``values`` is that array
        (NaN where masked, with ``mask``). The numbers are the JSON answer's, bit for bit."""
        request = _merge(body, fields)
        doc, rid = self._call("POST", "/trace", request, request_id, NPZ if arrays else None)
        return Trace.from_json(_document(doc), rid, request=request)

    def generate(self, sentence: str | Request | None = None, /, *, tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, sample_seed: int | None = None,
                 request_id: str | None = None, **options: Any) -> dict[str, Any]:
        """POST /trace with ``generate``: ``tokens`` tokens generated after the sentence by a stack's language-model
        head (``options`` are /trace's fields; ``block`` defaults to "gpt2" and ``lm_head`` to "tied"). Greedy
        unless ``sample_seed`` is given. Returns the JSON document: ``vocabulary``, ``stages`` (only
        next_token_probs) and ``generation``, one entry per token (its probability, candidates, logits and row of
        attention)."""
        body = {"sentence": sentence} if isinstance(sentence, str) else dict(sentence or {})
        fields: dict[str, Any] = {"block": "gpt2", "lm_head": "tied", "stages": ["next_token_probs"], **options,
                                  "generate": tokens}
        fields |= {name: value for name, value in (("temperature", temperature), ("top_k", top_k),
                                                   ("top_p", top_p), ("sample_seed", sample_seed))
                   if value is not None and not (name == "temperature" and value == 1.0)}
        doc, _ = self._call("POST", "/trace", _merge(body, fields), request_id)
        return _document(doc)

    def trace_npz(self, body: Request | None = None, /, *, request_id: str | None = None, **fields: Any) -> bytes:
        """POST /trace with ``Accept: application/x-npz``: the archive's bytes exactly as the service sent
        them (``np.load`` reads it; :func:`load_npz` turns it back into the JSON's document)."""
        answer, _ = self._call("POST", "/trace", _merge(body, fields), request_id, NPZ)
        if not isinstance(answer, _NpzBody):
            raise ClientError(f"POST /trace answered JSON where {NPZ} was asked for (a service older than 1.1.0?)")
        return answer.content

    def check(self, body: Request | None = None, /, *, request_id: str | None = None, body_format: str = "auto",
              **fields: Any) -> CheckResult:
        """POST /check: compare ``submission`` (stage id -> values) with the reference.

        ``body_format``: ``"json"``, ``"npz"`` (:func:`encode_npz_check`: exact arrays, about a third
        of JSON's size) or ``"auto"``: JSON, unless the JSON body would pass the service's
        ``max_check_body_bytes`` or ``max_check_json_values`` (asked once from GET /version, for a body
        over 64 KiB), then npz, which a service of schema 1.2.0 or later accepts."""
        payload = _merge(body, fields)
        if body_format not in ("auto", "json", "npz"):
            raise ValueError(f'body_format must be "auto", "json" or "npz", got {body_format!r}')
        data = None if body_format == "npz" else encode_json(payload)
        if data is None or (body_format == "auto" and self._over_json_limits(data)):
            send = _Body(encode_npz_check(payload), NPZ)
        else:
            send = _Body(data, "application/json")
        doc, rid = self._call("POST", "/check", send, request_id)
        return CheckResult.from_json(doc, rid)

    _check_limits: dict[str, Any] | None = None

    def _over_json_limits(self, data: bytes) -> bool:
        """Whether a JSON /check body would be refused for its size by a service that takes npz instead."""
        if len(data) <= _JSON_ALWAYS_BYTES:
            return False
        if self._check_limits is None:
            v: Mapping[str, Any]
            try:
                v = self.version()
                major_minor = tuple(int(p) for p in str(v.get("schema_version", "0.0")).split(".")[:2])
            except (ClientError, ValueError):  # no usable /version: send JSON, as a client before npz did
                v, major_minor = {}, (0, 0)
            self._check_limits = dict(v.get("limits", {}), npz=major_minor >= (1, 2))
        limits = self._check_limits
        if not limits["npz"]:
            return False  # an older service: JSON, and its 413 if it is too large
        values = data.count(b",") + data.count(b"[") + data.count(b"{") + 1  # what the service counts
        return (len(data) > limits.get("max_check_body_bytes", 16 * 2**20)
                or values > limits.get("max_check_json_values", 1_000_000))

    def explain(self, sentence: str | Request | None = None, /, *, head: int, query: int, key: int,
                request_id: str | None = None, **options: Any) -> Explanation:
        """POST /explain: every number of one cell (head, query, key; 0-based), from q·k to the weight.

        ``sentence`` is the text, or a whole /trace request body; ``options`` are /trace's fields.
        """
        body = {"sentence": sentence} if isinstance(sentence, str) else sentence
        doc, rid = self._call("POST", "/explain", _merge(body, {**options, "head": head, "query": query, "key": key}),
                              request_id)
        return Explanation.from_json(doc, rid)

    def explain_norm(self, sentence: str | Request | None = None, /, *, cell: str, token: int, feature: int,
                     layer: int = 0, request_id: str | None = None, **options: Any) -> dict[str, Any]:
        """POST /explain of a stack's norm value: ``cell`` "norm1", "norm2" or "final_norm", the token and the
        feature (0-based), in ``layer``: the token's mean and variance (or mean square), the normalised value,
        γ·x̂ + β. ``options`` are /trace's fields, a block field among them. Returns the JSON document."""
        body = {"sentence": sentence} if isinstance(sentence, str) else sentence
        fields = {**options, "cell": cell, "layer": layer, "token": token, "feature": feature}
        doc, _ = self._call("POST", "/explain", _merge(body, fields), request_id)
        return doc

    def explain_ffn(self, sentence: str | Request | None = None, /, *, token: int, unit: int, layer: int = 0,
                    request_id: str | None = None, **options: Any) -> dict[str, Any]:
        """POST /explain of a stack's feed-forward unit (0-based ``token`` and ``unit`` in ``layer``): the products
        with W_1's row, the pre-activation, the activation (SwiGLU's up projection and gate) and the unit's share
        of the output. ``options`` are /trace's fields, a block field among them. Returns the JSON document."""
        body = {"sentence": sentence} if isinstance(sentence, str) else sentence
        fields = {**options, "cell": "ffn", "layer": layer, "token": token, "unit": unit}
        doc, _ = self._call("POST", "/explain", _merge(body, fields), request_id)
        return doc

    def export(self, sentence: str | Request | None = None, /, *, format: str, request_id: str | None = None,
               **options: Any) -> dict[str, Any]:
        """POST /export: the trace in a viewer's input format, ``"bertviz"``, ``"circuitsvis"`` or
        ``"transformer-explainer"``; the answer's ``data`` holds it (docs/interop.md, "Exports").

        ``sentence`` is the text, or a whole /trace request body; ``options`` are /trace's fields.
        Returns the JSON document as sent; ``attention_trace.export`` turns it into the Python
        viewers' arguments.
        """
        body = {"sentence": sentence} if isinstance(sentence, str) else sentence
        doc, _ = self._call("POST", "/export", _merge(body, {**options, "format": format}), request_id)
        return doc

    def _batch(self, path: str, items: Iterable[Request], wrap: Callable[[dict[str, Any], str | None], R],
               request_id: str | None, accept: str | None = None) -> list[BatchItem[R]]:
        answer, rid = self._call("POST", path, {"items": [dict(i) for i in items]}, request_id, accept)
        doc = _document(answer)
        out: list[BatchItem[R]] = []
        for r in doc["results"]:
            problem = None if r["problem"] is None else ProblemError.from_document(r["problem"], request_id=rid)
            result = None if r["result"] is None else wrap(r["result"], rid)
            out.append(BatchItem(r["index"], r["status"], result, problem))
        return out

    def trace_batch(self, items: Iterable[Request], *, request_id: str | None = None,
                    arrays: bool = False) -> list[BatchItem[Trace]]:
        """POST /trace/batch: each item answered on its own; a bad item does not fail the rest.
        ``arrays=True``: exact float64 arrays, as :meth:`trace`."""
        return self._batch("/trace/batch", items, Trace.from_json, request_id, NPZ if arrays else None)

    def check_batch(self, items: Iterable[Request], *, request_id: str | None = None) -> list[BatchItem[CheckResult]]:
        """POST /check/batch."""
        return self._batch("/check/batch", items, CheckResult.from_json, request_id)

    def health(self, *, request_id: str | None = None) -> Health:
        """GET /health: ``{"status": "ok"}``."""
        return self._call("GET", "/health", None, request_id)[0]

    def version(self, *, request_id: str | None = None) -> VersionInfo:
        """GET /version: versions, limits, stage ids and the known bugs."""
        return self._call("GET", "/version", None, request_id)[0]

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------- HTTP


class Client(_Base):
    """The attention-trace service over HTTP.

    ``timeout``: seconds, one number for both or ``(connect, read)``.
    ``retries``: how many times to retry after the first attempt, only on a
    connection error (refused, reset, DNS, connect timeout) or a 503; waits
    ``backoff·2^(attempt−1)`` seconds (jittered, at most ``backoff_max``, longer
    if the 503 says ``Retry-After``). A read timeout, any other status and
    every 4xx are final: the service is stateless, but a request that timed
    out is usually one that is too big, and retrying it would only add load.
    ``request_id``: an ``X-Request-ID`` to send with every request, or a
    function making one per call (each call may pass its own); retries of a
    call reuse its ID.
    """

    def __init__(self, url: str, timeout: float | tuple[float, float] = DEFAULT_TIMEOUT,
                 retries: int = DEFAULT_RETRIES, *, backoff: float = 0.25, backoff_max: float = 8.0,
                 request_id: RequestId = None, session: requests.Session | None = None) -> None:
        if not re.match(r"^https?://[^/]", url or ""):
            raise ValueError(f"url must be an http:// or https:// URL, got {url!r}")
        if isinstance(timeout, (int, float)):
            timeout = (float(timeout), float(timeout))
        connect, read = (float(t) for t in timeout)
        if connect <= 0 or read <= 0:
            raise ValueError(f"timeouts must be positive, got {timeout!r}")
        if retries < 0 or backoff < 0 or backoff_max < 0:
            raise ValueError("retries, backoff and backoff_max must not be negative")
        self.url = url.rstrip("/")
        self.timeout = (connect, read)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.backoff_max = float(backoff_max)
        if isinstance(request_id, str):
            _check_request_id(request_id)
        self._default_request_id = request_id
        self._own_session = session is None
        self.session = session or requests.Session()
        if session is None:  # a caller's session keeps its own User-Agent
            self.session.headers["User-Agent"] = (f"attention-trace-client/{_client_version()} "
                                                  f"{requests.utils.default_user_agent()}")

    def __repr__(self) -> str:
        return f"Client({self.url!r}, timeout={self.timeout!r}, retries={self.retries!r})"

    def close(self) -> None:
        if self._own_session:
            self.session.close()

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        delay = min(self.backoff_max, self.backoff * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
        if retry_after and retry_after.strip().isdigit():
            delay = max(delay, min(self.backoff_max, float(retry_after)))
        return delay

    def _request(self, method: str, path: str, payload: Any, request_id: str | None,
                 accept: str | None = None) -> tuple[Any, str | None]:
        url = self.url + path
        data, headers = _encode_request(payload, request_id, accept)
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = self.session.request(method, url, data=data, headers=headers, timeout=self.timeout,
                                            allow_redirects=False)
            except requests.ConnectionError as e:  # includes ConnectTimeout; not ReadTimeout
                if attempt <= self.retries:
                    time.sleep(self._delay(attempt, None))
                    continue
                raise TransportError(f"could not connect to {self.url} ({method} {path}) after {attempt} "
                                     f"attempt{'s' if attempt > 1 else ''}: {_reason(e)}",
                                     url=url, attempts=attempt, cause=e) from None
            except requests.Timeout as e:
                raise TransportError(f"{self.url} did not answer {method} {path} within {self.timeout[1]:g} s "
                                     "(the read timeout; not retried)", url=url, attempts=attempt, cause=e) from None
            except requests.RequestException as e:
                raise TransportError(f"{method} {url} failed: {e}", url=url, attempts=attempt, cause=e) from None
            if resp.status_code in RETRY_STATUSES and attempt <= self.retries:
                delay = self._delay(attempt, resp.headers.get("Retry-After"))
                resp.close()
                time.sleep(delay)
                continue
            return _answer(resp.status_code, resp.headers, resp.content, resp.reason, method, url)


def _reason(e: BaseException) -> str:
    """The innermost useful text of a requests/urllib3 connection error."""
    text = str(e)
    m = re.search(r"\[Errno -?\d+\] [^'\")\]]+|Connection refused|timed out|Name or service not known|"
                  r"RemoteDisconnected\([^)]*\)|Connection reset by peer", text)
    return m.group(0) if m else text[:300]


def _answer(status: int, headers: Mapping[str, str], content: bytes, reason: str | None, method: str,
            url: str) -> tuple[Any, str | None]:
    """A response's document, or the ProblemError it stands for (HTTP and in-process alike)."""
    rid = headers.get("X-Request-ID")
    if 200 <= status < 300 and headers.get("Content-Type", "").split(";")[0].strip() == NPZ:
        return _NpzBody(content, f"{method} {url}"), rid
    try:
        doc = json.loads(content)
    except ValueError:
        doc = None
    if 200 <= status < 300:
        if doc is None:
            raise ClientError(f"{method} {url} answered {status} with a body that is not JSON "
                              f"({headers.get('Content-Type', 'no Content-Type')})")
        return doc, rid
    if isinstance(doc, dict) and "title" in doc and "status" in doc:
        raise ProblemError.from_document(doc, status=status, request_id=rid)
    if 300 <= status < 400:
        detail = f"{method} {url} was redirected to {headers.get('Location', '?')}; use that URL"
    else:
        snippet = " ".join(content.decode("utf-8", "replace").split())[:200]
        detail = f"{method} {url} answered {status} without problem details" + (f": {snippet}" if snippet else "")
    raise ProblemError(status, "about:blank", reason or f"HTTP {status}", detail, request_id=rid)


# ------------------------------------------------------------------ in-process


class LocalClient(_Base):
    """The same interface, answered in this process by the service itself: no server.

    Each call is an HTTP request to ``create_app(settings).test_client()``, the
    very app that gunicorn serves (validation, engine, serialisation, problem
    documents, request ids), so its answers are byte-identical to the
    service's by construction. Needs the full package (service, engine,
    flask, pydantic).
    """

    def __init__(self, settings: Any = None, *, request_id: RequestId = None) -> None:
        try:
            from service import create_app
            from service.settings import Settings
        except ImportError as e:  # pragma: no cover - only a client-only install lacks them
            raise ImportError(f"LocalClient needs the attention-trace service package ({e}); "
                              "install attention-trace, or use Client(url)") from e
        self.settings = settings if settings is not None else Settings()
        self._http = create_app(self.settings).test_client()
        if isinstance(request_id, str):
            _check_request_id(request_id)
        self._default_request_id = request_id

    def __repr__(self) -> str:
        return "LocalClient()"

    def _request(self, method: str, path: str, payload: Any, request_id: str | None,
                 accept: str | None = None) -> tuple[Any, str | None]:
        data, headers = _encode_request(payload, request_id, accept)
        resp = self._http.open(path, method=method, data=data, headers=headers)
        # werkzeug's Headers reads as a mapping of names to values (case-insensitive, as requests' own)
        return _answer(resp.status_code, cast(Mapping[str, str], resp.headers), resp.get_data(),
                       resp.status.partition(" ")[2], method, f"local:{path}")
