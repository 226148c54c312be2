"""Request framing for service/worker.py: gunicorn's own parser and readers, fed as bytes arrive.

The worker's event loop receives a request a piece at a time and never blocks.
gunicorn's HTTP/1.1 parser (``gunicorn.http.message.Request``) and its chunked
body reader (``gunicorn.http.body.ChunkedReader``) pull their bytes from a
socket and block when none are there. Here they pull from a ``Feed``, the
bytes received so far, which raises ``NeedMore`` where a socket would block.
Every framing decision is gunicorn's: where the head ends and whether it is
valid (bare LF, request line, headers, Content-Length, Transfer-Encoding);
what a chunk-size line says (hex digits only), its extensions, the CRLF after
each chunk, the trailers, where the body ends. Nothing here reads HTTP syntax:

- ``HeadReader`` only decides *when* gunicorn's parser is worth running again
  (a new line end arrived, or the bytes doubled since the last try: linear
  work however a head is cut up) and runs it on the bytes so far;
- ``ChunkedBody`` runs gunicorn's ``ChunkedReader`` generator over the body as
  it arrives. The generator yields every piece of chunk data before it reads
  on, so it is only resumed when bytes are waiting; where it must read a line
  (a chunk-size line, the trailers) and they are not all there yet, it stops
  with ``NeedMore`` and is started again, later, at the start of that line
  (gunicorn's reader is told where each line starts by a two-method subclass).
  The declared size counts against the body limit the moment its line is
  parsed (``BodyTooLarge``, 413), before any of its data is buffered; chunk
  data is decoded as it arrives, and the raw bytes are dropped once decoded,
  so a body holds at most its limit plus one line in memory.

tests/test_framing.py checks, for bodies cut at every byte, that the result is
exactly what gunicorn's ChunkedReader gives on the whole body at once.
"""

from __future__ import annotations

from typing import Any

from gunicorn import http
from gunicorn.http.body import Body, ChunkedReader, LengthReader
from gunicorn.http.unreader import IterUnreader, SocketUnreader

#: a chunked body's trailers may be at most this large (as a request head; gunicorn's own default is 256 KiB)
MAX_TRAILERS = 64 * 1024
#: at most this many chunks in one body: each costs a few microseconds of parsing, and a 1-byte chunk is
#: 6 bytes on the wire, so a 4 MiB body of tiny chunks would otherwise cost seconds of the event loop
MAX_CHUNKS = 16384


class NeedMore(Exception):
    """The parser needs bytes that have not arrived yet."""


class BodyTooLarge(Exception):
    """A chunk-size line declared more than the body limit leaves."""

    def __init__(self, declared: int, limit: int) -> None:
        super().__init__(f"a chunk of {declared} bytes would take the body past its limit of {limit} bytes")


class TooManyChunks(Exception):
    def __init__(self) -> None:
        super().__init__(f"more than {MAX_CHUNKS} chunks in one body")


class Feed:
    """Bytes received on a connection, read by gunicorn's parser as if they were its socket."""

    def __init__(self, buf: bytearray | None = None, pos: int = 0) -> None:
        self.buf = buf if buf is not None else bytearray()
        self.pos = pos
        #: every byte of the message is here: answer EOF (b"") at the end, as a closed socket would
        self.final = False

    def recv(self, n: int) -> bytes:
        if self.pos >= len(self.buf):
            if self.final:
                return b""
            raise NeedMore
        end = min(len(self.buf), self.pos + n)
        with memoryview(self.buf) as view:
            chunk = bytes(view[self.pos:end])
        self.pos = end
        return chunk

    def rest(self) -> bytes:
        return bytes(self.buf[self.pos:])

    def waiting(self) -> int:
        return len(self.buf) - self.pos


def unread_len(unreader: Any) -> int:
    """Bytes an unreader holds back (what its parser read and gave back)."""
    return unreader.buf.seek(0, 2)


class _Retry:
    """When a parser that stopped for want of bytes is worth running again. Inside a line: when a line
    end has arrived since. Past the first line of a block of lines (a request head, a chunked body's
    trailers): when the block's end (an empty line) or a bare LF has arrived, so gunicorn refuses the
    bare LF at once. Either way, also when the bytes doubled since the last try, so a line or block
    with no end reaches gunicorn's limits. Linear in the bytes, however they are cut up."""

    def __init__(self, scanned: int = 0, pending: int = 0) -> None:
        self.scanned = scanned  # buf[:scanned] has been looked at
        self.retry_at = max(1024, 2 * pending) if pending else 0

    def due(self, buf: bytearray, start: int, block: bool) -> bool:
        """`start`: where the bytes the parser reads begin in `buf`; `block`: past the first line."""
        n = len(buf)
        if n <= self.scanned:
            return False
        new = max(start, self.scanned)
        if block:
            found = buf.find(b"\r\n\r\n", max(start, new - 3)) >= 0
            i = -1 if found else buf.find(b"\n", new)
            while i >= 0 and not found:
                found = i == start or buf[i - 1] != 0x0D  # a bare LF
                i = buf.find(b"\n", i + 1)
        else:
            found = buf.find(b"\n", new) >= 0
        self.scanned = n
        if found or n - start >= self.retry_at:
            self.retry_at = max(1024, 2 * (n - start))
            return True
        return False


class HeadReader:
    """gunicorn's request parser over the bytes of a request head so far."""

    def __init__(self) -> None:
        self.retry = _Retry()
        self.line_done = False  # the request line has ended (then the head is a block of lines)

    def parse(self, cfg: Any, buf: bytearray, addr: Any) -> tuple[Any, Any, int] | None:
        """(request, parser, bytes of the head) once gunicorn's parser has one; None while it needs more.
        Raises what gunicorn's parser raises (the worker answers 400, 414, 417, 431 or 501). The parser's
        socket is a Feed over `buf`, which the worker goes on filling: the body is read from it."""
        self.line_done = self.line_done or buf.find(b"\r\n", 0, self.retry.scanned) >= 0
        if not self.retry.due(buf, 0, self.line_done):
            return None
        parser = http.get_parser(cfg, Feed(buf), addr)
        try:
            req = next(parser)
        except NeedMore:
            return None
        return req, parser, parser.unreader.sock.pos - unread_len(parser.unreader)


class _Reader(ChunkedReader):
    """gunicorn's ChunkedReader, telling its driver where each chunk-size line starts and what it declares."""

    def __init__(self, req: Any, unreader: Any, driver: ChunkedBody) -> None:
        super().__init__(req, unreader)
        self.driver = driver
        self.limit_trailer_section = min(self.limit_trailer_section, MAX_TRAILERS)

    def parse_chunk_size(self, unreader, data=None):
        self.driver._line(unreader, data)
        size, rest = super().parse_chunk_size(unreader, data)
        self.driver._declared(size, unreader, rest)
        return size, rest


class ChunkedBody:
    """A chunked request body decoded by gunicorn's ChunkedReader as its bytes arrive (module docstring)."""

    def __init__(self, req: Any, limit: int, received: bytes = b"") -> None:
        self.req = req
        self.limit = limit
        self.raw = bytearray(received)  # bytes received and not yet decoded; raw[0] is at offset self.base
        self.base = 0
        self.pieces: list[bytes] = []  # the decoded body
        self.size = 0
        self.chunks = 0
        self.done = False
        self.leftover = b""  # what followed the body (a pipelined request)
        self.mark = 0  # offset of the line being parsed: gunicorn's reader starts again there if it must
        self.chunk_end: int | None = None  # offset where the current chunk's data ends (its CRLF follows)
        self.left = 0  # data of the current chunk still to come
        self.retry = _Retry()
        self.retry_mark = -1  # the line self.retry is about
        self.gen: Any = None
        self._start()

    # -- what the worker calls

    def feed(self, data: bytes = b"") -> None:
        """Take the bytes just received and decode what can be; raises gunicorn's framing errors,
        BodyTooLarge or TooManyChunks."""
        if data:
            self.raw += data
        while not self.done:
            if self.gen is None:
                start = self.mark - self.base
                # past the line's end (its CRLF), gunicorn's reader is in the trailers: a block of lines
                if not self.retry.due(self.raw, start, self.raw.find(b"\r\n", start, self.retry.scanned) >= 0):
                    break
                self._start()
            if not self._can_resume():
                break
            try:
                piece = next(self.gen)
            except NeedMore:
                self.gen = None  # it stopped inside a line: started again at self.mark when more is here
                if self.retry_mark != self.mark:
                    self.retry = _Retry(len(self.raw), len(self.raw) - (self.mark - self.base))
                    self.retry_mark = self.mark
                break
            except StopIteration:
                self.done = True
                self.leftover = self.unreader.take_buffered() + self.source.rest()
                self.raw = bytearray()
                break
            if piece:
                self.pieces.append(piece)
                self.size += len(piece)
                self.left -= len(piece)
        self._compact()

    @property
    def buffered(self) -> int:
        return len(self.raw) + self.size

    def request_body(self) -> Body:
        """The decoded body, for the application (read as a body of known length)."""
        return Body(LengthReader(IterUnreader(self.pieces), self.size))

    # -- gunicorn's reader, driven

    def _start(self) -> None:
        self.source = Feed(self.raw, self.mark - self.base)
        self.unreader = SocketUnreader(self.source)
        self.gen = _Reader(self.req, self.unreader, self).parser
        self.chunk_end = None

    def _offset(self, held: bytes | None = None) -> int:
        """The offset of the first byte gunicorn's reader has taken but not used (`held` is what its
        caller holds)."""
        return self.base + self.source.pos - unread_len(self.unreader) - len(held or b"")

    def _line(self, unreader: Any, data: bytes | None) -> None:
        mark = self._offset(data)
        if mark != self.mark or not self.chunks:  # a new line, not the same one started again
            self.chunks += 1
            if self.chunks > MAX_CHUNKS:
                raise TooManyChunks
        self.mark = mark
        self.chunk_end = None

    def _declared(self, size: int, unreader: Any, rest: bytes | None) -> None:
        if size > self.limit - self.size:
            raise BodyTooLarge(size, self.limit)
        if size:
            self.chunk_end = self._offset(rest) + size
            self.left = size

    def _can_resume(self) -> bool:
        """Whether gunicorn's generator can go on without running out of bytes where it could not be
        started again: inside a chunk's data it reads whatever is waiting (so something must be), and
        after a chunk's data it reads the CRLF and goes on to the next line (so that CRLF must be here)."""
        if self.chunk_end is None:
            return True  # a line: if it is not all here the generator stops and is started again at it
        waiting = self.source.waiting() + unread_len(self.unreader)
        if self.left > 0:
            return waiting > 0
        return self.base + len(self.raw) >= self.chunk_end + 2

    def _compact(self) -> None:
        """Drop the raw bytes already decoded (never the line being parsed, nor a chunk's CRLF)."""
        if self.done:
            return
        keep = self.chunk_end if self.chunk_end is not None else self.mark
        drop = min(keep - self.base, self.source.pos)
        if drop >= 65536 or (drop > 0 and drop * 2 >= len(self.raw)):
            del self.raw[:drop]
            self.base += drop
            self.source.pos -= drop
            self.retry.scanned = max(0, self.retry.scanned - drop)
