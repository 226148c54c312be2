"""Response compression: brotli quality 1 for large JSON when the client accepts it."""

from __future__ import annotations

import gzip

import brotli
import pytest

BIG = {"sentence": "the cat sat on the mat and looked at the dog", "d_model": 64, "num_heads": 4}  # ~157 KB
#: gzip costs ~1.5× br a byte: compressing BIG would cost more than computing it (service/compression.py)
BIG_GZ = {**BIG, "d_model": 128}  # ~281 KB, 3.8 ms of estimated work
SMALL = {"sentence": "the cat sat", "d_model": 4}  # ~3 KB


def test_large_json_is_brotli_compressed_when_accepted(client):
    plain = client.post("/trace", json=BIG)
    packed = client.post("/trace", json=BIG, headers={"Accept-Encoding": "gzip, deflate, br"})
    assert "Content-Encoding" not in plain.headers and "Accept-Encoding" in plain.headers["Vary"]
    assert packed.headers["Content-Encoding"] == "br" and "Accept-Encoding" in packed.headers["Vary"]
    raw = plain.get_data()
    assert brotli.decompress(packed.get_data()) == raw  # the very same bytes, decoded
    assert len(packed.get_data()) < 0.6 * len(raw)
    # Deterministic: the same request gives the same compressed bytes.
    again = client.post("/trace", json=BIG, headers={"Accept-Encoding": "br"})
    assert again.get_data() == packed.get_data()


def test_small_bodies_and_clients_without_br_are_not_compressed(client):
    small = client.post("/trace", json=SMALL, headers={"Accept-Encoding": "br"})
    assert "Content-Encoding" not in small.headers and len(small.get_data()) < 16384
    gz_only = client.post("/trace", json=BIG, headers={"Accept-Encoding": "gzip"})  # gzip is opt-in
    assert "Content-Encoding" not in gz_only.headers
    refused = client.post("/trace", json=BIG, headers={"Accept-Encoding": "br;q=0"})
    assert "Content-Encoding" not in refused.headers


def test_gzip_when_the_operator_enables_it(app_factory):
    client = app_factory(compression=("br", "gzip")).test_client()
    resp = client.post("/trace", json=BIG_GZ, headers={"Accept-Encoding": "gzip"})
    assert resp.headers["Content-Encoding"] == "gzip"
    plain = client.post("/trace", json=BIG_GZ).get_data()
    assert gzip.decompress(resp.get_data()) == plain
    assert client.post("/trace", json=BIG_GZ, headers={"Accept-Encoding": "gzip"}).get_data() == resp.get_data()
    prefers = client.post("/trace", json=BIG_GZ, headers={"Accept-Encoding": "gzip, br"})
    assert prefers.headers["Content-Encoding"] == "br"  # the operator's order decides


def test_compression_off(app_factory):
    client = app_factory(compression=()).test_client()
    resp = client.post("/trace", json=BIG, headers={"Accept-Encoding": "br, gzip"})
    assert "Content-Encoding" not in resp.headers


def test_compression_never_costs_more_than_the_answer(client, app_factory):
    """brotli costs ~6.2 ns a byte; the largest traces cost ~2.6 ns a byte to produce. Compressing
    them would more than double the request's CPU (measured: 270 ms → 643 ms), so they go out
    as they are, while an answer that was expensive to compute for its size is compressed."""
    import time

    from tools import measure_limits

    largest = {**measure_limits.largest_trace(), "seed": 4242}
    plain = app_factory(response_cache_bytes=0).test_client()
    t = time.thread_time()
    resp = plain.post("/trace", json=largest, headers={"Accept-Encoding": "br"})
    cpu = time.thread_time() - t
    assert resp.status_code == 200 and "Content-Encoding" not in resp.headers
    assert "Accept-Encoding" in resp.headers["Vary"] and len(resp.get_data()) > 30e6
    # the weights of d_model 512 are 1 M generated numbers: a 256 KB answer is worth compressing
    costly = {"sentence": "the cat sat on the mat", "d_model": 512, "num_heads": 8, "seed": 4243}
    resp = plain.post("/trace", json=costly, headers={"Accept-Encoding": "br"})
    assert resp.headers["Content-Encoding"] == "br"
    assert cpu < 10  # sanity: the largest trace is a fraction of a second, not a hang


def test_compression_setting_from_env():
    from service.settings import Settings

    assert Settings.from_env({"ATTENTION_TRACE_COMPRESSION": "off"}).compression == ()
    assert Settings.from_env({"ATTENTION_TRACE_COMPRESSION": "gzip, br"}).compression == ("gzip", "br")
    with pytest.raises(ValueError, match="br and/or gzip"):
        Settings.from_env({"ATTENTION_TRACE_COMPRESSION": "zstd"})


# ----------------------------------------------------------- the response cache


def test_response_cache_gives_the_same_bytes_as_a_miss(app_factory):
    cached = app_factory()
    uncached = app_factory(response_cache_bytes=0)
    body = b'{"sentence": "the cat sat", "d_model": 24, "num_heads": 4}'
    first = cached.test_client().post("/trace", data=body, content_type="application/json")
    second = cached.test_client().post("/trace", data=body, content_type="application/json")
    plain = uncached.test_client().post("/trace", data=body, content_type="application/json")
    assert first.get_data() == second.get_data() == plain.get_data()
    assert len(cached.extensions["attention_trace.responses"]) == 1
    assert uncached.extensions["attention_trace.responses"] is None


def test_response_cache_keeps_only_successes_and_stays_bounded(app_factory):
    app = app_factory(response_cache_bytes=20_000)  # room for about three one-token traces
    client, cache = app.test_client(), app.extensions["attention_trace.responses"]
    assert client.post("/trace", json={"sentence": "a", "num_heads": 5}).status_code == 422
    assert len(cache) == 0  # errors are never cached: validation runs every time
    for word in ("alpha", "beta", "gamma", "delta", "epsilon"):
        assert client.post("/trace", json={"sentence": word}).status_code == 200
    assert 0 < cache.size <= 20_000 and len(cache) < 5  # the oldest were evicted
    big = client.post("/trace", json={"tokens": ["x"] * 64, "d_model": 64})  # > 256 KiB: not kept
    assert len(big.get_data()) > 256 * 1024 and big.get_data() not in cache._entries.values()


@pytest.mark.parametrize("existing", [None, "", "Accept", "accept-encoding", "Accept, Origin", "Origin,Accept-Encoding",
                                      "Cookie, ACCEPT-ENCODING , Origin"])
def test_add_vary_does_what_werkzeug_does(existing):
    """service.compression.add_vary (a string edit) gives the Vary header werkzeug's resp.vary.add gives."""
    from flask import Response

    from service.compression import add_vary

    for name in ("Accept-Encoding", "Accept", "Origin"):
        ours, theirs = Response(), Response()
        if existing is not None:
            ours.headers["Vary"] = theirs.headers["Vary"] = existing
        add_vary(ours, name)
        theirs.vary.add(name)
        assert {v.strip().lower() for v in ours.headers["Vary"].split(",")} == \
            {v.strip().lower() for v in theirs.headers["Vary"].split(",") if v.strip()}, (existing, name)
        assert ours.headers.get_all("Vary") == [ours.headers["Vary"]]


def test_no_accept_encoding_header_means_identity(client):
    """Without Accept-Encoding the answer goes out as it is (the header is not parsed), still with Vary."""
    for headers in ({}, {"Accept-Encoding": ""}):
        resp = client.post("/trace", json=BIG, headers=headers)
        assert "Content-Encoding" not in resp.headers and "Accept-Encoding" in resp.headers["Vary"]
        assert resp.get_data() == client.post("/trace", json=BIG, headers={"Accept-Encoding": "identity"}).get_data()
