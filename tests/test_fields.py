"""Each request field is declared once (engine/fields.py), and every shell derives it from there.

Two proofs. Every declared field flows: it is in each request schema with its declared type, bounds, default
and description, refused with its declared type beyond its bounds, an option of the command line that sets it,
echoed in an answer's config where its variant is used and read by the client's ``Config``, and carried by the
viewer's address into the request it sends. And CONTRIBUTING.md's recipe for a new field, followed literally in
a copy of the code for a scratch field, makes it flow through all of them while touching only the files the
recipe names.
"""

from __future__ import annotations

import dataclasses
import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from attention_trace.cli import build_parser, trace_body
from attention_trace.client import Config
from conftest import ROOT
from engine import fields
from service.models import ConfigOut
from service.routes.check import CheckRequest
from service.routes.explain import ExplainRequest
from service.routes.export import ExportRequest
from service.routes.trace import TraceRequest
from service.routes.viewer import FIELDS_SCRIPT, fields_script

NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="the viewer's address is checked under Node: no `node` on PATH")

#: the files CONTRIBUTING.md's recipe touches for a setting that needs no rule beyond its bounds and no step
RECIPE_FILES = {"engine/fields.py", "engine/layer.py", "openapi.yaml", "service/static/fields.js"}


def sample(f: fields.Field) -> Any:
    """A valid value of the field on its own that is not its default."""
    if f.kind == "bool":
        return not f.default
    if f.kind == "choice":
        return f.choices[-1]
    if f.kind == "choices":
        return [f.choices[-1]]
    if f.kind == "int":
        return int(f.minimum or 0) + 2
    if f.kind == "float":
        return f.maximum / 2 if f.maximum is not None else (f.above or f.minimum or 0) + 1.5
    if f.kind == "text":
        return "le chat"
    return ["le", "chat"]


def beyond(f: fields.Field) -> Any:
    """A value beyond the field's bounds (or not among its choices)."""
    if f.kind in ("choice", "choices"):
        return "no_such_choice" if f.kind == "choice" else ["no_such_choice"]
    if f.kind == "strings":  # one more than it may hold
        return [f"w{i}" for i in range((f.max_items or 0) + 1)]
    if f.maximum is not None:
        return f.maximum * 2 if f.kind == "float" else int(f.maximum) + 1
    return (f.above if f.above is not None else f.minimum - 1) if f.kind == "float" else int(f.minimum) - 1


def schema_property(model: Any, name: str) -> dict[str, Any]:
    """The field's schema, the non-null branch of a nullable one merged in."""
    prop = dict(model.model_json_schema()["properties"][name])
    for branch in prop.pop("anyOf", []):
        if branch != {"type": "null"}:
            prop |= branch
    return prop


def run_node(script: str, static: Path) -> Any:
    """``script`` under Node with ``U``, url-state.js loaded as the page loads it from ``static``."""
    prelude = (
        f"const {{ load }} = require({json.dumps(str(static.parent.parent / 'tests' / 'js' / 'load.js'))});"
        "const U = load('format.js', 'fields.js', 'url-state.js').urlState;"
    )
    proc = subprocess.run([NODE, "-e", prelude + script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def address_of(f: fields.Field, value: Any) -> str:
    """A viewer's address that sets the field to ``value``, its variant's switch on."""
    parts = [("q", "0")]
    switch = fields.variant(f.variant).switch
    if switch is not None and switch[0] != f.name:
        on = fields.BY_NAME[switch[0]]
        parts.append((on.address, switch[1] if switch[1] is not None else ",".join(sample(on))))
    if f.kind in ("tokens", "strings"):
        parts += [(f.address, t) for t in value]
    else:
        text = ("1" if value else "0") if f.kind == "bool" else ",".join(value) if f.kind == "choices" else str(value)
        parts.append((f.address, text))
    from urllib.parse import urlencode

    return "#" + urlencode(parts)


# ------------------------------------------------------------------ every declared field flows


def test_the_viewers_copy_of_the_declaration_is_generated():
    assert FIELDS_SCRIPT.read_text(encoding="utf-8") == fields_script(), (
        "service/static/fields.js is stale: run .venv/bin/python scripts/gen-openapi"
    )


@pytest.mark.parametrize("f", fields.FIELDS, ids=lambda f: f.name)
def test_every_declared_field_is_in_every_request_schema_as_declared(f):
    for model in (TraceRequest, CheckRequest, ExplainRequest, ExportRequest):
        prop = schema_property(model, f.name)
        assert prop["description"] == f.doc
        assert prop.get("default") == f.default
        for key, bound in (("minimum", f.minimum), ("exclusiveMinimum", f.above), ("maximum", f.maximum)):
            assert prop.get(key) == bound, (model.__name__, key)
        if f.kind == "choice":
            assert prop["enum"] == list(f.choices)
        if f.kind == "choices":
            assert prop["items"]["enum"] == list(f.choices) and prop["maxItems"] == f.max_items


@pytest.mark.parametrize("f", fields.GENERATE_OPTIONS, ids=lambda f: f.name)
def test_each_generation_option_is_trace_requests_as_declared_and_the_generate_commands(client, f):
    """/trace's generation options are declared once (engine/fields.py, GENERATE_OPTIONS): /trace's request has each
    with its description, default and bounds (/explain's and /export's inherit it), /check's has none, a value
    past a bound is refused at its pointer, and the generate command's option sets it."""
    prop = schema_property(TraceRequest, f.name)
    assert prop["description"] == f.doc and prop.get("default") == f.default
    for key, bound in (("minimum", f.minimum), ("exclusiveMinimum", f.above), ("maximum", f.maximum)):
        assert prop.get(key) == bound, key
    assert f.name not in CheckRequest.model_json_schema()["properties"]
    body = {
        "sentence": "the cat sat",
        "block": "gpt2",
        "lm_head": "tied",
        "generate": 1,
        f.name: f.maximum + 1 if f.kind == "int" else f.above,
    }
    errors = client.post("/trace", json=body).get_json()["errors"]
    assert [e["pointer"] for e in errors] == [f"/{f.name}"], errors
    value = 3 if f.kind == "int" else 0.5
    args = build_parser().parse_args(["generate", "the cat", f.flag, str(value)])
    assert getattr(args, f.name) == value and args.flags[f"/{f.name}"] == f.flag


@pytest.mark.parametrize(
    "f", [f for f in fields.FIELDS if f.rule is not None or f.maximum is not None], ids=lambda f: f.name
)
def test_a_value_beyond_its_bounds_is_refused_with_the_declared_type(client, f):
    body = {"sentence": "the cat sat", f.name: beyond(f)}
    resp = client.post("/trace", json=body)
    assert resp.status_code == 422, resp.get_json()
    errors = resp.get_json()["errors"]
    mine = [e for e in errors if e["pointer"].startswith(f"/{f.name}")]
    assert mine, errors
    if f.refusal is not None:
        assert mine[0]["type"] == f.refusal, mine


@pytest.mark.parametrize("f", [f for f in fields.FIELDS if f.flag is not None], ids=lambda f: f.name)
def test_every_declared_option_is_in_the_help_and_sets_its_field(f):
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices["trace"]  # type: ignore[union-attr]
    assert f.flag in sub.format_help()
    value = sample(f)
    if not f.flag.startswith("-"):  # the positional argument
        args = parser.parse_args(["trace", value])
    elif f.switch is not None:
        value = f.switch
        args = parser.parse_args(["trace", "the cat", f.flag])
    else:
        words = [str(v) for v in value] if isinstance(value, list) else [str(value)]
        args = parser.parse_args(["trace", *([] if f.name == "tokens" else ["the cat"]), f.flag, *words])
    body = trace_body(args)
    assert body[f.name] == value and type(body[f.name]) is type(value)


def test_every_echoed_field_is_in_an_answer_read_by_the_clients_config(client):
    """Two traces between them use every variant: each echoed field is in one's config, as ConfigOut publishes
    it, and the client's Config reads it."""
    requests = [
        {
            "sentence": "the cat sat",
            "d_model": 16,
            "num_heads": 4,
            "num_kv_heads": 2,
            "causal": True,
            "window": 2,
            "block": "llama",
            "num_layers": 2,
            "norm_eps": 1e-5,
            "d_ff": 32,
            "norm_weights": "seeded",
            "lm_head": "tied",
            "temperature": 0.5,
        },
        {
            "sentence": "the cat sat",
            "d_model": 32,
            "num_heads": 2,
            "head_weights": ["previous_token", "seeded"],
            "sharpness": 4,
        },
    ]
    echoed: dict[str, Any] = {}
    for body in requests:
        resp = client.post("/trace", json=body)
        assert resp.status_code == 200, resp.get_json()
        cfg = resp.get_json()["config"]
        echoed |= cfg
        config = Config.from_json(cfg)
        for f in fields.FIELDS:
            if f.echoed and f.name in cfg:
                assert getattr(config, f.name) == cfg[f.name]
    config_fields = {f.name for f in dataclasses.fields(Config)}
    for f in fields.FIELDS:
        if f.echoed:
            assert f.name in echoed and f.name in ConfigOut.model_fields and f.name in config_fields, f.name
        else:
            assert f.name not in ConfigOut.model_fields


@needs_node
@pytest.mark.integration  # starts node / a fresh interpreter
def test_every_field_the_address_carries_reaches_the_request_and_comes_back():
    carried = [f for f in fields.FIELDS if f.address is not None]
    cases = [{"name": f.name, "url": f.address, "hash": address_of(f, sample(f)), "value": sample(f)} for f in carried]
    got = run_node(
        f"const cases = {json.dumps(cases)};"
        "console.log(JSON.stringify(cases.map((c) => { const fields = U.fieldsFromHash(c.hash);"
        "  const again = U.fieldsFromHash(U.hashFor(fields, { query: 0, head: 0, step: null }));"
        "  return [U.requestFrom(fields).body[c.name], U.requestFrom(again).body[c.name]]; })));",
        ROOT / "service" / "static",
    )
    for case, (sent, round_trip) in zip(cases, got):
        value = case["value"]
        assert sent == value and round_trip == value, (case, sent, round_trip)
    assert {f.name for f in carried} >= {f.name for f in fields.FIELDS if f.setting}, "every setting is in the address"


# ------------------------------------------------------------------ the recipe, followed literally

#: CONTRIBUTING.md, "Recipe: add a configuration field", step 1: the field's declaration
SCRATCH_FIELD = """    Field("scratch_gain", "float", 1.0, above=0, maximum=8, unit="×", echo=_attr("scratch_gain"),
          doc="A scratch setting the recipe's test adds and removes.", metavar="G", help="a scratch gain"),
"""
#: step 2: TraceConfig's attribute of the same name (a setting that changes no number needs no step)
SCRATCH_ATTRIBUTE = "    scratch_gain: float = 1.0\n"

#: what the copy's service, command line and client say of the scratch field (run in the copy)
PROBE = r"""
import io, json, contextlib
from attention_trace.cli import build_parser, main, trace_body
from attention_trace.client import LocalClient
from service.openapi import render
from service.routes.trace import TraceRequest
from service import create_app

out = {}
out["schema"] = TraceRequest.model_json_schema()["properties"]["scratch_gain"]
out["in_openapi"] = "scratch_gain" in render()
help_text = io.StringIO()
with contextlib.redirect_stdout(help_text):
    try:
        main(["trace", "--help"])
    except SystemExit:
        pass
out["help"] = help_text.getvalue()
out["body"] = trace_body(build_parser().parse_args(["trace", "the cat", "--scratch-gain", "2.5"]))
t = LocalClient().trace(sentence="the cat sat", scratch_gain=2.5)
out["config"] = t.config.scratch_gain
out["echo"] = t.raw["config"]["scratch_gain"]
refused = create_app().test_client().post("/trace", json={"sentence": "the cat", "scratch_gain": 9})
out["refused"] = [refused.status_code, refused.get_json()["errors"]]
print(json.dumps(out))
"""


def _copy_of_the_code(dest: Path) -> Path:
    for part in ("engine", "service", "attention_trace", "viewer"):
        shutil.copytree(ROOT / part, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "scripts").mkdir()
    (dest / "tests" / "js").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "gen-openapi", dest / "scripts" / "gen-openapi")
    shutil.copy(ROOT / "openapi.yaml", dest / "openapi.yaml")
    shutil.copy(ROOT / "tests" / "js" / "load.js", dest / "tests" / "js" / "load.js")
    return dest


def _edit(path: Path, anchor: str, insert: str, *, before: bool) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(anchor) == 1, f"{path}: the recipe's anchor {anchor!r} moved"
    path.write_text(text.replace(anchor, insert + anchor if before else anchor + insert), encoding="utf-8")


def _changed_files(copy: Path) -> set[str]:
    changed = set()
    for path in copy.rglob("*"):
        rel = path.relative_to(copy).as_posix()
        if path.is_file() and "__pycache__" not in rel:
            original = ROOT / rel
            if not original.exists() or not filecmp.cmp(path, original, shallow=False):
                changed.add(rel)
    return changed


@pytest.mark.integration  # starts node / a fresh interpreter
def test_contributings_recipe_for_a_new_field_takes_only_the_files_it_names(tmp_path):
    """CONTRIBUTING.md's recipe, step by step, for a scratch field in a copy of the code: declared in
    engine/fields.py, given to TraceConfig, then scripts/gen-openapi. The field is then in the request schema and
    openapi.yaml, the command line's --help and request, the answer's config and the client's Config, refused
    beyond its bounds, and carried by the viewer's address into its request; and no other file changed."""
    copy = _copy_of_the_code(tmp_path / "copy")
    _edit(copy / "engine" / "fields.py", ")\n\nBY_NAME", SCRATCH_FIELD, before=True)
    _edit(copy / "engine" / "layer.py", "    sharpness: float = C.DEFAULT_SHARPNESS", SCRATCH_ATTRIBUTE, before=True)
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run(
        [sys.executable, str(copy / "scripts" / "gen-openapi")],
        capture_output=True,
        text=True,
        env=env,
        cwd=copy,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert _changed_files(copy) == RECIPE_FILES
    assert len(RECIPE_FILES) <= 6

    probe = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=copy, timeout=120
    )
    assert probe.returncode == 0, probe.stderr
    got = json.loads(probe.stdout)
    assert got["schema"]["default"] == 1.0 and got["schema"]["exclusiveMinimum"] == 0 and got["schema"]["maximum"] == 8
    assert got["in_openapi"] and "scratch_gain" in (copy / "openapi.yaml").read_text(encoding="utf-8")
    assert "--scratch-gain G" in got["help"] and "a scratch gain (default 1)" in got["help"]
    assert got["body"] == {"sentence": "the cat", "scratch_gain": 2.5}
    assert got["config"] == got["echo"] == 2.5
    status, errors = got["refused"]
    assert status == 422 and [e["pointer"] for e in errors] == ["/scratch_gain"]
    if NODE is not None:  # the viewer: the copy's url-state.js with the copy's fields.js
        sent = run_node(
            "const f = U.fieldsFromHash('#scratch_gain=3');"
            "console.log(JSON.stringify([U.requestFrom(f).body.scratch_gain, U.DEFAULT_FIELDS.scratch_gain,"
            " U.hashFor(f, { query: 0, head: 0, step: null })]));",
            copy / "service" / "static",
        )
        assert sent[0] == 3 and sent[1] == "1" and "scratch_gain=3" in sent[2]
