"""The Python client: Client against real gunicorn, LocalClient in-process, and
retries, timeouts and errors against a tiny scripted HTTP server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

import engine
from attention_trace import (
    BatchItem,
    CheckResult,
    Client,
    LocalClient,
    ProblemError,
    Trace,
    TransportError,
)
from service.settings import Settings

from conftest import free_port

pytestmark = pytest.mark.integration

BODY = {"sentence": "the cat sat on the mat", "d_model": 24, "num_heads": 4, "causal": True}
CHECKED = ["scores", "scaled_scores", "masked_scores", "weights", "context", "concat", "output"]


@pytest.fixture(scope="module")
def remote(gunicorn_server) -> Iterator[Client]:
    with Client(gunicorn_server.url, timeout=(2, 20), retries=1, backoff=0.01) as c:
        yield c


@pytest.fixture(scope="module")
def local() -> LocalClient:
    return LocalClient()


@pytest.fixture(params=["remote", "local"])
def client(request, remote, local):
    """Each test runs with both clients: same interface, same answers."""
    return remote if request.param == "remote" else local


# ------------------------------------------------------------------- results


def test_trace_is_typed_and_both_clients_agree(remote, local, spec_checker):
    t = remote.trace(BODY, include_parameters=True)
    u = local.trace(**BODY, include_parameters=True)
    assert t.raw == u.raw  # the same document, float for float
    spec_checker.check("/trace", "POST", 200, "application/json", json.dumps(u.raw).encode())

    assert isinstance(t, Trace) and t.config.d_k == 6 and t.config.num_heads == 4 and t.config.causal
    assert t.texts == ["the", "cat", "sat", "on", "the", "mat"]
    assert (t.tokens[1].index, t.tokens[1].text, t.tokens[1].start, t.tokens[1].end) == (1, "cat", 4, 7)
    ref = engine.trace(engine.TraceConfig(d_model=24, num_heads=4, causal=True), sentence=BODY["sentence"])
    for sid in ("input", "scores", "weights", "context", "concat", "output"):
        a = t.stages[sid].array()
        assert a.dtype == np.float64 and a.shape == t.stages[sid].shape
        assert np.array_equal(a, ref.stages[sid].values), sid  # exact round trip
    masked = t.stages["masked_scores"]
    assert np.array_equal(masked.mask, np.broadcast_to(np.triu(np.ones((6, 6), bool), 1), (4, 6, 6)))
    assert np.isnan(masked.array()[masked.mask]).all() and not np.isnan(masked.array()[~masked.mask]).any()
    assert list(t.stages["tokens"].array()) == t.texts and t.stages["tokens"].mask is None
    assert t.parameters is not None and t.parameters.W_Q.shape == (4, 6, 24) and t.parameters.W_O.shape == (24, 24)
    assert np.array_equal(t.parameters.W_K, ref.parameters.W_K)
    assert t.stats.entropy.shape == (4, 6) and t.injected_bug is None
    assert t.parameters_digest == ref.parameters_digest and t.engine_version == ref.engine_version


def test_missing_stage_says_which_stages_there_are(local):
    t = local.trace(sentence="a b", stages=["weights"])
    assert list(t.stages) == ["weights"] and t.config.stages == ["weights"]
    with pytest.raises(KeyError, match="stage 'output' is not in this trace; it has weights"):
        t.array("output")


def test_injected_bug_is_typed(client):
    t = client.trace(BODY, inject_bug="average_heads", stages=["concat"])
    assert t.injected_bug.name == "average_heads" and "deliberately wrong" in t.injected_bug.warning
    assert t.array("concat").shape == (6, 6)


@pytest.mark.parametrize("bug", ["no_scale", "softmax_wrong_axis"])
def test_check_result_is_typed_and_both_clients_agree(remote, local, spec_checker, bug):
    buggy = local.trace(BODY, inject_bug=bug, stages=CHECKED)
    sub = {sid: buggy.array(sid) for sid in CHECKED}  # numpy arrays, NaN where masked...
    sub["masked_scores"] = np.where(buggy.stages["masked_scores"].mask, None, sub["masked_scores"])  # ...null here
    r = remote.check(BODY, submission=sub)
    s = local.check(BODY, submission=sub)
    assert r.raw == s.raw
    spec_checker.check("/check", "POST", 200, "application/json", json.dumps(s.raw).encode())
    assert isinstance(r, CheckResult) and r.passed is False
    assert r.first_wrong_stage == engine.BUGS[bug].stage
    assert r.diagnosis.bug == bug and bug in r.diagnosis.matches and r.diagnosis.summary == engine.BUGS[bug].summary
    assert r.message.startswith(f"Stage '{r.first_wrong_stage}'") and f"known bug '{bug}'" in r.message
    assert list(r.stages) == CHECKED and r.stages["scores"].passed and r.stages["scores"].mismatches == 0
    wrong = r.stages[r.first_wrong_stage]
    assert not wrong.passed and wrong.shape_ok and wrong.first_mismatch is not None and wrong.step >= 7
    assert r.tolerance.rtol == 1e-5 and r.config.d_k == 6


def test_check_accepts_numpy_and_float32(client):
    t = client.trace(sentence="the cat sat", d_model=8, num_heads=2, stages=["weights", "output"])
    sub = {"weights": t.array("weights").astype(np.float32), "output": t.array("output")}
    r = client.check(sentence="the cat sat", d_model=8, num_heads=2, submission=sub)
    assert r.passed and r.first_wrong_stage is None and r.diagnosis.bug is None


def test_batches(client):
    items = [{"sentence": "the cat"}, {"sentence": "a", "num_heads": 5}, {"tokens": ["x"], "d_model": 4}]
    out = client.trace_batch(items)
    assert [(b.index, b.status, b.ok) for b in out] == [(0, 200, True), (1, 422, False), (2, 200, True)]
    assert isinstance(out[0], BatchItem) and out[0].unwrap().texts == ["the", "cat"]
    assert out[0].unwrap().raw == client.trace(items[0]).raw
    p = out[1].problem
    assert isinstance(p, ProblemError) and p.status == 422 and p.errors[0]["pointer"] == "/items/1/num_heads"
    with pytest.raises(ProblemError, match="not divisible"):
        out[1].unwrap()
    checks = client.check_batch([{"sentence": "a", "submission": {"weights": [[[1.0]]]}},
                                 {"sentence": "a", "submission": {"weights": [[[0.5]]]}}])
    assert [c.unwrap().passed for c in checks] == [True, False]


def test_health_and_version(remote, local):
    assert remote.health() == local.health() == {"status": "ok"}
    rv, lv = remote.version(), local.version()
    assert rv == lv
    assert rv["stage_ids"] == list(engine.ALL_STAGE_IDS) and set(rv["bugs"]) == set(engine.BUGS)


# -------------------------------------------------------------------- errors


@pytest.mark.parametrize(("body", "pointer", "type_"), [
    ({"sentence": "a", "num_heads": 5}, "/num_heads", "head_division"),
    ({"sentence": "a", "d_modle": 8}, "/d_modle", "extra_forbidden"),
    ({"sentence": "a", "d_model": "24"}, "/d_model", "int_type"),
    ({"tokens": ["a"], "d_model": 2, "input": [[float("nan"), 1.0]]}, "/input/0/0", "finite_number"),
])
def test_problem_errors_carry_the_problem_details(remote, local, body, pointer, type_):
    with pytest.raises(ProblemError) as r:
        remote.trace(body)
    with pytest.raises(ProblemError) as s:
        local.trace(body)
    e = r.value
    assert e.to_dict() == s.value.to_dict()  # LocalClient raises what the service answers
    assert e.status == 422 and e.type == "urn:attention-trace:problem:validation-error"
    assert e.kind == "validation-error" and e.title == "Invalid request" and e.instance == "/trace"
    assert e.errors[0]["pointer"] == pointer and e.errors[0]["type"] == type_
    assert e.detail.startswith(pointer) and str(e).startswith("422 Invalid request: ")
    assert e.document["status"] == 422 and e.request_id


def test_check_validation_errors_match(remote, local):
    body = {"sentence": "a b", "d_model": 4, "submission": {"weights": [[True]]}}
    with pytest.raises(ProblemError) as r:
        remote.check(body)
    with pytest.raises(ProblemError) as s:
        local.check(body)
    assert r.value.to_dict() == s.value.to_dict()
    assert r.value.instance == "/check" and r.value.errors[0]["pointer"].startswith("/submission/weights")


def test_local_client_limits_and_body_size():
    small = LocalClient(Settings(max_tokens=2, max_body_bytes=200))
    with pytest.raises(ProblemError) as e:
        small.trace(sentence="a b c")
    assert e.value.status == 422 and e.value.errors[0]["type"] == "too_many_tokens"
    with pytest.raises(ProblemError) as e:
        small.trace(tokens=["x"] * 100)
    assert e.value.status == 413 and e.value.kind == "payload-too-large"


def test_requests_must_be_objects(local):
    with pytest.raises(TypeError, match="mapping"):
        local.trace(["the", "cat"])  # type: ignore[arg-type]


def test_request_id_is_sent_and_returned(gunicorn_server):
    with Client(gunicorn_server.url, request_id="grader-run.42") as c:
        assert c.trace(sentence="a").request_id == "grader-run.42"
        assert c.trace(sentence="a", request_id="item:7").request_id == "item:7"
        with pytest.raises(ProblemError) as e:
            c.trace(sentence="a", num_heads=5, request_id="bad-7")
        assert e.value.request_id == "bad-7"
    ids = iter(["one", "two"])
    with Client(gunicorn_server.url, request_id=lambda: next(ids)) as c:  # one fresh id per call
        assert [c.trace(sentence="a").request_id, c.trace(sentence="b").request_id] == ["one", "two"]
    with Client(gunicorn_server.url) as c:
        assert len(c.trace(sentence="a").request_id) == 32  # the service made one
        with pytest.raises(ValueError, match="request_id"):
            c.trace(sentence="a", request_id="has spaces")


def test_constructor_checks_its_arguments():
    assert Client("http://127.0.0.1:1/", timeout=5).timeout == (5.0, 5.0)
    assert Client("http://127.0.0.1:1").url == "http://127.0.0.1:1"
    for bad in ({"timeout": 0}, {"timeout": (1, -1)}, {"retries": -1}, {"request_id": "a b"}):
        with pytest.raises(ValueError):
            Client("http://127.0.0.1:1", **bad)
    with pytest.raises(ValueError, match="URL"):
        Client("127.0.0.1:8000")


# ------------------------------------------------- retries, against a script


class Scripted(ThreadingHTTPServer):
    """Answers each request with the next scripted (status, headers, body, delay); records them."""

    daemon_threads = True
    block_on_close = False  # do not wait for a handler still sleeping on close

    def __init__(self, script: list[tuple[int, dict[str, str], bytes, float]]) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.script = list(script)
        self.seen: list[tuple[str, str, str | None]] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Scripted

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.seen.append((self.command, self.path, self.headers.get("X-Request-ID")))
        status, headers, body, delay = self.server.script.pop(0) if self.server.script else (599, {}, b"", 0.0)
        time.sleep(delay)
        try:
            self.send_response(status)
            for k, v in {"Content-Length": str(len(body)), **headers}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (read timeout)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:  # keep test output clean
        pass


@pytest.fixture()
def scripted() -> Iterator:
    servers: list[Scripted] = []

    def start(*script):
        s = Scripted(list(script))
        threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def problem(status: int, kind: str, title: str) -> tuple[int, dict[str, str], bytes, float]:
    doc = {"type": f"urn:attention-trace:problem:{kind}", "title": title, "status": status,
           "detail": f"{title}, scripted", "instance": "/trace"}
    return status, {"Content-Type": "application/problem+json"}, json.dumps(doc).encode(), 0.0


HEALTHY = (200, {"Content-Type": "application/json", "X-Request-ID": "r1"}, b'{"status": "ok"}', 0.0)


def test_503_is_retried_then_succeeds(scripted):
    s = scripted(problem(503, "unavailable", "Service Unavailable"), HEALTHY)
    with Client(s.url, retries=2, backoff=0.01, request_id="same-id") as c:
        assert c.health() == {"status": "ok"}
    assert s.seen == [("GET", "/health", "same-id")] * 2  # retried once, with the same request id


def test_503_retries_are_bounded_and_raise_the_problem(scripted):
    s = scripted(*[problem(503, "unavailable", "Service Unavailable")] * 5)
    with Client(s.url, retries=2, backoff=0.01) as c, pytest.raises(ProblemError) as e:
        c.trace(sentence="a")
    assert len(s.seen) == 3 and e.value.status == 503 and e.value.kind == "unavailable"


def test_retry_after_is_honoured_within_backoff_max(scripted):
    s = scripted((503, {"Retry-After": "30"}, b"", 0.0), HEALTHY)
    start = time.monotonic()
    with Client(s.url, retries=1, backoff=0.01, backoff_max=0.3) as c:
        c.health()
    assert 0.3 <= time.monotonic() - start < 2  # waited, but no longer than backoff_max


@pytest.mark.parametrize("status", [500, 502, 429, 404, 422])
def test_other_statuses_are_never_retried(scripted, status):
    s = scripted(problem(status, "x", "Scripted"), HEALTHY)
    with Client(s.url, retries=3, backoff=0.01) as c, pytest.raises(ProblemError) as e:
        c.trace(sentence="a")
    assert len(s.seen) == 1 and e.value.status == status and e.value.detail == "Scripted, scripted"


def test_an_error_without_problem_details_is_still_a_problem_error(scripted):
    s = scripted((502, {"Content-Type": "text/html"}, b"<html><body>bad gateway</body></html>", 0.0))
    with Client(s.url, retries=0) as c, pytest.raises(ProblemError) as e:
        c.health()
    assert e.value.status == 502 and e.value.type == "about:blank" and e.value.title == "Bad Gateway"
    assert "bad gateway" in e.value.detail


def test_connection_errors_are_retried_then_raise():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with Client(url, retries=2, backoff=0.01) as c, pytest.raises(TransportError) as e:
        c.health()
    assert e.value.attempts == 3 and "Connection refused" in str(e.value) and e.value.url == url + "/health"


def test_read_timeout_is_not_retried(scripted):
    s = scripted((200, {}, b"{}", 0.8), HEALTHY)
    with Client(s.url, timeout=(1.0, 0.2), retries=3, backoff=0.01) as c, pytest.raises(TransportError) as e:
        c.health()
    # one attempt, one request seen: no retry (the count proves it; a wall-clock bound would only measure the load)
    assert e.value.attempts == 1 and len(s.seen) == 1 and "within 0.2 s" in str(e.value)
