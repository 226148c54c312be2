"""Contract fuzzing: schemathesis against the committed openapi.yaml on the WSGI
app (in process, fixed seed, bounded examples, every check on), and
hypothesis-generated /trace requests whose JSON answers must satisfy the
engine's invariants.

Deterministic: schemathesis gets a fixed seed and hypothesis runs under the
"ci" profile (derandomize=True) from conftest.
"""

from __future__ import annotations

import json
import math
import re
import typing
import urllib.parse

import orjson
import pydantic_core
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import yaml
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.openapi.checks import RejectedPositiveData

from conftest import ROOT
from service import create_app
from service.settings import Settings

#: contract fuzzing: make test runs it, make check leaves it out (a quarter of the quick suite's CPU)
pytestmark = pytest.mark.slow

SEED = 20_260_529
#: per operation and phase; POST /trace gets positive and negative examples
MAX_EXAMPLES = 120

load_all_checks()
ALL_CHECKS = list(CHECKS.get_all())

# Every rule the JSON Schema can state is in openapi.yaml (exactly one of
# sentence/tokens among them). Rules it cannot (d_model divisible by num_heads,
# token counts after tokenising, the trace-size bound, characters no tokenizer
# should see, the operator's limits) answer 422, as each operation's 422
# description lists. So a
# schema-valid request may get 422, but only from one of those rules: pydantic's
# built-in error types mean the models and the spec disagree.
BUILTIN_ERROR_TYPES = frozenset(typing.get_args(pydantic_core.core_schema.ErrorType))

CONFIG = schemathesis.Config.from_dict({
    "seed": SEED,
    "generation": {"max-examples": MAX_EXAMPLES, "mode": "all"},
    "checks": {
        # On, with 422 allowed for the rules above; schema_valid_422_names_a_semantic_rule pins that down.
        # (schemathesis' defaults, which include 404 for a path parameter naming nothing, plus 422)
        "positive_data_acceptance": {"expected-statuses": ["2xx", "3xx", "401", "403", "404", "409", "422", "429",
                                                           "5xx"]},
        # Invalid data must be refused: schemathesis' list, plus 413 (a generated invalid body can be larger than
        # the body limit, and is then refused before it is parsed). A 5xx still fails not_a_server_error.
        "negative_data_rejection": {"expected-statuses": ["400", "401", "403", "404", "405", "406", "409", "413",
                                                          "415", "422", "428", "429", "5xx"]},
    },
})
assert all(getattr(CONFIG.projects.default.checks, name).enabled
           for name in ("not_a_server_error", "status_code_conformance", "content_type_conformance",
                        "response_headers_conformance", "response_schema_conformance", "negative_data_rejection",
                        "positive_data_acceptance", "missing_required_header", "unsupported_method",
                        "allow_header_conformance", "use_after_free", "ensure_resource_availability", "ignored_auth"))



def closing(app):
    """Like a WSGI server: read the app's iterable and close() it. schemathesis's
    WSGI transport reads but does not close, which leaks a file (static pages)
    until garbage collection and trips filterwarnings=error."""
    def wsgi(environ, start_response):
        it = app(environ, start_response)
        try:
            return [b"".join(it)]
        finally:
            if hasattr(it, "close"):
                it.close()
    return wsgi


def _npz_body(ctx, value) -> bytes:
    """/check's npz submission body. The schema can only say "a string": a schema-valid (positive) case
    becomes a readable archive whose weights are the generated value's bytes read as float64 (any bits:
    NaN and infinities fail the stage, a 200); any other case goes as raw bytes, which must be a clean
    400 (tests/test_check_npz.py builds the real archives and the hostile ones)."""
    import io
    import zipfile

    import numpy as np

    raw = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
    meta = ctx.case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return raw
    weights = np.frombuffer((raw * 72)[:72].ljust(72, b"\0"), dtype="<f8").reshape(1, 3, 3)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("metadata.json", orjson.dumps({"sentence": "the cat sat", "d_model": 4,
                                                   "submission": {"weights": {"npz": "w"}}}))
        with zf.open("w.npy", "w") as f:
            np.lib.format.write_array(f, weights)
    return buf.getvalue()


schemathesis.serializer("application/x-npz")(_npz_body)

schema = schemathesis.openapi.from_path(ROOT / "openapi.yaml", config=CONFIG)
# WSGI, in process. Compression off: schemathesis advertises br but does not
# decode it over WSGI, and Content-Encoding is transport, not the contract
# (tests/test_compression.py covers it).
schema.app = closing(create_app(Settings(compression=())))


def _at(doc, pointer: str):
    """The value at an RFC 6901 pointer, or KeyError."""
    for part in pointer.split("/")[1:] if pointer else []:
        part = part.replace("~1", "/").replace("~0", "~")
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def _integral_float(body, pointer: str) -> bool:
    """JSON Schema's "integer" admits 24.0; the API is strict and refuses it
    (README: "`24.0` [is] not [an] integer"), a rule the schema cannot state."""
    try:
        value = _at(body, pointer)
    except (KeyError, IndexError, ValueError, TypeError):
        return False
    return isinstance(value, float) and value.is_integer()


def schema_valid_422_names_a_semantic_rule(ctx, response, case) -> None:
    """A schema-valid (positive) request rejected with 422 must blame a rule
    the schema cannot express, never a pydantic built-in constraint."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 422:
        return None
    doc = orjson.loads(response.content)
    builtin = [e for e in doc.get("errors") or [] if e["type"] in BUILTIN_ERROR_TYPES
               and not (e["type"] == "int_type" and _integral_float(case.body, e["pointer"]))]
    if builtin:
        raise AssertionError("schema-valid request rejected by a schema-level rule the spec does not state: "
                             + "; ".join(f"{e['pointer']}: {e['type']}: {e['message']}" for e in builtin[:5]))
    return None


def no_internals_in_the_answer(ctx, response, case) -> None:
    text = response.content.decode("utf-8", "replace")
    # A 404 names the path it was asked for (as sent, and JSON-escaped in problem+json): the client's own words
    # are not the server's internals, whatever they say ("/static/Traceback").
    path = urllib.parse.unquote(urllib.parse.urlsplit(response.request.url).path)
    for echoed in (path, json.dumps(path)[1:-1]):
        text = text.replace(echoed, "")
    assert "Traceback" not in text and 'File "' not in text, text[:300]
    headers = {k.lower(): v for k, v in response.headers.items()}
    assert headers.get("x-content-type-options") in ("nosniff", ["nosniff"])
    assert headers.get("x-request-id")


@schema.parametrize()
@settings(suppress_health_check=list(HealthCheck), deadline=None)
def test_contract(case):
    case.call_and_validate(checks=ALL_CHECKS,
                           additional_checks=[schema_valid_422_names_a_semantic_rule, no_internals_in_the_answer])


# ------------------------------------------- schemathesis' own settings: `run openapi.yaml -c all --mode all`

#: the same run with schemathesis' defaults for every check: a schema-valid request must be answered 2xx, so a
#: 422 is a failure unless it is a conflict JSON Schema cannot state, which the operation's 422 description lists
#: with its error types (service/openapi.py, INVALID_REQUESTS)
STRICT = schemathesis.openapi.from_path(ROOT / "openapi.yaml", config=schemathesis.Config.from_dict(
    {"seed": SEED, "generation": {"mode": "all"}}))
STRICT.app = closing(create_app(Settings(compression=())))
_SPEC = yaml.safe_load((ROOT / "openapi.yaml").read_text(encoding="utf-8"))


def documented_types(path: str, method: str) -> set[str]:
    """The error types an operation's 422 description names (backquoted)."""
    response = _SPEC["paths"][path][method.lower()]["responses"].get("422", {})
    return set(re.findall(r"`([a-z][a-z0-9_]*)`", response.get("description", "")))


def is_documented_conflict(failure: Failure, case, response) -> bool:
    """A schema-valid request refused (422) only by rules the operation's 422 description lists."""
    if not isinstance(failure, RejectedPositiveData) or response.status_code != 422:
        return False
    types = {e["type"] for e in orjson.loads(response.content).get("errors") or []}
    return bool(types) and types <= documented_types(case.operation.path, case.method)


@pytest.mark.slow
@STRICT.parametrize()
@settings(suppress_health_check=list(HealthCheck), deadline=None)
def test_contract_with_every_check_at_its_defaults(case):
    response = case.call()
    try:
        case.validate_response(response, checks=ALL_CHECKS, additional_checks=[no_internals_in_the_answer])
    except (Failure, FailureGroup) as error:
        failures = error.exceptions if isinstance(error, FailureGroup) else (error,)
        if not all(is_documented_conflict(f, case, response) for f in failures):
            raise


def test_a_422_is_documented_only_with_the_types_its_description_names():
    """The filter above lets through nothing else: an undocumented type, or a status other than 422, stays a
    failure."""
    import types

    case = types.SimpleNamespace(operation=types.SimpleNamespace(path="/trace"), method="POST")
    failure = RejectedPositiveData(operation="POST /trace", message="", status_code=422, allowed_statuses=["2xx"])

    def answer(status: int, *kinds: str):
        body = {"errors": [{"pointer": "", "type": k, "message": ""} for k in kinds]}
        return types.SimpleNamespace(status_code=status, content=orjson.dumps(body))

    assert {"head_division", "stage_needs_causal", "trace_too_large"} <= documented_types("/trace", "post")
    assert is_documented_conflict(failure, case, answer(422, "head_division", "stage_needs_causal"))
    assert not is_documented_conflict(failure, case, answer(422, "head_division", "missing"))
    assert not is_documented_conflict(failure, case, answer(422))
    assert not is_documented_conflict(failure, case, answer(400, "head_division"))
    assert "stage_needs_causal" not in documented_types("/trace/html", "post")  # the page has no stages


def test_every_operation_is_fuzzed():
    # Loaded from the file (not from /openapi.yaml), so no operation is skipped as "the schema endpoint".
    ops = {op.ok().label for op in schema.get_all_operations()}
    assert {"POST /trace", "GET /health", "GET /version", "GET /openapi.yaml"} <= ops


# ------------------------------------------------- engine invariants on the JSON


TEXT = st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"))
HEADS = [1, 2, 3, 4, 6, 8]
STAGES = ["tokens", "token_embedding", "positional_encoding", "input", "q", "k", "v", "scores", "scaled_scores",
          "masked_scores", "weights", "context", "concat", "output"]


@st.composite
def trace_requests(draw) -> dict:
    h = draw(st.sampled_from(HEADS))
    req: dict = {"d_model": h * draw(st.integers(1, 8)), "num_heads": h}
    if draw(st.booleans()):
        req["sentence"] = draw(st.text(TEXT, min_size=1, max_size=60).filter(lambda s: not s.isspace()))
    else:
        req["tokens"] = draw(st.lists(st.text(TEXT, min_size=1, max_size=6).filter(lambda s: not s.isspace()),
                                      min_size=1, max_size=12))
    for name, strategy in (("seed", st.integers(0, 2**32 - 1)), ("scale", st.booleans()),
                           ("causal", st.booleans()), ("positional_encoding", st.sampled_from(["sinusoidal", "none"])),
                           ("include_parameters", st.booleans())):
        if draw(st.booleans()):
            req[name] = draw(strategy)
    if draw(st.integers(0, 3)) == 0:
        allowed = STAGES if req.get("causal") else [s for s in STAGES if s != "masked_scores"]
        req["stages"] = draw(st.lists(st.sampled_from(allowed), min_size=1, max_size=4, unique=True))
    if draw(st.integers(0, 4)) == 0:
        req["precision"] = draw(st.integers(0, 17))
    return req


def nested_shape(values) -> list[int]:
    """The shape of a nested list, asserting it is rectangular."""
    if not isinstance(values, list):
        return []
    inner = [nested_shape(v) for v in values]
    assert all(s == inner[0] for s in inner), "ragged array"
    return [len(values), *(inner[0] if inner else [])]


def assert_invariants(req: dict, doc: dict) -> None:
    cfg = doc["config"]
    n, h = cfg["n_tokens"], req["num_heads"]
    d_model, d_k = req["d_model"], req["d_model"] // req["num_heads"]
    assert (cfg["d_model"], cfg["num_heads"], cfg["d_k"]) == (d_model, h, d_k)
    assert n == len(doc["tokens"]) >= 1
    axis_size = {"token": n, "query": n, "key": n, "head": h, "d_k": d_k, "d_model": d_model, "concat": h * d_k}
    precision = req.get("precision")
    # Rounding each of n weights to p places moves a row's sum by at most n·10^-p/2.
    tol = 1e-12 if precision is None else n * 0.5 * 10.0**-precision + 1e-12
    stages = doc["stages"]
    wanted = req.get("stages")
    if wanted is not None:
        assert set(stages) == set(wanted)
    for sid, st_ in stages.items():
        # shapes match axes, and the nested values match the shape
        assert len(st_["axes"]) == len(st_["shape"]), sid
        assert st_["shape"] == [axis_size[a] for a in st_["axes"]], (sid, st_["axes"], st_["shape"])
        assert nested_shape(st_["values"]) == st_["shape"], sid
    if "tokens" in stages:
        assert stages["tokens"]["values"] == [t["text"] for t in doc["tokens"]]
    if "sentence" in req:
        s = req["sentence"]
        assert all(s[t["start"]:t["end"]] == t["text"] for t in doc["tokens"])
    weights = stages.get("weights", {}).get("values")
    if weights is not None:
        for hi in range(h):
            for i in range(n):
                row = weights[hi][i]
                assert all(isinstance(w, float) and 0.0 <= w <= 1.0 for w in row)
                assert math.fsum(row) == pytest.approx(1.0, abs=tol), (hi, i, math.fsum(row))
                if req.get("causal"):
                    assert all(w == 0.0 for w in row[i + 1:]), "a masked key has a non-zero weight"
        if precision is None:
            maxw = doc["stats"]["max_weight"]
            assert [[max(r) for r in head] for head in weights] == maxw
    masked = stages.get("masked_scores")
    if masked is not None:
        scaled = stages.get("scaled_scores")
        for hi in range(h):
            for i in range(n):
                for j in range(n):
                    v = masked["values"][hi][i][j]
                    if j > i:
                        assert v is None, "a masked entry is not null"
                    else:
                        assert isinstance(v, float)
                        if scaled is not None:
                            assert v == scaled["values"][hi][i][j]
    else:
        assert not req.get("causal") or wanted is not None, "causal trace without masked_scores"
    # stats: [head, query], every number finite (orjson refuses NaN/Infinity when parsing)
    assert nested_shape(doc["stats"]["entropy"]) == [h, n]
    assert nested_shape(doc["stats"]["max_weight"]) == [h, n]
    slack = 1e-9 if precision is None else 0.5 * 10.0**-precision + 1e-9  # entropies are rounded too
    assert all(-slack <= e <= math.log(n) + slack for row in doc["stats"]["entropy"] for e in row)
    if req.get("include_parameters"):
        p = doc["parameters"]
        assert nested_shape(p["W_Q"]) == nested_shape(p["W_K"]) == nested_shape(p["W_V"]) == [h, d_k, d_model]
        assert nested_shape(p["W_O"]) == [d_model, h * d_k]
    else:
        assert doc.get("parameters") is None


@given(req=trace_requests())
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow], deadline=None)
def test_trace_json_satisfies_the_engine_invariants(client, req):
    resp = client.post("/trace", data=orjson.dumps(req), content_type="application/json")
    assert resp.status_code == 200, resp.get_data(as_text=True)
    body = resp.get_data()
    doc = orjson.loads(body)  # strict: NaN and Infinity are not JSON and would fail here
    assert_invariants(req, doc)
    # Same question, same answer, byte for byte.
    again = client.post("/trace", data=orjson.dumps(req), content_type="application/json")
    assert again.get_data() == body
