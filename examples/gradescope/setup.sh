#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image.
# It installs the client's dependencies (requests, numpy) into a virtualenv
# that run_autograder uses; the client itself (attention_trace/) is in the zip.
set -euo pipefail

ROOT="${AUTOGRADER_ROOT:-/autograder}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv python3-pip
fi
python3 -m venv "$ROOT/venv"
"$ROOT/venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$ROOT/venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$HERE/requirements.txt"
"$ROOT/venv/bin/python" -c 'import numpy, requests; print("numpy", numpy.__version__, "requests", requests.__version__)'
