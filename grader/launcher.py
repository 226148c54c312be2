"""The sandbox's first step, run by the grader as a child process: isolate, limit, drop privileges, exec.

    python -I -S launcher.py launch SPEC_FD     # read the JSON spec from SPEC_FD, then exec the student's python
    python -I -S launcher.py sweep UID          # become UID and SIGKILL every process UID owns

Standard library only (ctypes for unshare, mount and prctl): it runs with the
grader's interpreter under ``-I -S`` before anything of the student's exists,
and it execs the student's interpreter (or exits) within milliseconds. It never
imports anything of the grader, and it reads no environment: the grader starts
it with an empty one and passes everything in the spec.

``launch``, in order:

1. New namespaces, each only where the kernel lets us (what happened is
   reported, never silently skipped):

   * as root: a network namespace (no interface but a loopback that is down:
     nothing to connect to, not even the grader on 127.0.0.1), an IPC
     namespace, and a mount namespace in which each of ``hide`` (the grader's
     code, its configuration, the results directory, ...) is covered by an
     empty read-only tmpfs, and ``scratch`` (/tmp and the other world-writable
     directories) and the student's home are private tmpfs of a bounded size;
   * a PID namespace: the student sees and signals only its own processes
     (without a uid of its own, it could otherwise kill the grader);
   * not root: the same inside a new user namespace when unprivileged user
     namespaces are allowed (the uid maps to itself: no privilege is gained).

2. ``setrlimit``: address space, CPU seconds, processes (fork bombs), file
   size, open files, no core dumps, no POSIX message queues.
3. As root: no supplementary groups, then gid and uid set to ``uid`` (an
   unused uid the grader picked for this process alone), checked.
4. ``no_new_privs`` (no setuid binary can give privileges back), a seccomp
   filter that refuses every socket but AF_UNIX (the network is cut even where
   no network namespace can be made), ``oom_score_adj`` 1000 (under memory
   pressure the kernel kills the student's processes first), and a
   parent-death signal (the student dies with the grader). With a new PID
   namespace, the launcher forks the student as its pid 1 (with a /proc of its
   own) and stays outside as its parent, mirroring its exit.
5. A status line on the control pipe, then ``execve`` of the student's
   interpreter with the spec's (clean) environment, in its own directory.

Any failure of a step that must not fail (limits, dropping privileges, the
exec) is reported on the control pipe and the launcher exits 127: the student's
code never runs with less protection than the grader asked for, except where a
namespace is unavailable, which is reported as a note.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
AF_UNIX = 1
#: machine -> (audit arch, socket, io_uring_setup): the syscalls a sandboxed process may not make
#: (io_uring can open sockets too); on x86_64 the x32 ABI (nr >= 0x40000000) is refused as a whole
SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)


def _check(result: int, what: str) -> None:
    if result != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    _check(_libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, ctypes.c_ulong(flags),
                       data.encode() if data else None), f"mount {target}")


def prctl(option: int, value: int) -> None:
    _check(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0),
                       ctypes.c_ulong(0)), "prctl")


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_no_network() -> None:
    """A seccomp filter that refuses (EACCES) every socket but AF_UNIX, and io_uring: the network is
    cut even where no network namespace can be made (a container without CAP_SYS_ADMIN). Needs no
    privilege, only no_new_privs; it holds across exec and in every child."""
    arch, nr_socket, nr_io_uring = SECCOMP_ARCH[platform.machine()]
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EACCES
    prog = [
        (ld, 0, 0, 4),                 # 0: the audit arch
        (jeq, 0, 7, arch),             # 1: not ours (a 32-bit ABI): deny
        (ld, 0, 0, 0),                 # 2: the syscall number
        (jge, 5, 0, 0x40000000),       # 3: x32 ABI: deny
        (jeq, 4, 0, nr_io_uring),      # 4: io_uring_setup: deny
        (jeq, 0, 2, nr_socket),        # 5: not socket(): allow
        (ld, 0, 0, 16),                # 6: socket's first argument, the address family
        (jeq, 0, 1, AF_UNIX),          # 7: AF_UNIX: allow, anything else: deny
        (ret, 0, 0, allow),            # 8
        (ret, 0, 0, deny),             # 9
    ]
    filters = (_SockFilter * len(prog))(*[_SockFilter(*f) for f in prog])
    fprog = _SockFprog(len(prog), filters)
    _check(_libc.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog),
                       ctypes.c_ulong(0), ctypes.c_ulong(0)), "seccomp")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _say(fd: int, doc: dict) -> None:
    os.write(fd, (json.dumps(doc) + "\n").encode())


def _hide(spec: dict, notes: dict) -> None:
    """In our own mount namespace: cover each of the grader's paths with an empty read-only tmpfs, and
    give the student private, size-limited scratch space (a tmpfs on each world-writable directory and
    on its home), so nothing it writes reaches the disk, outlives it, or is seen by another process."""
    mount("none", "/", None, MS_REC | MS_PRIVATE, None)  # nothing we mount propagates back to the host
    hidden, failed = [], []
    for p in spec.get("hide", []):
        if not os.path.isdir(p):
            continue
        try:
            mount("tmpfs", p, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,nr_inodes=4,mode=0755")
            hidden.append(p)
        except OSError as e:
            failed.append(f"{p}: {e.strerror}")
    notes["hidden_paths"] = hidden
    scratch, mb = [], int(spec["limits"].get("scratch_mb", 16))
    uid, gid = spec.get("uid", os.getuid()), spec.get("gid", os.getgid())
    for p in spec.get("scratch", []):
        if not os.path.isdir(p):
            continue
        try:
            mount("tmpfs", p, "tmpfs", MS_NOSUID | MS_NODEV, f"size={mb}m,nr_inodes=4096,mode=1777")
            scratch.append(p)
        except OSError as e:
            failed.append(f"{p}: {e.strerror}")
    home = spec.get("home")
    if home:
        try:
            mount("tmpfs", home, "tmpfs", MS_NOSUID | MS_NODEV, f"size={mb}m,nr_inodes=4096,mode=0700,uid={uid},gid={gid}")
            os.mkdir(os.path.join(home, "tmp"), 0o700)
            os.chown(os.path.join(home, "tmp"), uid, gid)
            scratch.append(home)
        except OSError as e:
            failed.append(f"{home}: {e.strerror}")
    notes["scratch"] = f"private tmpfs of {mb} MiB each: {', '.join(scratch) or 'none'}"
    if failed:
        notes["mount_failed"] = failed


def _namespaces(spec: dict, notes: dict) -> None:
    root = os.geteuid() == 0
    if root:
        try:
            if not spec.get("net_namespace", True):
                raise OSError(errno.EPERM, "turned off")
            unshare(CLONE_NEWNET)
            notes["network"] = "isolated: a new network namespace with no interface but a loopback that is down"
        except OSError as e:
            notes["network"] = f"NOT isolated: unshare(CLONE_NEWNET) failed ({e.strerror})"
        try:
            unshare(CLONE_NEWIPC)
            notes["ipc"] = "isolated: a new IPC namespace"
        except OSError as e:
            notes["ipc"] = f"shared: unshare(CLONE_NEWIPC) failed ({e.strerror})"
        try:
            unshare(CLONE_NEWNS)
            _hide(spec, notes)
            notes["filesystem"] = "the grader's paths are covered by empty tmpfs mounts"
        except OSError as e:
            notes["filesystem"] = f"the grader's paths are protected by permissions only: {e.strerror}"
        try:
            unshare(CLONE_NEWPID)
            notes["pid"] = "isolated: a new PID namespace (it sees and signals only its own processes)"
        except OSError as e:
            notes["pid"] = f"shared: unshare(CLONE_NEWPID) failed ({e.strerror})"
        return
    uid, gid = os.getuid(), os.getgid()
    try:
        unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID)
        notes["pid"] = ("isolated: a new PID namespace (it runs as the grader's uid, but cannot see or signal "
                        "the grader)")
    except OSError as e:
        notes["network"] = f"NOT isolated: not root, and no user namespace ({e.strerror})"
        notes["filesystem"] = "NOT protected: not root; the student runs as the grader's user"
        return
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    notes["network"] = "isolated: a new network namespace (inside an unprivileged user namespace)"
    notes["ipc"] = "isolated: a new IPC namespace"
    try:
        _hide(spec, notes)
        notes["filesystem"] = ("the grader's paths are covered by empty tmpfs mounts, but the student runs as the "
                               "grader's user (not root: no uid to drop to)")
    except OSError as e:
        notes["filesystem"] = f"NOT protected: not root, and mounting failed ({e.strerror})"


def _count_processes(uid: int) -> int:
    n = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


def _limits(spec: dict) -> None:
    lim = spec["limits"]
    mb = 1024 * 1024
    nproc = int(lim["processes"])
    if os.geteuid() != 0:  # RLIMIT_NPROC counts every process of the real uid: ours too
        nproc += _count_processes(os.getuid())
    cpu = int(lim["cpu_seconds"])
    for res, soft, hard in (
        (resource.RLIMIT_AS, int(lim["memory_mb"]) * mb, int(lim["memory_mb"]) * mb),
        (resource.RLIMIT_CPU, cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL a second later
        (resource.RLIMIT_NPROC, nproc, nproc),
        (resource.RLIMIT_FSIZE, int(lim["file_size_mb"]) * mb, int(lim["file_size_mb"]) * mb),
        (resource.RLIMIT_NOFILE, int(lim["open_files"]), int(lim["open_files"])),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_MSGQUEUE, 0, 0),
        (resource.RLIMIT_MEMLOCK, 0, 0),
    ):
        old_soft, old_hard = resource.getrlimit(res)
        if old_hard != resource.RLIM_INFINITY and hard > old_hard:  # never raise a limit someone set lower
            hard = old_hard
            soft = min(soft, hard)
        resource.setrlimit(res, (soft, hard))


class Unmapped(OSError):
    """The uid or gid does not exist in this user namespace (a container that maps few uids)."""


def _drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    try:
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise Unmapped(e.errno, f"uid {uid} is not mapped in this user namespace") from None
        raise
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
        raise OSError(errno.EPERM, "the uid or gid did not change")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise OSError(errno.EPERM, "root could be regained after dropping privileges")


def _fork_into_pid_namespace(status: int) -> None:
    """After unshare(CLONE_NEWPID) our next child is pid 1 of the new namespace: fork it and return in
    it. This process stays outside as its parent, only waiting, and exits as it did (so the grader,
    which watches this process, sees the student's exit status or signal)."""
    pid = os.fork()
    if pid == 0:
        try:  # a /proc of the new namespace: the student lists only its own processes
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        except OSError:
            pass
        return
    os.closerange(3, 65536)  # the pipes are the student's business, not ours
    while True:
        try:
            _, st = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(st):
        sig = os.WTERMSIG(st)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(st) & 0xFF)


def launch(spec_fd: int) -> None:
    chunks = []
    while True:
        b = os.read(spec_fd, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(spec_fd)
    spec = json.loads(b"".join(chunks))
    status = int(spec["status_fd"])
    notes: dict = {}
    try:
        _write("/proc/self/oom_score_adj", "1000")  # under memory pressure, the student's processes go first
        _namespaces(spec, notes)
        if not spec.get("net_namespace", True):  # only the tests turn it off: the seccomp filter must hold alone
            notes["network"] = "NOT isolated: the network namespace was turned off"
        _limits(spec)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # this launcher dies with the grader, and the student with it
        if os.getppid() != int(spec["grader_pid"]):
            os._exit(1)
        if notes.get("pid", "").startswith("isolated"):
            _fork_into_pid_namespace(status)
        if os.geteuid() == 0:
            _drop_privileges(int(spec["uid"]), int(spec["gid"]))
            notes["uid"] = f"runs as uid {spec['uid']}, used by no other process (no groups, no capabilities)"
        else:
            notes["uid"] = f"NOT dropped: not root, the student runs as the grader's uid {os.getuid()}"
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # again: a change of uid clears it
        if spec.get("seccomp", True) and platform.machine() in SECCOMP_ARCH:
            try:
                seccomp_no_network()
                notes["seccomp"] = "sockets other than AF_UNIX (and io_uring) are refused by a seccomp filter"
                if not notes.get("network", "").startswith("isolated"):
                    notes["network"] = ("isolated by the seccomp filter only (no network namespace here: "
                                        + notes.get("network", "") + ")")
            except OSError as e:
                notes["seccomp"] = f"no seccomp filter ({e.strerror})"
        else:
            notes["seccomp"] = f"no seccomp filter for {platform.machine()}"
        if os.getppid() == 1 and not notes.get("pid", "").startswith("isolated"):  # orphaned meanwhile
            os._exit(1)
        os.chdir(spec["cwd"])
        os.umask(0o077)
    except OSError as e:
        code = "uid_unmapped" if isinstance(e, Unmapped) else "launch_failed"
        _say(status, {"event": "launch_failed", "code": code, "error": f"{type(e).__name__}: {e}", "notes": notes})
        os._exit(127)
    _say(status, {"event": "launched", "notes": notes})
    try:
        os.execve(spec["python"], spec["argv"], spec["env"])
    except OSError as e:
        _say(status, {"event": "launch_failed", "code": "exec_failed", "error": f"exec {spec['python']}: {e}",
                      "notes": notes})
        os._exit(127)


def sweep(uid: int) -> None:
    """Become ``uid`` and SIGKILL every process it owns: kill(-1) as that uid reaches
    exactly those, including any that left the process group (setsid, double fork).

    One kill(-1) signals them all under the kernel's task-list lock, and a process
    with a pending SIGKILL cannot finish a fork, so none can slip out; it is sent
    three times anyway. (Its return value says nothing: Linux reports success when
    any other process exists, signalled or not. The grader counts what is left.)
    """
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    for _ in range(3):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return


def main(argv: list[str]) -> None:
    if len(argv) == 3 and argv[1] == "launch":
        launch(int(argv[2]))
    elif len(argv) == 3 and argv[1] == "sweep":
        sweep(int(argv[2]))
    else:
        sys.exit(f"usage: {argv[0]} launch SPEC_FD | sweep UID")


if __name__ == "__main__":
    main(sys.argv)
