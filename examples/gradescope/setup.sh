#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image (the zip is unpacked in
# /autograder/source, the working directory). It:
#   1. makes sure there is a Python >= 3.11 (Gradescope's Ubuntu 22.04 image has 3.10: python3.11
#      comes from apt; the Ubuntu 24.04 image already has 3.12);
#   2. creates /autograder/venv with the attention-trace project (pinned, from requirements.txt): the
#      grader package and the engine it computes the reference with, in-process: no server needed;
#   3. builds the sandbox's student runtime (/opt/attention-trace/student-python: the standard
#      library and numpy, readable by the unprivileged uid the student's code runs as) and proves
#      it by running a sandboxed probe;
#   4. closes the grader's own files to every other uid.
set -euo pipefail

ROOT="${AUTOGRADER_ROOT:-/autograder}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

pick_python() {
    for p in python3.13 python3.12 python3.11 python3; do
        if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            command -v "$p"; return 0
        fi
    done
    return 1
}
if ! PY="$(pick_python)"; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3.11 python3.11-venv \
        || DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv
    PY="$(pick_python)" || { echo "setup.sh: no Python >= 3.11 with venv could be installed; choose the Ubuntu 24.04 base image" >&2; exit 1; }
fi
"$PY" -m venv "$ROOT/venv"
"$ROOT/venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$ROOT/venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$HERE/attention-trace/requirements.txt"
"$ROOT/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "$HERE/attention-trace"
"$ROOT/venv/bin/attention-trace-grade" setup-sandbox
chmod 0700 "$HERE" "$ROOT/venv"
"$ROOT/venv/bin/attention-trace-grade" selftest "$HERE/course.toml"
