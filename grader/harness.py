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
  (arrays are in the input ``.npz``; an argument is ``{"array": key}`` or
  ``{"value": v}``), or ``{"op": "exit"}``.

A call is answered before the grader sends the next one, and the grader never
sends an input that holds the answer to an earlier call it has not received.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

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
            with open(os.path.join(out_dir, f"{seq}.npz"), "r+b") as f:  # the file the grader made for this call
                f.truncate(0)
                np.savez(f, **out)
        except BaseException as e:  # noqa: BLE001 - the student's error, reported for their call
            _send({"event": "error", "seq": seq, "error": _error(e, sub_dir)})
            continue
        _send({"event": "done", "seq": seq, "seconds": round(seconds, 6)})


_OUT = 1

if __name__ == "__main__":
    main(sys.argv)
