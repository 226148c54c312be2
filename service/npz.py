"""A JSON answer as a NumPy ``.npz`` archive: exact float64 arrays, no text round trip.

``Accept: application/x-npz`` on /trace and /trace/batch. The archive (an
uncompressed zip, what ``np.savez`` writes, readable by ``np.load`` and by
a zip reader plus a small .npy reader such as npyjs in JavaScript) holds:

- ``metadata.json``: the JSON answer itself, in which every numeric array is
  replaced by ``{"npz": KEY}``; KEY is the JSON Pointer of the array it
  replaces, without the leading slash (``stages/q/values``,
  ``stats/entropy``, ``results/0/result/stages/weights/values``);
- one ``KEY.npy`` member per array, float64 in the JSON's shape and axes.
  Where the JSON has null (a masked entry of ``masked_scores``) the array
  holds NaN, and the stage gains ``"mask": {"npz": ".../mask"}``, a boolean
  array that is true exactly there.

Every number is the float64 the engine computed; the JSON answer prints the
same number as the shortest decimal that reads back to it, so the two are
equal bit for bit (tests/test_npz.py). The Python client reads it back with
``Client.trace(..., arrays=True)`` (attention_trace/client.py, ``load_npz``).
"""

from __future__ import annotations

import bisect
import io
import math
import struct
import zipfile
import zlib
from typing import Any

import numpy as np
import orjson
import pydantic_core

MEDIA_TYPE = "application/x-npz"
METADATA = "metadata.json"


def _escape(token: str) -> str:
    """One JSON Pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


#: leaves that hold no array (a list of only these is copied as it is)
_PLAIN = frozenset({str, int, float, bool, type(None)})


def split(doc: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """The document with each ndarray replaced by ``{"npz": key}``, and the arrays by key."""
    arrays: dict[str, np.ndarray] = {}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, np.ndarray):
            arrays[path] = node
            return {"npz": path}
        if isinstance(node, dict):
            return {k: walk(v, f"{path}/{_escape(k)}" if path else _escape(k)) for k, v in node.items()}
        if isinstance(node, list):
            if all(type(v) in _PLAIN for v in node):  # axes, shapes, token texts: nothing to replace inside
                return list(node)
            return [walk(v, f"{path}/{i}" if path else str(i)) for i, v in enumerate(node)]
        return node

    return walk(doc, ""), arrays


class _Parts(io.RawIOBase):
    """A file that keeps what is written to it as a list of bytes, never joined: zipfile writes an archive into
    it, and the answer goes out part by part. zipfile seeks back only to write a member's local header again
    (with its CRC and sizes) over the first one, of the same length: that is the one overwrite allowed."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[bytes] = []
        self._starts: list[int] = []
        self._pos = self._size = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        self._pos = pos if whence == io.SEEK_SET else (self._size + pos if whence == io.SEEK_END else self._pos + pos)
        return self._pos

    def write(self, data: Any) -> int:
        part = bytes(data)  # one copy, as into a BytesIO, but never grown nor joined
        n = len(part)
        if self._pos == self._size:
            self.parts.append(part)
            self._starts.append(self._pos)
            self._size += n
        else:
            i = bisect.bisect_right(self._starts, self._pos) - 1
            if i < 0 or self._starts[i] != self._pos or len(self.parts[i]) != n:
                raise io.UnsupportedOperation("only a whole earlier write can be written over")
            self.parts[i] = part
        self._pos += n
        return n


def dumps(doc: Any) -> bytes:
    """The ``.npz`` bytes of a document whose arrays are numpy arrays (see the module's docstring)."""
    return b"".join(dump_parts(doc))


def dump_parts(doc: Any) -> list[bytes]:
    """``dumps``'s bytes in parts, as written (an answer is sent from them without joining them)."""
    meta, arrays = split(doc)
    buf = _Parts()
    # What np.savez writes (stored, not deflated: float64 noise barely compresses, and the
    # client asked for speed), built here so that the metadata member is plain JSON.
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        # Every member dated 1980-01-01 (zip's epoch, what members opened by name get), so the same request
        # gets the same bytes; writestr would stamp the metadata with the current time.
        info = zipfile.ZipInfo(METADATA)
        info.external_attr = 0o600 << 16  # -rw-------, as writestr gives a file
        zf.writestr(info, orjson.dumps(meta))
        for key, a in arrays.items():
            a = np.ascontiguousarray(a)
            with zf.open(key + ".npy", "w", force_zip64=True) as f:
                # np.lib.format.write_array's bytes: its version 1.0 header (what it picks for every header
                # under 64 KiB), then the data, here straight from the array's memory rather than a copy
                np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(a))
                f.write(memoryview(a).cast("B"))  # type: ignore[arg-type]  # numpy types no buffer for py3.11
    return buf.parts



# --------------------------------------------------------------- submissions (POST /check)
#
# A /check body may be the same kind of archive: ``metadata.json`` is the /check request, in which a
# submitted stage may be ``{"npz": KEY}`` (optionally with ``"mask": {"npz": MASK_KEY}``, a boolean
# array true where the stage is masked, as the answers carry it), and KEY.npy holds its array.
# The archive is read only within bounds set before any work: the zip's own directory is checked
# first (member count, directory size), then the members' declared sizes (what they unpack to),
# then each member's .npy header (dtype, shape, exact data size) before its data is used.

#: most members: metadata.json plus every stage and a mask (there are 20 stage ids)
MAX_MEMBERS = 64
#: largest zip central directory: MAX_MEMBERS entries with names of a few hundred bytes
MAX_DIRECTORY_BYTES = 64 * 1024
#: the end-of-central-directory record and its zip64 forms (APPNOTE 4.3.14-16)
_EOCD = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_EOCD = b"PK\x06\x06"


class NpzBodyError(ValueError):
    """An npz body that cannot be read, or that unpacks beyond its bounds: ``status`` 400 or 413;
    ``pointer`` and ``type`` for a 422 about the request it holds."""

    def __init__(self, status: int, message: str, *, pointer: str | None = None, type: str = "npz") -> None:
        super().__init__(message)
        self.status, self.pointer, self.type = status, pointer, type


def _directory(body: bytes) -> tuple[int, int]:
    """(members, central directory bytes) from the end record, read before zipfile parses anything: a
    forged directory could otherwise hold hundreds of thousands of entries in a few megabytes."""
    at = body.rfind(_EOCD, max(0, len(body) - 22 - 65535))  # the record, then at most a 64 KiB comment
    if at < 0 or len(body) - at < 22:
        raise NpzBodyError(400, "the body is not a zip archive (no end of central directory): send what "
                                "np.savez writes")
    _, _, _, _, entries, size, _, _ = struct.unpack("<4sHHHHIIH", body[at:at + 22])
    locator = at - 20
    if locator >= 0 and body[locator:locator + 4] == _ZIP64_LOCATOR:
        (offset,) = struct.unpack("<Q", body[locator + 8:locator + 16])
        if offset + 56 > len(body) or body[offset:offset + 4] != _ZIP64_EOCD:
            raise NpzBodyError(400, "the zip64 end of central directory is missing or damaged")
        entries, size = struct.unpack("<QQ", body[offset + 32:offset + 48])
    return entries, size


def _member_name(key: Any) -> str:
    return f"{key}.npy"


def _array(data: bytes, what: str, pointer: str) -> np.ndarray:
    """A .npy member's array, read-only over ``data``, after its header (format 1.0 or 2.0, no pickles)
    and its exact size are checked."""
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        header = {(1, 0): np.lib.format.read_array_header_1_0,
                  (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if header is None:
            raise ValueError(f"npy format {version[0]}.{version[1]}; np.save writes 1.0")
        shape, fortran, dtype = header(f)
    except ValueError as e:
        raise NpzBodyError(400, f"{what} is not a readable .npy array: {e}") from None
    if dtype.hasobject or dtype.kind not in "fiub" or dtype.fields is not None or dtype.itemsize > 8:
        raise NpzBodyError(422, f"{what} holds {dtype}, not real numbers: send float64 (float32 and integers "
                                "are read as float64 too)", pointer=pointer, type="npz_dtype")
    count = math.prod(shape)
    if len(data) - f.tell() != count * dtype.itemsize:
        raise NpzBodyError(400, f"{what} holds {len(data) - f.tell()} bytes of data where its header says "
                                f"{count * dtype.itemsize}")
    a = np.frombuffer(data, dtype=dtype, count=count, offset=f.tell())
    return a.reshape(shape, order="F" if fortran else "C")


def read_submission(body: bytes, *, max_unpacked: int, max_metadata_values: int,
                    token_stages: frozenset[str]) -> tuple[Any, dict[str, tuple[np.ndarray, np.ndarray | None]]]:
    """The /check request an npz body holds: metadata.json's document, each submitted stage that is an
    npz reference replaced by ``[]``, and those stages' arrays (values as sent, mask or None).

    ``max_unpacked``: most bytes the members may unpack to together; ``max_metadata_values``: most JSON
    values metadata.json may hold (counted before it is parsed, as a JSON body's are). Raises NpzBodyError.
    """
    members, directory = _directory(body)
    if members > MAX_MEMBERS or directory > MAX_DIRECTORY_BYTES:
        raise NpzBodyError(413, f"the archive has {members} members in a {directory}-byte directory; at most "
                                f"{MAX_MEMBERS} members (metadata.json and the stages) in {MAX_DIRECTORY_BYTES} bytes")
    try:
        zf = zipfile.ZipFile(io.BytesIO(body))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, struct.error) as e:
        raise NpzBodyError(400, f"the body is not a readable zip archive: {e}") from None
    with zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        if len(infos) > MAX_MEMBERS or len(set(names)) != len(names):
            raise NpzBodyError(400, "the archive names a member twice" if len(infos) <= MAX_MEMBERS else
                                    f"the archive has more than {MAX_MEMBERS} members")
        for info in infos:
            if info.flag_bits & 0x1:
                raise NpzBodyError(400, f"{_cut(info.filename)} is encrypted")
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise NpzBodyError(400, f"{_cut(info.filename)} is compressed with method {info.compress_type}; "
                                        "send np.savez (stored) or np.savez_compressed (deflated) archives")
        unpacked = sum(i.file_size for i in infos)
        if unpacked > max_unpacked:  # before inflating anything: a deflated member may say 1 GB
            raise NpzBodyError(413, f"the archive's members unpack to {unpacked} bytes, above the limit of "
                                    f"{max_unpacked}")
        if METADATA not in names:
            raise NpzBodyError(400, f"the archive has no {METADATA}: it holds the /check request")

        def read(name: str) -> bytes:
            info = zf.getinfo(name)
            try:
                with zf.open(info) as f:
                    # At most the declared size (inflated in steps of that size, never the whole stream
                    # at once, as zf.read would); a member that holds more fails its CRC check there.
                    data = f.read(info.file_size + 1)
            except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, struct.error) as e:
                raise NpzBodyError(400, f"{_cut(name)} cannot be read: {e}") from None
            if len(data) != info.file_size:
                raise NpzBodyError(400, f"{_cut(name)} holds {len(data)} bytes where the archive says "
                                        f"{info.file_size}")
            return data

        raw_meta = read(METADATA)
        values = raw_meta.count(b",") + raw_meta.count(b"[") + raw_meta.count(b"{") + 1  # as api.bound_json_values
        if values > max_metadata_values:
            raise NpzBodyError(413, f"{METADATA} holds more than {max_metadata_values} JSON values; submit the "
                                    "stages as members")
        try:  # the parser JSON bodies go through: NaN and Infinity literals are read as in a JSON submission
            meta = pydantic_core.from_json(raw_meta, allow_inf_nan=True)
        except ValueError as e:
            raise NpzBodyError(400, f"{METADATA} is not valid JSON: {e}") from None
        if not isinstance(meta, dict):
            return meta, {}  # the model says the request must be an object
        for field in ("input", "context_input", "parameters"):
            node = meta.get(field)
            if isinstance(node, dict) and ("npz" in node or any(isinstance(v, dict) and "npz" in v
                                                                for v in node.values())):
                raise NpzBodyError(422, f"only submitted stages may be npz members; send {field} as JSON in "
                                        f"{METADATA}", pointer=f"/{field}", type="npz_reference")
        submission = meta.get("submission")
        arrays: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        used = {METADATA}
        if isinstance(submission, dict):
            for sid, node in list(submission.items()):
                if not (isinstance(node, dict) and "npz" in node):
                    continue
                where = f"/submission/{_escape(str(sid))[:64]}"
                if sid in token_stages:
                    raise NpzBodyError(422, f"submission.{sid} is a list of strings: send it as JSON in {METADATA}",
                                       pointer=where, type="npz_reference")
                mask_ref = node.get("mask")
                if set(node) - {"npz", "mask"} or not isinstance(node["npz"], str) or not (
                        mask_ref is None or (isinstance(mask_ref, dict) and set(mask_ref) == {"npz"}
                                             and isinstance(mask_ref["npz"], str))):
                    raise NpzBodyError(422, 'an npz reference is {"npz": KEY}, with at most "mask": {"npz": KEY}',
                                       pointer=where, type="npz_reference")
                refs = [node["npz"]] + ([mask_ref["npz"]] if mask_ref is not None else [])
                for key in refs:
                    if _member_name(key) not in names:
                        raise NpzBodyError(422, f"the archive has no member {_cut(_member_name(key))}",
                                           pointer=where, type="npz_member_missing")
                    used.add(_member_name(key))
                values_a = _array(read(_member_name(refs[0])), f"submission.{sid}", where)
                if values_a.dtype.kind == "b":
                    raise NpzBodyError(422, f"submission.{sid} holds booleans, not numbers", pointer=where,
                                       type="npz_dtype")
                mask_a = None
                if mask_ref is not None:
                    mask_a = _array(read(_member_name(refs[1])), f"submission.{sid}'s mask", where)
                    if mask_a.dtype.kind != "b" or mask_a.shape != values_a.shape:
                        raise NpzBodyError(422, f"submission.{sid}'s mask must be booleans of the stage's shape "
                                                f"{list(values_a.shape)}, got {mask_a.dtype} {list(mask_a.shape)}",
                                           pointer=where, type="npz_mask")
                arrays[sid] = (values_a, mask_a)
                submission[sid] = []  # what the model validates; the arrays come with it
        unused = sorted(set(names) - used)
        if unused:
            raise NpzBodyError(422, f"the archive's member {_cut(unused[0])} is not referenced by {METADATA}"
                               + (f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""),
                               pointer="", type="npz_member_unused")
    return meta, arrays


def _cut(name: str) -> str:
    return repr(name if len(name) <= 64 else name[:64] + "…")
