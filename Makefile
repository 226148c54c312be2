# Set-up is part of each command: `make run` builds .venv/ with the runtime
# requirements only; `make check` and `make test` add the test requirements.
# Each step runs once, and again when its requirements file changes.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000
PIP    := $(BIN)/python -m pip install --quiet --disable-pip-version-check
# Tests write nothing into the tree: no bytecode, no caches (see tests/conftest.py).
TEST_ENV := PYTHONDONTWRITEBYTECODE=1

.PHONY: run install install-test lint check test browser nginx bench bench-guard loadtest attack measure-memory clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The runtime: requirements.txt (the service's pinned dependencies) and this package, editable.
$(VENV)/.runtime: $(BIN)/python requirements.txt pyproject.toml
	$(PIP) -r requirements.txt
	$(PIP) --no-deps -e .
	touch $@

# The test stack on top: pytest, the browser driver, the references (torch CPU build, transformers, bertviz …).
$(VENV)/.test: $(VENV)/.runtime requirements-dev.txt
	$(PIP) -r requirements-dev.txt
	touch $@

install: $(VENV)/.runtime
install-test: $(VENV)/.test

# Foreground gunicorn with the committed config; SIGTERM or Ctrl-C stops it.
# exec so the signal reaches gunicorn's master directly.
run: $(VENV)/.runtime
	HOST=$(HOST) PORT=$(PORT) exec $(BIN)/gunicorn -c gunicorn.conf.py service.wsgi:app

# Debian's chromium + chromedriver for the viewer's browser tests (idempotent;
# installs with apt-get only when they are missing).
browser:
	scripts/install-browser

# Debian's nginx for the tests that run the shipped nginx configuration in front of
# gunicorn (tests/test_nginx.py); installs with apt-get only when it is missing.
nginx:
	command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx \
	  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light; }

# The house rules, held by tools (settings in pyproject.toml; .pre-commit-config.yaml runs the same four):
# ruff's rules, the formatter (but its backlog), mypy (--strict on engine/), the import contracts (ARCHITECTURE.md).
lint: $(VENV)/.test
	$(BIN)/ruff check --no-cache .
	$(BIN)/ruff format --check --no-cache --force-exclude .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache --no-logo

# The quick loop for every edit: lint, then the in-process tests, on two workers (pytest-xdist); no real
# gunicorn, browser, sandbox or long runs. Measured from a fresh clone on an idle 2-core machine: 50 s, mypy cold.
# The contract fuzzing (slow) is not even collected: its imports and schemathesis's plugin cost ~4 s a worker.
check: lint
	$(TEST_ENV) HYPOTHESIS_PROFILE=check $(BIN)/python -m pytest -n 2 --dist loadfile \
	  -m "not slow and not browser and not sandbox and not integration" \
	  --ignore=tests/test_fuzz.py -p no:schemathesis $(PYTEST_ARGS)

# Everything, as CI runs it.
test: lint browser nginx
	$(TEST_ENV) $(BIN)/python -m pytest $(PYTEST_ARGS)

# Benchmark-only packages (torch CPU build, threadpoolctl), never runtime or test deps.
$(VENV)/.bench-installed: $(VENV)/.test bench/requirements.txt
	$(PIP) -r bench/requirements.txt
	touch $@

# The benchmark table (docs/performance.md); BENCH_ARGS=--quick for a shorter run, BENCH_ARGS=--server
# for the server's ratios and the worker classes alone (bench/README.md).
# wrk from Debian is the load generator; the Python one stands in without it.
# OPENBLAS_CORETYPE/L2_SIZE are unset for this command alone (they slow current numpy).
bench: $(VENV)/.bench-installed
	command -v wrk >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq wrk; } \
	  || echo "wrk could not be installed: the Python load generator stands in"
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BIN)/python -m bench.run $(BENCH_ARGS)

# CI's performance guard (bench/guard.py, ~30 s): ratios against a floor measured in the same run;
# fails only on a regression of more than 2x against bench/guard-baseline.json. Figures: artifacts/bench-guard.*
bench-guard: $(VENV)/.bench-installed
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BIN)/python -m bench.guard $(GUARD_ARGS)

# Real gunicorn under concurrent mixed load, with one worker SIGKILLed mid-run
# (docs/reliability.md). E.g. make loadtest LOADTEST_ARGS="--duration 60 --threads 8"
loadtest: $(VENV)/.test
	$(BIN)/python scripts/loadtest --kill-worker $(LOADTEST_ARGS)

# Slow-client and amplification attacks with a probe watching /health
# (docs/reliability.md); ATTACK_ARGS="--url http://127.0.0.1:8080" attacks a
# server running already (loopback only).
attack: $(VENV)/.test
	$(BIN)/python scripts/attack $(ATTACK_ARGS)

# Each worker's steady and peak memory at the largest allowed requests (docs/deploy.md).
measure-memory: $(VENV)/.test
	$(BIN)/python scripts/measure-memory $(MEASURE_ARGS)

clean:
	rm -rf $(VENV) .venv-deploy .pytest_cache .hypothesis *.egg-info
