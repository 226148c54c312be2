"""A gunicorn worker that reads whole requests before any work starts, and
writes whole responses after it: nginx's buffering, inside each worker.

Why (docs/reliability.md has the measurements): gunicorn's sync worker gives
one client the whole worker from accept() to close(). Two idle sockets, two
slowloris clients, a slow body or a client that never reads stopped all
traffic for 31 s, the worker timeout. gthread only moves the problem to its
thread pool (a thread blocks on a client that sent one byte). Here, one
event loop per worker (``selectors``, in the main thread) does all the
socket I/O, non-blocking and under deadlines; the application runs in two
threads (and, for a request it says is cheap, on the loop's own) only on
requests that have fully arrived:

- **framing**: none of it here. gunicorn's own parser (``Request``) and body
  readers (``LengthReader``, ``ChunkedReader``) decide every byte, fed the
  bytes received so far as they arrive (service/framing.py): a bare LF, a
  chunk size that is not hex, a missing CRLF are refused at once, as stock
  gunicorn refuses them; a declared chunk counts against the body limit when
  its size line is parsed (413 before its data), and a chunked body is
  decoded as it arrives (its raw bytes dropped);
- **reading**: the request head must arrive within ``header_timeout`` seconds
  of the connection (or of the previous response, on a kept-alive
  connection), at most 64 KiB; the body at no less than ``min_body_rate``
  (16 KiB/s) on average after a ``body_timeout`` grace, and with no pause
  longer than ``body_timeout``. ``Content-Length`` above the service's body limit is
  handed to the app at once (it answers 413) without reading the body, and
  ``Expect: 100-continue`` is answered only after that check;
- **buffering**: request bodies and answers held for clients are bounded per
  worker (``max_buffered``). A body over 64 KiB first reserves its size (a
  chunked one its limit): while bodies and answers hold ``max_buffered``, it
  waits unread (TCP holds its client back, its clocks stop), 503 after
  ``queue_timeout``; the first body is always let in, and a reserved body is
  read to its end, so bodies never wait for each other. Answers over the
  bound: the most stalled reader is cut off first. Heads and small bodies
  (64 KiB each) are read regardless;
- **admission**: a complete request goes to a *lane*. GET/HEAD/OPTIONS (health
  probes, /version, the viewer) have their own thread, so they never wait
  behind a trace; everything else queues for the *work* thread, at most
  ``max_queue`` deep and ``queue_timeout`` seconds old, else an immediate 503
  with Retry-After (a proxy retries it on another replica). A queued request
  whose client hangs up leaves the queue uncomputed, and a lane checks the
  socket again before it computes (logged 499, as nginx does). A small
  request the application says is cheap (its ``request_cost``: the CPU it
  expects from the body alone, at most ``inline_max``, 5 ms) is answered on
  the event loop's own thread when the work thread is idle and nothing is
  queued: the hand-off to the work thread and back cost more than an S trace's
  own rendering, and the loop is held no longer than one such request;
- **writing**: the response is rendered into memory and sent as the client
  reads it; a client that reads nothing for ``send_timeout`` seconds is cut
  off;
- **capacity**: at most ``worker_connections`` connections per worker; when
  full, the slowest connection still sending its request is dropped to make
  room, so idle and slow clients cannot lock others out;
- **stopping** (``max_requests``, SIGTERM): no new connection is taken; every
  request already sent is answered, pipelined ones too (the last answer says
  "close"); a kept-alive connection quiet for ``DRAIN_QUIET`` (1 s) after its
  last answer is closed with a FIN and a lingering read, never a reset.
  Workers are replaced one at a time: one that reaches ``max_requests`` while
  another's replacement is booting serves on until it is ready
  (``RecycleBoard``);
- **balance**: a worker with ``SHED_QUEUE`` traces waiting holds more than
  its share of the busy clients: it closes one kept-alive connection after
  its answer, at most every ``SHED_EVERY`` seconds, and the client reconnects
  to the least loaded worker (after a recycle, the new one);
- **logging**: every request the server refuses or cuts off itself (400, 408,
  413, 414, 417, 431, 499, 501, 503) gets a JSON access-log line with the
  client's address (and its X-Request-ID when well formed), as answered
  requests do, plus a warning in the error log.

A request that runs longer than gunicorn's ``timeout`` stops the worker's
heartbeat, so the arbiter replaces the worker as it would a sync worker.
Plain HTTP/1.x only (no TLS, no HTTP/2: TLS ends at the proxy or ingress).
"""

from __future__ import annotations

import atexit
import errno
import gc
import logging
import mmap
import os
import queue
import selectors
import socket
import struct
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gunicorn.http import wsgi
from gunicorn.http.body import ChunkedReader, LengthReader
from gunicorn.http.errors import (
    ChunkMissingTerminator, ExpectationFailed, InvalidChunkExtension, InvalidChunkSize, LimitRequestHeaders,
    LimitRequestLine, UnsupportedTransferCoding,
)
from gunicorn.workers import base

from service import _REQUEST_ID
from service.framing import BodyTooLarge, ChunkedBody, Feed, HeadReader, TooManyChunks
from service.gunicorn_support import problem_response
from service.settings import CHECK_PATHS, Settings

#: largest request head accepted (request line + headers); gunicorn's own
#: limits (limit_request_line, limit_request_field_size, limit_request_fields)
#: apply within it
MAX_HEAD = 64 * 1024
#: a body no larger than this is always read, whatever the worker holds (small requests are never starved
#: by large slow ones); a larger one first reserves its size in max_buffered (BufferedWorker._reserve)
SMALL_BODY = 64 * 1024
#: the largest body the application is asked to cost on the event loop (BufferedWorker._cheap): asking parses it
#: there, so the body's size bounds what asking costs (a /trace body of 256 tokens is ~1.3 KB)
INLINE_BODY_MAX = 2048
SEND_CHUNK = 256 * 1024
#: a connection younger than this is never dropped to make room (its request may still be on the way)
SHED_AGE = 0.5
#: how often a busy worker looks for new connections (an idle one takes them at once): at least every
#: ACCEPT_POLL seconds (its longest sleep), and at most every ACCEPT_BUSY_GAP seconds while events keep it
#: awake. Looking after every event cost a failed accept() per request under load, each one a GIL release
#: that the compute thread took, and the loop then waited to get back (measured: one accept4 (EAGAIN) per
#: request, ~1.1 per answer). An idle worker, waiting on the listening socket, still takes a new
#: connection at once, and wins it against busy workers more often.
ACCEPT_POLL = 0.02
ACCEPT_BUSY_GAP = 0.002
#: the heartbeat gunicorn's arbiter watches (a file's mtime) is touched at most this often, and not on
#: every turn of the loop (a utimensat per event): the arbiter's timeout is tens of seconds
HEARTBEAT_EVERY = 0.25
#: an answer no larger than this is sent in one send() (its head and body joined: one copy of at most
#: 64 KiB, against a second system call and TCP segment); larger ones are sent in their parts
JOIN_SMALL = 64 * 1024
#: Least connections first: a worker with no open connection waits on the listening socket and takes a new
#: one at once; one holding k connections only looks every k·ACCEPT_SPREAD seconds (at most
#: ACCEPT_SPREAD_MAX), one at a time. Every worker wakes for a new connection, and without this the first
#: awake took whole bursts, so kept-alive clients (wrk, a proxy's upstream pool) could all land on one
#: worker while the other cores idled (measured: 4 connections on 1 of 2 workers, half the throughput).
ACCEPT_SPREAD = 0.0005
ACCEPT_SPREAD_MAX = 0.002
#: a stopping worker closes a kept-alive connection once it has been quiet this long after its last answer
DRAIN_QUIET = 1.0
#: Rebalancing: a worker with at least SHED_QUEUE traces waiting in its queue (beyond the one it computes)
#: holds more than its share of the busy clients, and closes one kept-alive connection after its answer
#: ("Connection: close"), at most every SHED_EVERY seconds; the client reconnects, and a worker with no
#: connection (waiting on the listening socket) takes it at once. Without it, after a recycle (max_requests)
#: the survivor kept every connection until keepalive_requests, while the new worker idled (measured: 3 to
#: 222 ms from its start to its first request under wrk, 4 connections on 2 workers). Evenly spread
#: clients leave at most one trace waiting per worker, so they are never closed.
SHED_QUEUE = 2
SHED_EVERY = 0.05
#: a worker that reaches max_requests while another worker's replacement is still booting goes on serving
#: (RecycleBoard), for at most this long after that recycle began, and to 2 × max_requests at most
RECYCLE_WAIT_MAX = 10.0


@dataclass(frozen=True)
class Limits:
    """Set once in gunicorn.conf.py (the master), inherited by every worker."""

    header_timeout: float = 10.0
    body_timeout: float = 10.0
    min_body_rate: float = 16 * 1024
    send_timeout: float = 10.0
    queue_timeout: float = 15.0
    #: requests answered on one kept-alive connection before it is closed (nginx's keepalive_requests):
    #: long-lived clients then reconnect now and then, and connections that all landed on one worker
    #: (one that was booting or recycled when they connected) spread out again over the workers
    keepalive_requests: int = 100
    max_queue: int = 16
    max_fast_queue: int = 64
    max_buffered: int = 64 * 1024 * 1024
    #: a request the application expects to cost at most this many seconds of CPU is answered on the event loop's
    #: thread when the work thread is idle (BufferedWorker._cheap); 0: every request goes to its lane
    inline_max: float = 0.005
    # The service's own limits (gunicorn.conf.py passes the configured ones).
    max_body_bytes: int = Settings.max_body_bytes
    #: /check and /check/batch take larger bodies
    max_check_body_bytes: int = Settings.max_check_body_bytes
    linger: float = 2.0


LIMITS = Limits()


class RecycleBoard:
    """When a worker last began a recycle (max_requests) and when a worker last became ready, in memory shared by
    every worker: it is mapped when this module is imported, in gunicorn's master (which loads the worker class),
    before it forks them.

    Why: evenly loaded workers reach max_requests together (its jitter, 10 % in gunicorn.conf.py, is a fraction
    of a second at full load), and all of them then stopped at once: no worker answered anything for the ~0.5 s of the
    replacements' exit and boot (measured, 2 workers under wrk: nothing answered for 0.6 s at each pair of
    recycles). Now a worker that reaches max_requests while another's replacement is still booting waits for
    it, so one worker at a time is replaced and the others keep answering."""

    def __init__(self) -> None:
        self.mem = mmap.mmap(-1, 16)  # MAP_SHARED: the master's workers all see the same two numbers

    def begin_recycle(self, now: float) -> bool:
        """True if this worker may recycle now (then it is marked as recycling); False while another
        worker's replacement is booting (for at most RECYCLE_WAIT_MAX seconds after that recycle began)."""
        began, ready = struct.unpack("dd", self.mem[:16])
        if began > ready and now - began < RECYCLE_WAIT_MAX:
            return False
        self.mem[:8] = struct.pack("d", now)
        return True

    def ready(self, now: float) -> None:
        """A worker has loaded the app and is about to take connections."""
        self.mem[8:16] = struct.pack("d", now)


RECYCLES = RecycleBoard()


def configure(**values: Any) -> Limits:
    """gunicorn.conf.py's hook: replace the limits (before the workers fork)."""
    global LIMITS
    LIMITS = Limits(**values)
    return LIMITS


class OutBuffer:
    """What gunicorn's Response writes, collected in memory."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.parts.append(bytes(data))

    def send(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def gettimeout(self) -> float:
        return 0.0

    def setblocking(self, flag: bool) -> None:
        pass

    def value(self) -> list[bytes]:
        """The parts as written (not joined: a 40 MB answer is not copied once more)."""
        return self.parts


class Conn:
    __slots__ = ("sock", "fd", "addr", "server", "state", "source", "head", "chunked", "accepted", "phase_start",
                 "last_progress", "received", "body_start", "reserved", "paused_at", "resume_deadline", "expects", "req",
                 "parser", "need", "deadline", "out", "out_pos", "out_left", "out_size", "keep", "close_after",
                 "request_start", "lane", "queued_at", "events", "linger_until", "served", "environ")

    def __init__(self, sock: socket.socket, addr: Any, server: Any, now: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.addr = addr
        self.server = server
        self.accepted = now
        self.events = 0
        self.served = 0  # requests answered on this connection
        self.reset(now, b"")

    def reset(self, now: float, leftover: bytes) -> None:
        """Wait for the next request head (a new or kept-alive connection)."""
        self.state = "head"
        self.source = Feed(bytearray(leftover))  # what gunicorn's parser reads: the bytes received so far
        self.head = HeadReader()
        self.chunked: ChunkedBody | None = None
        self.phase_start = now
        self.last_progress = now
        self.received = len(leftover)
        self.body_start = 0  # self.received when the head ended
        self.reserved = 0  # bytes of max_buffered this request's body holds (a body over SMALL_BODY)
        self.paused_at = 0.0  # when reading was paused for buffer room (0: not paused)
        self.resume_deadline = 0.0
        self.expects = False  # the client waits for 100 Continue (sent when a paused body is let in)
        self.req = None
        self.parser = None
        self.need = 0
        self.deadline = now + LIMITS.header_timeout
        self.out: deque[memoryview] | None = None  # what is left to send, in parts
        self.out_pos = 0  # bytes sent so far
        self.out_left = 0
        self.out_size = 0
        self.keep = False
        self.close_after = False
        self.request_start = None
        self.lane = None
        self.queued_at = 0.0
        self.linger_until = 0.0
        self.environ: dict[str, Any] | None = None  # what the app's request_cost adds to this request's environ

    @property
    def buffered(self) -> int:
        return (len(self.source.buf) + (self.chunked.buffered if self.chunked is not None else 0)
                + (self.out_left if self.out is not None else 0))

    def client_ip(self) -> str:
        return self.addr[0] if isinstance(self.addr, tuple) else str(self.addr)


class _Rejection:
    """Enough of gunicorn's request/response for an access-log line about a refused request."""

    def __init__(self, status: int, reason: str, sent: int, request_id: str) -> None:
        self.status = f"{status} {reason}"
        self.sent = sent
        self.headers = [("X-Request-ID", request_id)]


class BufferedWorker(base.Worker):
    """See the module docstring."""

    def init_process(self) -> None:
        _tune_malloc()
        # No garbage collection while gunicorn loads the app (base.Worker.init_process, below): its imports
        # create ~60,000 objects that all live, and collecting as they come was ~10 % of a boot (measured in
        # process: 270-278 -> 241-253 ms of CPU), paid at every recycle. run() turns it back on.
        gc.disable()
        self.sel = selectors.DefaultSelector()
        self.conns: dict[int, Conn] = {}
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self.fast_q: deque[Conn] = deque()
        self.work_q: deque[Conn] = deque()
        # One lock over both queues, one condition per lane: a trace wakes the work thread alone (with one
        # condition for both, every submission woke the fast lane too, ~2 context switches a request for nothing)
        self.lock = threading.Lock()
        self.cond = {"fast": threading.Condition(self.lock), "work": threading.Condition(self.lock)}
        self.running: dict[str, tuple[Conn, float] | None] = {"fast": None, "work": None}
        self.accepting = False
        self.next_accept_look = 0.0
        self.next_busy_look = 0.0
        self.last_shed = 0.0  # when a connection was last closed to rebalance (SHED_QUEUE)
        self.next_heartbeat = 0.0
        self.paused: deque[Conn] = deque()  # bodies waiting for room in the buffers (max_buffered)
        self.nr_lock = threading.Lock()
        super().init_process()

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        gc.enable()
        RECYCLES.ready(time.monotonic())
        for listener in self.sockets:
            listener.setblocking(False)
        self._accept(True)
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.sel.register(self.PIPE[0], selectors.EVENT_READ, "signal")
        threads = [threading.Thread(target=self._lane, args=(name,), name=f"lane-{name}", daemon=True)
                   for name in ("fast", "work")]
        for t in threads:
            t.start()
        stop_by = None
        while True:
            now = time.monotonic()
            if now >= self.next_heartbeat and self._heartbeat_ok(now):
                self.notify()
                self.next_heartbeat = now + min(HEARTBEAT_EVERY, self.timeout / 4)
            if not self.alive:
                if stop_by is None:
                    stop_by = now + self.cfg.graceful_timeout
                    self._accept(False)
                self._drain_idle(now)
                if not self.conns or now > stop_by:
                    break
            if self.ppid != os.getppid():
                self.log.info("Parent changed, shutting down: %s", self)
                break
            # Load balancing between workers: a worker with no connection waits on the
            # listening socket and takes a new connection at once; one holding
            # connections looks every k·ACCEPT_SPREAD seconds (ACCEPT_SPREAD's comment),
            # and one with work queued or running every ACCEPT_BUSY_GAP to ACCEPT_POLL
            # seconds, so new connections go to the least loaded worker, and are still
            # taken when every worker is busy.
            held = self._held()
            busy = self.alive and (self._busy() or held >= self.worker_connections)
            self._accept(self.alive and not busy and not held)
            timeout = self._next_wakeup(now)
            if not self.alive:
                timeout = min(timeout, DRAIN_QUIET / 4)
            if busy:
                timeout = min(timeout, ACCEPT_POLL)
            elif self.alive and held:  # look for a new connection now and then (least connections first)
                timeout = min(timeout, max(0.0, self.next_accept_look - now))
            try:
                events = self.sel.select(timeout=timeout)
            except OSError as e:
                if e.errno != errno.EINTR:
                    raise
                events = []
            for key, mask in events:
                self._dispatch(key, mask)
            self._completions()
            self._resume_paused()
            if busy:
                if time.monotonic() >= self.next_busy_look:
                    for listener in self.sockets:
                        self._on_accept(listener, burst=4)
                    self.next_busy_look = time.monotonic() + ACCEPT_BUSY_GAP
            elif self.alive and held and time.monotonic() >= self.next_accept_look:
                for listener in self.sockets:
                    self._on_accept(listener, burst=1)
                self._look_later()
            self._timeouts(time.monotonic())
        with self.lock:
            for cond in self.cond.values():
                cond.notify_all()
        for conn in list(self.conns.values()):
            self._close(conn)
        # gunicorn now logs the exit, runs its worker_exit hook and exits with status 0; the interpreter's
        # teardown after that (the app's modules, numpy's, a garbage collection of the whole heap) cost
        # ~70 ms of CPU at every recycle (measured after SIGTERM: 60-80 ms), and nothing in it is needed
        atexit.register(_exit_now)

    @property
    def worker_connections(self) -> int:
        return max(8, int(self.cfg.worker_connections))

    def _full(self) -> bool:
        """At worker_connections (lingering closes, a few seconds at most, do not count)."""
        return self._held() >= self.worker_connections

    def _look_later(self) -> None:
        """When a worker holding connections next looks for a new one: k·ACCEPT_SPREAD, at most ACCEPT_SPREAD_MAX."""
        self.next_accept_look = time.monotonic() + min(ACCEPT_SPREAD * max(1, self._held()), ACCEPT_SPREAD_MAX)

    def _held(self) -> int:
        """Open connections that may send another request (lingering closes do not count)."""
        return sum(1 for c in self.conns.values() if c.state != "linger")

    def _busy(self) -> bool:
        return bool(self.work_q) or self.running["work"] is not None

    def _heartbeat_ok(self, now: float) -> bool:
        """No request has run longer than gunicorn's timeout (else the arbiter should replace us)."""
        for item in self.running.values():
            if item is not None and now - item[1] > self.timeout:
                return False
        return True

    def _next_wakeup(self, now: float) -> float:
        soonest = now + 1.0
        for conn in self.conns.values():
            if conn.state in ("head", "body", "write", "linger") and conn.deadline < soonest:
                soonest = conn.deadline
        return max(0.0, min(1.0, soonest - now))

    def _accept(self, on: bool) -> None:
        if on == self.accepting:
            return
        for listener in self.sockets:
            if on:
                self.sel.register(listener, selectors.EVENT_READ, "accept")
            else:
                self.sel.unregister(listener)
        self.accepting = on

    def _dispatch(self, key: selectors.SelectorKey, mask: int) -> None:
        if key.data == "accept":
            self._on_accept(key.fileobj)
        elif key.data == "wake":
            try:  # one read: whatever is left (over 4 KiB of wake-ups) wakes the next select again
                os.read(self.wake_r, 4096)
            except BlockingIOError:
                pass
        elif key.data == "signal":
            try:
                while os.read(self.PIPE[0], 4096):
                    pass
            except (BlockingIOError, OSError):
                pass
        else:
            conn: Conn = key.data
            if self.conns.get(conn.fd) is not conn:
                return
            if mask & selectors.EVENT_READ:
                self._on_readable(conn)
            if self.conns.get(conn.fd) is conn and mask & selectors.EVENT_WRITE:
                self._on_writable(conn)

    def _watch(self, conn: Conn, events: int) -> None:
        if events == conn.events:
            return
        if conn.events == 0:
            self.sel.register(conn.sock, events, conn)
        elif events == 0:
            self.sel.unregister(conn.sock)
        else:
            self.sel.modify(conn.sock, events, conn)
        conn.events = events

    # ------------------------------------------------------------------ accept

    def _on_accept(self, listener: socket.socket, burst: int = 64) -> None:
        for _ in range(burst):  # a burst at a time, then back to the others
            if self._full() and not self._shed_slowest_sender():
                return
            try:
                sock, addr = listener.accept()
            except OSError as e:
                if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ECONNABORTED):
                    return
                raise
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Conn(sock, addr, listener.getsockname(), time.monotonic())
            self.conns[conn.fd] = conn
            self._watch(conn, selectors.EVENT_READ)
            if burst == 64 and self._held():  # from the listener's event: one, then least connections first
                self._look_later()
                return

    def _shed_slowest_sender(self) -> bool:
        """Full: drop the connection that has sent its request the slowest (at least SHED_AGE old)."""
        now = time.monotonic()
        victims = [c for c in self.conns.values() if c.state in ("head", "body") and now - c.phase_start > SHED_AGE]
        if not victims:
            return False
        victim = min(victims, key=lambda c: c.received / (now - c.phase_start))
        request_id = uuid.uuid4().hex
        body = problem_response(408, "Request Timeout", "The server is full and this request was the slowest "
                                "to arrive.", request_id)
        self._log_refusal(victim, 408, "Request Timeout", victim.req, len(body), request_id,
                          f"dropped to make room (worker_connections full): it sent {victim.received} bytes "
                          f"in {now - victim.phase_start:.1f} s")
        try:
            victim.sock.send(body)  # one try, no lingering: the room is needed now
        except OSError:
            pass
        self._close(victim)
        return True

    # ------------------------------------------------------------------ reading

    @staticmethod
    def _recv(conn: Conn) -> bytes | None:
        """At most 64 KiB: None when nothing is ready yet, b"" when the client closed or the socket failed."""
        try:
            return conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return b""

    def _on_readable(self, conn: Conn) -> None:
        if conn.state == "linger":
            self._linger_read(conn)
            return
        if conn.state == "queued":
            self._check_gone(conn)
            return
        if conn.state not in ("head", "body"):
            return
        data = self._recv(conn)
        if data is None:
            return
        if not data:
            if conn.state == "head" and conn.received == 0:
                self._close(conn)  # a kept-alive or idle connection the client closed: nothing to say
            else:
                self.log.info("client %s closed the connection after sending %d bytes of a request",
                              conn.client_ip(), conn.received)
                self._close(conn)
            return
        now = time.monotonic()
        conn.received += len(data)
        conn.last_progress = now
        if conn.chunked is not None:
            self._feed_chunked(conn, now, data)
            return
        conn.source.buf += data
        self._advance(conn, now)

    def _advance(self, conn: Conn, now: float) -> None:
        if conn.state == "head":
            buf = conn.source.buf
            try:
                parsed = conn.head.parse(self.cfg, buf, conn.addr)
            except Exception as exc:  # noqa: BLE001 (gunicorn's parser refused the head: 400/414/417/431/501)
                self._reject_exc(conn, exc, req=getattr(exc, "req", None))
                return
            if parsed is not None:
                self._start_body(conn, now, *parsed)
            elif len(buf) > MAX_HEAD:
                line_end = buf.find(b"\r\n")
                too_long = line_end < 0 or line_end > self.cfg.limit_request_line
                exc = LimitRequestLine(len(buf), self.cfg.limit_request_line) if too_long \
                    else LimitRequestHeaders("the request head is larger than 64 KiB")
                self._reject_exc(conn, exc)
        elif conn.state == "body" and len(conn.source.buf) >= conn.need:
            self._submit(conn, now)

    def _start_body(self, conn: Conn, now: float, req: Any, parser: Any, head_size: int) -> None:
        """gunicorn's parser has read a request head (its socket: conn.source's bytes); now its body."""
        conn.req = req
        conn.parser = parser
        conn.source = parser.unreader.sock  # the same bytes, read by the body's reader from here on
        conn.request_start = datetime.now()
        conn.body_start = conn.received - (len(conn.source.buf) - head_size)
        # gunicorn would answer 100 Continue as soon as the app starts; this worker does, below,
        # only once the body is known to be within the limit (RFC 9110 10.1.1).
        expects_continue, req._expected_100_continue = req._expected_100_continue, False
        reader = req.body.reader if req.body is not None else None
        limit = LIMITS.max_check_body_bytes if req.path in CHECK_PATHS else LIMITS.max_body_bytes
        conn.state = "body"
        conn.phase_start = now
        if isinstance(reader, ChunkedReader):
            # gunicorn's ChunkedReader decodes the body as it arrives (service/framing.py)
            received = parser.unreader.take_buffered() + conn.source.rest()
            conn.source = Feed()
            conn.chunked = ChunkedBody(req, limit)
            conn.deadline = now + LIMITS.body_timeout + limit / LIMITS.min_body_rate
            self._continue(conn, expects_continue)
            self._feed_chunked(conn, now, received)
            return
        length = reader.length if isinstance(reader, LengthReader) else 0  # gunicorn: no body is length 0
        conn.need = head_size + length
        if length > limit:
            # Refused unread: the app answers 413 from Content-Length alone. No 100 Continue.
            conn.close_after = True
            self._submit(conn, now)
            return
        conn.deadline = now + LIMITS.body_timeout + length / LIMITS.min_body_rate
        if length and len(conn.source.buf) < conn.need:
            if length > SMALL_BODY and not self._reserve(conn, length):
                conn.expects = expects_continue  # 100 Continue when it is let in
                self._pause(conn)
                return
            self._continue(conn, expects_continue)
        self._advance(conn, now)

    @staticmethod
    def _continue(conn: Conn, expected: bool) -> None:
        if expected:
            try:
                conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            except OSError:
                pass

    def _feed_chunked(self, conn: Conn, now: float, data: bytes) -> None:
        body = conn.chunked
        try:
            body.feed(data)
        except (BodyTooLarge, TooManyChunks) as exc:
            self._reject(conn, 413, "Request Entity Too Large", req=conn.req, why=str(exc),
                         detail=f"The request body is larger than the limit of {body.limit} bytes for "
                                f"{conn.req.path} ({exc}).")
            return
        except Exception as exc:  # noqa: BLE001 (gunicorn's ChunkedReader refused the framing: InvalidChunkSize, ...)
            status, reason = _status_of(exc)
            self._reject(conn, status, reason, req=conn.req, why=f"{type(exc).__name__}: {exc}",
                         detail=f"The request body's chunked framing is invalid ({type(exc).__name__}).")
            return
        if body.done:
            conn.req.body = body.request_body()
            self._submit(conn, now)
        elif body.buffered > SMALL_BODY and not conn.reserved and not self._reserve(conn, body.limit):
            self._pause(conn)  # its size is unknown: it reserves its limit

    # ------------------------------------------------------------------ input buffer room

    def _room(self, conn: Conn) -> tuple[int, bool]:
        """(bytes of max_buffered not held by answers or reserved by other bodies, whether others reserve any)."""
        held = others = 0
        for c in self.conns.values():
            if c is not conn:
                others += c.reserved
            if c.out is not None:
                held += c.out_left
        return LIMITS.max_buffered - held - others, others > 0

    def _reserve(self, conn: Conn, size: int) -> bool:
        """Reserve room for a body of `size` bytes before reading it: while request bodies and answers
        hold max_buffered, a large body waits unread (TCP holds its client back) until an answer or a
        body leaves. The first body is always let in (so one always makes progress, whatever its size),
        and a reserved body is always read to its end, so bodies never wait for each other in a circle."""
        room, others = self._room(conn)
        if others and size > room:
            return False
        conn.reserved = size
        return True

    def _pause(self, conn: Conn) -> None:
        """Wait, unread, for room. The body's clocks stop meanwhile (the wait is the server's, not the
        client's); after queue_timeout it gets 503 with Retry-After."""
        now = time.monotonic()
        self._watch(conn, 0)
        conn.paused_at = now
        conn.resume_deadline = conn.deadline
        conn.deadline = now + LIMITS.queue_timeout
        self.paused.append(conn)

    def _resume_paused(self) -> None:
        """Let waiting bodies in, oldest first, as their reservations fit."""
        now = time.monotonic()
        while self.paused:
            conn = self.paused[0]
            if self.conns.get(conn.fd) is not conn or not conn.paused_at:
                self.paused.popleft()
                continue
            if not self._reserve(conn, conn.chunked.limit if conn.chunked is not None else conn.need):
                return
            self.paused.popleft()
            waited = now - conn.paused_at
            conn.phase_start += waited
            conn.last_progress += waited
            conn.deadline = conn.resume_deadline + waited
            conn.paused_at = 0.0
            self._continue(conn, conn.expects)
            conn.expects = False
            self._watch(conn, selectors.EVENT_READ)

    # ------------------------------------------------------------------ clients that are gone

    def _check_gone(self, conn: Conn) -> None:
        """A queued request's socket became readable: a pipelined request, or the client hung up. A request
        whose client is gone is dropped from its queue, never computed (nginx's 499)."""
        try:
            data = conn.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self._watch(conn, 0)  # the next request is on its way: it is read after this answer
            return
        with self.lock:
            q = self.fast_q if conn.lane == "fast" else self.work_q
            try:
                q.remove(conn)
            except ValueError:  # being computed: its answer will find the socket closed
                self._watch(conn, 0)
                return
        self._gone(conn, "in the queue")

    def _gone(self, conn: Conn, where: str) -> None:
        self._log_refusal(conn, 499, "Client Closed Request", conn.req, 0, _request_id(conn.req),
                          f"the client closed the connection while its request waited {where}; not computed")
        self._close(conn)

    @staticmethod
    def _client_gone(conn: Conn) -> bool:
        """The client has closed its end (EOF, or an error) with nothing more sent. Called from a lane."""
        if conn.state == "closed":
            return True
        try:
            return not conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    @staticmethod
    def _pipelined(conn: Conn) -> bool:
        """Bytes of a further request are here already (read, or waiting in the kernel). Called from a lane."""
        if conn.chunked is not None and conn.chunked.leftover or len(conn.source.buf) > conn.need:
            return True
        try:
            return bool(conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except OSError:
            return False

    # ------------------------------------------------------------------ admission

    def _submit(self, conn: Conn, now: float) -> None:
        """A complete request (or one to refuse unread) goes to its lane."""
        conn.source.final = True  # the body's reader (in the lane) finds its end, as at a closed socket
        fast = conn.req.method in ("GET", "HEAD", "OPTIONS")
        lane, q, cap = ("fast", self.fast_q, LIMITS.max_fast_queue) if fast else \
            ("work", self.work_q, LIMITS.max_queue)
        if len(q) >= cap:
            self._reject(conn, 503, "Service Unavailable", req=conn.req,
                         detail="The server is busy; try again in a moment.", retry_after=1,
                         why=f"the {lane} queue is full ({cap} requests waiting)")
            return
        conn.state = "queued"
        conn.lane = lane
        conn.queued_at = now
        # Nothing more is read until it is answered; the socket is only watched for the client hanging up
        # (_check_gone): then the request leaves the queue uncomputed.
        self._watch(conn, selectors.EVENT_READ)
        if not fast and not q and self.running["work"] is None and self._cheap(conn):
            self._serve_inline(conn)
            return
        with self.lock:
            q.append(conn)
            self.cond[lane].notify()

    def _cheap(self, conn: Conn) -> bool:
        """Whether the application expects this request to cost at most ``inline_max`` of CPU.

        It is asked (the WSGI callable's optional ``request_cost(method, path, body)``: seconds and environ
        entries, or None) only about a whole body of at most INLINE_BODY_MAX bytes framed by Content-Length, so
        asking costs little on the event loop. What it adds to the environ (service: the validated request,
        so the app does not validate it twice) goes with the request to whichever thread answers it."""
        request_cost = getattr(self.wsgi, "request_cost", None)
        reader = conn.req.body.reader if conn.req.body is not None else None
        if request_cost is None or LIMITS.inline_max <= 0 or conn.chunked is not None \
                or not isinstance(reader, LengthReader) or reader.length > INLINE_BODY_MAX:
            return False
        body = bytes(conn.source.buf[conn.need - reader.length:conn.need])  # the head's bytes come first
        try:
            answer = request_cost(conn.req.method, conn.req.path, body)
        except Exception:  # an app's estimate must not fail its request: it goes to its lane
            self.log.exception("request_cost failed; the request goes to the work thread")
            return False
        if answer is None:
            return False
        seconds, conn.environ = answer
        return seconds <= LIMITS.inline_max

    def _serve_inline(self, conn: Conn) -> None:
        """Answer a cheap request here, on the event loop's thread, as a lane would (its result is sent by
        _completions, after this loop pass)."""
        self.running["work"] = (conn, time.monotonic())  # as a lane: what the heartbeat and _busy see
        try:
            result = self._serve(conn)
        except Exception as e:  # noqa: BLE001 (as in a lane: answer 500 and go on; SystemExit, from gunicorn's
            # quit and abort signals, stops the worker as it would without this request)
            result = ("error", e)
        finally:
            self.running["work"] = None
        self.done.put((conn, result))

    def _lane(self, name: str) -> None:
        q = self.fast_q if name == "fast" else self.work_q
        cond = self.cond[name]
        while True:
            with cond:
                while not q:
                    if not self.alive and not self.conns:
                        return
                    cond.wait(1.0)
                conn = q.popleft()
                self.running[name] = (conn, time.monotonic())
            try:
                result = self._serve(conn)
            except BaseException as e:  # noqa: BLE001 (never let a lane die: answer 500 and go on)
                result = ("error", e)
            finally:
                self.running[name] = None
            self.done.put((conn, result))
            try:
                os.write(self.wake_w, b"x")
            except OSError:
                pass

    def _serve(self, conn: Conn) -> tuple:
        """Run the app on a complete request (in a lane thread); the response comes back as bytes."""
        waited = time.monotonic() - conn.queued_at
        if waited > LIMITS.queue_timeout:
            return ("reject", 503, "Service Unavailable", f"it waited {waited:.1f} s in the work queue")
        if self._client_gone(conn):
            return ("gone",)
        req = conn.req
        out = OutBuffer()
        resp, environ = wsgi.create(req, out, conn.addr, conn.server, self.cfg)
        environ["wsgi.multithread"] = True
        if conn.environ:
            environ.update(conn.environ)
        with self.nr_lock:
            self.nr += 1
            if self.nr >= self.max_requests and self.alive and \
                    (RECYCLES.begin_recycle(time.monotonic()) or self.nr >= 2 * self.max_requests):
                self.log.info("Autorestarting worker after current request.")
                self.alive = False
        conn.served += 1
        # Close after this answer when the worker is stopping (max_requests, SIGTERM), after keepalive_requests,
        # or to rebalance (SHED_QUEUE): the client reconnects, to whichever worker is least busy; but not while
        # requests the client has pipelined are here already: those are answered first, and the last says "close".
        now = time.monotonic()
        shed = conn.lane == "work" and len(self.work_q) >= SHED_QUEUE and now - self.last_shed >= SHED_EVERY \
            and self.cfg.workers > 1
        if not self.cfg.keepalive or conn.close_after or conn.served >= 2 * LIMITS.keepalive_requests or \
                ((not self.alive or conn.served >= LIMITS.keepalive_requests or shed) and not self._pipelined(conn)):
            resp.force_close()
            if shed:
                self.last_shed = now
        respiter = self.wsgi(environ, resp.start_response)
        try:
            for item in respiter:
                resp.write(item)
            resp.close()
        finally:
            self.log.access(resp, req, environ, datetime.now() - conn.request_start)
            if hasattr(respiter, "close"):
                respiter.close()
        keep = not resp.should_close()
        leftover = b""
        if keep:
            keep = bool(conn.parser.finish_body())
            leftover = conn.chunked.leftover if conn.chunked is not None else \
                conn.parser.unreader.take_buffered() + conn.source.rest()
        return ("ok", out.value(), keep, leftover)

    def _completions(self) -> None:
        while True:
            try:
                conn, result = self.done.get_nowait()
            except queue.Empty:
                return
            if self.conns.get(conn.fd) is not conn:
                continue  # the client went away meanwhile (its descriptor may be someone else's now)
            if result[0] == "ok":
                _, data, keep, leftover = result
                self._send(conn, data, keep, leftover)
            elif result[0] == "gone":
                self._gone(conn, "for its lane")
            elif result[0] == "reject":
                _, status, reason, why = result
                self._reject(conn, status, reason, req=conn.req, retry_after=1,
                             detail="The server is busy; try again in a moment.", why=why)
            else:
                exc = result[1]
                self.log.error("Error handling request %s %s: %r", getattr(conn.req, "method", "-"),
                               getattr(conn.req, "uri", "-"), exc, exc_info=exc)
                self._reject(conn, 500, "Internal Server Error", req=conn.req, detail="The server failed "
                             "to answer this request.", why="the application raised")

    # ------------------------------------------------------------------ writing

    def _send(self, conn: Conn, data: bytes | list[bytes], keep: bool, leftover: bytes) -> None:
        now = time.monotonic()
        conn.state = "write"
        parts = [data] if isinstance(data, bytes) else data
        if len(parts) > 1 and sum(len(p) for p in parts) <= JOIN_SMALL:
            parts = [b"".join(parts)]
        conn.out = deque(memoryview(p) for p in parts if p)
        conn.out_pos = 0
        conn.out_size = conn.out_left = sum(len(p) for p in conn.out)
        conn.keep = keep  # what the answer said: a stopping worker still answers a request already sent
        conn.source = Feed(bytearray(leftover))
        conn.chunked = None
        conn.reserved = 0  # the body is no longer held
        conn.last_progress = now
        conn.deadline = now + LIMITS.send_timeout
        self._make_room(conn)
        # Most answers go out whole at once: the socket is watched for writing only when some is left (for
        # every other answer that was two epoll_ctl calls for nothing, from reading to writing and back).
        self._on_writable(conn)
        if self.conns.get(conn.fd) is conn and conn.state == "write" and conn.out is not None:
            self._watch(conn, selectors.EVENT_WRITE)

    def _on_writable(self, conn: Conn) -> None:
        if conn.state != "write" or conn.out is None:
            return
        sent = 0
        while conn.out:
            part = conn.out[0]
            try:
                n = conn.sock.send(part[:SEND_CHUNK])
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._close(conn)
                return
            sent += n
            if n == len(part):
                conn.out.popleft()
            else:
                conn.out[0] = part[n:]
                break
        if sent:
            now = time.monotonic()
            conn.out_pos += sent
            conn.out_left -= sent
            conn.last_progress = now
            conn.deadline = now + LIMITS.send_timeout
        if conn.out:
            return
        now = time.monotonic()
        conn.out = None
        if conn.keep:
            leftover = conn.source.rest()
            conn.reset(now, leftover)
            conn.deadline = now + min(self.cfg.keepalive, LIMITS.header_timeout) if not leftover \
                else now + LIMITS.header_timeout
            self._watch(conn, selectors.EVENT_READ)
            if leftover:
                self._advance(conn, now)
        else:
            self._linger(conn, now)

    def _linger(self, conn: Conn, now: float) -> None:
        """Half-close, then read and drop what the client still sends, so that it
        gets the answer rather than a reset (RFC 9112 9.6). At most
        worker_connections lingering at once: beyond that the oldest is closed."""
        lingering = [c for c in self.conns.values() if c.state == "linger"]
        if len(lingering) >= self.worker_connections:
            self._close(min(lingering, key=lambda c: c.deadline))
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.state = "linger"
        conn.source = Feed()
        conn.deadline = now + LIMITS.linger
        self._watch(conn, selectors.EVENT_READ)

    def _linger_read(self, conn: Conn) -> None:
        data = self._recv(conn)
        if data is None:
            return
        conn.received += len(data)
        if not data or conn.received > 4 * max(LIMITS.max_body_bytes, LIMITS.max_check_body_bytes):
            self._close(conn)

    def _make_room(self, keep: Conn) -> None:
        """Above max_buffered, cut off the readers that have read least recently."""
        total = sum(c.buffered for c in self.conns.values())
        if total <= LIMITS.max_buffered:
            return
        now = time.monotonic()
        stalled = sorted((c for c in self.conns.values() if c is not keep and c.state == "write"
                          and now - c.last_progress > 1.0), key=lambda c: c.last_progress)
        for c in stalled:
            if total <= LIMITS.max_buffered:
                break
            total -= c.buffered
            self._cut_off_reader(c, now, "the worker's output buffer is full")

    def _cut_off_reader(self, conn: Conn, now: float, why: str) -> None:
        sent, size = conn.out_pos, conn.out_size
        self.log.warning("client %s cut off: it read %d of %d bytes of its answer and nothing for %.1f s (%s)",
                         conn.client_ip(), sent, size, now - conn.last_progress, why)
        self._close(conn)

    # ------------------------------------------------------------------ timeouts and refusals

    def _timeouts(self, now: float) -> None:
        for conn in list(self.conns.values()):
            if conn.state not in ("head", "body", "write", "linger") or now < conn.deadline:
                continue
            if conn.state == "linger":
                self._close(conn)
            elif conn.state == "write":
                self._cut_off_reader(conn, now, f"send_timeout {LIMITS.send_timeout:g} s")
            elif conn.paused_at:
                self._reject(conn, 503, "Service Unavailable", req=conn.req, retry_after=1,
                             detail="The server is busy; try again in a moment.",
                             why=f"its body waited {now - conn.paused_at:.1f} s for room in the worker's "
                                 f"buffers (max_buffered {LIMITS.max_buffered} bytes)")
            elif conn.state == "head" and conn.received == 0:
                # idle, nothing sent: no answer is owed
                if conn.phase_start == conn.accepted:  # a new connection
                    self._close(conn)
                    self._log_refusal(conn, 408, "Request Timeout", None, 0, uuid.uuid4().hex,
                                      f"idle for {now - conn.phase_start:.1f} s without sending a request")
                else:  # kept alive after an answer: FIN, so a request that crossed it is not met with a reset
                    self._linger(conn, now)
            else:
                self._refuse_slow(conn, f"header_timeout {LIMITS.header_timeout:g} s" if conn.state == "head"
                                  else f"body too slow: {conn.received} bytes in {now - conn.phase_start:.1f} s")
        # A body must keep coming: no pause longer than body_timeout, and after that
        # grace, at least min_body_rate bytes a second on average.
        for conn in list(self.conns.values()):
            if conn.state != "body" or conn.paused_at:
                continue
            elapsed = now - conn.phase_start
            body = conn.received - conn.body_start
            if now - conn.last_progress > LIMITS.body_timeout:
                self._refuse_slow(conn, f"no body bytes for {now - conn.last_progress:.1f} s")
            elif elapsed > LIMITS.body_timeout and body < LIMITS.min_body_rate * (elapsed - LIMITS.body_timeout):
                self._refuse_slow(conn, f"body too slow: {body} bytes in {elapsed:.1f} s")

    def _refuse_slow(self, conn: Conn, why: str) -> None:
        self._reject(conn, 408, "Request Timeout", req=conn.req, why=why,
                     detail="The request did not arrive in time.")

    def _drain_idle(self, now: float) -> None:
        """A stopping worker (max_requests, SIGTERM) closes its kept-alive connections cleanly.

        A request already sent is answered (its answer says "close"), pipelined ones too (_serve). A
        kept-alive connection quiet for DRAIN_QUIET seconds after its last answer is closed with a FIN and a
        lingering read, never a reset: a busy client has sent its next request by then (and gets it
        answered), an idle one sees the close before it sends. A new connection is waited for: its request
        may be on the way."""
        for conn in list(self.conns.values()):
            if conn.state == "head" and not conn.received and conn.phase_start != conn.accepted \
                    and now - conn.phase_start >= DRAIN_QUIET:
                self._linger(conn, now)

    def _reject_exc(self, conn: Conn, exc: Exception, req: Any = None) -> None:
        status, reason = _status_of(exc)
        self._reject(conn, status, reason, req=req, why=f"{type(exc).__name__}: {exc}",
                     detail=f"The server refused the request before reading it: {reason}.")

    def _reject(self, conn: Conn, status: int, reason: str, *, req: Any = None, why: str, detail: str,
                retry_after: int | None = None) -> None:
        """Answer a refusal the server makes itself (problem+json), log it, and close."""
        request_id = _request_id(req)
        body = problem_response(status, reason, detail, request_id, retry_after=retry_after)
        self._log_refusal(conn, status, reason, req, len(body), request_id, why)
        conn.close_after = True
        conn.req = req
        self._send(conn, body, False, b"")

    def _log_refusal(self, conn: Conn, status: int, reason: str, req: Any, size: int, request_id: str,
                     why: str) -> None:
        self.log.warning("Refused %s %s from %s: %d %s (%s)", getattr(req, "method", "-"),
                         getattr(req, "path", "-"), conn.client_ip(), status, reason, why)
        environ = {"REQUEST_METHOD": getattr(req, "method", None) or "-", "RAW_URI": getattr(req, "uri", "-"),
                   "PATH_INFO": getattr(req, "path", None) or "-", "QUERY_STRING": getattr(req, "query", ""),
                   "SERVER_PROTOCOL": "HTTP/%s" % ".".join(map(str, getattr(req, "version", None) or (1, 1))),
                   "REMOTE_ADDR": conn.client_ip(), "HTTP_USER_AGENT": _header(req, "USER-AGENT") or "-"}
        started = conn.request_start or datetime.now() - timedelta(seconds=time.monotonic() - conn.phase_start)
        self.log.access(_Rejection(status, reason, size, request_id), getattr(req, "headers", None) or [],
                        environ, datetime.now() - started)

    def _close(self, conn: Conn) -> None:
        if self.conns.get(conn.fd) is conn:
            del self.conns[conn.fd]
        if conn.events:
            try:
                self.sel.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass
            conn.events = 0
        try:
            conn.sock.close()
        except OSError:
            pass
        conn.state = "closed"
        conn.out = None

    # ------------------------------------------------------------------ signals

    def handle_abort(self, sig, frame):
        """The arbiter timed a request out: tell its client, then exit as gunicorn does."""
        for item in list(self.running.values()):
            if item is not None:
                conn = item[0]
                body = problem_response(503, "Service Unavailable", "The request took too long and was "
                                        "stopped.", uuid.uuid4().hex)
                try:
                    conn.sock.setblocking(True)
                    conn.sock.settimeout(0.5)
                    conn.sock.sendall(body)
                except OSError:
                    pass
                self._log_refusal(conn, 503, "Service Unavailable", conn.req, len(body), "-",
                                  f"it ran longer than the worker timeout ({self.timeout} s)")
        super().handle_abort(sig, frame)


#: glibc tunables the server's processes should start with (they are read once, at exec: the
#: Dockerfile and `make run` set GLIBC_TUNABLES; tests and benchmarks start gunicorn with
#: ``server_env``): blocks glibc maps afresh (4 MiB and more, below) are backed by transparent
#: huge pages where the kernel allows them (THP "madvise" or "always"), so a large answer's
#: arrays and JSON are faulted in 2 MiB at a time instead of 4 KiB: at L (128 tokens,
#: d_model 512, 8 heads) 8,300 → 1,400 page faults, worker CPU 60 → 47 ms a request
#: (docs/performance.md). Without THP it changes nothing.
MALLOC_TUNABLES = "glibc.malloc.hugetlb=1"
_TUNABLE = MALLOC_TUNABLES.split("=")[0]  # its name: an operator's own value for it is kept


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with MALLOC_TUNABLES added to its GLIBC_TUNABLES (kept if already there)."""
    out = dict(env)
    given = out.get("GLIBC_TUNABLES", "")
    if _TUNABLE not in given:
        out["GLIBC_TUNABLES"] = f"{given}:{MALLOC_TUNABLES}" if given else MALLOC_TUNABLES
    return out


def malloc_note(env: Mapping[str, str] = os.environ) -> str | None:
    """What the master logs at start when the workers will run without MALLOC_TUNABLES."""
    if env.get("GUNICORN_MALLOC_TUNING", "1") == "0" or _TUNABLE in env.get("GLIBC_TUNABLES", ""):
        return None
    return (f"GLIBC_TUNABLES does not hold {MALLOC_TUNABLES}: large answers will be faulted in 4 KiB pages "
            "(~1.3x the CPU of a 20 MB trace); start gunicorn with it (the Dockerfile and `make run` do)")


def _exit_now() -> None:
    """The last atexit handler registered, so the first to run (registered only when the worker's loop has
    returned, after which gunicorn exits with 0): flush the logs, then leave without the interpreter's teardown."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


#: blocks at least this large are mapped afresh and unmapped when freed (_tune_malloc)
MMAP_THRESHOLD = 4 * 1024 * 1024
#: free memory at the top of a heap beyond this is given back to the system (_tune_malloc): twice the largest
#: block the heap holds, so one answer freed at the top is not given back only to be faulted in again
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD


def _tune_malloc() -> None:
    """glibc's malloc, for a worker that computes in one thread and does I/O in another.

    - At most 2 arenas (M_ARENA_MAX): by default each thread that allocates
      gets its own, up to 8 per core, and each keeps the memory it freed.
    - Blocks of 4 MiB and more are always mapped afresh and returned to the
      system when freed (a fixed M_MMAP_THRESHOLD): glibc's default raises the
      threshold to the largest block freed so far (up to 32 MiB), after which
      every large array of a trace stays in the heap, fragmented, and the
      worker's resident memory only grows (docs/reliability.md measures both).
      Mapping afresh costs page faults; MALLOC_TUNABLES makes them huge pages.
    - Free memory at the top of a heap is given back to the system only above
      8 MiB (M_TRIM_THRESHOLD). Fixing M_MMAP_THRESHOLD also fixes the trim
      threshold at glibc's 128 KiB, and then every answer between 128 KiB and
      4 MiB was given back when freed and faulted in again by the next one (a
      huge page zeroed each time): 1.76 -> 1.47 ms for a 616 KB trace (32
      tokens, d_model 64) in the server, and 1.45 -> 1.05 ms in process.
    GUNICORN_MALLOC_TUNING=0 leaves glibc's defaults.
    """
    if os.environ.get("GUNICORN_MALLOC_TUNING", "1") == "0":
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc
    libc.mallopt(-8, 2)  # M_ARENA_MAX
    libc.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, TRIM_THRESHOLD)  # M_TRIM_THRESHOLD


def _request_id(req: Any) -> str:
    """The caller's X-Request-ID when it is well formed (as the app answers it), else a new one."""
    given = _header(req, "X-REQUEST-ID")
    return given if given and _REQUEST_ID.match(given) else uuid.uuid4().hex


def _header(req: Any, name: str) -> str | None:
    for k, v in getattr(req, "headers", None) or []:
        if k == name:
            return v
    return None


def _status_of(exc: Exception) -> tuple[int, str]:
    if isinstance(exc, LimitRequestLine):
        return 414, "URI Too Long"
    if isinstance(exc, LimitRequestHeaders):
        return 431, "Request Header Fields Too Large"
    if isinstance(exc, ExpectationFailed):
        return 417, "Expectation Failed"
    if isinstance(exc, UnsupportedTransferCoding):
        return 501, "Not Implemented"
    if isinstance(exc, (InvalidChunkSize, ChunkMissingTerminator, InvalidChunkExtension)):
        return 400, "Bad Request"
    return 400, "Bad Request"

