"""The package as a user installs it: a wheel in a fresh venv, used from a directory outside the clone.

`pip install .` (not editable) is how the project lands in a notebook environment. Every in-process path
must then work from the installed files alone: the CLI without --url (it runs the service in-process),
--html (the offline page, which inlines the viewer's static files), and LocalClient (which serves the
packaged openapi.yaml).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """(the venv's bin, an empty working directory, the environment): the wheel built from this tree, installed."""
    base = tmp_path_factory.mktemp("wheel")
    dist, env_dir, work = base / "dist", base / "venv", base / "work"
    work.mkdir()
    # Nothing of the clone on the path: no PYTHONPATH, and the working directory is outside it.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    # setuptools writes build/ and *.egg-info into the source directory: build from a copy, so the tree stays as is
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv*", ".git", "build", "dist", "*.egg-info",
                                                              "__pycache__", "artifacts", "node_modules"))
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(dist), str(src)], work, env)
    # `pip install .` is quiet: setuptools warns of every folder of files it is not told is a package
    assert "absent from the `packages` configuration" not in built.stdout + built.stderr
    wheels = list(dist.glob("attention_trace-*.whl"))
    assert len(wheels) == 1, wheels
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bin_dir = env_dir / "bin"
    # The runtime pins as constraints: the same versions `make run` and the container use.
    run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "-c", str(ROOT / "requirements.txt"), str(wheels[0])], work, env)
    return bin_dir, work, env


def test_the_wheel_carries_the_contract_and_the_viewer(installed: tuple[Path, Path, dict[str, str]]) -> None:
    bin_dir, work, env = installed
    code = ("import service, pathlib; p = pathlib.Path(service.__file__).parent; "
            "print(p); print((p / 'openapi.yaml').stat().st_size); print((p / 'static' / 'app.js').stat().st_size)")
    where, spec_size, js_size = run([str(bin_dir / "python"), "-c", code], work, env).stdout.split()
    assert not Path(where).resolve().is_relative_to(ROOT), f"imported from the clone: {where}"
    assert int(spec_size) == (ROOT / "openapi.yaml").stat().st_size
    assert int(js_size) == (ROOT / "service" / "static" / "app.js").stat().st_size


def test_the_cli_traces_in_process(installed: tuple[Path, Path, dict[str, str]]) -> None:
    bin_dir, work, env = installed
    out = run([str(bin_dir / "attention-trace"), "the cat sat", "--json"], work, env).stdout
    doc = json.loads(out)
    assert [t["text"] for t in doc["tokens"]] == ["the", "cat", "sat"]
    weights = doc["stages"]["weights"]["values"]
    assert all(abs(sum(row) - 1.0) < 1e-12 for head in weights for row in head)


def test_the_cli_writes_the_offline_page(installed: tuple[Path, Path, dict[str, str]]) -> None:
    bin_dir, work, env = installed
    page = work / "trace.html"
    run([str(bin_dir / "attention-trace"), "the cat sat", "--html", str(page)], work, env)
    text = page.read_text(encoding="utf-8")
    assert '<script type="application/json" id="trace-json">' in text
    assert "Content-Security-Policy" in text


def test_local_client_serves_from_the_installed_files(installed: tuple[Path, Path, dict[str, str]]) -> None:
    bin_dir, work, env = installed
    code = ("from attention_trace import LocalClient\n"
            "c = LocalClient()\n"
            "t = c.trace(sentence='the cat sat', d_model=8, num_heads=2)\n"
            "print(t.stages['weights'].shape)\n")
    assert run([str(bin_dir / "python"), "-c", code], work, env).stdout.strip() == "(2, 3, 3)"


def test_the_wheel_installs_the_grader_and_its_command(installed: tuple[Path, Path, dict[str, str]]) -> None:
    """The grader is a package of the wheel: attention-trace-grade and python -m grader run from the installed
    files, with the shipped course and the correct students its self-test grades, and no web framework."""
    bin_dir, work, env = installed
    out = run([str(bin_dir / "attention-trace-grade"), "--help"], work, env).stdout
    assert all(command in out for command in ("setup-sandbox", "grade", "selftest"))
    assert "selftest" in run([str(bin_dir / "python"), "-m", "grader", "--help"], work, env).stdout
    code = ("import sys, grader, grader.core\n"
            "from grader import config\n"
            "c = config.load(grader.COURSE)\n"
            "print(grader.__file__)\n"
            "print((grader.STUDENTS / 'correct.py').is_file(), (grader.STUDENTS / 'single_function' / 'correct.py').is_file())\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('flask', 'pydantic', 'requests')))\n")
    where, students, frameworks = run([str(bin_dir / "python"), "-c", code], work, env).stdout.splitlines()
    assert not Path(where).resolve().is_relative_to(ROOT), f"imported from the clone: {where}"
    assert students == "True True" and frameworks == "[]"
