"""The attention-trace console script, run as a subprocess: the walkthrough
table's numbers against the trace, --json, --url, and the check subcommand."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attention_trace import LocalClient
from attention_trace.cli import main
from conftest import BLAS_ENV, ROOT, Gunicorn

pytestmark = pytest.mark.integration

SCRIPT = Path(sys.executable).with_name("attention-trace")
SENTENCE = "the cat sat on the mat"
CHECKED = ["scores", "scaled_scores", "masked_scores", "weights", "context", "concat", "output"]


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "attention_trace.cli"]
    return subprocess.run(command + list(args), input=stdin, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **BLAS_ENV})


@pytest.fixture(scope="module")
def server(gunicorn_server: Gunicorn) -> Gunicorn:
    """conftest's real gunicorn (2 workers) on a free loopback port."""
    return gunicorn_server


def rounded(x: float, decimals: int) -> float:
    """What the table prints, as a number."""
    return float(f"{x:.{decimals}f}")


def parse_rows(out: str) -> dict[int, dict[str, list[tuple[str, str]]]]:
    """The seed-style layout: {head: {row label: [(key, value text)]}, plus "context": [(i, text)]}."""
    heads: dict[int, dict[str, list[tuple[str, str]]]] = {}
    current = None
    lines = out.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^Head (\d+)", line)
        if m:
            current = heads.setdefault(int(m.group(1)), {})
            continue
        if current is None or "|" not in line:
            continue
        label, cells = (part.strip() for part in line.split("|", 1))
        if label == "Weight V":
            text = cells
            j = i
            while not text.endswith("]"):
                j += 1
                text += lines[j].strip()
            numbers = text.removeprefix("context = [").removesuffix("]").split(",")
            current["context"] = [(str(k), v.strip()) for k, v in enumerate(numbers)]
        else:
            current[label] = [tuple(c.split(" → ")) for c in cells.split(" · ")]  # type: ignore[misc]
    return heads


# --------------------------------------------------------------- the table


ROWS_ARGS = [SENTENCE, "--heads", "4", "--causal"]


@pytest.fixture(scope="module")
def rows_run() -> subprocess.CompletedProcess[str]:
    return cli(*ROWS_ARGS)


def in_process(capsys, *args: str) -> tuple[int, str, str]:
    """main() in this process (fast): exit status, stdout, stderr."""
    try:
        code = main(list(args))
    except SystemExit as e:  # argparse: usage errors and --help
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_seed_style_rows_hold_the_trace_numbers(rows_run):
    run = rows_run
    assert run.returncode == 0, run.stderr
    assert run.stderr == "" and "\x1b[" not in run.stdout  # no colour codes into a pipe
    t = LocalClient().trace(sentence=SENTENCE, num_heads=4, causal=True)
    first = run.stdout.splitlines()[0]
    assert first.startswith(f'"{SENTENCE}" · 6 tokens · d_model 24 · 4 heads · d_k 6 · seed 0 · scores ÷ √6 = 2.449')
    assert 'Query: "cat" (token 1)' in run.stdout  # the default query: the second token
    heads = parse_rows(run.stdout)
    assert list(heads) == [0, 1, 2, 3]
    scores, scaled, weights = t.array("scores"), t.array("scaled_scores"), t.array("weights")
    mask, context = t.stages["masked_scores"].mask, t.array("context")
    q = 1
    for h, rows in heads.items():
        assert list(rows) == ["Score QKᵀ", "Scale ÷√d_k", "Mask (causal)", "Softmax", "context"]
        for label in ("Score QKᵀ", "Scale ÷√d_k", "Mask (causal)", "Softmax"):
            assert [k for k, _ in rows[label]] == t.texts
        for j in range(6):
            assert float(rows["Score QKᵀ"][j][1]) == rounded(scores[h, q, j], 3)
            assert float(rows["Scale ÷√d_k"][j][1]) == rounded(scaled[h, q, j], 3)
            masked_text = rows["Mask (causal)"][j][1].strip()
            if mask[h, q, j]:  # a masked key's weight is the mask's 0, not a probability: "masked", as the viewer says
                assert masked_text == "masked" and rows["Softmax"][j][1].strip() == "masked"
                continue
            assert float(masked_text) == rounded(scaled[h, q, j], 3)
            assert float(rows["Softmax"][j][1].rstrip("%")) == rounded(100 * weights[h, q, j], 1)
        assert [float(v) for _, v in rows["context"]] == [rounded(v, 3) for v in context[h, q]]
    # Each column lines up across the rows of a head.
    block = [line for line in run.stdout.splitlines() if "|" in line and "→" in line][:4]
    assert len({tuple(m.start() for m in re.finditer("→", line)) for line in block}) == 1


def test_table_layout_query_head_and_options():
    run = cli(SENTENCE, "--layout", "table", "--query", "mat", "--no-scale", "--heads", "2", "--head", "1",
              "--seed", "7", "--d-model", "8", "--decimals", "4")
    assert run.returncode == 0, run.stderr
    t = LocalClient().trace(sentence=SENTENCE, num_heads=2, scale=False, seed=7, d_model=8)
    assert 'Query: "mat" (token 5)' in run.stdout and "scores not scaled (÷ 1)" in run.stdout
    assert "Head 1 of 2" in run.stdout and "Head 0 of 2" not in run.stdout  # --head 1: 0-based, as the API and viewer
    rows = [line.split() for line in run.stdout.splitlines() if re.match(r"^\s+\d+\s", line)]
    assert [r[1] for r in rows] == t.texts
    for j, (_, _, score, scaled, softmax) in enumerate(rows):
        assert float(score) == rounded(t.array("scores")[1, 5, j], 4)
        assert float(scaled) == float(score)  # no scaling
        assert float(softmax.rstrip("%")) == rounded(100 * t.array("weights")[1, 5, j], 2)
    context = re.search(r"context = \[([^\]]*)\]", run.stdout, re.S).group(1)
    assert [float(v) for v in context.split(",")] == [rounded(v, 4) for v in t.array("context")[1, 5]]


def test_variant_flags_reach_the_service_and_label_the_table():
    run = cli(SENTENCE, "--layout", "table", "--query", "mat", "--heads", "4", "--d-model", "16", "--causal",
              "--rope", "--kv-heads", "2", "--window", "3", "--decode", "--head", "1")
    assert run.returncode == 0, run.stderr
    t = LocalClient().trace(sentence=SENTENCE, num_heads=4, d_model=16, causal=True, positional_encoding="rope",
                            num_kv_heads=2, window=3, decode=True)
    assert "RoPE (rotate_half, base 10000) · 2 K/V heads [[0, 1], [2, 3]] · window 3" in run.stdout
    rows = [line.split() for line in run.stdout.splitlines() if re.match(r"^\s+\d+\s", line)]
    assert [r[-1] for r in rows[:3]] == ["masked"] * 3  # more than window − 1 = 2 keys back: masked
    assert [float(r[2]) for r in rows] == [rounded(v, 3) for v in t.array("scores")[1, 5]]
    weights = " ".join(f"{100 * w:.1f}%" for w in t.raw["decode"][5]["weights"][1])
    assert f"step 5: the cache holds the keys and values of positions 3…5 (3 of 6); this query's weights over " \
           f"them: {weights}" in run.stdout


def test_cross_attention_table_lists_the_context_as_keys():
    run = cli("the cat sat", "--layout", "table", "--heads", "2", "--d-model", "8", "--context", "le chat était assis")
    assert run.returncode == 0, run.stderr
    rows = [line.split() for line in run.stdout.splitlines() if re.match(r"^\s+\d+\s", line)]
    assert [r[1] for r in rows] == ["le", "chat", "était", "assis"] * 2  # two heads
    assert 'cross-attention to "le chat était assis"' in run.stdout


def test_json_is_the_in_process_trace_exactly():
    run = cli("the cat sat", "--heads", "4", "--causal", "--seed", "3", "--json")
    assert run.returncode == 0, run.stderr
    expected = LocalClient().trace(sentence="the cat sat", num_heads=4, causal=True, seed=3)
    doc = json.loads(run.stdout)
    assert doc == expected.raw
    assert np.array_equal(np.array(doc["stages"]["weights"]["values"]), expected.array("weights"))  # float for float


def test_url_gives_the_same_output_as_in_process(server, rows_run):
    remote = cli(*ROWS_ARGS, "--url", server.url)
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == rows_run.stdout
    remote_json = cli("the cat sat", "--causal", "--json", "--url", server.url)
    assert json.loads(remote_json.stdout) == LocalClient().trace(sentence="the cat sat", causal=True).raw


def test_colour_only_when_asked(capsys, rows_run):
    assert "\x1b[" not in rows_run.stdout  # not a terminal
    code, out, _ = in_process(capsys, "a b", "--color", "always")
    assert code == 0 and "\x1b[1m" in out


def test_module_entry_point_and_the_word_check():
    run = subprocess.run([sys.executable, "-m", "attention_trace.cli", "--", "check"], capture_output=True, text=True)
    assert run.returncode == 0 and 'Query: "check" (token 0)' in run.stdout


@pytest.mark.parametrize(("args", "needle"), [
    ([], "give a command or a sentence to trace"),
    (["trace"], "give exactly one of SENTENCE or --tokens"),
    (["a b", "--tokens", "a", "b"], "give exactly one of SENTENCE or --tokens"),
    (["a b", "--stages", "weights"], "--stages picks the stages of --json or --npz"),
    (["a b", "--explain", "a,b", "--export", "bertviz"], "argument --explain: not allowed with argument --export"),
    (["a b", "--inject-bug", "nope"], "--inject-bug (/inject_bug): Input should be"),
    (["a b", "--heads", "5", "--d-model", "12"], "--heads (/num_heads): d_model 12 is not divisible by num_heads 5"),
    (["a b", "--query", "zebra"], "--query 'zebra' is not a token of the sentence; the tokens are 0 'a', 1 'b'"),
    (["a b", "--query", "7"], "there is no token 7"),
    (["a b", "--head", "2", "--heads", "2"], "--head 2: there are 2 heads (0 to 1)"),
    (["   "], "(/sentence): the sentence is only whitespace"),
])
def test_usage_and_validation_errors_exit_2(capsys, args, needle):
    code, out, err = in_process(capsys, *args)
    assert code == 2 and needle in err, err
    assert out == ""


def test_a_validation_error_prints_the_problem_without_a_traceback():
    run = cli("a b", "--heads", "5", "--d-model", "12")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == ("attention-trace: error: Invalid request (422)\n"
                          "  --heads (/num_heads): d_model 12 is not divisible by num_heads 5 (d_k would be 2.4); "
                          "choose num_heads among the divisors of d_model: 1, 2, 3, 4, 6, 12\n")


def test_unreachable_service_exits_3():
    from conftest import free_port

    run = cli("a b", "--url", f"http://127.0.0.1:{free_port()}", "--retries", "0")
    assert run.returncode == 3 and "could not connect" in run.stderr and "Traceback" not in run.stderr


# --------------------------------------------------------------------- check


def submission_file(tmp_path: Path, name: str, bug: str | None = None, **extra) -> Path:
    body = {"sentence": SENTENCE, "d_model": 24, "num_heads": 4, "causal": True}
    t = LocalClient().trace(body, stages=CHECKED, **({"inject_bug": bug} if bug else {}))
    path = tmp_path / name
    path.write_text(json.dumps({**body, "submission": {s: t.stages[s].values for s in CHECKED}, **extra}))
    return path


def stage_lines(out: str) -> dict[str, str]:
    return {m.group(2): m.group(3) for m in re.finditer(r"^\s+(\d+)\s+(\w+)\s+(pass|FAIL)\s", out, re.M)}


def test_check_passes_with_exit_0(tmp_path):
    run = cli("check", str(submission_file(tmp_path, "ok.json")))
    assert run.returncode == 0, run.stderr
    assert stage_lines(run.stdout) == dict.fromkeys(CHECKED, "pass")
    assert re.search(r"^Result:\s+passed$", run.stdout, re.M)
    assert re.search(r"^First wrong stage:\s+none$", run.stdout, re.M)


def test_check_failure_names_the_stage_and_the_bug_with_exit_1(tmp_path, server):
    path = submission_file(tmp_path, "bug.json", "no_scale")
    run = cli("check", str(path))
    assert run.returncode == 1, run.stderr
    assert stage_lines(run.stdout) == {"scores": "pass", **dict.fromkeys(CHECKED[1:], "FAIL")}
    assert re.search(r"^First wrong stage:\s+scaled_scores \(step 7\)$", run.stdout, re.M)
    assert re.search(r"^Diagnosis:\s+no_scale: the scores were not divided by √d_k at all", run.stdout, re.M)
    assert re.search(r"^Message:\s+Stage 'scaled_scores' \(step 7, QKᵀ/√d_k\) is the first that differs", run.stdout,
                     re.M)
    remote = cli("check", str(path), "--url", server.url)
    assert remote.returncode == 1 and remote.stdout == run.stdout


def test_check_json_tolerances_and_stdin(tmp_path, capsys, monkeypatch):
    path = submission_file(tmp_path, "bug.json", "no_scale")
    code, out, _ = in_process(capsys, "check", str(path), "--json")
    assert code == 1 and json.loads(out)["diagnosis"]["bug"] == "no_scale"
    code, out, _ = in_process(capsys, "check", str(path), "--atol", "1000")  # every value within 1000: passes
    assert code == 0 and "atol 1000" in out
    monkeypatch.setattr("sys.stdin", io.StringIO(submission_file(tmp_path, "ok.json").read_text()))
    code, out, _ = in_process(capsys, "check", "-")
    assert code == 0 and out.startswith("Check of standard input:")


@pytest.mark.parametrize(("content", "needle"), [
    ("{not json", "is not valid JSON: Expecting property name enclosed in double quotes at line 1, column 2"),
    ("[1, 2]", "must hold a JSON object (a /check request body), not a list"),
    ('{"sentence": "a", "num_heads": 5, "submission": {"weights": [[[1.0]]]}}',
     "/num_heads: d_model 24 is not divisible by num_heads 5"),
    ('{"sentence": "a", "submission": {"weight": [1.0]}}', "/submission/weight"),
    (None, "cannot read"),
])
def test_check_errors_exit_2_with_the_problem_on_stderr(tmp_path, capsys, content, needle):
    path = tmp_path / "submission.json"
    if content is not None:
        path.write_text(content)
    code, out, err = in_process(capsys, "check", str(path))
    assert code == 2 and needle in err, err
    assert out == ""


def test_check_usage_errors_exit_2_without_a_traceback(tmp_path, capsys):
    code, _, err = in_process(capsys, "check")
    assert code == 2 and "SUBMISSION.json" in err
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    run = cli("check", str(path))
    assert run.returncode == 2 and run.stdout == "" and "Traceback" not in run.stderr
    assert run.stderr.startswith("attention-trace: error: ") and "is not valid JSON" in run.stderr


# ------------------------------------------------------------------ subcommands and output modes


@pytest.mark.parametrize("args", [
    ["the cat sat", "--export", "bertviz", "--npz", "f.npz"],
    ["the cat sat", "--json", "--html", "f.html"],
    ["trace", "the cat sat", "--npz", "f.npz", "--json"],
    ["the cat sat", "--export", "circuitsvis", "--json"],
])
def test_conflicting_output_modes_are_a_usage_error(capsys, args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = in_process(capsys, *args)
    assert code == 2 and "not allowed with argument" in err and out == ""
    assert not list(tmp_path.iterdir())  # nothing written


def test_the_top_level_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for command in ("trace", "check", "explain", "export", "html"):
        assert f"    {command} " in out, command


def test_the_subcommands_answer_as_the_trace_flags_do(capsys, tmp_path):
    assert in_process(capsys, "explain", "the cat sat", "cat,sat", "--json")[1] == \
        in_process(capsys, "the cat sat", "--explain", "cat,sat", "--json")[1]
    assert in_process(capsys, "export", "the cat sat", "circuitsvis", "--heads", "2", "--d-model", "8")[1] == \
        in_process(capsys, "the cat sat", "--export", "circuitsvis", "--heads", "2", "--d-model", "8")[1]
    a, b = tmp_path / "a.html", tmp_path / "b.html"
    assert in_process(capsys, "html", "the cat sat", str(a))[0] == 0
    assert in_process(capsys, "the cat sat", "--html", str(b))[0] == 0
    assert a.read_bytes() == b.read_bytes()
    assert in_process(capsys, "trace", "the cat sat")[1] == in_process(capsys, "the cat sat")[1]


def test_the_html_command_writes_a_text_scale_and_a_theme_into_the_pages_view(capsys, tmp_path):
    from attention_trace.cli import TEXT_SCALES, THEMES

    plain, lecture = tmp_path / "plain.html", tmp_path / "lecture.html"
    assert in_process(capsys, "html", "the cat sat", str(plain))[0] == 0
    assert in_process(capsys, "html", "the cat sat", str(lecture), "--text", "150", "--theme", "dark")[0] == 0
    view = b'<script type="application/json" id="view-state">{"fragment":"text=150&theme=dark"}</script>\n'
    data = b'<script type="application/json" id="trace-data">'
    assert b'id="view-state">{' not in plain.read_bytes()
    assert lecture.read_bytes() == plain.read_bytes().replace(data, view + data, 1)
    assert in_process(capsys, "html", "the cat sat", str(lecture), "--text", "175")[0] == 2
    # the viewer's own choices (url-state.js): 1, 1.25, 1.5, 2 times the text; its themes
    url_state = (ROOT / "service" / "static" / "url-state.js").read_text(encoding="utf-8")
    scales = re.search(r"const TEXT_SCALES = Object\.freeze\(\[([^\]]*)\]\)", url_state).group(1)
    themes = re.search(r"const THEMES = Object\.freeze\(\[([^\]]*)\]\)", url_state).group(1)
    assert TEXT_SCALES == tuple(round(100 * float(x)) for x in scales.split(","))
    assert THEMES == tuple(t.strip().strip("'") for t in themes.split(","))


def test_tokens_stages_and_an_injected_bug(capsys):
    code, out, _ = in_process(capsys, "trace", "--tokens", "the", "cat", "sat", "--stages", "weights", "--json")
    doc = json.loads(out)
    assert code == 0 and list(doc["stages"]) == ["weights"] and [t["text"] for t in doc["tokens"]] == ["the", "cat", "sat"]
    code, out, _ = in_process(capsys, "the cat sat", "--inject-bug", "no_scale", "--json")
    assert json.loads(out)["injected_bug"]["name"] == "no_scale"
    code, out, _ = in_process(capsys, "the cat sat", "--inject-bug", "no_scale")
    assert code == 0 and "Injected bug no_scale" in out and "deliberately wrong" in out
