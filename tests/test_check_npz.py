"""/check takes a submission as an npz body (``Content-Type: application/x-npz``): the layout of the npz
answers, metadata.json holding the request. It answers exactly what the JSON body answers, and its cost
is bounded before anything in the archive is used: the zip's directory (member count and size), what
the members unpack to, metadata.json's JSON values, each member's .npy header.

The largest submission's time and memory are in tests/test_check_limits.py (docs/checking.md).
"""

from __future__ import annotations

import io
import json
import struct
import time
import tracemalloc
import zipfile

import numpy as np
import pytest

from attention_trace.client import LocalClient, ProblemError, encode_npz_check
from service.npz import MAX_MEMBERS
from service.settings import Settings

NPZ = "application/x-npz"
BASE = {"sentence": "the cat sat on the mat", "d_model": 16, "num_heads": 4, "causal": True}


def archive(meta, arrays: dict[str, np.ndarray], *, compression=zipfile.ZIP_STORED, extra: dict | None = None) -> bytes:
    """An npz body as np.savez writes it: metadata.json plus KEY.npy members."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compression) as zf:
        zf.writestr("metadata.json", json.dumps(meta) if not isinstance(meta, bytes) else meta)
        for key, a in arrays.items():
            with zf.open(key + ".npy", "w") as f:
                np.lib.format.write_array(f, a, allow_pickle=True)
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return buf.getvalue()


def reference(client, body=BASE) -> dict:
    return {sid: st["values"] for sid, st in client.post("/trace", json=body).get_json()["stages"].items()}


def post(client, body: bytes):
    return client.post("/check", data=body, content_type=NPZ)


def problem(resp, status: int) -> dict:
    assert resp.status_code == status and resp.mimetype == "application/problem+json", resp.get_data(as_text=True)
    return resp.get_json()


# ----------------------------------------------------------------- the same answer as JSON


@pytest.mark.parametrize("case", ["exact", "float32", "one stage wrong", "nan", "filled mask", "deflated",
                                  "cross-attention", "json stage beside npz ones"])
def test_an_npz_submission_answers_exactly_what_the_json_one_answers(client, case):
    body = dict(BASE)
    if case == "cross-attention":
        body = {"sentence": "the cat sat", "d_model": 8, "num_heads": 2, "context_sentence": "le chat noir"}
    ref = reference(client, body)
    sub = {sid: v for sid, v in ref.items()}
    arrays, meta_sub = {}, {}
    for sid, values in sub.items():
        if sid in ("tokens", "context_tokens"):
            meta_sub[sid] = values
            continue
        obj = np.array(values, dtype=object)
        nulls = np.equal(obj, None)
        a = np.where(nulls, np.nan, obj).astype(np.float64)
        if case == "float32":
            a = a.astype(np.float32)
            sub[sid] = np.where(nulls, None, a.astype(np.float64)).tolist()
        if case == "one stage wrong" and sid == "weights":
            a = a * 1.01
            sub[sid] = a.tolist()
        if case == "nan" and sid == "output":
            a[1, 2] = np.nan
            sub[sid] = [[("NaN" if np.isnan(x) else x) for x in row] for row in a.tolist()]
        ref_key = {"npz": f"submission/{sid}"}
        if nulls.any():
            if case == "filled mask":  # no mask member: -inf where masked, as students fill them
                a = np.where(nulls, -np.inf, a)
                sub[sid] = np.where(nulls, "-Infinity", obj).tolist()
            else:
                arrays[f"submission/{sid}/mask"] = nulls
                ref_key["mask"] = {"npz": f"submission/{sid}/mask"}
        if case == "json stage beside npz ones" and sid == "scores":
            meta_sub[sid] = values
            continue
        arrays[f"submission/{sid}"] = a
        meta_sub[sid] = ref_key
    compression = zipfile.ZIP_DEFLATED if case == "deflated" else zipfile.ZIP_STORED
    got = post(client, archive({**body, "submission": meta_sub}, arrays, compression=compression))
    assert got.status_code == 200, got.get_data(as_text=True)
    want = client.post("/check", json={**body, "submission": sub})
    assert got.get_json() == want.get_json()
    assert got.get_data() == want.get_data()
    doc = got.get_json()
    assert doc["passed"] is (case in ("exact", "float32", "filled mask", "deflated", "cross-attention",
                                      "json stage beside npz ones"))
    if case == "one stage wrong":
        assert doc["first_wrong_stage"] == "weights"
    if case == "nan":
        assert doc["stages"]["output"]["non_finite"] == {"count": 1, "first": [{"index": [1, 2], "value": "NaN"}]}
    if case == "filled mask":
        assert doc["stages"]["masked_scores"]["treated_as_masked"] > 0


def test_a_wrong_shape_and_a_known_bug_are_found_in_arrays_as_in_json(client):
    wrong = client.post("/trace", json={**BASE, "inject_bug": "average_heads"}).get_json()["stages"]
    meta = {**BASE, "submission": {"concat": {"npz": "c"}, "weights": {"npz": "w"}}}
    arrays = {"c": np.array(wrong["concat"]["values"]), "w": np.array(wrong["weights"]["values"])}
    doc = post(client, archive(meta, arrays)).get_json()
    assert doc["diagnosis"]["bug"] == "average_heads" and doc["stages"]["concat"]["shape_ok"] is False


# ------------------------------------------------------------------- the client sends it


def _sent_types(monkeypatch) -> list[str]:
    import attention_trace.client as client_module

    seen: list[str] = []
    original = client_module._encode_request

    def spy(payload, request_id, accept=None):
        data, headers = original(payload, request_id, accept)
        seen.append(headers.get("Content-Type", ""))
        return data, headers

    monkeypatch.setattr(client_module, "_encode_request", spy)
    return seen


def test_the_client_sends_npz_only_when_the_json_would_pass_the_limit(monkeypatch):
    big = {"tokens": [f"w{i}" for i in range(64)], "d_model": 64, "num_heads": 4, "causal": True}
    t = LocalClient().trace(big, arrays=True)
    sub = {sid: st.values for sid, st in t.stages.items()}
    masked = t.stages["masked_scores"]
    sub["masked_scores"] = np.ma.masked_array(masked.array(), masked.mask)
    from attention_trace.client import encode_json

    as_json, as_npz = len(encode_json({**big, "submission": sub})), len(encode_npz_check({**big, "submission": sub}))
    assert as_npz < as_json / 2
    c = LocalClient(Settings(max_check_body_bytes=(as_json + as_npz) // 2))
    seen = _sent_types(monkeypatch)
    small = c.check(BASE, submission={"tokens": "the cat sat on the mat".split()})
    assert small.passed and seen[-1] == "application/json"
    r = c.check(big, submission=sub)
    assert r.passed, r.message
    assert seen[-2:] == ["", NPZ]  # GET /version (once), then the archive
    with pytest.raises(ProblemError) as exc:
        c.check(big, submission=sub, body_format="json")
    assert exc.value.status == 413 and seen[-1] == "application/json"
    assert c.check(big, submission=sub).passed and seen[-1] == NPZ and seen.count("") == 1  # limits asked once
    # the JSON value limit counts too
    c = LocalClient(Settings(max_check_json_values=50_000))
    seen = _sent_types(monkeypatch)
    assert c.check(big, submission=sub).passed and seen[-1] == NPZ


def test_the_clients_archive_keeps_nulls_nan_and_float32_apart():
    sub = {"tokens": ["a", "b"], "weights": [[[1.0, None], [float("nan"), 0.5]]],
           "scores": np.ones((1, 2, 2), dtype=np.float32), "ragged": [[1.0], [1.0, 2.0]]}
    with zipfile.ZipFile(io.BytesIO(encode_npz_check({"tokens": ["a", "b"], "submission": sub}))) as zf:
        meta = json.loads(zf.read("metadata.json"))
        assert meta["submission"]["tokens"] == ["a", "b"] and meta["submission"]["ragged"] == [[1.0], [1.0, 2.0]]
        assert meta["submission"]["weights"] == {"npz": "submission/weights",
                                                 "mask": {"npz": "submission/weights/mask"}}
        w = np.load(io.BytesIO(zf.read("submission/weights.npy")))
        mask = np.load(io.BytesIO(zf.read("submission/weights/mask.npy")))
        assert mask.tolist() == [[[False, True], [False, False]]] and np.isnan(w[0, 1, 0]) and w[0, 1, 1] == 0.5
        assert np.load(io.BytesIO(zf.read("submission/scores.npy"))).dtype == np.float32


# -------------------------------------------------------------------- bounds before the work


def _bounded(client, body: bytes, status: int, *, peak_mib: float = 16.0, seconds: float = 2.0) -> dict:
    """The answer to ``body``, which must come quickly and with little memory (Python allocations)."""
    tracemalloc.start()
    tracemalloc.reset_peak()  # the body's own making is not the request's
    start = time.perf_counter()
    resp = post(client, body)
    elapsed = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    doc = problem(resp, status)
    assert peak < peak_mib * 2**20 + 2 * len(body), f"{peak / 2**20:.1f} MiB"
    assert elapsed < seconds, f"{elapsed:.2f} s"
    return doc


@pytest.mark.slow  # ~3 s of CPU
def test_a_zip_bomb_is_refused_from_its_declared_sizes_before_inflating(client):
    """A deflated member of 1 GiB of zeros is 1 MB of body: refused (413) before a byte is inflated."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("metadata.json", json.dumps({**BASE, "submission": {"weights": {"npz": "w"}}}))
        with zf.open("w.npy", "w", force_zip64=True) as f:
            chunk = bytes(2**24)
            for _ in range(64):
                f.write(chunk)
    body = buf.getvalue()
    assert len(body) < 2 * 2**20
    doc = _bounded(client, body, 413)
    meta = len(json.dumps({**BASE, "submission": {"weights": {"npz": "w"}}}))
    assert doc["type"].endswith("payload-too-large") and f"unpack to {2**30 + meta} bytes" in doc["detail"]


def test_a_member_that_inflates_past_its_declared_size_is_cut_there(client):
    """A member declaring 1 000 bytes whose data inflates to 64 MiB: read up to 1 000 bytes, then refused."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("metadata.json", json.dumps({**BASE, "submission": {"weights": {"npz": "w"}}}))
        zf.writestr("w.npy", bytes(64 * 2**20))
    body = bytearray(buf.getvalue())
    with zipfile.ZipFile(io.BytesIO(bytes(body))) as zf:
        info = zf.getinfo("w.npy")
    # the uncompressed size, in the member's local header and in its central directory entry
    struct.pack_into("<I", body, info.header_offset + 22, 1000)
    eocd = body.rfind(b"PK\x05\x06")
    (at,) = struct.unpack_from("<I", body, eocd + 16)  # the central directory's offset
    while body[at + 46:at + 46 + 5] != b"w.npy":
        n, m, k = struct.unpack_from("<HHH", body, at + 28)
        at += 46 + n + m + k
    struct.pack_into("<I", body, at + 24, 1000)
    doc = _bounded(client, bytes(body), 400)
    assert doc["type"].endswith("malformed-npz") and "'w.npy' cannot be read" in doc["detail"]


def test_too_many_members_are_refused_from_the_end_record_before_the_directory_is_parsed(client):
    names = {f"m{i}.npy": b"" for i in range(5000)}
    body = archive({**BASE, "submission": {"weights": [[[1.0]]]}}, {}, extra=names)
    doc = _bounded(client, body, 413)
    assert "5001 members" in doc["detail"] and f"at most {MAX_MEMBERS} members" in doc["detail"]
    # an end record that lies about the count still gives away the directory's size
    forged = bytearray(body)
    eocd = forged.rfind(b"PK\x05\x06")
    struct.pack_into("<HH", forged, eocd + 8, 2, 2)
    doc = _bounded(client, bytes(forged), 413)
    assert "2 members in a" in doc["detail"]
    # a few over the limit
    names = {f"m{i}.npy": b"" for i in range(MAX_MEMBERS)}
    doc = problem(post(client, archive({**BASE, "submission": {}}, {}, extra=names)), 413)
    assert f"{MAX_MEMBERS + 1} members" in doc["detail"]


def test_metadata_with_more_json_values_than_allowed_is_refused_before_parsing(app_factory):
    client = app_factory(max_check_json_values=1000).test_client()
    meta = json.dumps({**BASE, "submission": {"weights": [[[0.0] * 10] * 10] * 11}}).encode()
    doc = _bounded(client, archive(meta, {}), 413)
    assert "metadata.json holds more than 1000 JSON values" in doc["detail"]


def test_an_npz_body_over_the_byte_limit_is_a_413(app_factory):
    client = app_factory(max_check_body_bytes=10_000).test_client()
    body = archive({**BASE, "submission": {"weights": {"npz": "w"}}}, {"w": np.zeros((4, 60, 60))})
    assert len(body) > 10_000
    assert problem(post(client, body), 413)["type"].endswith("payload-too-large")


@pytest.mark.parametrize("name, make, status, kind, needle", [
    ("not a zip", lambda: b"PK not really", 400, "malformed-npz", "not a zip archive"),
    ("JSON sent as npz", lambda: b'{"sentence": "a"}', 400, "malformed-npz", "not a zip archive"),
    ("truncated", lambda: archive({**BASE, "submission": {"weights": {"npz": "w"}}},
                                  {"w": np.zeros((4, 6, 6))})[:-30], 400, "malformed-npz", "not a"),
    ("no metadata", lambda: archive(b"", {}, extra={}).replace(b"metadata.json", b"metadatb.json"), 400,
     "malformed-npz", "no metadata.json"),
    ("metadata not JSON", lambda: archive(b"{nope", {}), 400, "malformed-npz", "metadata.json is not valid JSON"),
    ("bzip2", lambda: archive({**BASE, "submission": {}}, {}, compression=zipfile.ZIP_BZIP2), 400,
     "malformed-npz", "compressed with method 12"),
    ("not an npy", lambda: archive({**BASE, "submission": {"weights": {"npz": "w"}}}, {},
                                   extra={"w.npy": b"hello"}), 400, "malformed-npz", "not a readable .npy array"),
    ("npy data short", lambda: archive({**BASE, "submission": {"weights": {"npz": "w"}}}, {},
                                       extra={"w.npy": _npy(np.zeros((4, 6, 6)))[:-8]}), 400, "malformed-npz",
     "holds 1144 bytes of data where its header says 1152"),
])
def test_an_archive_that_cannot_be_read_is_a_400(client, name, make, status, kind, needle):
    doc = problem(post(client, make()), status)
    assert doc["type"].endswith(kind) and needle in doc["detail"], doc


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, allow_pickle=True)
    return buf.getvalue()


@pytest.mark.parametrize("name, meta_sub, arrays, extra, pointer, type_, needle", [
    ("a member no one references", {"weights": {"npz": "w"}}, {"w": np.zeros((4, 6, 6)), "typo": np.zeros(1)}, {},
     "", "npz_member_unused", "'typo.npy' is not referenced"),
    ("a reference without its member", {"weights": {"npz": "w"}}, {}, {}, "/submission/weights",
     "npz_member_missing", "no member 'w.npy'"),
    ("objects (a pickle)", {"weights": {"npz": "w"}}, {"w": np.array([[["x"]]], dtype=object)}, {},
     "/submission/weights", "npz_dtype", "holds object"),
    ("complex numbers", {"weights": {"npz": "w"}}, {"w": np.zeros((4, 6, 6), dtype=complex)}, {},
     "/submission/weights", "npz_dtype", "holds complex128"),
    ("booleans", {"weights": {"npz": "w"}}, {"w": np.zeros((4, 6, 6), dtype=bool)}, {}, "/submission/weights",
     "npz_dtype", "holds booleans"),
    ("a mask of another shape", {"masked_scores": {"npz": "m", "mask": {"npz": "k"}}},
     {"m": np.zeros((4, 6, 6)), "k": np.zeros((4, 6), dtype=bool)}, {}, "/submission/masked_scores", "npz_mask",
     "must be booleans of the stage's shape [4, 6, 6]"),
    ("tokens as an array", {"tokens": {"npz": "t"}}, {"t": np.zeros(6)}, {}, "/submission/tokens",
     "npz_reference", "is a list of strings"),
    ("a malformed reference", {"weights": {"npz": 5}}, {}, {}, "/submission/weights", "npz_reference",
     'an npz reference is {"npz": KEY}'),
    ("four dimensions", {"weights": {"npz": "w"}}, {"w": np.zeros((1, 4, 6, 6))}, {}, "/submission/weights",
     "submission_type", "4 dimensions, deeper than any stage"),
    ("a scalar", {"weights": {"npz": "w"}}, {"w": np.float64(1.0)}, {}, "/submission/weights",
     "submission_type", "a single number, not an array"),
    ("input as a member", {"weights": {"npz": "w"}}, {"w": np.zeros((4, 6, 6)), "x": np.zeros((6, 16))},
     {"input": {"npz": "x"}}, "/input", "npz_reference", "only submitted stages may be npz members"),
    ("a stage the trace has not", {"q_rotated": {"npz": "w"}}, {"w": np.zeros((4, 6, 4))}, {},
     "/submission/q_rotated", "stage_needs_rope", "exist only with positional_encoding"),
])
def test_an_archive_whose_request_is_wrong_is_a_422_at_the_pointer(client, name, meta_sub, arrays, extra, pointer,
                                                                   type_, needle):
    body = archive({**BASE, **extra, "submission": meta_sub}, arrays)
    (err,) = problem(post(client, body), 422)["errors"]
    assert err["pointer"] == pointer and err["type"] == type_ and needle in err["message"], err


def test_the_request_in_metadata_is_validated_as_a_json_body(client):
    body = archive({**BASE, "num_heads": 5, "submission": {"weights": {"npz": "w"}}}, {"w": np.zeros((4, 6, 6))})
    json_doc = client.post("/check", json={**BASE, "num_heads": 5, "submission": {"weights": [[[0.0]]]}}).get_json()
    assert problem(post(client, body), 422)["errors"] == json_doc["errors"]
    assert problem(post(client, archive([1, 2], {})), 422)["errors"][0]["message"] == \
        "the request body must be a JSON object"


def test_only_check_takes_npz_and_the_415_says_so(client):
    body = archive({**BASE, "submission": {}}, {})
    for path in ("/trace", "/check/batch", "/explain"):
        resp = client.post(path, data=body, content_type=NPZ)
        assert resp.status_code == 415 and "application/json" in resp.headers["Accept-Post"], path
    resp = client.post("/check", data=b"x", content_type="text/plain")
    assert resp.status_code == 415 and resp.headers["Accept-Post"] == f"application/json, {NPZ}"
    assert NPZ in resp.get_json()["detail"]


def test_a_service_without_npz_gets_json_from_the_client(monkeypatch):
    """A service older than schema 1.2.0 (or one whose /version cannot be read) is sent JSON, as before."""
    import attention_trace.client as client_module

    big = {"tokens": [f"w{i}" for i in range(64)], "d_model": 64, "num_heads": 4}
    c = LocalClient(Settings(max_check_body_bytes=300_000))
    sub = {sid: st.values for sid, st in c.trace(big, arrays=True).stages.items()}
    for version in ({"schema_version": "1.1.0", "limits": {"max_check_body_bytes": 300_000}}, None):
        def fake(self, *, request_id=None, _v=version):
            if _v is None:
                raise client_module.TransportError("down", url="local:/version", attempts=1)
            return _v
        monkeypatch.setattr(LocalClient, "version", fake)
        c = LocalClient(Settings(max_check_body_bytes=300_000))
        seen = _sent_types(monkeypatch)
        with pytest.raises(ProblemError) as exc:
            c.check(big, submission=sub)
        assert exc.value.status == 413 and seen[-1] == "application/json"
