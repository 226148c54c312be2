"""service/framing.py: gunicorn's parser and ChunkedReader fed as bytes arrive give exactly what they give
on the whole message at once (no home-made HTTP framing).

For generated chunked bodies (valid, or with a byte changed, added or removed), cut into pieces at random
points: when gunicorn's ChunkedReader, reading the whole body from a socket, decodes it, the incremental
ChunkedBody decodes the same bytes and leaves the same bytes after it; when gunicorn refuses the framing,
ChunkedBody raises the same error; when gunicorn runs out of bytes, ChunkedBody is still waiting for more.
"""

from __future__ import annotations

import pytest
from gunicorn.config import Config
from gunicorn.http.body import Body, ChunkedReader
from gunicorn.http.errors import ChunkMissingTerminator, InvalidChunkSize, NoMoreData, ParseException
from gunicorn.http.unreader import IterUnreader
from hypothesis import given, settings
from hypothesis import strategies as st

from service.framing import BodyTooLarge, ChunkedBody, Feed, HeadReader, NeedMore

CFG = Config()
HEAD = b"POST /trace HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


def request():
    req, _, _ = HeadReader().parse(CFG, bytearray(HEAD), ("127.0.0.1", 1))
    return req


def reference(body: bytes):
    """gunicorn's ChunkedReader on the whole body: ("ok", decoded, leftover) | ("error", type) | ("eof",)."""
    unreader = IterUnreader([body])
    reader = Body(ChunkedReader(request(), unreader))
    try:
        decoded = reader.read()
    except (NoMoreData, ChunkMissingTerminator) as e:
        # the end of the bytes, where a socket would wait for more: inside a chunk or a line, or fewer
        # than the 2 bytes of a chunk's CRLF (gunicorn reads on from a socket until it has 2)
        if isinstance(e, NoMoreData) or isinstance(e.__context__, NoMoreData) or len(e.term) < 2:
            return ("eof",)
        return ("error", type(e))
    except Exception as e:  # noqa: BLE001 - any refusal of gunicorn's
        return ("error", type(e))
    return ("ok", decoded, unreader.take_buffered() + b"".join(unreader.iter or []))


def incremental(body: bytes, cuts: list[int], limit: int = 1 << 30):
    decoder = ChunkedBody(request(), limit)
    last = 0
    try:
        for cut in sorted(set(cuts)) + [len(body)]:
            decoder.feed(body[last:cut])
            last = cut
            if decoder.done:
                break
    except Exception as e:  # noqa: BLE001 (any refusal of gunicorn's)
        return ("error", type(e))
    if not decoder.done:
        return ("eof",)
    decoded = b"".join(decoder.pieces)
    # what followed the body: the leftover, and any pieces not fed because the body ended before them
    return ("ok", decoded, decoder.leftover + body[last:])


def chunked(pieces: list[bytes], ext: bool, trailers: list[bytes]) -> bytes:
    out = b""
    for p in pieces:
        out += b"%x%s\r\n%s\r\n" % (len(p), b";a=b" if ext else b"", p)
    return out + b"0\r\n" + b"".join(t + b"\r\n" for t in trailers) + b"\r\n"


pieces_st = st.lists(st.binary(min_size=1, max_size=40), max_size=6)
trailers_st = st.lists(st.sampled_from([b"X-A: 1", b"X-Long: " + b"v" * 30, b"Bad Trailer", b"Host: evil"]),
                       max_size=2)


@settings(max_examples=1000)
@given(pieces_st, st.booleans(), trailers_st, st.binary(max_size=10),
       st.lists(st.integers(0, 400), max_size=12), st.booleans(), st.data())
def test_incremental_decoding_is_gunicorns(pieces, ext, trailers, after, cuts, every_byte, data):
    body = chunked(pieces, ext, trailers) + after
    mutation = data.draw(st.sampled_from(["none", "replace", "insert", "delete", "truncate"]))
    if mutation != "none" and body:
        i = data.draw(st.integers(0, len(body) - 1))
        byte = data.draw(st.sampled_from([b"-", b"+", b" ", b"\r", b"\n", b"\t", b";", b"x", b"0", b"f", b"G"]))
        body = {"replace": body[:i] + byte + body[i + 1:], "insert": body[:i] + byte + body[i:],
                "delete": body[:i] + body[i + 1:], "truncate": body[:i]}[mutation]
    cuts = list(range(1, len(body))) if every_byte else [c for c in cuts if 0 < c < len(body)]
    assert_same(incremental(body, cuts), reference(body), body, cuts)


def assert_same(got, expected, body, cuts) -> None:
    """The same outcome; for a refusal, the same error when the bytes came at once. Cut up, gunicorn may
    refuse the same bytes for another reason first (a bare LF in trailers before their end is seen), as it
    would reading them from a socket as they arrive."""
    assert got[0] == expected[0], (body, cuts, got, expected)
    if got[0] == "ok" or not cuts:
        assert got == expected, (body, cuts, got, expected)
    if got[0] == "error":
        assert issubclass(got[1], ParseException), got


@pytest.mark.parametrize("size", [b"-6", b"-0", b"+6", b" 6", b"0x6", b"6_0", b"", b"\xff", b"1 2"])
def test_a_chunk_size_is_hex_digits_only(size):
    """int(x, 16) accepted "-6"; gunicorn's reader refuses anything but hex digits."""
    decoder = ChunkedBody(request(), 1 << 20)
    with pytest.raises(InvalidChunkSize):
        decoder.feed(size + b"\r\n")


def test_a_declared_chunk_counts_against_the_limit_before_its_data():
    """The size is checked as soon as its line is parsed, with no data yet."""
    decoder = ChunkedBody(request(), 4 * 1024 * 1024)
    with pytest.raises(BodyTooLarge):
        decoder.feed(b"fffffffffff\r\n")
    decoder = ChunkedBody(request(), 100)
    decoder.feed(b"60\r\n" + b"a" * 0x60 + b"\r\n")
    with pytest.raises(BodyTooLarge):
        decoder.feed(b"5\r\n")  # 96 + 5 > 100
    decoder = ChunkedBody(request(), 100)
    decoder.feed(b"64\r\n" + b"a" * 100 + b"\r\n0\r\n\r\n")
    assert decoder.done and decoder.size == 100


def test_memory_is_the_decoded_body_and_one_line():
    """Raw bytes are dropped once decoded: a body sent in many chunks holds about its decoded size."""
    decoder = ChunkedBody(request(), 1 << 30)
    piece = b"1000;" + b"e=" + b"x" * 4000 + b"\r\n" + b"a" * 0x1000 + b"\r\n"
    for _ in range(1000):
        decoder.feed(piece)
    assert decoder.size == 1000 * 0x1000
    assert len(decoder.raw) < 2 * len(piece) + 65536


def test_lines_cut_into_single_bytes_cost_linear_work():
    """A chunk-size line and trailers sent a byte at a time: gunicorn's reader is not run again on every
    byte (only at line ends, or when the bytes doubled)."""
    starts = []

    class Counting(ChunkedBody):
        def _start(self) -> None:
            starts.append(1)
            super()._start()

    decoder = Counting(request(), 1 << 20)
    data = b"5;" + b"x" * 2000 + b"\r\nhello\r\n0\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(50)) + b"\r\n"
    for i in range(len(data)):
        decoder.feed(data[i:i + 1])
    assert decoder.done and b"".join(decoder.pieces) == b"hello"
    assert len(starts) < 20, len(starts)


def test_a_head_is_parsed_by_gunicorn_once_it_can_be():
    head = HeadReader()
    buf = bytearray()
    for piece in (b"GET /health HT", b"TP/1.1\r\nHost: x\r\n", b"X-A: b\r\n", b"\r\n"):
        buf += piece
        parsed = head.parse(CFG, buf, ("127.0.0.1", 1))
    assert parsed is not None and parsed[0].path == "/health" and parsed[2] == len(buf)
    # a bare LF anywhere in the head: gunicorn's own refusal, at once
    for bad in (b"GET / HTTP/1.1\nHost: x\n\n", b"GET / HTTP/1.1\r\nHost: x\nX: y\r\n"):
        with pytest.raises(Exception) as e:
            HeadReader().parse(CFG, bytearray(bad), ("127.0.0.1", 1))
        assert "bare LF" in str(e.value) or "LF" in repr(e.value), e.value


def test_feed_raises_need_more_until_final():
    feed = Feed(bytearray(b"ab"))
    assert feed.recv(1) == b"a" and feed.recv(5) == b"b"
    with pytest.raises(NeedMore):
        feed.recv(1)
    feed.final = True
    assert feed.recv(1) == b""
