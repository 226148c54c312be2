"""Runs inside the sandbox, as the student: imports the submission and answers the grader's calls.

    python -I -S -B harness.py CTRL_IN CTRL_OUT SITE_PACKAGES SUBMISSION_DIR FILE OUT_DIR

Standard library and numpy only; it knows nothing of the grader (no URL, no
client, no configuration, no results path), and it trusts nothing it is told
beyond the call itself. The student's code runs in this very process and may
replace any of it: that changes only what this process answers, which the
grader checks against the reference on its side.

The protocol, one JSON object per line:

* to the grader (CTRL_OUT): ``{"event": "ready", "functions": [...]}`` once the
  submission is imported, or ``{"event": "import_failed", "phase": "missing" |
  "syntax" | "import", "error": {...}}``; then per call ``{"event": "done", "seq": k}``
  (the answer is in ``out/<k>.npz``, the one file the grader created, empty, for this call) or
  ``{"event": "error", "seq": k, "error": {...}}``;
* from the grader (CTRL_IN): ``{"op": "call", "seq": k, "function": name, "input":
  path, "args": [...], "kwargs": {...}, "result": "array" | "stages", "stages": [...]}``
  (arrays are in the input ``.npz``; an argument is ``{"array": key}``,
  ``{"value": v}`` or ``{"dict": {name: argument}}``), or ``{"op": "exit"}``.

A call is answered before the grader sends the next one, and the grader never
sends an input that holds the answer to an earlier call it has not received.

Before the submission is imported, an audit hook (``sys.addaudithook``, which
nothing in the process can remove) reports what the student's code tries that the
sandbox refuses or that a solution has no use for: network sockets, files outside
its own tree, new processes and signals, native code (ctypes, which the hook
cannot see past). Each is one ``{"event": "audit", "kind": ..., "what": ...,
"detail": ...}`` line, written to the grader as it happens: the course staff's
academic-integrity log (the grader never shows it to the student, and it never
changes a grade). It is evidence, not a wall: code that runs in this process can
hide from it (the walls are the sandbox's).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

MAX_MESSAGE = 4000  # characters of an exception's message sent back


def _send(doc: dict) -> None:
    os.write(_OUT, (json.dumps(doc) + "\n").encode())


def _error(e: BaseException, sub_dir: str) -> dict:
    """The exception's type and message, and only the frames in the student's files."""
    frames = []
    for f in traceback.extract_tb(e.__traceback__):
        if os.path.abspath(f.filename).startswith(sub_dir + os.sep):
            frames.append({"file": os.path.relpath(f.filename, sub_dir), "line": f.lineno, "function": f.name,
                           "code": (f.line or "")[:300]})
    try:
        message = str(e)[:MAX_MESSAGE]
    except BaseException:  # noqa: BLE001 - a hostile __str__
        message = "(the exception's message could not be shown)"
    if isinstance(e, SyntaxError):
        frames = [{"file": os.path.basename(e.filename or "?"), "line": e.lineno or 0, "function": "<module>",
                   "code": (e.text or "").rstrip()[:300]}]
        message = e.msg or message
    return {"type": type(e).__name__[:200], "message": message, "frames": frames[-20:]}


#: audit events -> the integrity log's kind (module docstring)
AUDITED = {
    **dict.fromkeys(("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                     "socket.gethostbyname", "socket.gethostbyaddr", "socket.__new__"), "network"),
    **dict.fromkeys(("open", "os.listdir", "os.scandir", "os.remove", "os.rename", "os.rmdir", "os.mkdir",
                     "os.chmod", "os.chown", "os.symlink", "os.link", "os.truncate", "shutil.rmtree",
                     "shutil.copyfile", "shutil.move"), "files"),
    **dict.fromkeys(("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
                     "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "resource.setrlimit",
                     "os.setuid", "os.setgid"), "processes"),
    **dict.fromkeys(("ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.addressof",
                     "ctypes.string_at", "ctypes.call_function"), "native_code"),
    **dict.fromkeys(("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
                     "sys._current_exceptions", "sys._getframe", "object.__setattr__"), "introspection"),
}
#: the standard library's frame readers: sys._getframe called from these on the student's behalf (inspect.stack,
#: inspect.currentframe, traceback.extract_stack) is the student's
FRAME_READERS = ("inspect.py", "traceback.py")
AUDIT_EXAMPLES = 20  # events of each kind sent in full; after that, only the count at each power of two


def _install_audit(roots: list[str], student: str) -> None:
    """The integrity log's hook. It touches nothing of the student's (no repr of their objects): only
    strings, bytes and numbers from the event's arguments, and the file names of the frames that called
    ``sys._getframe`` (the standard library calls it too: collections.namedtuple, typing; only the student's
    own calls, directly or through inspect or traceback, are recorded). ``student``: the submission's folder."""
    write, out, dumps, sep = os.write, _OUT, json.dumps, os.sep
    getframe, readers, mine = sys._getframe, FRAME_READERS, os.path.normpath(student) + os.sep
    busy: list = []  # the hook's own sys._getframe raises the event again: not recorded
    join, normpath, getcwd = os.path.join, os.path.normpath, os.getcwd
    audited = AUDITED
    counts: dict = {}
    allowed = tuple(normpath(r) + sep for r in roots)

    def plain(value):
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return value if not isinstance(value, str) else value[:200]
        if isinstance(value, bytes):
            return value[:200].decode("utf-8", "replace")
        if isinstance(value, tuple) and len(value) <= 4:
            return [plain(v) for v in value]
        return type(value).__name__

    def outside(path) -> bool:
        if isinstance(path, bytes):
            path = path.decode("utf-8", "replace")
        if not isinstance(path, str):
            return False  # a file descriptor, or the student's own object
        full = normpath(path if path.startswith(sep) else join(getcwd(), path)) + sep
        return not full.startswith(allowed)

    def by_student() -> bool:
        """Whether the code that called sys._getframe is the student's (or a frame reader it called)."""
        if busy:
            return False
        busy.append(1)
        try:
            f: Any = getframe(2)  # 0 this, 1 the hook, 2 the code that called sys._getframe (a C call has no frame)
            for _ in range(4):
                if f is None:
                    return False
                name = f.f_code.co_filename
                if name.startswith(mine):
                    return True
                if not name.endswith(readers):
                    return False
                f = f.f_back
            return False
        finally:
            busy.pop()

    def hook(event, args):
        kind = audited.get(event)
        if kind is None:
            return
        try:
            if event == "sys._getframe" and not by_student():
                return
            if event == "socket.__new__" and (len(args) < 2 or args[1] == 1):  # AF_UNIX: a local pipe, not the network
                return
            if event == "object.__setattr__" and not (len(args) > 1 and args[1] in ("__code__", "__globals__")):
                return
            if kind == "files" and not any(outside(a) for a in args[:2]):
                return
            n = counts.get(kind, 0) + 1
            counts[kind] = n
            if n <= AUDIT_EXAMPLES:
                doc = {"event": "audit", "kind": kind, "what": event, "detail": plain(args[:3])}
            elif n & (n - 1) == 0:
                doc = {"event": "audit", "kind": kind, "count": n}
            else:
                return
            write(out, (dumps(doc) + "\n").encode())
        except BaseException:  # noqa: BLE001 - the hook must never change what the student's code does
            return

    sys.addaudithook(hook)


def _to_array(np, value, what: str):
    """A student's value as a float64 array, or TypeError saying why it is not one."""
    if value is None:
        raise TypeError(f"{what} is None (did you forget to return?)")
    if isinstance(value, np.ma.MaskedArray):  # masked entries mean "excluded": -inf
        value = value.astype(np.float64).filled(-np.inf)
    try:
        a = np.asarray(value)
    except Exception as e:  # noqa: BLE001 - ragged lists and the like
        raise TypeError(f"{what} is not an array of numbers ({type(e).__name__}: {e})") from None
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{what} is not an array of numbers: numpy sees dtype {a.dtype} "
                        f"(a {type(value).__name__})")
    return np.array(a, dtype=np.float64)


def main(argv: list[str]) -> None:
    global _OUT
    ctrl_in, _OUT = int(argv[1]), int(argv[2])
    site, sub_dir, filename, out_dir = argv[3], os.path.abspath(argv[4]), argv[5], argv[6]
    sys.path.append(site)
    import numpy as np  # before the student's directory is on the path: a numpy.py there cannot shadow it

    _send({"event": "started"})  # the student's time starts now (the interpreter and numpy are not theirs)

    path = os.path.join(sub_dir, filename)
    if not os.path.isfile(path):
        found = sorted(os.listdir(sub_dir)) if os.path.isdir(sub_dir) else []
        _send({"event": "import_failed", "phase": "missing", "found": found[:50]})
        return
    try:
        with open(path, "rb") as f:
            source = f.read()
        code = compile(source, path, "exec", dont_inherit=True)
    except BaseException as e:  # noqa: BLE001 - SyntaxError, ValueError (null bytes), MemoryError ...
        _send({"event": "import_failed", "phase": "syntax", "error": _error(e, sub_dir)})
        return
    sys.path.insert(0, sub_dir)  # the student's own helper modules
    # its own tree: the run directory (the submission, in/, out/, home), its private scratch, the runtime
    run_dir = os.path.dirname(sub_dir)
    _install_audit([run_dir, "/tmp", "/var/tmp", "/dev/shm", "/run/lock", sys.prefix, sys.base_prefix, site,
                    "/dev/null", "/dev/urandom", "/dev/random", "/dev/zero", "/proc/self", "/sys/devices/system/cpu",
                    "/proc/cpuinfo", "/proc/meminfo", "/etc/localtime", "/usr/share/zoneinfo"], sub_dir)
    import types

    module = types.ModuleType(os.path.splitext(filename)[0])
    module.__file__ = path
    sys.modules[module.__name__] = module
    try:
        exec(code, module.__dict__)  # noqa: S102 - this is what the sandbox is for
    except BaseException as e:  # noqa: BLE001 - anything, SystemExit and KeyboardInterrupt included
        _send({"event": "import_failed", "phase": "import", "error": _error(e, sub_dir)})
        return
    functions = sorted(k for k, v in list(module.__dict__.items()) if callable(v) and not k.startswith("_"))
    _send({"event": "ready", "functions": functions[:500]})

    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = os.read(ctrl_in, 65536)
            if not chunk:
                return
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        msg = json.loads(line)
        if msg.get("op") != "call":
            return
        seq = msg["seq"]
        try:
            with np.load(msg["input"], allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}

            def arg(a):
                if "dict" in a:  # block's params: a dict of arrays (and eps)
                    return {str(k): arg(v) for k, v in a["dict"].items()}
                return arrays[a["array"]].copy() if "array" in a else a["value"]

            args = [arg(a) for a in msg["args"]]
            kwargs = {k: arg(a) for k, a in msg.get("kwargs", {}).items()}
            fn = getattr(module, msg["function"], None)
            if not callable(fn):
                raise NameError(f"your file does not define a function {msg['function']}")
            start = time.perf_counter()
            value = fn(*args, **kwargs)
            seconds = time.perf_counter() - start
            if msg.get("result") == "stages" and isinstance(value, dict):
                wanted = set(msg.get("stages", []))
                out = {str(k): _to_array(np, v, f"{msg['function']}(...)[{k!r}]")
                       for k, v in value.items() if str(k) in wanted}
            else:
                out = {"result": _to_array(np, value, f"what {msg['function']} returned")}
            with open(os.path.join(out_dir, f"{seq}.npz"), "r+b") as answer:  # the file the grader made for this call
                answer.truncate(0)
                np.savez(answer, **out)
        except BaseException as e:  # noqa: BLE001 - the student's error, reported for their call
            _send({"event": "error", "seq": seq, "error": _error(e, sub_dir)})
            continue
        _send({"event": "done", "seq": seq, "seconds": round(seconds, 6)})


_OUT = 1

if __name__ == "__main__":
    main(sys.argv)
