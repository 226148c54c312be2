"""openapi.yaml, read by the common TypeScript generator, types every real answer.

openapi-typescript (default settings) turns each response schema into a TypeScript type, and
``tsc --strict`` checks the service's own answers of every JSON endpoint against them, written
as typed constants. A schema that says a field is always there when the service omits it (a
``default`` on an output field, or a wrong ``required``), or that misses a field the service
sends, is a type error here. Both tools come from the npm registry, installed into a cache
directory outside the repository (ATTENTION_TRACE_TS_CACHE, default
~/.cache/attention-trace/openapi-typescript); without Node and npm, or without the registry,
the test is skipped and says why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT
from contract_answers import answers

pytestmark = pytest.mark.integration  # starts another process

#: exact versions, so a new release cannot change what is checked
OPENAPI_TYPESCRIPT = "openapi-typescript@7.13.0"
TYPESCRIPT = "typescript@5.9.3"
CACHE = Path(os.environ.get("ATTENTION_TRACE_TS_CACHE",
                            Path.home() / ".cache" / "attention-trace" / "openapi-typescript"))


@pytest.fixture(scope="module")
def toolchain() -> Path:
    """The cache directory holding both tools (installed there once)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("Node.js and npm are not installed: the TypeScript check of openapi.yaml needs them "
                    "(Debian: apt-get install nodejs npm)")
    bins = CACHE / "node_modules" / ".bin"
    wanted = CACHE / "wanted.txt"
    if not (bins / "tsc").exists() or not wanted.exists() or wanted.read_text() != f"{OPENAPI_TYPESCRIPT} {TYPESCRIPT}":
        CACHE.mkdir(parents=True, exist_ok=True)
        (CACHE / "package.json").write_text('{"private": true}\n')
        done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", str(CACHE),
                               OPENAPI_TYPESCRIPT, TYPESCRIPT], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            pytest.skip(f"npm could not install {OPENAPI_TYPESCRIPT} and {TYPESCRIPT} into {CACHE} (no registry?): "
                        + done.stderr.strip()[-300:])
        wanted.write_text(f"{OPENAPI_TYPESCRIPT} {TYPESCRIPT}")
    return bins


def test_types_generated_from_openapi_yaml_accept_every_real_answer(client, toolchain, tmp_path):
    types = tmp_path / "api.ts"
    gen = subprocess.run([str(toolchain / "openapi-typescript"), str(ROOT / "openapi.yaml"), "-o", str(types)],
                         capture_output=True, text=True, timeout=120)
    assert gen.returncode == 0, gen.stderr
    lines = ['import type { paths } from "./api";', ""]
    for i, (name, path, method, status, mime, body) in enumerate(answers(client)):
        # The operation's own answer type: its status and media type, as a client would look it up.
        kind = f'paths["{path}"]["{method}"]["responses"][{status}]["content"]["{mime}"]'
        if (path, method) in (("/nope", "get"), ("/trace", "get")):  # not in the spec: typed as /trace's problems
            kind = f'paths["/trace"]["post"]["responses"][{status}]["content"]["{mime}"]'
        lines += [f"// {name}", f"export const answer{i}: {kind} = {json.dumps(body, ensure_ascii=False)};", ""]
    (tmp_path / "answers.ts").write_text("\n".join(lines), encoding="utf-8")
    check = subprocess.run([str(toolchain / "tsc"), "--strict", "--noEmit", "--target", "es2022", "--module", "es2022",
                            "--moduleResolution", "bundler", str(tmp_path / "answers.ts")],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    errors = [line for line in check.stdout.splitlines() if ": error TS" in line]
    assert check.returncode == 0 and not errors, f"{len(errors)} type errors:\n" + "\n".join(
        line.replace(str(tmp_path) + "/", "")[:400] for line in check.stdout.splitlines()[:40])
