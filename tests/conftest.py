"""Shared fixtures: apps from the factory, a client that checks every response
against openapi.yaml, real gunicorn on a free loopback port, and the viewer's
headless Chromium (tests/viewer_browser_support.py) with a console that fails a
test on a browser error or a CSP violation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from flask.testing import FlaskClient
from jsonschema import Draft202012Validator

from service import create_app
from service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # tools/ and bench/ are not installed packages: they import from the checkout
    sys.path.insert(0, str(ROOT))
# real gunicorn on a free loopback port: tests import both from here, as they always have
from tools.server import Gunicorn, Nginx, free_port  # noqa: E402, F401 (after sys.path names the repository; re-exported)
#: the BLAS settings of this process (OPENBLAS_CORETYPE picks a kernel, and kernels differ in the last bits): a
#: subprocess whose answer a test compares byte for byte with this process's must run with the same ones
BLAS_ENV = {k: v for k, v in os.environ.items() if k.startswith(("OPENBLAS_", "OMP_", "MKL_", "GOTO_"))}
#: where tests put logs, screenshots and figures: never the tree (a test run leaves the checkout as it was).
#: ATTENTION_TRACE_ARTIFACTS moves it, e.g. to keep a CI run's logs; the tools the tests start (tools/,
#: bench/) inherit it, so they write there too.
ARTIFACTS = Path(os.environ.get("ATTENTION_TRACE_ARTIFACTS")
                 or Path(tempfile.gettempdir()) / "attention-trace-test-artifacts")
os.environ["ATTENTION_TRACE_ARTIFACTS"] = str(ARTIFACTS)

# Hypothesis keeps a cache of constants in .hypothesis/ under the working directory: outside the tree instead.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(ARTIFACTS / "hypothesis"))
from hypothesis import HealthCheck, settings  # noqa: E402  (after its storage directory is set)


# Fixed seed and bounded examples: CI runs are deterministic and fast.
# No example database: it would be a .hypothesis/ directory in the tree, and derandomized runs need none.
settings.register_profile(
    "ci", derandomize=True, max_examples=60, deadline=None, print_blob=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile("dev", max_examples=300, deadline=None, database=None)
# make check's quick loop: the same, with a quarter of the examples (examples() below); make test runs them all
settings.register_profile("check", parent=settings.get_profile("ci"), max_examples=15)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def examples(n: int) -> int:
    """A property's number of examples: ``n``, or a quarter of it (at least 10) under the ``check`` profile."""
    return max(10, n // 4) if os.environ.get("HYPOTHESIS_PROFILE") == "check" else n


def _tree_files() -> set[str] | None:
    """Untracked and ignored files in the checkout (not .venv), or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all", "-z"],
                             cwd=ROOT, capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    entries = {e[3:] for e in out.split("\0") if e[:2] in ("??", "!!")}
    return {e for e in entries if not e.startswith((".venv/", ".venv-deploy/")) and "__pycache__/" not in e}


#: the markers of the tests that may start another process (gunicorn, the CLI, node, git …): make check leaves
#: them out, so it stays quick. An unmarked test that starts one fails, saying so.
PROCESS_MARKERS = ("integration", "browser", "sandbox", "slow")
_may_start_processes = True  # outside a test (collection, the session's own checks) anything may run
_popen_init = subprocess.Popen.__init__


def _guarded_popen_init(self: subprocess.Popen, *args: object, **kwargs: object) -> None:
    command = args[0] if args else kwargs.get("args")
    program = command[0] if isinstance(command, (list, tuple)) and command else command
    # git reads the checkout's file list in a few ms (the lint rules and the source scans use it): not a cost
    if not _may_start_processes and os.path.basename(str(program)) != "git":
        raise RuntimeError(f"this test starts a process ({str(command)[:80]}): "
                           f"mark it with one of {', '.join(PROCESS_MARKERS)} (pyproject.toml), so that make check "
                           "stays quick")
    _popen_init(self, *args, **kwargs)  # type: ignore[arg-type]  # the arguments, as given


subprocess.Popen.__init__ = _guarded_popen_init  # type: ignore[method-assign]  # the guard above


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the test's fixtures (a module's server is started by its first test's set-up)."""
    global _may_start_processes
    _may_start_processes = any(item.get_closest_marker(m) for m in PROCESS_MARKERS)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    global _may_start_processes
    _may_start_processes = True


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_TREE] = _tree_files()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A test run leaves the tree as it found it: logs and figures go to ARTIFACTS, not the checkout."""
    before = session.config.stash.get(_TREE, None)
    after = _tree_files()
    if before is None or after is None:
        return
    new = sorted(after - before)
    if new:
        session.config.get_terminal_writer().line(
            f"FAILED: the test run wrote {len(new)} files into the tree (write them under conftest.ARTIFACTS or "
            f"tmp_path): {', '.join(new[:10])}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_TREE = pytest.StashKey[set[str] | None]()


@pytest.fixture(scope="session")
def spec() -> dict:
    return yaml.safe_load((ROOT / "openapi.yaml").read_text(encoding="utf-8"))


class SpecChecker:
    """Validates a response (status, media type, body) against the spec."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.checked = 0

    def operation(self, path: str, method: str) -> dict | None:
        """The spec's operation for a concrete path; "/static/{path}" matches any file under it."""
        for template, item in self.spec["paths"].items():
            prefix = template.removesuffix("{path}")
            if template == path or (prefix != template and path.startswith(prefix) and len(path) > len(prefix)):
                return item.get(method.lower())
        return None

    def response(self, response: dict) -> dict:
        """A response object, its $ref to components.responses followed."""
        if "$ref" in response:
            return self.spec["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
        return response

    def check(self, path: str, method: str, status: int, content_type: str, body: bytes) -> None:
        op = self.operation(path, method)
        if op is None:
            # Undeclared paths and methods must still answer problem+json.
            assert status in (404, 405), f"{method} {path} is not in the spec but answered {status}"
            assert content_type.startswith("application/problem+json"), f"{method} {path}: {content_type}"
            op = {"responses": self.spec["paths"]["/trace"]["post"]["responses"]}
        responses = {code: self.response(r) for code, r in op["responses"].items()}
        assert str(status) in responses, f"{method} {path} answered {status}, not documented in openapi.yaml"
        if "content" not in responses[str(status)]:
            assert not body, f"{method} {path} {status} must have no body"
            self.checked += 1
            return
        content = responses[str(status)]["content"]
        mime = content_type.split(";")[0].strip()
        assert mime in content, f"{method} {path} {status} answered {mime!r}, documented {list(content)}"
        schema = content[mime].get("schema")
        if schema and mime.endswith("json"):
            import orjson

            validator = Draft202012Validator({**schema, "components": self.spec["components"]})
            errors = sorted(validator.iter_errors(orjson.loads(body)), key=lambda e: list(e.path))
            assert not errors, f"{method} {path} {status} breaks the spec: {errors[0].message} at {list(errors[0].path)}"
        self.checked += 1


@pytest.fixture(scope="session")
def spec_checker(spec: dict) -> SpecChecker:
    return SpecChecker(spec)


def decoded(resp) -> bytes:
    """A test response's body with any Content-Encoding undone."""
    body = resp.get_data()
    encoding = resp.headers.get("Content-Encoding")
    if encoding == "br":
        import brotli

        return brotli.decompress(body)
    if encoding == "gzip":
        import gzip

        return gzip.decompress(body)
    return body


class ValidatingClient(FlaskClient):
    """Flask test client that checks every response against openapi.yaml."""

    checker: SpecChecker

    def open(self, *args, **kwargs):  # type: ignore[override]
        resp = super().open(*args, **kwargs)
        req = resp.request
        if req.method != "OPTIONS":  # CORS preflights are answered by flask-cors, outside the contract
            self.checker.check(req.path, req.method, resp.status_code, resp.content_type or "", decoded(resp))
        return resp


def make_app(spec_checker: SpecChecker, **overrides):
    app = create_app(Settings(**overrides))
    app.config["TESTING"] = True
    ValidatingClient.checker = spec_checker
    app.test_client_class = ValidatingClient
    return app


@pytest.fixture()
def app(spec_checker: SpecChecker):
    return make_app(spec_checker)


@pytest.fixture()
def client(app) -> FlaskClient:
    return app.test_client()


@pytest.fixture()
def app_factory(spec_checker: SpecChecker):
    """Build apps with other limits: app_factory(max_tokens=4)."""
    return lambda **overrides: make_app(spec_checker, **overrides)


@pytest.fixture(scope="module")
def gunicorn_server() -> Iterator[Gunicorn]:
    server = Gunicorn(workers=2)
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------- the viewer in headless Chromium
# (tests/viewer_browser_support.py; imported inside the fixtures, so that a run without browser tests never
# imports Selenium)


@pytest.fixture(scope="module")
def server(gunicorn_server: Gunicorn) -> Gunicorn:
    """The gunicorn the browser tests' pages load from (one per test file)."""
    return gunicorn_server


@pytest.fixture(scope="module")
def browser_dirs(request: pytest.FixtureRequest) -> Iterator[dict[str, Path]]:
    """The browser's profile and downloads directories, one pair per test file, removed after it."""
    base = Path(tempfile.mkdtemp(prefix=f"{request.module.__name__}-"))
    dirs = {"profile": base / "profile", "downloads": base / "downloads"}
    for d in dirs.values():
        d.mkdir()
    try:
        yield dirs
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def chromium_options():
    """The browser's flags and screen; a test file overrides this fixture to change them."""
    from viewer_browser_support import ChromiumOptions

    return ChromiumOptions()


@pytest.fixture(scope="module")
def driver(request: pytest.FixtureRequest, browser_dirs: dict[str, Path], chromium_options):
    """Headless Chromium for one test file, its chromedriver log named after the file."""
    from viewer_browser_support import WAIT, chromium

    log_name = f"chromedriver-{request.module.__name__.removeprefix('test_')}.log"
    with chromium(browser_dirs, log_name, chromium_options.args) as drv:
        drv.set_script_timeout(WAIT)
        if chromium_options.size:
            width, height = chromium_options.size
            drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        yield drv


@pytest.fixture()
def console(driver, server: Gunicorn):
    """The browser log of one test: an error (but those the test allows) or a CSP violation fails it."""
    from viewer_browser_support import Console

    driver.get_log("browser")  # start from an empty log
    driver.get_log("performance")
    con = Console(driver)
    yield con
    con.check()
