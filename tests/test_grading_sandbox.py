"""The grading sandbox, run as in production: as root here, so the student's code runs as a fresh
unprivileged uid in new network, IPC and mount namespaces, under rlimits, from the student runtime.

* the runtime builds from nothing with the setup command (what setup.sh and the Dockerfile run) and
  a sandboxed process runs from it as the dropped uid (the interpreter under /root cannot be
  started by that uid: the trap the runtime exists for);
* a probe submission finds every door closed: no uid 0, no groups, a clean environment (no
  ATTENTION_TRACE_URL), no network (not even the grader's loopback), no /root, no grader files, no
  engine/client/grader to import, nothing writable outside its run directory, the limits set;
* a hang that ignores signals and forks setsid'd grandchildren is killed on the grader's clock,
  and no process of its uid survives; files it left in /tmp are removed;
* answers are read without trusting them (links, FIFOs, compressed or object arrays, lying headers);
* not root, the sandbox degrades, and says how.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from grading_support import COURSE, EXAMPLES, ROOT, sandbox_processes, student_runtime

from grader import runtime, sandbox

#: runs student code in the real grading sandbox (namespaces, seccomp, rlimits)
pytestmark = pytest.mark.sandbox

_ = student_runtime

PROBE = r'''
import json, os, socket, sys, resource

REPO, COURSE, GRADER = {repo!r}, {course!r}, {grader}


def _try(f):
    try:
        return f()
    except BaseException as e:
        return f"{{type(e).__name__}}: {{e}}"


def probe(port):
    r = {{"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "env": dict(os.environ)}}
    r["root"] = _try(lambda: os.listdir("/root"))
    r["repo"] = _try(lambda: os.listdir(REPO))
    r["engine_source"] = _try(lambda: open(REPO + "/engine/attention.py").read(10))
    r["course"] = _try(lambda: open(COURSE).read(10))
    for m in ("engine", "service", "attention_trace", "grader", "grading", "flask"):
        r["import " + m] = _try(lambda: __import__(m) and "imported")
    r["connect"] = _try(lambda: socket.create_connection(("127.0.0.1", int(port)), timeout=2) and "connected")
    r["dns"] = _try(lambda: socket.getaddrinfo("pypi.org", 443) and "resolved")
    r["write repo"] = _try(lambda: open(REPO + "/pwned", "w") and "written")
    r["write runtime"] = _try(lambda: open(sys.prefix + "/pwned", "w") and "written")
    r["setuid 0"] = _try(lambda: os.setuid(0) or "root again")
    r["limits"] = {{n: resource.getrlimit(getattr(resource, n)) for n in
                   ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE")}}
    r["tmp"] = _try(lambda: open("/tmp/attention-sandbox-leak-{tag}", "w").write("x"))
    r["pid"], r["processes"] = os.getpid(), sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    r["signal grader"] = _try(lambda: os.kill(GRADER, 0) or "signalled")
    print("PROBE " + json.dumps(r))
    return [0.5]
'''


def write_student(tmp: Path, source: str) -> Path:
    d = tmp / "sub"
    d.mkdir(parents=True, exist_ok=True)
    (d / "attention.py").write_text(source)
    return d


def run(student_runtime, sub: Path, calls, **limits) -> sandbox.RunResult:
    lim = sandbox.Limits(**{"call_seconds": 10, "total_seconds": 30, **limits})
    return sandbox.run_calls(calls, runtime=student_runtime, submission=sub, filename="attention.py", limits=lim,
                             hide=[str(ROOT)], deadline=time.monotonic() + lim.total_seconds)


def test_root_runs_these_tests():
    """The sandbox tests are meant to run as the project's machines run them: as root. Without root,
    test_not_root_degrades_and_says_how is what a grader gets."""
    assert os.geteuid() == 0, "run the test suite as root (make test on the project's machines) to test the sandbox"


def test_setup_builds_a_fresh_runtime_that_the_dropped_uid_can_run(tmp_path):
    """From nothing, as setup.sh and the PrairieLearn Dockerfile do: build, then prove it sandboxed."""
    Path("/opt/attention-trace").mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="test-runtime-", dir="/opt/attention-trace"))
    os.chmod(base, 0o755)  # the dropped uid must be able to reach it
    try:
        dest = base / "student-python"
        run_ = subprocess.run([sys.executable, "-m", "grader", "setup-sandbox", "--runtime", str(dest), "--force"],
                              cwd=EXAMPLES, capture_output=True, text=True, timeout=180)
        assert run_.returncode == 0, run_.stdout + run_.stderr
        assert "sandbox: works" in run_.stdout
        assert "uid: runs as uid" in run_.stdout and "network: isolated" in run_.stdout
        rt = runtime.runtime_at(dest)
        assert sorted(p.name for p in rt.site_packages.iterdir() if not p.name.startswith("__")) == \
            sorted(p for p in os.listdir(rt.site_packages) if p.startswith("numpy"))
        for dirpath, dirnames, filenames in os.walk(dest):
            for name in dirnames + filenames:
                st = os.lstat(os.path.join(dirpath, name))
                assert not st.st_mode & stat.S_IWOTH and st.st_uid == 0
                assert st.st_mode & stat.S_IROTH
        assert not Path(rt.python).resolve().is_relative_to(Path.home())
        assert not Path(rt.python).resolve().is_relative_to(ROOT)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_interpreter_trap_is_real():
    """Why the runtime exists: an unprivileged uid cannot start this project's interpreter where it lives
    (under /root here); the runtime's copy it can."""
    base = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    blocked = any(not p.stat().st_mode & stat.S_IXOTH for p in base.parents if p.exists())
    rt = runtime.build()
    env = {"LD_LIBRARY_PATH": str(rt.lib_dir)} if rt.lib_dir else {}
    ok = subprocess.run([str(rt.python), "-I", "-S", "-c", "print('ok')"], user=61999, group=61999, extra_groups=[],
                        env=env, capture_output=True, text=True, timeout=30, cwd="/")
    assert ok.stdout.strip() == "ok", ok.stderr
    if blocked:
        with pytest.raises(PermissionError):
            subprocess.run([str(base), "-c", "pass"], user=61999, group=61999, extra_groups=[], env={}, cwd="/",
                           timeout=30)


def test_the_probe_finds_every_door_closed(tmp_path, student_runtime, monkeypatch):
    monkeypatch.setenv("ATTENTION_TRACE_URL", "http://secret-grader-service.invalid")
    tag = os.urandom(4).hex()
    sub = write_student(tmp_path, PROBE.format(repo=str(ROOT), course=str(COURSE), tag=tag, grader=os.getpid()))
    with socket.socket() as listener:  # the grader's loopback: must be out of reach
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        res = run(student_runtime, sub, [sandbox.Call("p", "probe", {}, [{"value": port}])], memory_mb=768,
                  processes=20, file_size_mb=8, open_files=40)
    assert res.outcomes["p"].status == "ok", res.outcomes["p"]
    assert res.outcomes["p"].arrays["result"].tolist() == [0.5]
    r = json.loads(res.output.split("PROBE ", 1)[1])
    lo, hi = sandbox.UID_RANGE
    assert lo <= r["uid"] <= hi and r["gid"] == r["uid"] and r["groups"] == []
    assert set(r["env"]) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "PYTHONUTF8", "OPENBLAS_NUM_THREADS",
                             "OMP_NUM_THREADS", "MKL_NUM_THREADS", "LD_LIBRARY_PATH"}
    assert not any("secret" in v or "ATTENTION" in k for k, v in r["env"].items())
    assert r["root"].startswith("PermissionError")
    # an empty read-only tmpfs covers the repository (under /tmp, its private /tmp covers it as well)
    assert r["repo"] == [] or r["repo"].startswith("FileNotFoundError"), r["repo"]
    assert r["engine_source"].startswith("FileNotFoundError") and r["course"].startswith("FileNotFoundError")
    for m in ("engine", "service", "attention_trace", "grader", "grading", "flask"):
        assert r["import " + m].startswith("ModuleNotFoundError"), r["import " + m]
    assert r["connect"] == "PermissionError: [Errno 13] Permission denied", r["connect"]  # the seccomp filter
    assert r["dns"].startswith("gaierror"), r["dns"]
    assert "written" not in r["write repo"] and "written" not in r["write runtime"]
    assert r["setuid 0"].startswith("PermissionError")
    mb = 2**20
    assert r["limits"] == {"RLIMIT_AS": [768 * mb] * 2, "RLIMIT_CPU": [31, 32], "RLIMIT_NPROC": [20, 20],
                           "RLIMIT_FSIZE": [8 * mb] * 2, "RLIMIT_NOFILE": [40, 40], "RLIMIT_CORE": [0, 0]}
    assert r["tmp"] == 1  # it may write to /tmp: its own private tmpfs, gone with it
    assert not os.path.exists(f"/tmp/attention-sandbox-leak-{tag}")
    assert res.notes["scratch"] == "private tmpfs of 16 MiB each: /tmp, /var/tmp, /dev/shm, /run/lock, " + \
        res.notes["scratch"].rsplit(", ", 1)[1]
    assert r["pid"] == 1 and r["processes"] == [1]  # its own PID namespace, its own /proc
    assert r["signal grader"].startswith("ProcessLookupError")
    assert res.notes["network"].startswith("isolated") and res.notes["ipc"].startswith("isolated")
    assert res.notes["pid"].startswith("isolated")
    assert res.notes["seccomp"].startswith("sockets other than AF_UNIX (and io_uring) are refused")
    assert res.notes["hidden_paths"] == [str(ROOT)] and res.notes["uid"].startswith("runs as uid")
    assert res.leftover_processes == 0


ESCAPER = r'''
import os, signal, time


def hang():
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM, signal.SIGXCPU):
        signal.signal(sig, signal.SIG_IGN)
    signal.alarm(0)
    for _ in range(3):
        if os.fork() == 0:
            os.setsid()  # out of the process group
            if os.fork() == 0:
                while True:
                    time.sleep(0.01)
            os._exit(0)
    while True:
        try:
            time.sleep(0.01)
        except:  # noqa: E722
            pass


def fine():
    return [1.0]
'''


NETWORK = r'''
import socket


def probe(port):
    out = []
    for family, address in ((socket.AF_INET, ("127.0.0.1", port)), (socket.AF_INET6, ("::1", port))):
        try:
            socket.create_connection(address, timeout=2)
            out.append("connected")
        except OSError as e:
            out.append(f"{type(e).__name__}: {e.errno}")
    a, b = socket.socketpair()  # AF_UNIX stays allowed (multiprocessing uses it)
    a.sendall(b"x")
    out.append(b.recv(1).decode())
    for fam in (socket.AF_NETLINK, socket.AF_PACKET):
        try:
            socket.socket(fam, socket.SOCK_RAW)
            out.append("opened")
        except OSError as e:
            out.append(f"{type(e).__name__}: {e.errno}")
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)
    out.append(f"io_uring_setup {libc.syscall(425, 8, params)} {ctypes.get_errno()}")  # it can open sockets too
    print("NET", out)
    return [1.0]
'''


def test_without_a_network_namespace_the_seccomp_filter_still_cuts_the_network(tmp_path, student_runtime):
    """Containers without CAP_SYS_ADMIN (Docker's defaults, likely Gradescope's) cannot make a network
    namespace; the seccomp filter needs no privilege and refuses every socket but AF_UNIX."""
    sub = write_student(tmp_path, NETWORK)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        lim = sandbox.Limits(call_seconds=10, total_seconds=30)
        res = sandbox.run_calls([sandbox.Call("p", "probe", {}, [{"value": port}])], runtime=student_runtime,
                                submission=sub, filename="attention.py", limits=lim, hide=[str(ROOT)],
                                deadline=time.monotonic() + 30, net_namespace=False)
    assert res.outcomes["p"].status == "ok"
    assert "NET ['PermissionError: 13', 'PermissionError: 13', 'x', 'PermissionError: 13', " \
           "'PermissionError: 13', 'io_uring_setup -1 13']" in res.output, res.output
    assert res.notes["network"].startswith("isolated by the seccomp filter only (no network namespace here")


def test_a_hang_is_killed_with_everything_it_started(tmp_path, student_runtime):
    sub = write_student(tmp_path, ESCAPER)
    start = time.monotonic()
    res = run(student_runtime, sub, [sandbox.Call("h", "hang", {}, []), sandbox.Call("f", "fine", {}, [])],
              call_seconds=1.0)
    elapsed = time.monotonic() - start
    assert res.outcomes["h"].status == "timeout"
    assert "running hang when the time limit of 1 s per call ran out" in res.outcomes["h"].detail
    assert res.outcomes["f"].status == "ok"  # a fresh process for the calls after it
    assert res.processes == 2 and res.leftover_processes == 0
    assert not sandbox_processes()
    assert elapsed < 5, elapsed


def test_a_run_closes_every_descriptor_it_opened(tmp_path, student_runtime):
    """Each student process's pipes are closed once it is done, those that reached their end first too: a
    grading process that kept them ran out of select()'s 1,024 descriptors after ~340 submissions."""
    sub = write_student(tmp_path, ESCAPER)
    calls = [sandbox.Call("f", "fine", {}, []), sandbox.Call("h", "hang", {}, []), sandbox.Call("g", "fine", {}, [])]
    run(student_runtime, sub, calls[:1])  # warm: whatever the first run opens for good (imports, the runtime)
    before = sorted(os.listdir("/proc/self/fd"))
    for _ in range(3):
        res = run(student_runtime, sub, calls, call_seconds=1.0)
        assert [res.outcomes[k].status for k in "fhg"] == ["ok", "timeout", "ok"] and res.processes == 2
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_memory_and_process_limits_bind(tmp_path, student_runtime):
    sub = write_student(tmp_path, "import numpy as np, os\n\n"
                                  "def big():\n    return np.ones(2 * 10**9)\n\n"
                                  "def forks():\n    n = 0\n    try:\n        while True:\n"
                                  "            if os.fork() == 0:\n                import time; time.sleep(30)\n"
                                  "            n += 1\n    except OSError:\n        return [float(n)]\n")
    res = run(student_runtime, sub, [sandbox.Call("b", "big", {}, []), sandbox.Call("f", "forks", {}, [])],
              memory_mb=512, processes=8)
    assert res.outcomes["b"].status == "error" and res.outcomes["b"].error["type"] == "MemoryError"
    assert res.outcomes["f"].status == "ok" and res.outcomes["f"].arrays["result"][0] <= 8
    assert res.leftover_processes == 0 and not sandbox_processes()


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def test_answers_are_read_without_trusting_them(tmp_path):
    lim = sandbox.Limits(answer_max_bytes=1 << 20, answer_max_elements=10_000)
    me = os.getuid()
    good = tmp_path / "good.npz"
    good.write_bytes(_npz(result=np.arange(6.0).reshape(2, 3)))
    assert sandbox.read_answer(good, me, lim)["result"].tolist() == [[0, 1, 2], [3, 4, 5]]
    cases = {}
    (tmp_path / "link.npz").symlink_to(good)
    cases["link.npz"] = "could not be opened safely"
    os.mkfifo(tmp_path / "fifo.npz")
    cases["fifo.npz"] = "not a regular file"
    buf = io.BytesIO()
    np.savez_compressed(buf, result=np.zeros(3))
    (tmp_path / "compressed.npz").write_bytes(buf.getvalue())
    cases["compressed.npz"] = "unexpected member"
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(tmp_path / "object.npz", "w") as z:
        z.writestr("result.npy", buf.getvalue())
    cases["object.npz"] = "is not numbers"
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**9,)})
    with zipfile.ZipFile(tmp_path / "liar.npz", "w") as z:
        z.writestr("result.npy", header.getvalue() + b"\0" * 64)
    cases["liar.npz"] = "too large"
    (tmp_path / "huge.npz").write_bytes(b"\0" * (2 << 20))
    cases["huge.npz"] = "more than"
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    cases["junk.npz"] = "not a valid .npz"
    for name, why in cases.items():
        with pytest.raises(ValueError, match=why):
            sandbox.read_answer(tmp_path / name, me, lim)
    with pytest.raises(ValueError, match="belongs to someone else"):
        sandbox.read_answer(good, me + 1, lim)


NOT_ROOT = r'''
import json, sys, time
sys.path[:0] = [{site!r}, {examples!r}]
from pathlib import Path
from grader import runtime, sandbox
rt = runtime.runtime_at(Path({root!r}))
import os
res = sandbox.run_calls([sandbox.Call("p", "probe", {{}}, [{{"value": os.getpid()}}])], runtime=rt,
                        submission=Path({sub!r}), filename="attention.py", limits=sandbox.Limits(call_seconds=20, total_seconds=40),
                        hide=[{hide!r}], deadline=time.monotonic() + 40, run_base=Path({base!r}))
o = res.outcomes["p"]
print(json.dumps({{"notes": res.notes, "status": o.status, "output": res.output,
                   "result": None if o.arrays is None else o.arrays["result"].tolist()}}))
'''


def test_not_root_degrades_and_says_how(student_runtime):
    """A grader that is not root cannot drop to another uid: the student runs as the grader's user, in an
    unprivileged user namespace (network cut, paths hidden) where the kernel allows one. Either way the
    notes say so, and grading still works."""
    base = Path(tempfile.mkdtemp(prefix="attention-notroot-", dir="/tmp"))
    try:
        os.chmod(base, 0o777)
        sub = base / "sub"
        sub.mkdir()
        (sub / "attention.py").write_text("import os, socket\n\ndef probe(grader):\n    try:\n"
                                          "        socket.create_connection(('1.1.1.1', 53), timeout=2)\n"
                                          "        print('NET open')\n    except OSError as e:\n"
                                          "        print('NET', e)\n    try:\n"
                                          "        os.kill(grader, 0)\n        print('GRADER reachable')\n"
                                          "    except OSError as e:\n        print('GRADER', e)\n"
                                          "    return [2.0]\n")
        os.chmod(sub, 0o755)
        os.chmod(sub / "attention.py", 0o644)
        # The grader's own code, where the grader's user can read it: the checkout may sit under a directory
        # only root can enter (mktemp -d makes one 0700), and this grader is not root.
        code = base / "code"
        shutil.copytree(ROOT / "grader", code / "grader", ignore=shutil.ignore_patterns("students", "__pycache__"))
        os.chmod(code, 0o755)
        for path in (code / "grader", *(code / "grader").rglob("*")):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        script = NOT_ROOT.format(site=str(student_runtime.site_packages), examples=str(code),
                                 root=str(student_runtime.root), sub=str(sub), hide=str(ROOT), base=str(base))
        run_ = subprocess.run([str(student_runtime.python), "-I", "-S", "-c", script], user=65534, group=65534,
                              extra_groups=[], env=student_runtime.env(), cwd="/", capture_output=True, text=True,
                              timeout=120)
        assert run_.returncode == 0, run_.stderr
        doc = json.loads(run_.stdout.strip().splitlines()[-1])
        assert doc["status"] == "ok" and doc["result"] == [2.0]
        notes = doc["notes"]
        assert notes["uid"].startswith("NOT dropped: not root")
        if notes["network"].startswith("isolated"):
            assert "unprivileged user namespace" in notes["network"] and "NET [Errno 13]" in doc["output"]
            assert notes["pid"].startswith("isolated") and "GRADER [Errno 3]" in doc["output"]
        else:
            assert notes["network"].startswith("NOT isolated: not root, and no user namespace")
    finally:
        shutil.rmtree(base, ignore_errors=True)


FEW_UIDS = r'''
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
r2, w2 = os.pipe()
pid = os.fork()
if pid == 0:  # root in a new user namespace that maps only uids and gids 0..65535
    os.close(r)
    os.close(w2)
    if libc.unshare(0x10000000) != 0:
        os._exit(3)
    os.write(w, b"x")
    os.read(r2, 1)
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    os.execv(sys.argv[1], sys.argv[1:])
os.close(w)
os.close(r2)
assert os.read(r, 1) == b"x"
for f in ("uid_map", "gid_map"):
    with open(f"/proc/{pid}/{f}", "w") as fh:
        fh.write("0 0 65536")
os.write(w2, b"y")
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
'''

IN_CONTAINER = r'''
import json, sys, time
sys.path.insert(0, {examples!r})
from pathlib import Path
import numpy as np
from grader import runtime, sandbox
rt = runtime.runtime_at(Path({root!r}))
call = sandbox.Call("p", "scores", {{"a": np.ones((1, 2, 3))}}, [{{"array": "a"}}, {{"array": "a"}}])
res = sandbox.run_calls([call], runtime=rt, submission=Path({sub!r}), filename="attention.py",
                        limits=sandbox.Limits(call_seconds=10, total_seconds=20), hide=[],
                        deadline=time.monotonic() + 20)
o = res.outcomes["p"]
print(json.dumps({{"status": o.status, "result": o.arrays["result"].tolist(), "notes": res.notes,
                   "range": list(sandbox._uid_range)}}))
'''


def test_a_container_that_maps_few_uids_falls_back_to_low_ones(tmp_path, student_runtime):
    """Rootless and userns-remapped containers map 65536 uids: the grader's unused high uids do not
    exist there, so it picks one from 61000-64999 instead (and still runs the student as it)."""
    sub = write_student(tmp_path, "def scores(q, k):\n    return q @ k.transpose(0, 2, 1)\n")
    script = IN_CONTAINER.format(examples=str(ROOT), root=str(student_runtime.root), sub=str(sub))
    run_ = subprocess.run([sys.executable, "-c", FEW_UIDS, sys.executable, "-c", script], capture_output=True,
                          text=True, timeout=120, cwd="/")
    assert run_.returncode == 0, run_.stdout + run_.stderr
    doc = json.loads(run_.stdout.strip().splitlines()[-1])
    assert doc["status"] == "ok" and doc["result"] == [[[3.0, 3.0], [3.0, 3.0]]]
    assert doc["range"] == list(sandbox.SMALL_UID_RANGE)
    uid = int(doc["notes"]["uid"].split()[3].rstrip(","))
    assert sandbox.SMALL_UID_RANGE[0] <= uid <= sandbox.SMALL_UID_RANGE[1]
