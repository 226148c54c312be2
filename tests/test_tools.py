"""Each shared helper has one home: tools/.

``free_port`` and the gunicorn launcher live in tools/server.py, and nowhere else; the command-line tools
are modules of the tools package that import each other, and ``scripts/<name>`` only calls their
``main()``. A copy of a helper, or a script loaded by its path, fails here.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from conftest import ROOT


def python_files(root: Path) -> dict[str, ast.Module]:
    """Every Python file of the checkout (tracked or new, not ignored), by path: *.py and the
    extension-less scripts that start with a python shebang."""
    names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                           capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()
    out = {}
    for name in names:
        path = root / name
        if name.startswith("grader/students/") or not path.is_file():  # students write as they like
            continue
        if path.suffix == ".py" or (not path.suffix and path.read_bytes().startswith(b"#!/usr/bin/env python")):
            out[name] = ast.parse(path.read_bytes(), filename=name)
    return out


def _gunicorn_command(node: ast.AST) -> bool:
    """A command line (a list or tuple) that runs gunicorn: "-m", "gunicorn"; "gunicorn" and its options; or a
    path ending in gunicorn."""
    if not isinstance(node, (ast.List, ast.Tuple)):
        return False
    words = [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None for e in node.elts]
    if any(a == "-m" and b == "gunicorn" for a, b in zip(words, words[1:])):
        return True
    if words and words[0] == "gunicorn" and any((w or "").startswith("-") for w in words[1:]):
        return True  # gunicorn on PATH, with its options
    return any((w or "").endswith("/gunicorn") for w in words) or any(
        isinstance(e, ast.BinOp) and isinstance(e.op, ast.Div) and isinstance(e.right, ast.Constant)
        and e.right.value == "gunicorn" for e in node.elts)


def helper_homes(root: Path) -> dict[str, list[str]]:
    """Where each helper is defined, as path:qualified name: ``free_port`` (by any name ending in it), the
    functions that build a gunicorn command line, and each use of SourceFileLoader (a script loaded by its
    path instead of imported), as path:line."""
    found: dict[str, list[str]] = {"free_port": [], "gunicorn launcher": [], "SourceFileLoader": []}

    def visit(name: str, node: ast.AST, scope: list[str]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = [*scope, node.name]
            if not isinstance(node, ast.ClassDef) and node.name.endswith("free_port"):
                found["free_port"].append(f"{name}:{'.'.join(scope)}")
        if _gunicorn_command(node):
            where = f"{name}:{'.'.join(scope) or '<module>'}"
            if where not in found["gunicorn launcher"]:
                found["gunicorn launcher"].append(where)
        if (isinstance(node, ast.Name) and node.id == "SourceFileLoader") or \
                (isinstance(node, ast.Attribute) and node.attr == "SourceFileLoader") or \
                (isinstance(node, ast.alias) and node.name.split(".")[-1] == "SourceFileLoader"):
            found["SourceFileLoader"].append(f"{name}:{getattr(node, 'lineno', '?')}")
        for child in ast.iter_child_nodes(node):
            visit(name, child, scope)

    for name, tree in sorted(python_files(root).items()):
        visit(name, tree, [])
    return found


def test_each_helper_is_defined_once_in_tools():
    found = helper_homes(ROOT)
    assert found["free_port"] == ["tools/server.py:free_port"], found["free_port"]
    assert found["gunicorn launcher"] == ["tools/server.py:Gunicorn._start"], \
        f"start gunicorn with tools.server.Gunicorn, not a launcher of your own: {found['gunicorn launcher']}"
    assert found["SourceFileLoader"] == [], \
        f"import the module from tools/ instead of loading a script by its path: {found['SourceFileLoader']}"


def test_the_scan_finds_copies(tmp_path):
    """The scan itself: a second free_port, a second launcher and a loaded script are each found."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True, timeout=60)
    (tmp_path / "a.py").write_text(
        "import importlib.machinery, subprocess, sys\n"
        "def free_port():\n    return 0\n"
        "class Server:\n"
        "    def __init__(self):\n"
        "        cmd = [sys.executable, '-m', 'gunicorn', '-c', 'gunicorn.conf.py', 'x:app']\n"
        "        self.proc = subprocess.Popen(cmd)\n"
        "loader = importlib.machinery.SourceFileLoader('x', 'scripts/x')\n"
        "ok = 'gunicorn' in ('gunicorn', 'flask')\n")  # not a command line
    (tmp_path / "b").write_text("#!/usr/bin/env python3\nimport os\nfrom pathlib import Path\n"
                                "def _free_port():\n    pass\n"
                                "def start():\n    os.spawnv(os.P_NOWAIT, 'x', [Path('bin') / 'gunicorn', 'a:app'])\n"
                                "def other():\n    return ['gunicorn', '-c', 'gunicorn.conf.py', 'x:app']\n")
    assert helper_homes(tmp_path) == {"free_port": ["a.py:free_port", "b:_free_port"],
                                      "gunicorn launcher": ["a.py:Server.__init__", "b:start", "b:other"],
                                      "SourceFileLoader": ["a.py:8"]}


def _tools_modules() -> list[str]:
    return sorted(p.stem for p in (ROOT / "tools").glob("*.py") if p.stem not in ("__init__", "server"))


def test_each_script_is_a_thin_wrapper_around_its_module():
    """scripts/<name> puts the repository on sys.path and calls tools.<name>.main(): no code of its own."""
    wrapped = []
    for script in sorted((ROOT / "scripts").iterdir()):
        text = script.read_text(encoding="utf-8")
        if not text.startswith("#!/usr/bin/env python") or "from tools" not in text:
            continue
        module = script.name.replace("-", "_")
        tree = ast.parse(text)
        assert os.access(script, os.X_OK), f"{script.name} is not executable"
        assert not [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))], \
            f"{script.name} defines code: move it into tools/{module}.py"
        imports = [(n.module, [a.name for a in n.names]) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert (f"tools.{module}", ["main"]) in imports, imports
        assert len(text.splitlines()) <= 20, f"{script.name}: a wrapper is a few lines"
        wrapped.append(module)
    # every tool has its command, and every command its module
    assert wrapped == _tools_modules()
    assert {"loadtest", "attack", "kill_burst", "measure_check", "measure_limits", "measure_memory",
            "sidecar_nginx_conf", "soak_memory"} <= set(wrapped)


@pytest.mark.parametrize("module", _tools_modules())
def test_each_tool_has_a_main_that_takes_its_arguments(module):
    tree = ast.parse((ROOT / "tools" / f"{module}.py").read_text(encoding="utf-8"))
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    assert [a.arg for a in main.args.args] == ["argv"], f"tools/{module}.py: main(argv=None), as the tests call it"


@pytest.mark.integration  # starts another process
def test_a_wrapper_runs_from_another_directory(tmp_path):
    """The wrapper finds the repository from its own path, whatever the working directory."""
    from tools.sidecar_nginx_conf import sidecar_conf

    out = subprocess.run([str(ROOT / "scripts" / "sidecar-nginx-conf")], cwd=tmp_path, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    assert out == sidecar_conf() and "proxy_pass" in out


@pytest.mark.integration  # starts another process
def test_python_m_runs_a_tool():
    run = subprocess.run([sys.executable, "-m", "tools.attack", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert "--attack" in run.stdout and "slowloris" in run.stdout


@pytest.mark.integration  # starts another process
def test_the_wheel_leaves_tools_out():
    """tools/ (like tests/ and bench/) is for the checkout: pip install . ships the runtime packages only."""
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"]
    assert {p.split(".")[0] for p in packages} == {"engine", "service", "attention_trace", "grader", "viewer"}


def test_a_config_less_server_needs_a_directory_of_its_own():
    from tools.server import Gunicorn

    with pytest.raises(ValueError, match="cwd"):
        Gunicorn(config=None)  # from the repository root, gunicorn would load gunicorn.conf.py after all


@pytest.mark.integration
def test_the_benchmark_starts_its_floor_with_gunicorns_defaults(tmp_path):
    """bench's Server through the shared launcher: plain gunicorn (no gunicorn.conf.py: the sync worker and
    the worker count from args), its app from the repository, the log removed after a clean stop."""
    from bench.http_bench import Server

    (tmp_path / "x.json").write_bytes(b'{"x":1}')
    srv = Server(tmp_path, label="floor", args=["-k", "sync", "-w", "2"], app="bench.floor_app:app", plain=True)
    try:
        assert srv.post("/floor/x", b"{}") == (200, b'{"x":1}')
        deadline = time.monotonic() + 30
        while len(srv.worker_pids()) != 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(srv.worker_pids()) == 2
        text = srv.log_text()
        assert "Using worker: sync" in text and f"127.0.0.1:{srv.port}" in text
        log = srv.log
        assert log.is_file()
    finally:
        srv.stop()
    assert srv.proc.returncode == 0 and not log.exists()


# ---------------------------------------------------------------- measure-check's stacks


def _check_cost(body: dict) -> int | None:
    """What the service counts for this stack's /check (None: its trace is refused already)."""
    from service import budget
    from service.routes.trace import TraceRequest

    try:
        return budget.cost("/check", [TraceRequest.model_validate(body)])
    except ValueError:
        return None


def test_measure_checks_stacks_are_the_largest_the_budget_allows():
    """Each checked stack is within the /check budget and one more layer (or d_ff unit) is not; each refused
    stack is traceable, the deepest the trace allows, and over the budget."""
    from service import budget
    from service.settings import Settings
    from tools.measure_check import scenarios, stack_requests

    limit = budget.check_limit(Settings())
    shapes = {}
    stacks = stack_requests()
    assert {name for name, *_ in stacks} <= {name for name, *_ in scenarios()}  # each selectable with --only
    for name, request, what in stacks:
        grown = "d_ff" if name == "stack-check-erf" else "num_layers"
        shapes[name] = request[grown]
        more = _check_cost({**request, grown: request[grown] + 1})
        if "refused" in name:
            assert _check_cost(request) > limit and more is None, name  # one layer more: not even traceable
            assert "(a 422)" in what
        else:
            assert _check_cost(request) <= limit < (more or limit + 1), name
    # docs/performance.md's shapes at the default limits
    assert shapes == {"stack-check-gpt2": 5, "stack-check-deep": 40, "stack-check-steps": 73, "stack-check-erf": 3078,
                      "stack-check-refused-gpt2": 8, "stack-check-refused-deep": 96, "stack-check-refused-erf": 3}


@pytest.mark.integration  # starts another process
def test_measure_check_runs_a_stack_and_its_refusal_in_a_fresh_process(tmp_path, capsys):
    from tools.measure_check import main

    out = tmp_path / "check.json"
    assert main(["--no-gunicorn", "--only", "stack-check-steps", "stack-check-refused-deep", "--json", str(out)]) == 0
    results = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"stack-check-steps", "stack-check-refused-deep"}
    checked, refused = results["stack-check-steps"]["in_process"], results["stack-check-refused-deep"]["in_process"]
    assert checked["status"] == 200 and checked["summary"].startswith("Stage 'weights'")  # 1 % off: the first wrong
    assert refused["status"] == 422 and "checking this stack of 96 block(s) would cost" in refused["summary"]
    for p in (checked, refused):
        assert 0 < p["cpu_s"] < 30 and 0 < p["idle_mib"] <= p["peak_mib"]
    assert "stack-check-steps" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--no-gunicorn", "--only", "stack-check-nope"])  # a misspelt name is an error, not an empty run


# ---------------------------------------------------------------- soak-memory


def test_soak_memorys_table_takes_the_docs_columns():
    from tools.soak_memory import table

    readings = [{"requests": k * 1000, "workers": {"7": {"rss_mib": 100.0 + k, "pss_mib": 90.4 + k}}}
                for k in range(1, 41)]
    lines = table(readings, ["7"])
    assert lines[0] == "| requests | 1,000 | 2,000 | 5,000 | 8,000 | 10,000 | 20,000 | 30,000 | 40,000 |"
    assert lines[1] == "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    assert lines[2] == "| RSS (MiB) | 101 | 102 | 105 | 108 | 110 | 120 | 130 | 140 |"
    assert lines[3] == "| PSS (MiB) | 91 | 92 | 95 | 98 | 100 | 110 | 120 | 130 |"
    # a short run shows every reading, a worker per row pair when there are several
    two = [{"requests": 100, "workers": {"7": {"rss_mib": 1.0, "pss_mib": 2.0}, "8": {"rss_mib": 3.0, "pss_mib": 4.0}}}]
    assert table(two, ["7", "8"])[2:] == ["| worker 1 RSS (MiB) | 1 |", "| worker 1 PSS (MiB) | 2 |",
                                          "| worker 2 RSS (MiB) | 3 |", "| worker 2 PSS (MiB) | 4 |"]


def test_soak_memorys_requests_carry_their_own_headers():
    from tools.soak_memory import Connection, SoakReq

    r = SoakReq("m-br", "POST", "/trace", b"{}", "application/json", True, 1, (("Accept-Encoding", "br"),))
    raw = Connection.request_bytes(r, "id-1")
    assert raw == (b"POST /trace HTTP/1.1\r\nAccept-Encoding: br\r\nHost: 127.0.0.1\r\nX-Request-ID: id-1\r\n"
                   b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")


@pytest.mark.integration
def test_soak_memory_reads_a_workers_memory_as_the_requests_go(tmp_path, capsys):
    from tools.soak_memory import main

    out = tmp_path / "soak.json"
    assert main(["--requests", "300", "--every", "100", "--largest-share", "0", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["passed"] and rep["problems"] == []
    assert rep["command"]["env"]["GUNICORN_MAX_REQUESTS"] == "0"  # recycling off
    assert sum(n for by in rep["requests"].values() for n in by.values()) == 300
    assert [r["requests"] for r in rep["readings"]] == [100, 200, 300]
    (pid,) = rep["worker_peak_mib"]  # one worker, never replaced
    idle = rep["idle"][pid]["rss_mib"]
    for r in rep["readings"]:
        w = r["workers"][pid]
        # PSS is read just after RSS, while the other client's request runs: only the peak bounds both
        assert idle < w["rss_mib"] <= rep["worker_peak_mib"][pid] and 0 < w["pss_mib"] <= rep["worker_peak_mib"][pid]
    # the mix reached the worker: errors answered 4xx, the rest 2xx, several kinds of each
    assert {"check-s", "html-s", "m-npz", "batch", "400-malformed"} <= set(rep["requests"])
    printed = capsys.readouterr().out
    assert "| requests | 100 | 200 | 300 |" in printed and "| RSS (MiB) |" in printed and "PASS" in printed


def test_the_attack_holds_its_connections_from_several_source_addresses():
    """scripts/attack --addresses K: the server sees the held connections come from K loopback addresses in
    turn (per-address limits, nginx's among them, count each apart); a target off loopback is refused."""
    import socket
    import threading

    from tools import attack

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    peers: list[str] = []
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, (addr, _) = server.accept()
            except TimeoutError:
                continue
            peers.append(addr)
            accepted.append(conn)

    t = threading.Thread(target=accept)
    t.start()
    try:
        stats = {"opened": 0, "connect_failed": 0, "closed_by_server": 0}
        sources = attack.source_addresses("127.0.0.1", 3)
        attack.hold_connections("idle", "127.0.0.1", server.getsockname()[1], 6, time.monotonic() + 1.0, stats,
                                sources)
        deadline = time.monotonic() + 10
        while len(peers) < 6 and time.monotonic() < deadline:  # the accepting thread may lag the connects
            time.sleep(0.02)
    finally:
        stop.set()
        t.join(5)
        for c in accepted:
            c.close()
        server.close()
    assert sources == ("127.0.0.2", "127.0.0.3", "127.0.0.4")
    assert stats == {"opened": 6, "connect_failed": 0, "closed_by_server": 0}
    assert sorted(peers) == ["127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3", "127.0.0.4", "127.0.0.4"]
    assert attack.source_addresses("127.0.0.1", 1) == (None,)  # one address: the kernel's choice, as before
    with pytest.raises(SystemExit, match="loopback"):
        attack.source_addresses("192.0.2.1", 4)


@pytest.mark.integration  # starts another process
def test_child_pids_reads_the_children_lists_as_the_process_table_does():
    """tools.server.child_pids reads each thread's children list; it names the same children as a scan of every
    process's stat (the fallback), live ones alone by default, and the unreaped too with live=False."""
    import os
    import subprocess

    from tools import server

    live = subprocess.Popen(["sleep", "30"])
    exited = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while server._state(exited.pid) != "Z" and time.monotonic() < deadline:  # exited, not yet reaped
            time.sleep(0.02)
        me = os.getpid()  # this process may have other children too (servers the suite's fixtures started)
        children, every = server.child_pids(me), server.child_pids(me, live=False)
        assert children == server._scanned_child_pids(me, True) and live.pid in children
        assert exited.pid not in children
        assert every == server._scanned_child_pids(me, False) and {live.pid, exited.pid} <= set(every)
    finally:
        live.kill()
        live.wait()
        exited.wait()
    assert server.child_pids(live.pid) == [] and server.child_pids(2**22 + 1) == []  # none, and gone
