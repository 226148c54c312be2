"""Cheap requests answered on the worker's event loop (service/worker.py, ``BufferedWorker._cheap``).

A request whose body is small and framed by Content-Length is costed by the
app's ``request_cost`` on the event loop; one it expects to cost at most
``inline_max`` is answered there when the work thread is idle and nothing is
queued, and everything it adds to the environ goes with the request to
whichever thread answers. tests/inline_app.py says which thread ran it and
what its estimate saw; the service's own estimate is tested at the end.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import orjson
import pytest

from conftest import Gunicorn
from test_hostile import JSON, request_bytes

pytestmark = pytest.mark.integration

TESTS = str(Path(__file__).resolve().parent)


def start(**env: str) -> Gunicorn:
    return Gunicorn(workers=1, app="inline_app:app", env={"PYTHONPATH": TESTS, **env})


@pytest.fixture(scope="module")
def server():
    s = start()
    try:
        yield s
    finally:
        s.stop()


def exchange(server: Gunicorn, raw: bytes, answers: int = 1, within: float = 10.0) -> list[dict]:
    """Send raw bytes on one connection; the JSON bodies of the first `answers` answers."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=within) as s:
        s.sendall(raw)
        data = b""
        docs: list[dict] = []
        deadline = time.monotonic() + within
        while len(docs) < answers and time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            while True:  # every complete answer so far (the test app always sends Content-Length)
                head, sep, rest = data.partition(b"\r\n\r\n")
                if not sep:
                    break
                length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                if len(rest) < length:
                    break
                assert head.startswith(b"HTTP/1.1 200"), head
                docs.append(json.loads(rest[:length]))
                data = rest[length:]
        assert len(docs) == answers, f"{len(docs)} of {answers} answers within {within} s"
        return docs


def post(server: Gunicorn, path: str, body: bytes, **kw) -> dict:
    return exchange(server, request_bytes("POST", path, body, **kw))[0]


def test_a_cheap_request_is_answered_on_the_event_loop_with_what_its_estimate_added(server):
    body = b'{"sentence": "the cat sat"}'
    got = post(server, "/cost/1", body)
    assert got == {"thread": "MainThread", "body": body.decode(), "seen": body.decode()}


def test_a_costly_request_goes_to_the_work_thread_with_what_its_estimate_added(server):
    body = b'{"sentence": "the cat sat"}'
    got = post(server, "/cost/50", body)  # over the default inline_max of 5 ms
    assert got == {"thread": "lane-work", "body": body.decode(), "seen": body.decode()}


def test_an_unknown_or_failed_estimate_sends_the_request_to_the_work_thread(server):
    assert post(server, "/none", b"{}") == {"thread": "lane-work", "body": "{}", "seen": None}
    assert post(server, "/raise", b"{}") == {"thread": "lane-work", "body": "{}", "seen": None}
    assert "request_cost failed" in server.log.read_text(errors="replace")


def test_only_small_bodies_framed_by_content_length_are_costed(server):
    at_limit = b"x" * 2048
    assert post(server, "/cost/1", at_limit)["thread"] == "MainThread"
    over = b"x" * 2049
    assert post(server, "/cost/1", over) == {"thread": "lane-work", "body": over.decode(), "seen": None}
    chunked = post(server, "/cost/1", b"small", chunked=True)
    assert chunked == {"thread": "lane-work", "body": "small", "seen": None}
    get = exchange(server, request_bytes("GET", "/cost/1"))[0]
    assert get == {"thread": "lane-fast", "body": "", "seen": None}


def test_pipelined_requests_are_each_costed_on_their_own_bytes(server):
    first, second = b'{"n": 1, "pad": "aaaa"}', b'{"n": 2}'
    keep = request_bytes("POST", "/cost/1", first).replace(b"Connection: close", b"Connection: keep-alive")
    docs = exchange(server, keep + request_bytes("POST", "/cost/1", second), answers=2)
    assert [d["seen"] for d in docs] == [first.decode(), second.decode()]
    assert [d["body"] for d in docs] == [first.decode(), second.decode()]
    assert {d["thread"] for d in docs} == {"MainThread"}


def test_a_cheap_request_waits_its_turn_while_the_work_thread_is_busy(server, tmp_path):
    started = tmp_path / "started"
    slow: dict = {}

    def send_slow() -> None:
        slow["answer"] = post(server, "/sleep/1.5", str(started).encode())

    t = threading.Thread(target=send_slow)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while not started.exists():  # the slow request is running in the work thread from here
            assert time.monotonic() < deadline, "the slow request did not start within 10 s"
            time.sleep(0.01)
        seen = time.monotonic()
        got = post(server, "/cost/1", b"{}")
        waited = time.monotonic() - seen
    finally:
        t.join(10)
    assert slow["answer"]["thread"] == "lane-work"
    assert got == {"thread": "lane-work", "body": "{}", "seen": None}  # queued behind it, not costed
    assert waited > 1.0  # answered after the slow one's 1.5 s, in order


def test_inline_max_zero_asks_nothing_and_answers_every_request_in_its_lane():
    s = start(GUNICORN_INLINE_MS="0")
    try:
        assert post(s, "/cost/1", b"{}") == {"thread": "lane-work", "body": "{}", "seen": None}
    finally:
        s.stop()


# ------------------------------------------------------------------ the service's estimate


def test_the_service_costs_a_trace_body_as_its_budget_does_and_nothing_else():
    from service import budget, compression, create_app
    from service.edge import VALIDATED
    from service.routes.trace import TraceRequest
    from service.settings import Settings

    settings = Settings()
    app = create_app(settings)
    body = b'{"sentence": "the cat sat", "d_model": 24, "num_heads": 4}'
    seconds, extra = app.request_cost("POST", "/trace", body)
    want = TraceRequest.model_validate_json(body, context={"settings": settings})
    assert seconds == compression.estimate_s(budget.cost("/trace", [want]))
    model, seen, req, estimate = extra[VALIDATED]
    assert model is TraceRequest and seen == body and req == want and estimate == seconds
    assert app.request_cost("POST", "/trace", b'{"sentence": "the cat sat", "d_model": 25, "num_heads": 4}') is None  # 422
    assert app.request_cost("POST", "/trace", b"not json") is None
    assert app.request_cost("GET", "/trace", body) is None
    assert app.request_cost("POST", "/check", body) is None
    assert app.request_cost("POST", "/trace/html", body) is None


def test_a_body_the_estimate_validated_is_not_validated_again(monkeypatch):
    from service import budget, create_app
    from service.edge import VALIDATED
    from service.routes.trace import TraceRequest, render_trace
    from service.settings import Settings

    settings = Settings()
    app = create_app(settings)
    body = b'{"sentence": "the cat sat", "d_model": 24, "num_heads": 4}'
    _, extra = app.request_cost("POST", "/trace", body)
    validations: list[bytes] = []
    original = TraceRequest.model_validate_json

    def counted(data, **kw):
        validations.append(data)
        return original(data, **kw)

    monkeypatch.setattr(TraceRequest, "model_validate_json", counted)
    costed: list[str] = []
    original_cost = budget.cost

    def counted_cost(path, specs):
        costed.append(path)
        return original_cost(path, specs)

    monkeypatch.setattr(budget, "cost", counted_cost)
    client = app.test_client()
    r = client.post("/trace", data=body, content_type=JSON, environ_overrides=extra)
    assert r.status_code == 200 and validations == [] and costed == []  # nor costed again
    assert r.data == render_trace(extra[VALIDATED][2])
    # another body than the one validated: validated as usual, and answered for itself
    other = b'{"sentence": "the dog ran", "d_model": 24, "num_heads": 4}'
    r = client.post("/trace", data=other, content_type=JSON, environ_overrides=extra)
    assert r.status_code == 200 and validations == [other] and costed == ["/trace"]
    assert orjson.loads(r.data)["tokens"][1]["text"] == "dog"
