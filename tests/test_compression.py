"""Response compression: brotli quality 1 for large JSON when the client accepts it."""

from __future__ import annotations

import gzip

import brotli
import pytest

BIG = {"sentence": "the cat sat on the mat and looked at the dog", "d_model": 64, "num_heads": 4}  # ~100 KB
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
    resp = client.post("/trace", json=BIG, headers={"Accept-Encoding": "gzip"})
    assert resp.headers["Content-Encoding"] == "gzip"
    plain = client.post("/trace", json=BIG).get_data()
    assert gzip.decompress(resp.get_data()) == plain
    assert client.post("/trace", json=BIG, headers={"Accept-Encoding": "gzip"}).get_data() == resp.get_data()
    prefers = client.post("/trace", json=BIG, headers={"Accept-Encoding": "gzip, br"})
    assert prefers.headers["Content-Encoding"] == "br"  # the operator's order decides


def test_compression_off(app_factory):
    client = app_factory(compression=()).test_client()
    resp = client.post("/trace", json=BIG, headers={"Accept-Encoding": "br, gzip"})
    assert "Content-Encoding" not in resp.headers


def test_compression_setting_from_env():
    from service.settings import Settings

    assert Settings.from_env({"ATTENTION_TRACE_COMPRESSION": "off"}).compression == ()
    assert Settings.from_env({"ATTENTION_TRACE_COMPRESSION": "gzip, br"}).compression == ("gzip", "br")
    with pytest.raises(ValueError, match="br and/or gzip"):
        Settings.from_env({"ATTENTION_TRACE_COMPRESSION": "zstd"})
