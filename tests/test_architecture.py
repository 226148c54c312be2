"""ARCHITECTURE.md is the code's truth: every module and every file of the viewer listed (and none that is gone),
and its dependency picture the one import-linter holds (pyproject.toml's [tool.importlinter]; `make lint` runs it).
"""

from __future__ import annotations

import re
import tomllib

from conftest import ROOT

PAGE = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
PACKAGES = ("engine", "viewer", "service", "attention_trace", "grader", "tools", "bench")
#: a module's line: "- `path`: what it is"
LISTED = re.compile(r"^- `([\w./-]+)`: \S", re.MULTILINE)


def _modules() -> set[str]:
    """Every module of the packages (the sample students aside) and every file of the viewer."""
    files = {str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    files |= {str(p.relative_to(ROOT)) for p in (ROOT / "service" / "static").iterdir() if p.is_file()}
    return {f for f in files if not f.startswith("grader/students/")}


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def test_every_module_and_viewer_file_has_its_line():
    listed = set(LISTED.findall(PAGE))
    missing = sorted(_modules() - listed)
    assert not missing, "ARCHITECTURE.md lists no line for:\n" + "\n".join(missing)


def test_no_line_names_a_module_that_is_gone():
    gone = sorted(n for n in LISTED.findall(PAGE) if not (ROOT / n).is_file())
    assert not gone, "ARCHITECTURE.md lists what no longer exists:\n" + "\n".join(gone)


def test_the_picture_is_the_layers_contract():
    layers = _contracts()["layers"]["layers"]
    assert f"layers: {' > '.join(layers)}" in PAGE, "the picture's 'layers:' line is not pyproject.toml's"
    for package in PACKAGES:
        assert package in " ".join(layers), f"{package} is in no layer"


def test_every_seam_is_named_and_justified():
    seams = _contracts()["layers"].get("ignore_imports", [])
    assert seams, "the layers contract names its seams"
    for seam in seams:
        assert f"`{seam}`" in PAGE, f"ARCHITECTURE.md does not name the seam {seam}"


def test_the_core_is_forbidden_every_other_package():
    forbidden = set(_contracts()["core"]["forbidden_modules"])
    assert set(PACKAGES) - {"engine"} <= forbidden
    assert {"flask", "pydantic"} <= forbidden
