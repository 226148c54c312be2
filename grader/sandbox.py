"""Running a student's code in a separate, limited process, and talking to it.

The grader (this module, in the grader's process) starts each student process
through ``launcher.py`` (namespaces, rlimits, an unused uid, no new privileges)
which execs the student runtime's python on ``harness.py``. Then, per call:

1. the grader writes the call's arrays to ``in/<seq>.npz`` (a directory the
   student can read but not write) and one JSON line on the control pipe;
2. the harness calls the student's function and writes ``out/<seq>.npz`` (the
   only directory it can write, besides its home);
3. the grader reads that file, refusing anything but a regular file of the
   student's own, of bounded size, holding stored (uncompressed) numeric
   ``.npy`` members of bounded shape: ``np.load`` with ``allow_pickle=False``
   only after the headers were checked.

The grader keeps the time: its own deadline per call, waited for with
``select`` on the control pipe, the output pipe and a pidfd. When a deadline
passes, or the output exceeds its cap, it SIGKILLs the whole process group,
then, as root, every process of the student's uid (``launcher.py sweep``, which
also reaches processes that left the group with setsid). Nothing in the
student's process can stop this: no alarm, handler or ``except`` runs in the
grader.

Not root: no uid to drop to, so the student runs as the grader's user inside
an unprivileged user namespace when the kernel allows one (network cut, paths
hidden), else with rlimits and the process group only; every degradation is a
note in the result.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import pwd
import random
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from . import runtime as runtime_mod

HERE = Path(__file__).resolve().parent
LAUNCHER = HERE / "launcher.py"
HARNESS = HERE / "harness.py"

#: uids handed to student processes: unused by any account, one per process
UID_RANGE = (1_610_000_000, 1_619_999_999)
#: when the grader itself runs in a user namespace that maps only 65536 uids
SMALL_UID_RANGE = (61_000, 64_999)
MAX_LINE = 65536  # bytes of one control message from the student
AUDIT_EXAMPLES_KEPT = 10  # examples of each kind of the integrity log kept per process
WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
#: where run directories go as root: not under a world-writable directory (those are covered by the
#: student's private tmpfs), and not readable by other uids
ROOT_RUN_BASE = Path("/var/lib/attention-trace-grader/runs")
#: for the launcher and the interpreter with numpy to start: the grader's time, not the student's
STARTUP_SECONDS = 60.0


@dataclass(frozen=True)
class Limits:
    """What one student process may use. Times are wall-clock seconds, measured by the grader."""

    call_seconds: float = 10.0  # one call, and the import of the submission
    total_seconds: float = 120.0  # every student process of one submission together
    memory_mb: int = 1024  # RLIMIT_AS: address space
    processes: int = 32  # RLIMIT_NPROC of the student's uid (threads count)
    file_size_mb: int = 64  # RLIMIT_FSIZE: the largest file it may write
    open_files: int = 64  # RLIMIT_NOFILE
    output_keep_bytes: int = 65536  # of stdout + stderr kept (the rest is counted, not kept)
    output_max_bytes: int = 16 * 1024 * 1024  # past this much output the process is stopped
    scratch_mb: int = 16  # each private tmpfs: /tmp, /var/tmp, /dev/shm, /run/lock and its home
    restarts: int = 3  # fresh processes after a crash or a timeout, per process kind
    answer_max_bytes: int = 64 * 1024 * 1024
    answer_max_elements: int = 4_000_000

    @property
    def cpu_seconds(self) -> int:
        return int(math.ceil(self.total_seconds)) + 1


class SandboxError(Exception):
    """The sandbox itself failed (not the student's code): the submission cannot be graded."""


@dataclass
class Outcome:
    """What became of starting the submission, or of one call."""

    status: str  # ready | ok | error | missing | syntax | import | timeout | crashed | output | protocol | not_run
    arrays: dict[str, np.ndarray] | None = None
    error: dict[str, Any] | None = None  # {"type", "message", "frames"} from the harness
    detail: str = ""  # what happened, for the student (no numbers)
    functions: list[str] = field(default_factory=list)
    seconds: float = 0.0
    out_of_total: bool = False  # stopped, or never started, because the whole submission's time ran out
    #: stopped (a timeout): the largest address space its processes had reached, in MiB (VmPeak), for the
    #: integrity log's memory-limit entry; None when not measured
    memory_peak_mb: float | None = None

    @property
    def fatal(self) -> bool:
        """The process is gone (or must go): later calls need a new one."""
        return self.status in ("timeout", "crashed", "output", "protocol")


@dataclass
class Call:
    """One call of a student's function: ``function(*args, **kwargs)``; arrays travel in the .npz."""

    key: Any  # the caller's id for it
    function: str
    arrays: dict[str, np.ndarray]
    args: list[dict[str, Any]]  # {"array": name}, {"value": json} or {"dict": {name: one of these}}
    kwargs: dict[str, dict[str, Any]] = field(default_factory=dict)
    result: str = "array"  # or "stages": a dict of these stage arrays
    stages: list[str] = field(default_factory=list)
    where: str = ""  # "on configuration X", for messages


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _process_uids() -> set[int]:
    uids = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                uids.add(os.stat(f"/proc/{name}").st_uid)
            except OSError:
                pass
    return uids


def processes_of(uid: int) -> list[int]:
    """The live processes (not zombies) whose real uid is ``uid``."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status", "rb") as f:
                    state = real = None
                    for line in f:
                        if line.startswith(b"State:"):
                            state = line.split()[1]
                        elif line.startswith(b"Uid:"):
                            real = int(line.split()[1])
                            break
                if real == uid and state not in (b"Z", b"X"):
                    pids.append(int(name))
            except (OSError, ValueError, IndexError):
                pass
    return pids


_used_uids: set[int] = set()
_uid_range = UID_RANGE


def run_base_for(run_base: Path | None) -> Path:
    """Where the run directories of student processes go."""
    if run_base is not None:
        return run_base
    return ROOT_RUN_BASE if os.geteuid() == 0 else Path(tempfile.gettempdir())


def _pick_uid() -> int:
    busy = _process_uids() | _used_uids
    for _ in range(1000):
        uid = random.SystemRandom().randint(*_uid_range)
        if uid in busy:
            continue
        try:
            pwd.getpwuid(uid)
            continue
        except KeyError:
            pass
        _used_uids.add(uid)
        return uid
    raise SandboxError("no unused uid could be found for the student's process")


def read_answer(path: Path, owner: int, limits: Limits) -> dict[str, np.ndarray]:
    """The arrays of a student's ``.npz``, checked before numpy parses anything (ValueError says why not)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ValueError("no answer file was written") from None
    except OSError as e:
        raise ValueError(f"the answer file could not be opened safely ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("the answer is not a regular file")
        if st.st_uid != owner:
            raise ValueError("the answer file belongs to someone else")
        if st.st_size > limits.answer_max_bytes:
            raise ValueError(f"the answer is {st.st_size} bytes, more than {limits.answer_max_bytes}")
        chunks, left = [], st.st_size + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limits.answer_max_bytes:
        raise ValueError("the answer grew while it was read")
    out: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            infos = z.infolist()
            if len(infos) > 64:
                raise ValueError("the answer holds too many arrays")
            for info in infos:
                if info.compress_type != zipfile.ZIP_STORED or info.file_size > limits.answer_max_bytes \
                        or not info.filename.endswith(".npy"):
                    raise ValueError(f"unexpected member {info.filename!r} in the answer")
                raw = z.read(info)
                f = io.BytesIO(raw)
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                elif version in ((2, 0), (3, 0)):
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
                else:
                    raise ValueError("unknown .npy version")
                if dtype.hasobject or dtype.kind not in "biuf" or dtype.itemsize > 16:
                    raise ValueError(f"an array of {dtype} is not numbers")
                count = math.prod(shape)
                if len(shape) > 8 or count > limits.answer_max_elements:
                    raise ValueError(f"an array of shape {list(shape)} is too large")
                if f.tell() + count * dtype.itemsize != len(raw):
                    raise ValueError("an array's data does not match its header")
                f.seek(0)
                arr = np.load(f, allow_pickle=False)
                out[info.filename[:-4]] = np.asarray(arr, dtype=np.float64)
    except (zipfile.BadZipFile, OSError, EOFError, KeyError) as e:
        raise ValueError(f"the answer file is not a valid .npz ({type(e).__name__})") from None
    return out


class StudentProcess:
    """One sandboxed student process: started, called, stopped."""

    def __init__(self, runtime: runtime_mod.Runtime, submission: Path, filename: str, limits: Limits,
                 hide: list[str], run_base: Path | None = None, net_namespace: bool = True) -> None:
        self.runtime, self.submission, self.filename, self.limits = runtime, submission, filename, limits
        self.hide = hide
        self.net_namespace = net_namespace  # False only in tests: the seccomp filter alone must cut the network
        self.root = os.geteuid() == 0
        self.run_base = run_base
        self.proc: subprocess.Popen | None = None
        self.notes: dict[str, Any] = {}
        self.output = bytearray()
        self.output_total = 0
        self.seq = 0
        self.leftover_processes = 0
        self._buf = b""
        self._fds: list[int] = []
        self.total_deadline = math.inf
        self.audit: dict[str, dict[str, Any]] = {}  # the integrity log: kind -> {"count", "examples"}

    # ------------------------------------------------------------ start

    def _prepare(self) -> None:
        base = run_base_for(self.run_base)
        if self.root:
            base.mkdir(parents=True, exist_ok=True)
            os.chmod(base, 0o711)
        self.dir = Path(tempfile.mkdtemp(prefix="attention-grade-", dir=base))
        os.chmod(self.dir, 0o711)  # the student may pass through, not list
        self.uid = _pick_uid() if self.root else os.getuid()
        self.gid = self.uid if self.root else os.getgid()
        # out/ is the grader's: the student may write only the one answer file the grader creates per call
        for sub, mode, own in (("in", 0o755, False), ("out", 0o755, False), ("home", 0o700, True),
                               ("submission", 0o755, False)):
            p = self.dir / sub
            p.mkdir()
            os.chmod(p, mode)
            if own and self.root:
                self._chown(p)
        (self.dir / "home" / "tmp").mkdir()
        if self.root:
            self._chown(self.dir / "home" / "tmp")
        shutil.copy(HARNESS, self.dir / "harness.py")
        os.chmod(self.dir / "harness.py", 0o644)
        copy_submission(self.submission, self.dir / "submission")

    def _chown(self, path: Path) -> None:
        try:
            os.chown(path, self.uid, self.gid)
        except OSError as e:
            if e.errno == errno.EINVAL:  # a user namespace that does not map this uid
                raise SandboxError(f"uid {self.uid} is not mapped here (uid_unmapped)") from None
            raise

    def start(self, deadline: float) -> Outcome:
        """Launch the process and import the submission; ``ready`` lists the functions it defines.
        ``deadline``: when the time of the whole submission runs out (each call's is shorter)."""
        self.total_deadline = deadline
        self._prepare()
        ctrl_in_r, self.ctrl_in = os.pipe()
        self.ctrl_out, ctrl_out_w = os.pipe()
        self.out_r, out_w = os.pipe()
        spec_r, spec_w = os.pipe()
        self._fds = [self.ctrl_in, self.ctrl_out, self.out_r]
        py = self.runtime.python
        argv = [str(py), "-I", "-S", "-B", "-u", "-X", "faulthandler", str(self.dir / "harness.py"), str(ctrl_in_r),
                str(ctrl_out_w), str(self.runtime.site_packages), str(self.dir / "submission"), self.filename,
                str(self.dir / "out")]
        home = str(self.dir / "home")
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": f"{home}/tmp", "LANG": "C.UTF-8",
               "LC_ALL": "C.UTF-8", "PYTHONUTF8": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1", **self.runtime.env()}
        # never cover the run directory or the runtime with the student's private tmpfs
        under = [w for w in WORLD_WRITABLE if self.dir.is_relative_to(w) or self.runtime.root.is_relative_to(w)]
        spec = {"status_fd": ctrl_out_w, "grader_pid": os.getpid(), "uid": self.uid, "gid": self.gid,
                "cwd": home, "python": str(py), "argv": argv, "env": env, "hide": self.hide,
                "scratch": [w for w in WORLD_WRITABLE if w not in under], "home": home,
                "net_namespace": self.net_namespace,
                "limits": {"memory_mb": self.limits.memory_mb, "cpu_seconds": self.limits.cpu_seconds,
                           "processes": self.limits.processes, "file_size_mb": self.limits.file_size_mb,
                           "open_files": self.limits.open_files, "scratch_mb": self.limits.scratch_mb}}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(LAUNCHER), "launch", str(spec_r)],
                stdin=subprocess.DEVNULL, stdout=out_w, stderr=out_w, pass_fds=(ctrl_in_r, ctrl_out_w, spec_r),
                start_new_session=True, close_fds=True, cwd="/", env={})
        finally:
            for fd in (ctrl_in_r, ctrl_out_w, out_w, spec_r):
                os.close(fd)
        try:
            os.write(spec_w, json.dumps(spec).encode())
        finally:
            os.close(spec_w)
        for fd in (self.ctrl_in, self.ctrl_out, self.out_r):
            os.set_blocking(fd, False)
        try:
            self.pidfd: int | None = os.pidfd_open(self.proc.pid)
            self._fds.append(self.pidfd)
        except (OSError, AttributeError):
            self.pidfd = None
        start = time.monotonic()
        first = self._wait_message(start + STARTUP_SECONDS, "starting")
        if first.status == "message" and first.error and first.error.get("event") == "launch_failed":
            doc = first.error
            self.notes.update(doc.get("notes", {}))
            raise SandboxError(f"the sandbox could not start the student's process: {doc.get('error')}"
                               + (" (uid_unmapped)" if doc.get("code") == "uid_unmapped" else ""))
        launched = cast(dict[str, Any], first.error)  # a message's document (read when the status is "message")
        if first.status != "message" or launched.get("event") != "launched":
            if first.status == "message":
                raise SandboxError(f"the sandbox's launcher answered {first.error!r}")
            # the launcher died or hung before saying anything: our fault, not the student's
            raise SandboxError(f"the sandbox's launcher failed ({first.detail}); its output: "
                               f"{bytes(self.output[:2000]).decode('utf-8', 'replace')}")
        self.notes.update(launched.get("notes", {}))
        started = self._wait_message(time.monotonic() + STARTUP_SECONDS, "starting")
        if started.status != "message" or cast(dict[str, Any], started.error).get("event") != "started":
            raise SandboxError(f"the student's interpreter did not start ({started.detail or started.error}); its "
                               f"output: {bytes(self.output[:2000]).decode('utf-8', 'replace')}")
        deadline = min(deadline, time.monotonic() + self.limits.call_seconds)
        second = self._wait_message(deadline, "importing your file")
        second.seconds = time.monotonic() - start
        if second.status != "message":
            return second
        doc = cast(dict[str, Any], second.error)  # a message's document
        event = doc.get("event")
        if event == "ready":
            funcs: Any = doc.get("functions")
            ok = isinstance(funcs, list) and all(isinstance(f, str) for f in funcs)
            return Outcome("ready", functions=list(funcs) if ok else [], seconds=second.seconds)
        if event == "import_failed" and doc.get("phase") in ("missing", "syntax", "import"):
            out = Outcome(doc["phase"], error=_clean_error(doc.get("error")), seconds=second.seconds)
            if doc["phase"] == "missing":
                found: Any = doc.get("found") if isinstance(doc.get("found"), list) else []
                out.detail = ", ".join(str(f)[:100] for f in found[:20]) or "nothing"
            return out
        return Outcome("protocol", detail="your code wrote something unexpected to the grader's channel")

    # ------------------------------------------------------------ the loop

    def _close(self, fd: int) -> None:
        """A pipe at its end: closed now, and never watched again (``close`` closes only what is left; a grading
        process that dropped ended pipes without closing them ran out of select()'s 1,024 descriptors after
        ~340 submissions)."""
        self._fds = [f for f in self._fds if f != fd]
        try:
            os.close(fd)
        except OSError:
            pass

    def _drain_output(self) -> bool:
        """Read what the student printed; False once it printed more than allowed."""
        try:
            b = os.read(self.out_r, 1 << 16)
        except BlockingIOError:
            return True
        if not b:
            self._close(self.out_r)
            return True
        self.output_total += len(b)
        room = self.limits.output_keep_bytes - len(self.output)
        if room > 0:
            self.output += b[:room]
        return self.output_total <= self.limits.output_max_bytes

    def _audit(self, doc: dict[str, Any]) -> None:
        """One line of the integrity log from the harness: what the student's code tried (strings of bounded
        length only: it comes from the student's process)."""
        kind = str(doc.get("kind", "?"))[:40]
        entry = self.audit.setdefault(kind, {"count": 0, "examples": []})
        if len(self.audit) > 16:  # kinds are the harness's few: more is someone writing them
            self.audit.pop(kind)
            return
        count = doc.get("count")
        if isinstance(count, int) and not isinstance(count, bool):
            entry["count"] = max(entry["count"], min(count, 10**9))
            return
        entry["count"] += 1
        if len(entry["examples"]) < AUDIT_EXAMPLES_KEPT:
            entry["examples"].append(f"{str(doc.get('what', '?'))[:60]} {json.dumps(doc.get('detail'))[:300]}")

    def _wait_message(self, deadline: float, doing: str) -> Outcome:
        """The next control message (status "message", the document in ``error``), or what stopped it."""
        while True:
            if b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                try:
                    doc = json.loads(line)
                except ValueError:
                    return Outcome("protocol", detail="your code wrote something unexpected to the grader's channel")
                if not isinstance(doc, dict):
                    return Outcome("protocol", detail="your code wrote something unexpected to the grader's channel")
                if doc.get("event") == "audit":  # the integrity log (harness.py): kept, never answered
                    self._audit(doc)
                    continue
                return Outcome("message", error=doc)
            if len(self._buf) > MAX_LINE:
                return Outcome("protocol", detail="your code wrote too much to the grader's channel")
            left = deadline - time.monotonic()
            if left <= 0:
                peak = self.memory_peak_mb()  # before the kill: a process at its memory limit may look hung
                if deadline >= self.total_deadline:  # the submission's budget ran out, not this call's
                    return Outcome("timeout", detail=f"it was still {doing} when the time for the whole submission "
                                                     f"ran out: {self.limits.total_seconds:g} s for every call "
                                                     "together (each call may take "
                                                     f"{self.limits.call_seconds:g} s, but all of them share this)",
                                   out_of_total=True, memory_peak_mb=peak)
                return Outcome("timeout", detail=f"it was still {doing} when the time limit of "
                                                 f"{self.limits.call_seconds:g} s per call ran out",
                               memory_peak_mb=peak)
            fds = [fd for fd in (self.ctrl_out, self.out_r, self.pidfd) if fd is not None and fd in self._fds]
            ready, _, _ = select.select(fds, [], [], min(left, 0.5 if self.pidfd is None else left))
            if self.out_r in ready and not self._drain_output():
                return Outcome("output", detail=f"it printed more than {self.limits.output_max_bytes // 2**20} MiB "
                                                "while " + doing)
            if self.ctrl_out in ready:
                try:
                    b = os.read(self.ctrl_out, MAX_LINE)
                except BlockingIOError:
                    continue
                if b:
                    self._buf += b
                    continue
                self._close(self.ctrl_out)
            proc = cast(subprocess.Popen[bytes], self.proc)  # started
            if (self.pidfd is not None and self.pidfd in ready) or proc.poll() is not None \
                    or self.ctrl_out not in self._fds:
                if b"\n" in self._buf:
                    continue
                return self._died(doing)

    def memory_peak_mb(self) -> float | None:
        """The largest VmPeak (address space, what RLIMIT_AS bounds) among the student's live processes: the
        launcher's descendants, read from /proc. None when none can be read."""
        assert self.proc is not None
        peak: float | None = None
        todo, seen = [self.proc.pid], set[int]()
        while todo and len(seen) < 256:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            try:
                with open(f"/proc/{pid}/status", "rb") as f:
                    for line in f:
                        if line.startswith(b"VmPeak:"):
                            mb = int(line.split()[1]) / 1024
                            peak = mb if peak is None else max(peak, mb)
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                        todo += [int(c) for c in f.read().split()]
            except (OSError, ValueError):
                continue
        return peak

    def _died(self, doing: str) -> Outcome:
        proc = self.proc
        assert proc is not None  # started
        try:
            code = proc.wait(timeout=2)
        except subprocess.TimeoutExpired:  # the channel closed but the process lives: kill it
            self.kill()
            proc.wait()
            return Outcome("protocol", detail=f"your code closed the grader's channel while {doing}")
        if code < 0:
            sig = -code
            what = {signal.SIGSEGV: "crashed with a segmentation fault",
                    signal.SIGXCPU: f"used more than {self.limits.cpu_seconds} s of CPU time",
                    signal.SIGXFSZ: f"tried to write a file larger than {self.limits.file_size_mb} MiB",
                    signal.SIGKILL: "was killed (it went over the memory or CPU limit)",
                    signal.SIGABRT: "aborted", signal.SIGBUS: "crashed (bus error)",
                    signal.SIGFPE: "crashed (floating-point exception)"}.get(cast(signal.Signals, sig),
                                                                             f"was killed by {_signal_name(sig)}")
            return Outcome("crashed", detail=f"your code {what} while {doing}")
        return Outcome("crashed", detail=f"your code exited (status {code}) while {doing}: does it call exit(), "
                                         "sys.exit() or os._exit()?")

    def call(self, call: Call, deadline: float) -> Outcome:
        """Run one call; the answer's arrays in ``arrays``."""
        self.seq += 1
        seq = self.seq
        answer = self.dir / "out" / f"{seq}.npz"
        fd = os.open(answer, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        if self.root:
            os.chown(answer, self.uid, self.gid)  # the one file it may write
        path = self.dir / "in" / f"{seq}.npz"
        tmp = self.dir / "in" / f".{seq}.npz"
        with open(tmp, "wb") as f:
            np.savez(f, **call.arrays)  # type: ignore[arg-type]  # numpy's stubs read **kwds as allow_pickle
        os.chmod(tmp, 0o644)
        os.rename(tmp, path)
        msg = {"op": "call", "seq": seq, "function": call.function, "input": str(path), "args": call.args,
               "kwargs": call.kwargs, "result": call.result, "stages": call.stages}
        doing = f"running {call.function}" + (f" {call.where}" if call.where else "")
        start = time.monotonic()
        try:
            os.write(self.ctrl_in, (json.dumps(msg) + "\n").encode())
        except (BlockingIOError, BrokenPipeError):
            out = self._wait_message(min(deadline, time.monotonic() + 0.5), doing)
            if out.status in ("crashed", "timeout", "output"):
                return out
            return Outcome("protocol", detail="your code stopped reading the grader's channel")
        while True:
            out = self._wait_message(deadline, doing)
            out.seconds = time.monotonic() - start
            if out.status != "message":
                path.unlink(missing_ok=True)
                answer.unlink(missing_ok=True)
                return out
            doc = cast(dict[str, Any], out.error)  # a message's document
            if doc.get("seq") != seq:  # stray or forged messages for other calls are ignored
                continue
            path.unlink(missing_ok=True)
            if doc.get("event") != "done":
                answer.unlink(missing_ok=True)
                if doc.get("event") == "error":
                    return Outcome("error", error=_clean_error(doc.get("error")), seconds=out.seconds)
                return Outcome("protocol", detail="your code wrote something unexpected to the grader's channel")
            try:
                arrays = read_answer(answer, self.uid, self.limits)
            except ValueError as e:
                return Outcome("error", error={"type": "AnswerError", "message": str(e), "frames": []},
                               detail="its answer could not be read", seconds=out.seconds)
            finally:
                try:
                    answer.unlink()
                except OSError:
                    pass
            return Outcome("ok", arrays=arrays, seconds=out.seconds)

    # ------------------------------------------------------------ stop

    def kill(self) -> None:
        """SIGKILL the process group, then (as root) every process of the student's uid: those that
        left the group (setsid, a double fork) too."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.root:
            try:
                self.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
            if processes_of(self.uid):
                sweep(self.uid)

    def close(self) -> None:
        """Stop the process and everything it started, sweep its uid, remove its files."""
        if self.proc is not None:
            self.kill()
            self.proc.wait()
            while self.out_r in self._fds:  # what was printed up to the end
                ready, _, _ = select.select([self.out_r], [], [], 0)
                if not ready:
                    break
                before = self.output_total
                self._drain_output()
                if self.output_total == before or self.output_total > self.limits.output_max_bytes:
                    break
            if self.root:
                for _ in range(100):  # SIGKILLed processes take a moment to be gone
                    left = processes_of(self.uid)
                    if not left:
                        break
                    sweep(self.uid)
                self.leftover_processes = len(left)
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []
        if hasattr(self, "dir"):
            shutil.rmtree(self.dir, ignore_errors=True)
            if self.root:
                remove_files_of(self.uid)


def sweep(uid: int) -> None:
    """SIGKILL every process of ``uid`` (root only), through a helper that becomes that uid."""
    try:
        subprocess.run([sys.executable, "-I", "-S", str(LAUNCHER), "sweep", str(uid)], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={}, cwd="/", timeout=10,
                       check=False)
    except subprocess.TimeoutExpired:
        pass
    for _ in range(50):  # the kernel may take a moment to reap them
        pids = processes_of(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def remove_files_of(uid: int, roots: tuple[str, ...] = WORLD_WRITABLE) -> int:
    """Delete what a student process left in the world-writable directories (nothing else outside its
    own run directory is writable to it): a later process, of this submission or the next, must not
    find it. An entry it owns goes with everything under it; a world-writable directory of someone
    else's (like /tmp/.X11-unix) is looked into one level down."""
    removed = 0

    def scan(top: str, depth: int) -> None:
        nonlocal removed
        try:
            names = os.listdir(top)
        except OSError:
            return
        for name in names[:100000]:
            p = os.path.join(top, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if st.st_uid == uid:
                try:
                    if stat.S_ISDIR(st.st_mode):
                        shutil.rmtree(p, ignore_errors=True)
                    else:
                        os.unlink(p)
                    removed += 1
                except OSError:
                    pass
            elif depth and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH:
                scan(p, depth - 1)

    for top in roots:
        scan(top, 1)
    return removed


def copy_submission(src: Path, dst: Path, max_files: int = 200, max_bytes: int = 20 * 1024 * 1024) -> None:
    """The student's regular files (no links, no devices), read-only to them, bounded in number and size."""
    if not src.is_dir():
        return
    total = files = 0
    for dirpath, dirnames, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink() and not d.startswith(".")]
        (dst / rel).mkdir(mode=0o755, exist_ok=True)
        os.chmod(dst / rel, 0o755)
        for name in filenames:
            s = Path(dirpath) / name
            st = os.lstat(s)
            if not stat.S_ISREG(st.st_mode):
                continue
            files += 1
            total += st.st_size
            if files > max_files or total > max_bytes:
                return
            shutil.copyfile(s, dst / rel / name, follow_symlinks=False)
            os.chmod(dst / rel / name, 0o644)


def _clean_error(e: Any) -> dict[str, Any]:
    """A student's error report, reduced to strings of bounded length (it came from their process)."""
    if not isinstance(e, dict):
        return {"type": "Error", "message": "", "frames": []}
    frames = []
    for f in e.get("frames", [])[:20] if isinstance(e.get("frames"), list) else []:
        if isinstance(f, dict):
            frames.append({"file": str(f.get("file", "?"))[:200], "line": f.get("line") if isinstance(
                f.get("line"), int) else 0, "function": str(f.get("function", "?"))[:200],
                "code": str(f.get("code", ""))[:300]})
    return {"type": str(e.get("type", "Error"))[:200], "message": str(e.get("message", ""))[:4000], "frames": frames}


# ------------------------------------------------------------------ running a list of calls


@dataclass
class RunResult:
    start: Outcome  # the (first) import of the submission
    outcomes: dict[Any, Outcome]  # per call key
    output: str  # what the student's code printed (kept part)
    output_total: int
    notes: dict[str, Any]
    processes: int  # student processes started
    leftover_processes: int
    seconds: float
    audit: dict[str, dict[str, Any]] = field(default_factory=dict)  # the integrity log (StudentProcess.audit)


def run_calls(calls: list[Call], *, runtime: runtime_mod.Runtime, submission: Path, filename: str, limits: Limits,
              hide: list[str], deadline: float, run_base: Path | None = None,
              broken: dict[str, str] | None = None, net_namespace: bool = True) -> RunResult:
    """Run the calls in order in sandboxed processes: a new process after a crash or a timeout (at most
    ``limits.restarts``); a function that crashed or timed out is not called again (``broken``, which
    the caller may share between runs, says why)."""
    global _uid_range
    t0 = time.monotonic()
    outcomes: dict[Any, Outcome] = {}
    output = bytearray()
    output_total = processes = leftover = 0
    notes: dict[str, Any] = {}
    first_start: Outcome | None = None
    audit: dict[str, dict[str, Any]] = {}
    broken = {} if broken is None else broken  # function -> why it is not called again
    pending = list(calls)
    restarts = 0
    while pending:
        still = []
        for c in pending:  # a function that hung or crashed is not called again
            if c.function in broken:
                outcomes[c.key] = Outcome("not_run", detail=broken[c.function])
            else:
                still.append(c)
        pending = still
        if not pending:
            break
        if time.monotonic() >= deadline:
            for c in pending:
                outcomes[c.key] = Outcome("not_run", detail="not run: the time for the whole submission "
                                                            f"({limits.total_seconds:g} s, every call together) "
                                                            "ran out", out_of_total=True)
            break
        proc = StudentProcess(runtime, submission, filename, limits, hide, run_base, net_namespace)
        processes += 1
        try:
            try:
                st = proc.start(deadline)
            except SandboxError as e:
                if "uid_unmapped" in str(e) and _uid_range == UID_RANGE:
                    _uid_range = SMALL_UID_RANGE  # a user namespace with few uids: use low ones
                    processes -= 1
                    continue
                raise
            notes.update(proc.notes)
            if first_start is None:
                first_start = st
            if st.status != "ready":
                for c in pending:
                    outcomes[c.key] = Outcome("not_run", detail="")
                break
            while pending:
                c = pending[0]
                if c.function in broken:
                    outcomes[c.key] = Outcome("not_run", detail=broken[c.function])
                    pending.pop(0)
                    continue
                if c.function not in st.functions:
                    outcomes[c.key] = Outcome("error", error={"type": "NameError", "frames": [], "message":
                                              f"your file does not define a function {c.function}"})
                    pending.pop(0)
                    continue
                if time.monotonic() >= deadline:
                    break
                out = proc.call(c, min(deadline, time.monotonic() + limits.call_seconds))
                outcomes[c.key] = out
                pending.pop(0)
                if out.fatal:
                    broken[c.function] = (f"not run: {c.function} already failed {c.where}".rstrip()
                                          + f" ({out.detail.removeprefix('your code ')})")
                    break
        finally:
            proc.close()
            for kind, entry in proc.audit.items():
                into = audit.setdefault(kind, {"count": 0, "examples": []})
                into["count"] += entry["count"]
                into["examples"] += entry["examples"][: max(0, AUDIT_EXAMPLES_KEPT - len(into["examples"]))]
            output += proc.output[: max(0, limits.output_keep_bytes - len(output))]
            output_total += proc.output_total
            leftover += proc.leftover_processes
        if pending and time.monotonic() < deadline:
            restarts += 1
            if restarts > limits.restarts:
                for c in pending:
                    outcomes[c.key] = Outcome("not_run", detail=f"not run: your code crashed or timed out "
                                                                f"{restarts} times; the grader stopped trying")
                break
    return RunResult(first_start or Outcome("not_run"), outcomes, output.decode("utf-8", "replace"), output_total,
                     notes, processes, leftover, time.monotonic() - t0, audit)
