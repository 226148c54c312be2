"""Real gunicorn on a free 127.0.0.1 port: the one launcher of the tests, the benchmark and the tools.

``Gunicorn`` starts ``python -m gunicorn`` (the committed gunicorn.conf.py serving service.wsgi:app unless
told otherwise) with its output in a log file, polls until /health answers 200 and, when the number of
workers is given, until that many workers are up (with a deadline), and stops it by its PID.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def artifacts_dir() -> Path:
    """Where logs go: ATTENTION_TRACE_ARTIFACTS (the test suite points it outside the tree), else artifacts/."""
    return Path(os.environ.get("ATTENTION_TRACE_ARTIFACTS") or ROOT / "artifacts")


def shown(path: Path) -> str:
    """A path as a report prints it: relative to the repository when it is inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def free_port() -> int:
    """A 127.0.0.1 port that was free a moment ago (another process may take it before it is bound)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_pids(pid: int, live: bool = True) -> list[int]:
    """The children of a process, from /proc; with ``live``, not the exited ones still waiting to be reaped.

    Read from each of its threads' ``children`` list (~0.02 ms; watchers call this every 50 ms while a
    server is measured); without those lists (a kernel built without them), from every process's stat
    (~1.5 ms with 65 processes)."""
    try:
        kids = sorted({int(k) for task in Path(f"/proc/{pid}/task").iterdir()
                       for k in (task / "children").read_text().split()})
    except FileNotFoundError:
        if not Path(f"/proc/{pid}").exists():
            return []  # the process is gone
        return _scanned_child_pids(pid, live)  # no children lists, or a thread ended while they were read
    if not live:
        return kids
    return [k for k in kids if _state(k) not in ("Z", "X", None)]


def _state(pid: int) -> str | None:
    """A process's state letter from /proc (None when it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]  # after "pid (comm)"
    except (OSError, IndexError):
        return None


def _scanned_child_pids(pid: int, live: bool) -> list[int]:
    """child_pids from every process's stat."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)"
        except (OSError, IndexError):
            continue
        state, ppid = fields[0], int(fields[1])
        if ppid == pid and not (live and state in ("Z", "X")):
            pids.append(int(stat.parent.name))
    return sorted(pids)


class Gunicorn:
    """gunicorn on 127.0.0.1, ready when /health answers 200, its output in ``log``, stopped by its PID.

    ``workers`` sets WEB_CONCURRENCY and is also waited for (None: neither, the config's or ``args``' count).
    ``env`` is added to this process's environment. ``args`` go on gunicorn's command line after the config, where they override it
    (``-k sync`` runs the same config and app under a stock worker class). ``config=None`` starts gunicorn
    with none of the project's configuration: its defaults, the bind address and ``args`` only, run from
    ``cwd`` (which must not hold a gunicorn.conf.py) with the repository on PYTHONPATH so that ``app`` imports.
    ``prefix`` goes before the command (e.g. a shell that moves it into a cgroup, then execs it).
    """

    #: keep the log after a clean stop (the benchmark removes its servers' logs unless asked to keep them)
    keep_logs = True

    def __init__(self, workers: int | None = 2, env: dict[str, str] | None = None, prefix: Sequence[str] | None = None,
                 *, app: str = "service.wsgi:app", args: Sequence[str] = (), config: str | None = "gunicorn.conf.py",
                 cwd: Path | None = None, log_name: str = "gunicorn", ready_within: float = 60.0,
                 health_timeout: float = 2.0, attempts: int = 3) -> None:
        if config is None and cwd is None:
            raise ValueError("config=None needs a cwd without a gunicorn.conf.py (gunicorn would load that one)")
        self.workers = workers
        self.health_timeout = health_timeout
        # free_port() only finds a port that was free a moment ago: another process may take it before
        # gunicorn binds it. Then gunicorn says "Connection in use": try another port, a bounded number of times.
        for _ in range(attempts):
            if self._start(env, prefix, app, args, config, cwd, log_name, ready_within):
                return
        raise RuntimeError(f"gunicorn found no free port in {attempts} attempts; see {self.log}")

    def _start(self, env: dict[str, str] | None, prefix: Sequence[str] | None, app: str, args: Sequence[str],
               config: str | None, cwd: Path | None, log_name: str, ready_within: float) -> bool:
        """Start on a new free port; True once ready, False if the port was taken meanwhile."""
        self.port = free_port()
        self.light_port = free_port()  # gunicorn.conf.py's second port (LIGHT_PORT)
        while self.light_port == self.port:
            self.light_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = artifacts_dir() / f"{log_name}-{self.port}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        full_env = {**os.environ, "HOST": "127.0.0.1", "PORT": str(self.port), "LIGHT_PORT": str(self.light_port)}
        if self.workers is not None:
            full_env["WEB_CONCURRENCY"] = str(self.workers)
        full_env = {**full_env, **(env or {})}
        if config is None:
            path = full_env.get("PYTHONPATH")
            full_env["PYTHONPATH"] = str(ROOT) + (os.pathsep + path if path else "")
            cmd = [sys.executable, "-m", "gunicorn", "-b", f"127.0.0.1:{self.port}", *args, app]
        else:
            cmd = [sys.executable, "-m", "gunicorn", "-c", config, *args, app]
        self._log = self.log.open("wb")
        self.proc = subprocess.Popen([*(prefix or []), *cmd], cwd=cwd or ROOT, env=full_env, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + ready_within
        while not (self.healthy() and (self.workers is None or len(self.worker_pids()) == self.workers)):
            if "Connection in use" in self.log_text():
                self.stop()
                return False
            if self.proc.poll() is not None:
                self._log.close()
                raise RuntimeError(f"gunicorn exited with {self.proc.returncode}; see {self.log}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"gunicorn was not ready in {ready_within:g} s; see {self.log}")
            time.sleep(0.1)
        return True

    def healthy(self) -> bool:
        """GET /health answers 200 within ``health_timeout``."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.health_timeout)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):  # refused, or slow while workers boot under load
            return False
        finally:
            conn.close()

    def worker_pids(self, live: bool = True) -> list[int]:
        """The master's child processes (its workers); with ``live=False``, exited ones not yet reaped too."""
        return child_pids(self.proc.pid, live)

    def stop(self, timeout: float = 15) -> float:
        """SIGTERM the master by its PID (SIGKILL after ``timeout`` s); return how long it took to exit."""
        start = time.monotonic()
        clean = False
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
                clean = True
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        if clean and not self.keep_logs:
            self.log.unlink(missing_ok=True)
        return time.monotonic() - start

    def log_text(self) -> str:
        self._log.flush()
        return self.log.read_text(encoding="utf-8", errors="replace")

    def log_entries(self) -> list[dict]:
        """The access log's JSON lines so far (a line still being written is skipped)."""
        entries = []
        for line in self.log_text().splitlines():
            if line.startswith('{"time"'):
                try:
                    entries.append(json.loads(line))
                except ValueError:
                    continue
        return entries

    def wait_for_log(self, predicate: Callable[[dict], bool], count: int = 1, within: float = 10.0) -> list[dict]:
        """The access-log entries matching `predicate`, once there are `count` of them or
        `within` seconds have passed. A worker writes its line after the response has
        gone (and from another process), so reading the log right after the response
        races with it: poll with a deadline, never a fixed sleep."""
        deadline = time.monotonic() + within
        while True:
            found = [e for e in self.log_entries() if predicate(e)]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.05)


#: Debian's nginx (nginx-light or nginx), as `make test` installs it
NGINX = "/usr/sbin/nginx"


class Nginx:
    """The shipped nginx configuration (the Kubernetes sidecar's: deploy/nginx.conf for one backend) on a free
    127.0.0.1 port in front of a server on ``backend_port`` and ``light_port`` (gunicorn.conf.py's PORT and
    LIGHT_PORT; ``Gunicorn.port`` and ``.light_port``), its files in a directory of its own, ready when
    /nginx-health answers, stopped by its PID.

    ``workers``: the gunicorn workers behind it (the sidecar's max_conns is 4 for each). Only the paths
    change: the listen address, the pid file, the temp directories and the logs; and, with
    ``per_address_limits=False`` (a benchmark's load comes from one address), the per-address limit_req and
    limit_conn lines go."""

    def __init__(self, backend_port: int, light_port: int, workers: int = 2, log_name: str = "nginx",
                 ready_within: float = 20.0, *, per_address_limits: bool = True) -> None:
        import shutil
        import tempfile

        from tools.sidecar_nginx_conf import sidecar_conf

        self.dir = Path(tempfile.mkdtemp(prefix=f"{log_name}-", dir=artifacts_dir()))
        self.dir.chmod(0o755)  # nginx's workers (user nobody, when started as root) write its temp files here
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.dir / "error.log"
        self.access_log = self.dir / "access.log"
        conf = sidecar_conf(f"127.0.0.1:{backend_port}", f"127.0.0.1:{light_port}", workers)
        conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{self.port};").replace("/tmp/", f"{self.dir}/")
        conf = conf.replace("error_log /dev/stderr", f"error_log {self.log}")
        conf = conf.replace("access_log /dev/stdout", f"access_log {self.access_log}")
        if not per_address_limits:
            conf = "".join(line for line in conf.splitlines(keepends=True)
                           if not line.strip().startswith(("limit_req ", "limit_conn ")))
        (self.dir / "nginx.conf").write_text(conf, encoding="utf-8")
        binary = shutil.which("nginx") or NGINX
        with self.log.open("ab") as err:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen([binary, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf"),
                                          "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + ready_within
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"nginx was not ready in {ready_within:g} s; see {self.log}")
            time.sleep(0.05)

    def _ready(self) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            conn.request("GET", "/nginx-health")
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM (nginx's fast stop: it would wait for slow readers otherwise) by its PID, SIGKILL after ``timeout`` s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
