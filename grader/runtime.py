"""The student's interpreter: a copy of this Python's stdlib plus numpy, readable by any uid.

Why: the sandbox runs the student's code as an unprivileged uid, and this
project's interpreter lives under /root/.pyenv (its venv under the repository),
which such a uid cannot even start: /root is mode 700. Opening /root to every
uid would expose the rest of it; the grader's own environment also holds the
reference engine and the client, which a student's code must not import.

So the setup step builds a separate runtime in a neutral place
(``/opt/attention-trace/student-python`` as root,
``~/.cache/attention-trace/student-python`` otherwise):

    bin/python3                      the interpreter binary (copied)
    lib/libpython3.X.so.1.0          when the interpreter is a shared build (pyenv's is)
    lib/python3.X/                   the standard library, without its tests, tkinter, idlelib,
                                     ensurepip and site-packages
    lib/python3.X/site-packages/     numpy only (every file its wheel's RECORD lists)
    RUNTIME.json                     what it was built from; a mismatch rebuilds it

Files are hard links where the source is world-readable and on the same
filesystem (instant, no space), copies otherwise; directories are 0755 and
root-owned, so the student can read and run it and change nothing. CPython
finds its prefix from the binary's location (``lib/python3.X/os.py`` next to
it), and ``LD_LIBRARY_PATH`` points the dynamic loader at the copied
libpython before the binary's RUNPATH (which names the original under /root).

Build it with ``attention-trace-grade setup-sandbox`` (the platforms' setup scripts
and the tests do); it is idempotent and atomic (built aside, then renamed).
"""

from __future__ import annotations

import errno
import fcntl
import importlib.metadata
import json
import os
import re
import shutil
import stat
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import cast

BUILD_VERSION = 1
#: what students may import besides the standard library
DEFAULT_PACKAGES = ("numpy",)
#: standard-library directories a student has no use for (and the grader's packages)
SKIP_STDLIB = {"site-packages", "dist-packages", "test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip",
               "lib2to3", "unittest/test"}


@dataclass(frozen=True)
class Runtime:
    root: Path
    python: Path
    site_packages: Path
    lib_dir: Path | None  # where libpython is, for LD_LIBRARY_PATH; None for a static build

    def env(self) -> dict[str, str]:
        return {"LD_LIBRARY_PATH": str(self.lib_dir)} if self.lib_dir else {}


def default_location() -> Path:
    env = os.environ.get("ATTENTION_GRADER_RUNTIME")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/opt/attention-trace/student-python")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attention-trace" / "student-python"


def _mapped_libpython() -> str | None:
    """The libpython file this process has mapped, if any (Linux's /proc/self/maps)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and re.search(r"/libpython3\.\d+[^/]*\.so", parts[5]):
                    return parts[5].strip()
    except OSError:
        return None
    return None


def _static_binary() -> bool:
    """True when /proc/self/maps is readable and shows no libpython: the interpreter is linked statically."""
    return os.path.exists("/proc/self/maps") and _mapped_libpython() is None


def _source() -> dict:
    """Where this interpreter's binary, stdlib and libpython are."""
    exe = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    stdlib = Path(sysconfig.get_path("stdlib", vars={"installed_base": sys.base_prefix, "base": sys.base_prefix}))
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    # The libpython this interpreter runs on, if it is linked to one. sysconfig's Py_ENABLE_SHARED is not
    # enough: Debian builds a shared libpython but links /usr/bin/python3 statically, so what counts is
    # what the running binary mapped.
    lib = _mapped_libpython()
    if lib is None and sysconfig.get_config_var("Py_ENABLE_SHARED") and not _static_binary():
        name = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
        raise RuntimeError(f"{exe} is a shared build, but its {name} was not found")
    return {"executable": str(exe), "stdlib": str(stdlib), "libpython": lib, "version": ver,
            "hexversion": sys.hexversion}


def _stamp(packages: tuple[str, ...]) -> dict:
    src = _source()
    return {"build_version": BUILD_VERSION, **src,
            "packages": {p: importlib.metadata.version(p) for p in packages}}


def _place(src: Path, dst: Path) -> None:
    """Hard-link a world-readable file; copy (readable to all) anything else."""
    st = src.stat()
    if st.st_mode & stat.S_IROTH:
        try:
            os.link(src, dst)
            return
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES):
                raise
    shutil.copy2(src, dst)
    os.chmod(dst, 0o755 if st.st_mode & stat.S_IXUSR else 0o644)


def _copy_tree(src: Path, dst: Path, skip: set[str]) -> None:
    for dirpath, dirnames, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        dirnames[:] = [d for d in dirnames if (rel / d).as_posix() not in skip and d not in skip]
        target = dst / rel
        target.mkdir(mode=0o755, exist_ok=True)
        os.chmod(target, 0o755)
        for name in filenames:
            s = Path(dirpath) / name
            if s.is_symlink() or not s.is_file():
                continue
            _place(s, target / name)


def _check_reachable(path: Path) -> None:
    """Every directory above the runtime must be searchable by any uid."""
    for parent in [path, *path.parents]:
        if parent.exists() and not parent.stat().st_mode & stat.S_IXOTH:
            raise PermissionError(f"{parent} is not searchable by other users (mode "
                                  f"{oct(parent.stat().st_mode & 0o777)}), so a sandboxed student could not reach "
                                  f"the runtime in {path}; choose another place (ATTENTION_GRADER_RUNTIME)")


def runtime_at(root: Path) -> Runtime:
    stamp = json.loads((root / "RUNTIME.json").read_text())
    ver = stamp["version"]
    lib = root / "lib" if stamp.get("libpython") else None
    return Runtime(root, root / "bin" / "python3", root / "lib" / f"python{ver}" / "site-packages", lib)


def is_current(root: Path, packages: tuple[str, ...] = DEFAULT_PACKAGES) -> bool:
    try:
        return json.loads((root / "RUNTIME.json").read_text()) == _stamp(packages)
    except (OSError, ValueError, importlib.metadata.PackageNotFoundError):
        return False


def build(root: Path | None = None, packages: tuple[str, ...] = DEFAULT_PACKAGES, force: bool = False) -> Runtime:
    """Build (or keep, when current) the runtime at ``root``; returns it."""
    root = Path(root or default_location()).absolute()
    if not force and is_current(root, packages):
        return runtime_at(root)
    root.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    _check_reachable(root.parent)
    with open(root.parent / f".{root.name}.lock", "w") as lock:  # one builder at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and is_current(root, packages):  # another builder just made it
            return runtime_at(root)
        return _build(root, packages)


def _build(root: Path, packages: tuple[str, ...]) -> Runtime:
    stamp = _stamp(packages)
    tmp = root.parent / f".{root.name}.build-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o755)
    os.chmod(tmp, 0o755)
    ver = stamp["version"]
    (tmp / "bin").mkdir(mode=0o755)
    shutil.copy2(stamp["executable"], tmp / "bin" / "python3")
    os.chmod(tmp / "bin" / "python3", 0o755)
    (tmp / "lib").mkdir(mode=0o755)
    if stamp["libpython"]:
        shutil.copy2(stamp["libpython"], tmp / "lib" / Path(stamp["libpython"]).name)
        os.chmod(tmp / "lib" / Path(stamp["libpython"]).name, 0o755)
    stdlib = tmp / "lib" / f"python{ver}"
    _copy_tree(Path(stamp["stdlib"]), stdlib, SKIP_STDLIB)
    site = stdlib / "site-packages"
    site.mkdir(mode=0o755, exist_ok=True)
    for name in packages:
        dist = importlib.metadata.distribution(name)
        base = Path(cast(Path, dist.locate_file(""))).resolve()  # an installed distribution's files are Paths
        for f in dist.files or ():
            src = Path(cast(Path, dist.locate_file(f))).resolve()
            if not src.is_file() or not src.is_relative_to(base):  # scripts in bin/ and the like
                continue
            dst = site / src.relative_to(base)
            for d in reversed(dst.relative_to(site).parents[:-1]):
                (site / d).mkdir(mode=0o755, exist_ok=True)
                os.chmod(site / d, 0o755)
            _place(src, dst)
    (tmp / "RUNTIME.json").write_text(json.dumps(stamp, indent=2) + "\n")
    os.chmod(tmp / "RUNTIME.json", 0o644)
    old = root.parent / f".{root.name}.old-{os.getpid()}"
    if root.exists():
        os.rename(root, old)
    os.rename(tmp, root)
    shutil.rmtree(old, ignore_errors=True)
    return runtime_at(root)
