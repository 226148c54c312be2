"""/trace and /trace/batch as exact binary arrays: ``Accept: application/x-npz`` (service/npz.py).

The archive must hold exactly the JSON answer's numbers (bit for bit, NaN and a
mask where the JSON has null), be readable by ``np.load`` without pickles, and
leave the JSON answer (the default) untouched.
"""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile

import numpy as np
import orjson
import pytest
import requests

from attention_trace.client import LocalClient, load_npz

CLI = [sys.executable, "-m", "attention_trace.cli"]

NPZ = "application/x-npz"

CONFIGS = [
    {"sentence": "the cat sat"},
    {"sentence": "the cat sat on the mat", "num_heads": 4, "causal": True, "include_parameters": True},
    {"sentence": "a b c d e", "scale": False, "precision": 4, "stages": ["tokens", "weights", "masked_scores"],
     "causal": True},
    {"sentence": "one two three four", "positional_encoding": "rope", "num_heads": 4, "num_kv_heads": 2,
     "causal": True, "window": 2},
    {"sentence": "le chat", "context_sentence": "the cat sat down", "num_heads": 2},
    {"sentence": "to be or not", "causal": True, "decode": True, "num_heads": 2, "include_parameters": True,
     "parameters_layout": "torch"},
    {"tokens": ["x", "y"], "input": [[0.5] * 24, [-1e-300] * 24], "inject_bug": "no_scale"},
]


def _same(json_node, npz_node, where: str = "") -> None:
    """The npz document equals the JSON one: the same members, and each array holds the JSON's numbers
    exactly (NaN exactly where the JSON has null)."""
    if isinstance(npz_node, np.ndarray):
        assert npz_node.dtype in (np.float64, np.bool_), where
        if npz_node.dtype == np.bool_:
            return  # a mask: checked against the nulls with its stage
        expected = np.array(json_node, dtype=np.float64)  # null -> NaN
        assert npz_node.shape == expected.shape, where
        assert np.array_equal(npz_node, expected, equal_nan=True), where
        assert np.array_equal(npz_node.view(np.int64), np.where(np.isnan(expected), npz_node, expected).view(np.int64)), \
            f"{where}: not bit-identical"
    elif isinstance(json_node, dict):
        extra = set(npz_node) - set(json_node)
        assert extra <= {"mask"}, f"{where}: {extra}"
        assert set(json_node) <= set(npz_node), where
        for k in json_node:
            _same(json_node[k], npz_node[k], f"{where}/{k}")
        if "mask" in extra:
            nulls = np.equal(np.array(json_node["values"], dtype=object), None)
            assert np.array_equal(npz_node["mask"], nulls), f"{where}: mask"
            assert np.isnan(npz_node["values"][nulls]).all() and not np.isnan(npz_node["values"][~nulls]).any()
    elif isinstance(json_node, list) and json_node and isinstance(npz_node, list):
        assert len(json_node) == len(npz_node), where
        for i, (a, b) in enumerate(zip(json_node, npz_node)):
            _same(a, b, f"{where}/{i}")
    else:
        assert json_node == npz_node, where


@pytest.mark.parametrize("body", CONFIGS, ids=lambda b: ",".join(sorted(b))[:60])
def test_npz_holds_exactly_the_json_numbers(client, body):
    j = client.post("/trace", json=body)
    b = client.post("/trace", json=body, headers={"Accept": NPZ})
    assert j.status_code == b.status_code == 200
    assert j.mimetype == "application/json" and b.mimetype == NPZ
    doc = load_npz(b.data)
    _same(orjson.loads(j.data), doc)
    if body.get("causal") and "masked_scores" in doc["stages"]:
        assert doc["stages"]["masked_scores"]["mask"].any()


def test_the_archive_is_plain_numpy_without_pickles(client):
    body = {"sentence": "the cat sat", "num_heads": 2, "causal": True}
    data = client.post("/trace", json=body, headers={"Accept": NPZ}).data
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}
        assert zf.namelist()[0] == "metadata.json"
        assert all(n.endswith(".npy") for n in zf.namelist()[1:])
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        meta = orjson.loads(z["metadata.json"])
        assert meta["stages"]["weights"]["values"] == {"npz": "stages/weights/values"}
        assert meta["stages"]["masked_scores"]["mask"] == {"npz": "stages/masked_scores/mask"}
        assert meta["stages"]["tokens"]["values"] == ["the", "cat", "sat"]  # strings stay in the JSON
        w = z["stages/weights/values"]
        assert w.dtype == np.float64 and w.shape == (2, 3, 3)
        np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=0, atol=1e-15)
        assert z["stages/masked_scores/mask"].tolist()[0] == [[False, True, True], [False, False, True],
                                                              [False, False, False]]


def test_the_same_request_gets_the_same_bytes_whatever_the_clock(client, monkeypatch):
    """A zip member carries a date; every member's is zip's epoch, so the archive is a function of the request."""
    body = {"sentence": "the cat sat", "num_heads": 2}
    first = client.post("/trace", json=body, headers={"Accept": NPZ}).data
    monkeypatch.setattr(zipfile.time, "time", lambda: 2_000_000_000.0)  # 2033: what writestr would stamp
    second = client.post("/trace", json=body, headers={"Accept": NPZ}).data
    assert first == second
    with zipfile.ZipFile(io.BytesIO(first)) as zf:
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}


@pytest.mark.parametrize("accept, expected", [
    (None, "application/json"),
    ("*/*", "application/json"),
    ("application/json", "application/json"),
    ("application/json, application/x-npz", "application/json"),  # equal preference: the default
    ("application/x-npz", NPZ),
    ("application/x-npz, application/problem+json", NPZ),
    ("application/json;q=0.5, application/x-npz", NPZ),
    ("text/html", "application/json"),  # nothing acceptable: the default rather than a 406 (RFC 9110 12.1)
    ("APPLICATION/X-NPZ", NPZ),  # media types are case-insensitive
    ("application/*;q=0.5, application/json;q=0.1", NPZ),  # npz matches only through the wildcard, and wins
    ("*/*, application/json;q=0.1", NPZ),
    ("*/*;q=0.1, application/json", "application/json"),
])
def test_content_negotiation(client, accept, expected):
    headers = {"Accept": accept} if accept else {}
    r = client.post("/trace", json={"sentence": "the cat sat"}, headers=headers)
    assert r.status_code == 200 and r.mimetype == expected
    assert "Accept" in r.headers.get("Vary", "")


def test_json_answers_are_unchanged_by_the_binary_path(app_factory):
    """A JSON request answers the same bytes with the response cache on or off, before and after npz requests."""
    body = {"sentence": "the cat sat on the mat", "num_heads": 2, "causal": True}
    answers = []
    for cache in (0, 1 << 22):
        c = app_factory(response_cache_bytes=cache).test_client()
        first = c.post("/trace", json=body).data
        npz_bytes = [c.post("/trace", json=body, headers={"Accept": NPZ}).data for _ in range(2)]
        assert npz_bytes[0] == npz_bytes[1]  # deterministic, and a cached npz answer is the computed one
        assert c.post("/trace", json=body).data == first
        answers.append((first, npz_bytes[0]))
    assert answers[0] == answers[1]


def test_errors_stay_problem_json(client):
    r = client.post("/trace", json={"sentence": ""}, headers={"Accept": NPZ})
    assert r.status_code == 422 and r.mimetype == "application/problem+json"
    r = client.post("/trace", data=b"{", content_type="application/json", headers={"Accept": NPZ})
    assert r.status_code == 400 and r.mimetype == "application/problem+json"


def test_batch_as_npz(client):
    items = [{"sentence": "the cat sat", "causal": True}, {"sentence": ""}, {"sentence": "a b", "num_heads": 2}]
    j = client.post("/trace/batch", json={"items": items})
    b = client.post("/trace/batch", json={"items": items}, headers={"Accept": NPZ})
    assert b.status_code == 200 and b.mimetype == NPZ
    doc = load_npz(b.data)
    _same(orjson.loads(j.data), doc)
    assert [r["status"] for r in doc["results"]] == [200, 422, 200]
    with np.load(io.BytesIO(b.data), allow_pickle=False) as z:
        assert "results/2/result/stages/weights/values" in z.files
    # /check/batch answers JSON whatever the Accept (its answers are reports, not arrays)
    check = {"sentence": "a b", "submission": {"tokens": ["a", "b"]}}
    c = client.post("/check/batch", json={"items": [check]}, headers={"Accept": NPZ})
    assert c.status_code == 200 and c.mimetype == "application/json"


def test_client_arrays_and_trace_npz():
    c = LocalClient()
    body = {"sentence": "the cat sat on the mat", "num_heads": 2, "causal": True}
    j = c.trace(body)
    a = c.trace(body, arrays=True)
    assert isinstance(a.stages["q"].values, np.ndarray)
    for sid in j.stages:
        if sid == "tokens":
            assert a.stages[sid].values == j.stages[sid].values
            continue
        assert np.array_equal(a.array(sid), j.array(sid), equal_nan=True), sid
        assert np.array_equal(a.stages[sid].mask, j.stages[sid].mask), sid
    assert a.texts == j.texts and a.config == j.config
    raw = c.trace_npz(body)
    _same(j.raw, load_npz(raw))
    batch = c.trace_batch([body, {"sentence": ""}], arrays=True)
    assert batch[0].status == 200 and np.array_equal(batch[0].result.array("weights"), j.array("weights"))
    assert batch[1].status == 422 and batch[1].problem is not None


@pytest.mark.integration  # starts another process
def test_cli_writes_the_archive(tmp_path):
    out = tmp_path / "t.npz"
    r = subprocess.run([*CLI, "trace", "the cat sat", "--heads", "2", "--causal",
                        "--npz", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"to {out}" in r.stdout
    expected = LocalClient().trace(sentence="the cat sat", num_heads=2, causal=True)
    with np.load(out, allow_pickle=False) as z:
        assert np.array_equal(z["stages/output/values"], expected.array("output"))
    bad = subprocess.run([*CLI, "trace", "the cat", "--npz",
                          str(tmp_path / "missing" / "t.npz")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "cannot write" in bad.stderr


@pytest.mark.integration  # starts another process
def test_npz_through_gunicorn(gunicorn_server):
    body = {"sentence": "the cat sat on the mat", "num_heads": 4, "causal": True}
    j = requests.post(gunicorn_server.url + "/trace", json=body, timeout=30)
    b = requests.post(gunicorn_server.url + "/trace", json=body, headers={"Accept": NPZ}, timeout=30)
    assert b.status_code == 200 and b.headers["Content-Type"] == NPZ
    assert int(b.headers["Content-Length"]) == len(b.content)
    _same(j.json(), load_npz(b.content))


def _archive_the_plain_way(doc) -> bytes:
    """What np.savez's zipfile writes into a BytesIO for this document: the reference for the parts."""
    from service import npz

    meta, arrays = npz.split(doc)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        info = zipfile.ZipInfo(npz.METADATA)
        info.external_attr = 0o600 << 16
        zf.writestr(info, orjson.dumps(meta))
        for key, a in arrays.items():
            with zf.open(key + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


@pytest.mark.parametrize("body", CONFIGS[:2] + [{"tokens": [f"w{i}" for i in range(64)], "d_model": 128,
                                                  "num_heads": 4, "causal": True}], ids=["S", "params", "large"])
def test_the_archive_written_in_parts_is_the_archive_zipfile_writes(body):
    from service import npz
    from service.routes.trace import TraceRequest, trace_document

    doc = trace_document(TraceRequest(**body), binary=True)
    parts = npz.dump_parts(doc)
    assert len(parts) > 3 and all(type(p) is bytes for p in parts)
    assert b"".join(parts) == npz.dumps(doc) == _archive_the_plain_way(doc)


def test_the_parts_file_overwrites_only_a_whole_earlier_write():
    from service.npz import _Parts

    f = _Parts()
    f.write(b"head")
    f.write(memoryview(b"data"))
    end = f.tell()
    f.seek(0)
    f.write(b"HEAD")  # zipfile's second local header, over the first
    f.seek(end)
    f.write(b"tail")
    assert f.parts == [b"HEAD", b"data", b"tail"] and f.tell() == 12
    for at, data in ((0, b"HEA"), (1, b"EADd"), (4, b"DATA!")):
        f.seek(at)
        with pytest.raises(io.UnsupportedOperation):
            f.write(data)


@pytest.mark.integration  # starts another process
@pytest.mark.parametrize("cache", ["0", str(32 * 1024 * 1024)], ids=["cache off", "cache on"])
def test_a_large_npz_answer_in_parts_is_whole_over_http(cache):
    """An answer larger than the response cache keeps goes out in parts, never joined: the same bytes."""
    from conftest import Gunicorn
    from service import npz
    from service.routes.trace import TraceRequest, trace_document

    body = {"tokens": [f"w{i}" for i in range(64)], "d_model": 128, "num_heads": 4, "causal": True}
    want = npz.dumps(trace_document(TraceRequest(**body), binary=True))
    assert len(want) > 256 * 1024  # over the cache's largest entry
    server = Gunicorn(workers=1, env={"ATTENTION_TRACE_RESPONSE_CACHE_BYTES": cache})
    try:
        for _ in range(2):
            r = requests.post(server.url + "/trace", json=body, headers={"Accept": NPZ}, timeout=30)
            assert r.status_code == 200 and r.headers["Content-Type"] == NPZ
            assert int(r.headers["Content-Length"]) == len(r.content) and r.content == want
    finally:
        server.stop()
