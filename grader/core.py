"""Grading one submission: the platform-neutral core that both platform adapters call.

``grade(submission_dir, course)`` returns a :class:`GradeResult`:

1. each configuration gets its seed (drawn for this submission unless fixed),
   and the reference's trace of it (with the parameters): from the engine, in
   this process, by default (``reference.EngineSource``: no server, no HTTP,
   so no outage can reach a grade); from a service when the course sets a URL;
2. the student's functions run in sandboxed processes (``sandbox.py``) on the
   reference's own inputs, in walkthrough order: first a process for the
   configurations of visible tests, then a fresh one (fresh uid) for the rest,
   whose printed output is never shown; in each, the whole layer's calls run in
   a fresh process of their own, so nothing a stage function was given can
   answer them (``Grader.plan``), as do a block course's ``block`` calls
   (``block.py``: the block's references, checks and diagnosis);
3. each answer is checked against the reference (with the course's metric and
   tolerance, by ``engine.checking``, the code /check runs): pass/fail per stage,
   the known mistake that reproduces it (``engine.diagnose``), or else the hints;
4. a test earns its points when its function is right on every configuration
   it lists. A known mistake is named only when it explains every configuration
   where the function is wrong (``diagnosis.py``); a layer whose functions all
   pass is diagnosed as wired wrong. Hidden tests' messages say pass/fail, the
   named mistake and the hints without their numbers, never a value, an index,
   an input, or any text the student's code chose (an exception's type, message,
   file, line).

When the reference cannot be had (the service is down, answers an error, or
the sandbox itself fails), the result is *not gradable*: no score at all, and
a message saying so. A submission that cannot be run (no file, a syntax
error, an exception while importing) has ``format_errors``.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import re
import secrets
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import block as block_mod
from . import diagnosis
from . import runtime as runtime_mod
from .assignment import ALL_FUNCTIONS, AXES, BLOCK_STAGES, CALL_ORDER, CALLEES, FUNCTIONS, LAYER, STAGES_OF_CONFIG, \
    WHOLE, Reference, call_arguments, parts_of, reference_from_engine, stages_of_answer
from .config import Configuration, Course, Test
from .reference import AnswerRefused, CheckOutcome, EngineSource, ServiceSource, SourceError, configuration_check, \
    logit_scale, source_for, tolerance_of
from .sandbox import Call, Outcome, RunResult, SandboxError, run_base_for, run_calls

MAX_SHOWN_FAILURES = 3  # configurations detailed in one test's message
MAX_PRINTED_SHOWN = 8000  # characters of the student's own output in the summary
MAX_VALUE = 1e300  # what /check accepts; larger values fail locally
#: a process stopped with its address space (VmPeak) at least this share of [limits] memory_mb was at the memory
#: limit (the interpreter and numpy alone take about a tenth of 1024 MiB)
MEMORY_LIMIT_NEAR = 0.9
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")  # what a hidden test's hint may not hold


class Ungradable(Exception):
    """Not the student's fault: the reference or the sandbox failed. No grade may be recorded."""


@dataclass
class TestResult:
    name: str
    function: str
    visibility: str
    points: float
    max_points: float
    passed: bool
    message: str  # what the student sees: details for visible and after_* tests, none for hidden ones
    configurations: list[str]
    redacted: str = ""  # the same without any number, index, input or output (hidden tests' message)


@dataclass
class GradeResult:
    gradable: bool
    tests: list[TestResult] = field(default_factory=list)
    score: float = 0.0
    max_score: float = 0.0
    message: str = ""  # the summary for the student
    printed: str = ""  # what the student's code printed during visible tests (shown to them)
    format_errors: list[str] = field(default_factory=list)  # the submission could not be run at all
    internal_error: str | None = None  # why it is not gradable (staff: details in the log)
    extra: dict[str, Any] = field(default_factory=dict)  # staff: seeds, sandbox notes, timings
    log: list[str] = field(default_factory=list)  # staff: the grader's log


@dataclass
class Verdict:
    """One function on one configuration."""

    passed: bool
    detail: str  # may hold numbers: for visible tests
    redacted: str  # for hidden tests
    bugs: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    kind: str = "wrong"  # ok | wrong | error | timeout | crashed | not_run


@dataclass
class Explained:
    """What explains one test's failures, for visible tests (``shown``) and hidden ones (``hidden``)."""

    shown: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)
    named: list[str] = field(default_factory=list)  # the known mistakes named plainly (staff: the batch table)
    no_pointer: bool = False  # the "compare your step N with …" line would point at the wrong place


# ----------------------------------------------------------------- helpers


def engine_errors() -> type[Exception]:
    import engine

    return engine.EngineError


def make_source(course: Course) -> EngineSource | ServiceSource:
    """Where the references come from: the engine (``local``, the default) or the service at a URL. A block
    course's are always the engine's (config.py refuses a URL there; ATTENTION_TRACE_URL does not apply)."""
    if course.block is not None:
        return EngineSource()
    url = os.environ.get("ATTENTION_TRACE_URL") or course.url
    return source_for(url, course.timeout_seconds, course.retries)


def default_hide(course: Course, extra: tuple[str, ...] = ()) -> list[str]:
    """The grader's paths the student's process must not see: its code (the grading package and the
    service's engine), its environment, the course file, and whatever the platform adds."""
    paths = [Path(__file__).resolve().parent.parent, Path(sys.prefix)]
    try:
        import engine

        paths.append(Path(engine.__file__).resolve().parent.parent)
    except ImportError:  # a client-only install: no engine to hide
        pass
    if course.path is not None:
        paths.append(course.path.parent)
    paths += [Path(p) for p in course.hide + tuple(extra)]
    out: list[str] = []
    for p in paths:
        s = str(p)
        if s not in out and s != "/":
            out.append(s)
    return out


def _usable_hide(hide: list[str], keep: list[Path]) -> list[str]:
    """Hiding a path hides everything under it: never one above the runtime or the run directory."""
    out: list[str] = []
    for h in sorted(hide, key=lambda p: len(Path(p).parts)):
        hp = Path(h)
        if any(k == hp or hp in k.parents for k in keep):
            continue
        if any(Path(o) in hp.parents for o in out):  # already under a hidden path
            continue
        out.append(h)
    return out


def describe(c: Configuration, seed: int) -> str:
    n = len(c.tokens) if c.tokens is not None else None
    toks = f"{n} tokens, " if n is not None else ""
    return (f"'{c.name}' ({toks}d_model {c.d_model}, {c.num_heads} head{'s' if c.num_heads > 1 else ''} of d_k "
            f"{c.d_k}, {'causal' if c.causal else 'not causal'}, seed {seed})")


def _frames(error: dict[str, Any]) -> str:
    return "\n".join(f"  {f['file']}, line {f['line']}, in {f['function']}" + (f": {f['code']}" if f["code"] else "")
                     for f in error.get("frames", []))


def outcome_verdict(out: Outcome, function: str) -> Verdict:
    """A call that gave no answer: what the student is told. The redacted text (hidden tests) holds nothing
    the student's code chose: an exception's type, message, file, function and line, an exit status and a
    signal can each carry a number out of the sandbox, so none of them is repeated there."""
    if out.status == "error":
        e = out.error or {}
        if out.detail:  # the grader's own words: the answer file could not be read
            return Verdict(False, f"{out.detail}: {e.get('message', '')}".rstrip(": "), out.detail, kind="error")
        detail = f"your code raised {e.get('type', 'an error')}: {e.get('message', '')}".rstrip(": ")
        tb = _frames(e)
        return Verdict(False, detail + (f"\n{tb}" if tb else ""), f"your code raised an exception in {function}",
                       kind="error")
    kind = {"timeout": "timeout", "not_run": "not_run"}.get(out.status, "crashed")
    text = out.detail or "not run"
    if kind == "crashed" and out.status == "crashed":
        redacted = f"your code crashed or exited while running {function}"
    elif kind == "not_run" and ("already failed" in text or "imported" in text or "could not be run" in text):
        redacted = f"not run: {function} had already failed, or your file could not be imported"
    else:
        redacted = text
    return Verdict(False, text, redacted, kind=kind)


def failure_words(v: Verdict) -> str:
    """How a function failed, in words that hold nothing it chose and no value: for naming it."""
    if v.kind == "error":
        return "raises an exception"
    if v.kind == "crashed":
        return "crashes or exits"
    if v.kind == "timeout":
        return "does not finish in time"
    if v.kind == "plain":
        if "NaN" in v.redacted or "infinite" in v.redacted:
            return "returns NaN or infinite values"
        if "same number" in v.redacted:
            return "returns the same number everywhere (an unfinished placeholder?)"
        if "shape" in v.redacted:
            return "returns the wrong shape"
        return "returns values that cannot be compared"
    return "gives wrong numbers"


def numpy_words(stage: str, message: str) -> str:
    """/check's message in the words of a numpy student: a masked key is -inf in their array, not JSON's null."""
    if stage != "masked_scores":
        return message
    return message.replace("expected null (masked)", "expected -inf (a masked key)").replace(
        ", got null", ", got -inf (masked)")


def _nonfinite(arr: np.ndarray, ok: np.ndarray) -> tuple[str, list[int], int] | None:
    bad = ~ok
    if not bad.any():
        return None
    idx = [int(i) for i in np.argwhere(bad)[0]]
    v = arr[tuple(idx)]
    return (str(v), idx, int(bad.sum()))


#: what a NaN or an infinity most often means in a stage, said after the plain message
NONFINITE_WHY = {
    "weights": "in a softmax this usually means exp() overflowed (it does for scores above about 709): subtract "
               "each row's maximum before exp(), which changes no weight",
    "weights -inf": "a weight of -inf is log(0): a log-softmax gives it to a masked key, but a weight is a "
                    "probability (exp, not log)",
}
NONFINITE_WHY.update(dict.fromkeys(("context", "concat", "output"), "if it starts in the softmax: exp() overflows "
                                   "for scores above about 709, so subtract each row's maximum before exp()"))


def prepare(stage: str, arr: np.ndarray, ref: Reference) -> tuple[Any, str | None, str | None]:
    """A student's stage as the check takes it, (float64 values, null: where it is masked), or why it
    fails here already: (values, problem, redacted problem)."""
    expected = ref.expected_shape(stage)
    axes = AXES[stage]
    if arr.shape != expected and (arr.ndim > 3 or arr.size > 4 * math.prod(expected) + 4096 or arr.size == 0):
        return None, (f"the shape is wrong: expected {list(expected)} ({axes}), got {list(arr.shape)}"), \
            f"the shape is wrong: it should be [{axes}]"
    null = np.zeros(arr.shape, dtype=bool)
    if stage == "masked_scores":
        null = np.isneginf(arr)  # -inf means masked (so do values ≤ -1e9 where the reference masks)
    finite = np.isfinite(arr) & (np.abs(np.where(np.isfinite(arr), arr, 0.0)) <= MAX_VALUE)
    bad = _nonfinite(arr, finite | null)
    if bad is not None:
        value, idx, count = bad
        more = f" (and {count - 1} more)" if count > 1 else ""
        only = " (only masked entries may be -inf)" if stage == "masked_scores" else ""
        what = "a value too large to compare" if value not in ("nan", "inf", "-inf") else value
        key = f"{stage} -inf" if value == "-inf" and f"{stage} -inf" in NONFINITE_WHY else stage
        why = f"; {NONFINITE_WHY[key]}" if key in NONFINITE_WHY and value in ("nan", "inf", "-inf") else ""
        return None, (f"it holds {what} at {idx} ({axes}){more}: every value must be a finite number{only}{why}"), \
            f"it holds {'NaN or infinite values' if value in ('nan', 'inf', '-inf') else 'values too large'}{only}{why}"
    values = np.where(null, 0.0, arr.astype(np.float64))  # masked entries: 0 in the values, carried by null
    if arr.shape == expected:
        stub = diagnosis.placeholder(values, null, ref.arrays[stage])
        if stub is not None:
            return None, stub[0], stub[1]
    return (values, null), None, None


# ----------------------------------------------------------------- the grader


class Grader:
    def __init__(self, course: Course, submission: Path, *, source: EngineSource | ServiceSource | None = None,
                 client: Any = None, seeds: dict[str, int] | None = None, hide: tuple[str, ...] = (),
                 run_base: Path | None = None, log: Callable[[str], None] | None = None,
                 runtime: runtime_mod.Runtime | None = None, student: str | None = None) -> None:
        """``source``: where references come from (default: the course's, make_source); ``client``: an
        attention-trace client to ask instead (a ServiceSource over it)."""
        self.course, self.submission = course, submission
        if source is None and client is not None:
            source = ServiceSource(client)
        self._source, self._own_source = source, source is None
        self.fixed_seeds = dict(seeds or {})
        self.extra_hide = hide
        self.run_base = run_base
        self.runtime = runtime
        self.student = student  # who submitted (the platform's id): with [seeds] derive = "student", the seeds' key
        self.result = GradeResult(gradable=True, max_score=course.max_score)
        self._log_fn = log

    def log(self, line: str) -> None:
        self.result.log.append(line)
        if self._log_fn:
            self._log_fn(line)

    # ---------------------------------------------------------- steps

    def seeds(self) -> dict[str, int]:
        """Each configuration's seed: the course file's fixed one; else one given for a regrade (``seeds=``,
        ATTENTION_GRADER_SEEDS); else, with ``[seeds] derive = "student"``, derived from the student and the
        course's secret (the same on every regrade: :func:`derived_seed`); else drawn afresh."""
        env = os.environ.get("ATTENTION_GRADER_SEEDS")  # "name=seed,name=seed": a regrade with the same inputs
        fixed = dict(self.fixed_seeds)
        if env:
            for item in env.split(","):
                name, _, value = item.partition("=")
                fixed.setdefault(name.strip(), int(value))
        secret = None
        if self.course.seeds == "student" and any(c.seed is None and name not in fixed
                                                  for name, c in self.course.configurations.items()):
            if not self.student:
                raise Ungradable('the course derives seeds from the student ([seeds] derive = "student"), but no '
                                 "student id was given")
            secret = course_secret(self.course)
        out = {}
        for name, c in self.course.configurations.items():
            if c.seed is not None:
                out[name] = c.seed
            elif name in fixed:
                out[name] = fixed[name]
            elif secret is not None:
                out[name] = derived_seed(secret, self.student or "", name)
            else:
                out[name] = secrets.randbelow(2**32)
        return out

    def references(self, source: EngineSource | ServiceSource, seeds: dict[str, int],
                   used: list[str]) -> dict[str, Reference]:
        refs = {}
        for name in used:
            c = self.course.configurations[name]
            if c.block is not None:  # one Transformer block: always the engine's (block.py)
                try:
                    refs[name] = block_mod.reference(c, seeds[name])
                except engine_errors() as e:
                    raise SourceError(f"the engine refused configuration {name!r}: {e}") from None
            elif c.weight_scale != 1.0 and isinstance(source, EngineSource):
                # the engine's trace with the scaled weights (a service gets them in the request: Configuration.request)
                try:
                    refs[name] = reference_from_engine(diagnosis.engine_trace(c, seeds[name]))
                except engine_errors() as e:
                    raise SourceError(f"the engine refused configuration {name!r}: {e}") from None
            else:
                refs[name] = source.reference(c, seeds[name])
            if refs[name].n < 1:
                raise Ungradable(f"configuration {name!r} has no tokens")
        return refs

    def plan(self, refs: dict[str, Reference]) -> tuple[list[tuple[str, list[Call]]], dict[tuple[str, str], set[str]]]:
        """The sandboxed processes to run, in order, each with its calls in ``CALL_ORDER`` (walkthrough order):
        ``visible`` (the configurations of visible tests: what they print is shown) then ``protected`` (a fresh
        process, fresh uid, for the rest); in each, the whole layer's calls get a process of their own
        (``visible-layer``, ``protected-layer``) whenever the stage functions are called too. Every stage
        function's input after x determines the layer's output (output() is given concat and W_O, and
        concat·W_Oᵀ *is* the layer's answer); in a process of its own, the layer cannot be answered from
        anything a function was given (assignment.py). A block course's ``block`` gets a process of its own
        too (``visible-block``): the second norm's input in post-norm is the block's output before its norm.
        There the stage functions' calls are made in the order the block computes their stages
        (``Reference.order``): in pre-norm the norm of x comes before the attention that reads it."""
        course = self.course
        pairs: dict[tuple[str, str], set[str]] = {}  # (function, configuration) -> visibilities of its tests
        for t in course.tests:
            for c in t.configurations:
                pairs.setdefault((t.function, c), set()).add(t.visibility)
        shown_configs = {c for (f, c), vis in pairs.items() if "visible" in vis}
        # (visible or protected, the whole function whose process it is, or None: the stage functions') -> calls
        calls: dict[tuple[str, str | None], list[Call]] = {}
        order = list(course.configurations)
        for fname in CALL_ORDER:
            fn = ALL_FUNCTIONS[fname]
            layer = fname == LAYER
            for cname in order:
                if (fname, cname) not in pairs:
                    continue
                ref = refs[cname]
                for part in parts_of(fn, ref):
                    arrays, args, kwargs = call_arguments(part, ref)
                    stages = [s for s in STAGES_OF_CONFIG if s != "masked_scores" or ref.causal]
                    call = Call((fname, cname, part.stage), fname, arrays, args, kwargs,
                                result="stages" if layer else "array", stages=stages if layer else [],
                                where=f"on configuration '{cname}'")
                    kind = "visible" if cname in shown_configs else "protected"
                    calls.setdefault((kind, fname if fname in WHOLE else None), []).append(call)
        runs: list[tuple[str, list[Call]]] = []
        for kind in ("visible", "protected"):
            stage_calls = calls.get((kind, None), [])
            if course.block is not None:  # in the block's order, within each configuration (a stable sort)
                stage_calls.sort(key=lambda c: refs[c.key[1]].order.get(c.key[2], -1))
            groups = [(kind, stage_calls)] if stage_calls else []
            groups += [(f"{kind}-{name}", calls[(kind, fname)]) for fname, name in WHOLE.items()
                       if calls.get((kind, fname))]
            if len(groups) == 1:
                runs.append((kind, groups[0][1]))
            else:
                runs += groups
        return runs, pairs

    def run(self, calls: list[Call], hide: list[str], runtime: runtime_mod.Runtime, deadline: float,
            broken: dict[str, str]) -> RunResult:
        return run_calls(calls, runtime=runtime, submission=self.submission, filename=self.course.file,
                         limits=self.course.limits, hide=hide, deadline=deadline, run_base=self.run_base,
                         broken=broken)

    def check_of(self, cname: str) -> dict[str, Any]:
        """The course's ``[check]`` on one configuration: raised where its logits are so large that a float32
        softmax's rounding alone would use it up (``reference.configuration_check``)."""
        return configuration_check(self.course.check, logit_scale(self._refs[cname]))

    def check(self, source: EngineSource | ServiceSource, seeds: dict[str, int], refs: dict[str, Reference],
              fname: str, cname: str, answers: dict[str, np.ndarray]) -> dict[str, Verdict]:
        """Check one function's answers on one configuration: a verdict per graded stage."""
        ref = refs[cname]
        c = self.course.configurations[cname]
        submission, local = {}, {}
        for stage, arr in answers.items():
            if (stage not in STAGES_OF_CONFIG and stage not in BLOCK_STAGES) or (stage == "masked_scores"
                                                                                 and not ref.causal):
                continue
            values, problem, redacted = prepare(stage, arr, ref)
            if problem is not None:
                local[stage] = Verdict(False, f"{stage}: {problem}", f"{stage}: {redacted}", kind="plain")
            else:
                submission[stage] = values
        self._answers[(fname, cname)] = submission
        verdicts: dict[str, Verdict] = dict(local)
        block_part = {s: v for s, v in submission.items() if s in BLOCK_STAGES}
        attention = {s: v for s, v in submission.items() if s not in BLOCK_STAGES}
        if block_part:  # the block's stages: checked and diagnosed here (block.py)
            self.read_outcome(block_mod.check(ref, fname, block_part, tolerance_of(self.check_of(cname))), fname, cname,
                              verdicts)
        result: CheckOutcome | None = None
        if attention:
            try:
                result = source.check(ref, c, seeds[cname], attention, self.check_of(cname))
            except AnswerRefused as e:
                for stage in attention:
                    verdicts[stage] = Verdict(False, f"{stage}: the grading service refused these numbers: {e}",
                                              f"{stage}: the grading service refused these numbers")
        if result is not None:
            self.read_outcome(result, fname, cname, verdicts)
        return verdicts

    def read_outcome(self, result: CheckOutcome, fname: str, cname: str, verdicts: dict[str, Verdict]) -> None:
        """A check's verdicts, matches and hints into ``verdicts``."""
        for stage, sc in result.stages.items():
            if sc.passed:
                verdicts[stage] = Verdict(True, "", "", kind="ok")
            else:
                verdicts[stage] = Verdict(False, f"{stage}: {numpy_words(stage, sc.message)}", f"{stage}: wrong",
                                          kind="wrong", bugs=list(result.matches), hints=list(result.hints))
        if not result.passed and not result.matches:
            for v in verdicts.values():
                if not v.passed and not v.hints:
                    v.hints = list(result.hints)
            self._no_match_message.setdefault((fname, cname), result.diagnosis_message)

    # ---------------------------------------------------------- the whole thing

    def grade(self) -> GradeResult:
        res = self.result
        t0 = time.monotonic()
        source = None
        self._no_match_message: dict[tuple[str, str], str] = {}
        self._probes: dict[tuple[str, str], dict[str, Verdict]] = {}
        self._answers: dict[tuple[str, str], dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        try:
            source = self._source or make_source(self.course)
            if self.course.block is not None and not isinstance(source, EngineSource):
                # a service traces no block around a given x: a block course's checks are the engine's (block.py)
                self.log("grader: a block course grades with the engine; the service given is not used")
                if self._own_source:
                    source.close()
                source, self._own_source = EngineSource(), True
            seeds = self.seeds()
            res.extra["seeds"] = seeds
            if self.student is not None:
                res.extra["student"] = self.student
            res.extra["seeds_from"] = "derived from the student and the course secret" if (
                self.course.seeds == "student") else "drawn for this submission (unless fixed)"
            used = [n for n in self.course.configurations if any(n in t.configurations for t in self.course.tests)]
            refs = self.references(source, seeds, used)
            self._refs = refs
            bugs = source.bug_summaries  # the known mistakes' summaries, to name them
            if self.course.block is not None:
                bugs = {**bugs, **block_mod.summaries()}
            res.extra["engine_version"] = source.engine_version
            self.log(f"grader: core {Path(__file__).resolve().parent}, course {self.course.path}")
            self.log(f"grader: {len(used)} configurations, seeds {seeds}")
            runtime = self.runtime or runtime_mod.build(Path(self.course.runtime) if self.course.runtime else None)
            hide = default_hide(self.course, self.extra_hide)
            keep = [runtime.root, run_base_for(self.run_base)]
            hide = _usable_hide(hide, keep)
            planned, pairs = self.plan(refs)
            deadline = time.monotonic() + self.course.limits.total_seconds
            runs: dict[str, RunResult] = {}
            broken: dict[str, str] = {}  # a function that hung or crashed is not called again, hidden or not
            for kind, calls in planned:
                first = next(iter(runs.values()), None)
                if first is not None and first.start.status != "ready":  # the file cannot be imported: once is enough
                    runs[kind] = RunResult(first.start, {c.key: Outcome("not_run") for c in calls}, "", 0, {}, 0, 0, 0.0)
                else:
                    runs[kind] = self.run(calls, hide, runtime, deadline, broken)
            self.record_runs(runs)
            for r in runs.values():  # calls never made because the import failed: say why
                why = start_detail(r.start, self.course.file)
                for o in r.outcomes.values():
                    if o.status == "not_run" and not o.detail:
                        o.detail = f"not run: {why}" if why else "not run"
            start = next(iter(runs.values())).start
            if start.status in ("missing", "syntax", "import"):
                return self.format_error(start)
            outcomes: dict[Any, Outcome] = {}
            for r in runs.values():
                outcomes.update(r.outcomes)
            self.integrity(runs, outcomes)
            verdicts = self.verdicts(source, seeds, refs, pairs, outcomes, start)
            self._probes = self.probe(source, seeds, refs, verdicts, hide, runtime, deadline, broken)
            self.score(verdicts, seeds, bugs, runs, refs)
        except (Ungradable, SourceError) as e:
            return self.ungradable(str(e))
        except SandboxError as e:
            return self.ungradable(f"the sandbox failed: {e}")
        except Exception as e:  # noqa: BLE001 - a bug here, or in the reference: never the student's fault
            self.log("grader: internal error:\n" + traceback.format_exc())
            return self.ungradable(f"the autograder failed ({type(e).__name__}: {e})")
        finally:
            res.extra["seconds"] = round(time.monotonic() - t0, 3)
            if source is not None and self._own_source:
                source.close()
        return res

    #: a whole function's failures that its own functions may explain: wrong numbers, an exception, a crash,
    #: NaN or a placeholder (a timeout is not probed: a hang would only cost the time again)
    PROBED_KINDS = ("wrong", "plain", "error", "crashed")

    def probe(self, source: EngineSource | ServiceSource, seeds: dict[str, int], refs: dict[str, Reference],
              verdicts: dict[tuple[str, str], dict[str, Verdict]], hide: list[str], runtime: runtime_mod.Runtime,
              deadline: float, broken: dict[str, str]) -> dict[tuple[str, str], dict[str, Verdict]]:
        """Where a whole function (multi_head_attention, block) fails on a configuration that the tests of the
        functions it calls do not reach (a hidden one), those functions are run there too, under the same
        sandbox (a fresh process, a fresh uid; the whole layer in a process of its own, as in grading), and
        checked: (function, configuration) -> its verdict per stage. Never graded: only what the message says
        (a function that goes wrong only there is named, not the wiring)."""
        course = self.course
        graded_fns = {t.function for t in course.tests}
        reached = {(t.function, c) for t in course.tests for c in t.configurations}
        wanted: dict[str, list[str]] = {}  # configuration -> the functions to run there
        for (fname, cname), v in verdicts.items():
            if fname not in WHOLE or not any(not x.passed and x.kind in self.PROBED_KINDS for x in v.values()):
                continue
            callees = [f for f in self.callees_of(fname) if f in graded_fns and (f, cname) not in reached]
            for f in callees:
                if f not in wanted.setdefault(cname, []) and f not in broken:
                    wanted[cname].append(f)
        if not wanted:
            return {}
        calls: dict[bool, list[Call]] = {}  # whether the call is the whole layer's (a process of its own)
        for fname in CALL_ORDER:
            for cname, fns in wanted.items():
                if fname not in fns:
                    continue
                ref, layer = refs[cname], fname == LAYER
                if ALL_FUNCTIONS[fname].causal_only and not ref.causal:
                    continue
                stages = [s for s in STAGES_OF_CONFIG if s != "masked_scores" or ref.causal]
                for part in parts_of(ALL_FUNCTIONS[fname], ref):
                    arrays, args, kwargs = call_arguments(part, ref)
                    calls.setdefault(layer, []).append(Call((fname, cname, part.stage), fname, arrays, args, kwargs,
                                                            result="stages" if layer else "array",
                                                            stages=stages if layer else [],
                                                            where=f"on configuration '{cname}'"))
        if course.block is not None and False in calls:
            calls[False].sort(key=lambda c: refs[c.key[1]].order.get(c.key[2], -1))
        out: dict[tuple[str, str], dict[str, Verdict]] = {}
        for layer, group in sorted(calls.items()):
            r = self.run(group, hide, runtime, deadline, broken)
            self.log(f"grader: probe run ({'the layer' if layer else 'stage functions'} where a whole function "
                     f"failed unreached): {r.processes} process(es), {r.seconds:.2f} s")
            self.result.extra.setdefault("probes", []).append(sorted({f"{c.function} on '{c.key[1]}'" for c in group}))
            log = self.result.extra.setdefault("integrity", {})  # what the probe's processes tried: staff only too
            for kind, entry in r.audit.items():
                into = log.setdefault(kind, {"count": 0, "examples": []})
                into["count"] += entry["count"]
                into["examples"] += [f"probe: {e}" for e in entry["examples"]][: max(0, 10 - len(into["examples"]))]
            by_pair: dict[tuple[str, str], dict[str, np.ndarray]] = {}
            failed: dict[tuple[str, str], dict[str, Verdict]] = {}
            for c in group:
                fname, cname, stage = c.key
                o = r.outcomes.get(c.key) or Outcome("not_run", detail="not run")
                if o.status == "ok" and o.arrays is not None:
                    part = next(p for p in ALL_FUNCTIONS[fname].parts if p.stage == stage)
                    by_pair.setdefault((fname, cname), {}).update(stages_of_answer(o.arrays, part))
                else:
                    failed.setdefault((fname, cname), {})[stage] = outcome_verdict(o, fname)
            for pair in set(by_pair) | set(failed):
                v = self.check(source, seeds, refs, pair[0], pair[1], by_pair[pair]) if pair in by_pair else {}
                v.update(failed.get(pair, {}))
                graded_stages = self.graded_stages_of(pair[0])
                out[pair] = {s: x for s, x in v.items() if s in graded_stages}
        return out

    def callees_of(self, fname: str) -> list[str]:
        """The functions a whole function runs, its layer's included (block runs multi_head_attention)."""
        out: list[str] = []
        for f in CALLEES.get(fname, ()):
            out += [g for g in self.callees_of(f) if g not in out] if f in WHOLE else []
            if f not in out:
                out.append(f)
        return out

    @staticmethod
    def graded_stages_of(fname: str) -> list[str]:
        return list(ALL_FUNCTIONS[fname].stages) if fname != LAYER else ["output"]

    def record_runs(self, runs: dict[str, RunResult]) -> None:
        res = self.result
        res.extra["sandbox"] = {k: {"notes": r.notes, "processes": r.processes, "seconds": round(r.seconds, 3),
                                    "output_bytes": r.output_total, "leftover_processes": r.leftover_processes}
                                for k, r in runs.items()}
        for k, r in runs.items():
            self.log(f"grader: {k} run: {r.processes} process(es), {r.seconds:.2f} s, printed {r.output_total} "
                     f"bytes, {r.leftover_processes} process(es) left after the sweep; sandbox: {r.notes}")
        shown = [r for k, r in runs.items() if k.startswith("visible")]
        if any(r.output.strip() for r in shown):
            text = "".join(r.output for r in shown)
            cut = text[:MAX_PRINTED_SHOWN]
            more = sum(r.output_total for r in shown) - len(cut.encode())
            res.printed = cut + (f"\n[... {more} more bytes not shown]" if more > 0 else "")
        hidden_bytes = sum(r.output_total for k, r in runs.items() if k.startswith("protected"))
        if hidden_bytes:
            res.extra["protected_output_bytes"] = hidden_bytes

    def integrity(self, runs: dict[str, RunResult], outcomes: dict[Any, Outcome]) -> None:
        """The academic-integrity log, for the staff only (``extra["integrity"]`` and the grader's log, never a
        message): what the student's code tried that the sandbox refuses or a solution has no use for (the
        harness's audit hook: network, files outside its tree, processes and signals, native code,
        introspection), and which limits stopped it (time, CPU, memory, output, the answer file)."""
        log: dict[str, dict[str, Any]] = {}
        for k, r in runs.items():
            for kind, entry in r.audit.items():
                into = log.setdefault(kind, {"count": 0, "examples": []})
                into["count"] += entry["count"]
                into["examples"] += [f"{k}: {e}" for e in entry["examples"]][: max(0, 10 - len(into["examples"]))]
        stops, starts = [], set()
        for k, r in runs.items():  # a run never started (the file failed to import before) shares the first's start
            if r.start.status in ("timeout", "crashed", "output", "protocol") and id(r.start) not in starts:
                starts.add(id(r.start))
                stops.append((k, r.start))
        for key, o in outcomes.items():
            if o.status in ("timeout", "crashed", "output", "protocol") or (o.status == "error" and o.detail):
                where = f"{key[0]} on '{key[1]}'" if isinstance(key, tuple) and len(key) > 1 else str(key)
                stops.append((where, o))
        memory = []  # the memory limit: an allocation refused (MemoryError), or stopped with its address space there
        limit_mb = self.course.limits.memory_mb
        for key, o in outcomes.items():
            where = f"{key[0]} on '{key[1]}'" if isinstance(key, tuple) and len(key) > 1 else str(key)
            if o.status == "error" and (o.error or {}).get("type") == "MemoryError":
                memory.append(f"{where}: an allocation went past the memory limit ({limit_mb} MiB of address space) "
                              "and raised MemoryError")
            elif o.memory_peak_mb is not None and o.memory_peak_mb >= MEMORY_LIMIT_NEAR * limit_mb:
                memory.append(f"{where}: {o.status} with its address space at the memory limit "
                              f"({o.memory_peak_mb:.0f} of {limit_mb} MiB): stopped at the memory limit, not only "
                              "by the clock")
        if memory:
            log["memory"] = {"count": len(memory), "examples": memory[:10]}
        if stops:
            log["limits"] = {"count": len(stops), "examples": [f"{k}: {o.status}: {o.detail}"[:300]
                                                               for k, o in stops[:10]]}
        self.result.extra["integrity"] = log
        if log:
            self.log("grader: integrity log: " + "; ".join(
                f"{kind} {e['count']} ({' | '.join(e['examples'][:3])})" for kind, e in log.items()))
        else:
            self.log("grader: integrity log: nothing refused, no limit reached")

    def verdicts(self, source: EngineSource | ServiceSource, seeds: dict[str, int], refs: dict[str, Reference],
                 pairs: dict[tuple[str, str], set[str]], outcomes: dict[Any, Outcome],
                 start: Outcome) -> dict[tuple[str, str], dict[str, Verdict]]:
        """Per (function, configuration): a verdict per stage it is graded as."""
        out: dict[tuple[str, str], dict[str, Verdict]] = {}
        for (fname, cname) in pairs:
            fn = ALL_FUNCTIONS[fname]
            ref = refs[cname]
            answers: dict[str, np.ndarray] = {}
            failed: dict[str, Verdict] = {}
            for part in parts_of(fn, ref):
                o = outcomes.get((fname, cname, part.stage)) or Outcome("not_run", detail="not run")
                if o.status == "ok" and o.arrays is not None:
                    answers.update(stages_of_answer(o.arrays, part))
                else:
                    failed[part.stage] = outcome_verdict(o, fname)
            v = self.check(source, seeds, refs, fname, cname, answers) if answers else {}
            v.update(failed)
            if fname == "multi_head_attention":
                for s in STAGES_OF_CONFIG:
                    if s not in v and (s != "masked_scores" or ref.causal):
                        v.setdefault(s, Verdict(False, f"{s}: multi_head_attention did not return '{s}'",
                                                f"{s}: not returned", kind="wrong"))
            out[(fname, cname)] = v
        return out

    def score(self, verdicts: dict[tuple[str, str], dict[str, Verdict]], seeds: dict[str, int],
              bugs: dict[str, str], runs: dict[str, RunResult], refs: dict[str, Reference]) -> None:
        res = self.result
        course = self.course
        self._verdicts, self._refs, self._seeds = verdicts, refs, seeds
        failing: dict[str, list[tuple[str, list[Verdict]]]] = {}
        for t in course.tests:
            stages = self.graded_stages(t)
            failures = []
            for cname in t.configurations:
                v = verdicts[(t.function, cname)]
                bad = [v.get(s) or Verdict(False, f"{s}: not graded", f"{s}: not graded", kind="not_run")
                       for s in stages if s in refs[cname].arrays]  # a norm the block has not: not graded
                bad = [x for x in bad if not x.passed]
                if bad:
                    failures.append((cname, bad))
            failing[t.name] = failures
        # Which functions fail their own tests: with every one right, a failing layer is wired wrong.
        stage_tests = [t for t in course.tests if t.function in FUNCTIONS and t.function != "multi_head_attention"]
        self._failed_functions = list(dict.fromkeys(t.function for t in stage_tests if failing[t.name]))
        self._failed_any = list(dict.fromkeys(t.function for t in course.tests if failing[t.name]))
        self._wiring = course.form == "functions" and bool(stage_tests) and not self._failed_functions
        for t in course.tests:
            failures = failing[t.name]
            passed = not failures
            explained = self.explain(t, failures, bugs)
            redacted = self.test_message(t, failures, seeds, explained, redact=True)
            message = redacted if t.hidden else self.test_message(t, failures, seeds, explained, redact=False)
            res.tests.append(TestResult(t.name, t.function, t.visibility, t.points if passed else 0.0, t.points, passed,
                                        message, list(t.configurations), redacted))
            if explained.named:
                res.extra.setdefault("named", {})[t.name] = explained.named
        res.score = sum(x.points for x in res.tests)
        res.message = self.summary(runs, seeds)
        self.log(f"grader: score {res.score:g}/{res.max_score:g}; failed tests: "
                 f"{[x.name for x in res.tests if not x.passed]}")

    @staticmethod
    def graded_stages(t: Test) -> list[str]:
        if t.stage:
            return [t.stage]
        return list(ALL_FUNCTIONS[t.function].stages) if t.function != "multi_head_attention" else ["output"]

    # ---------------------------------------------------------- what explains a failure

    def explain(self, t: Test, failures: list[tuple[str, list[Verdict]]], bugs: dict[str, str]) -> Explained:
        """The lines after the per-configuration details: the known mistakes that explain the failures
        (diagnosis.naming), a constant factor, the wiring of the layer, hints. Each line in two forms, for
        visible tests and for hidden ones (no number)."""
        out = Explained()
        wrong = [c for c, bad in failures if any(v.kind == "wrong" for v in bad)]
        layer = t.function == "multi_head_attention"
        matched: dict[str, list[str]] = {}
        # where a function it runs goes wrong on a configuration its own tests do not reach: that function, not
        # the wiring (probe)
        unreached = {c: off for c, _ in failures if (off := self.unreached_failures(t, c))}
        if unreached:
            extra = self.unreached_lines(t, unreached)
            out.shown += extra
            out.hidden += extra
            out.no_pointer = True
        wired = [c for c in wrong if c not in unreached]  # wrong numbers, every function it runs right there
        if layer and self._wiring and wired:
            out.shown.append("Every stage function passes, so the wiring in multi_head_attention is wrong: what it "
                             "passes to each function, or which one it calls (or skips), or in what order.")
            out.hidden.append(out.shown[-1])
        for c, bad in failures:
            if c in wrong:
                if layer and self._wiring and c in wired:
                    matched[c] = self.wiring(t, c)
                    continue
                found: list[str] = []
                for v in bad:
                    found += [b for b in v.bugs if b not in found]
                matched[c] = found
        if t.function == "block" and failures:
            extra = self.block_lines(out, failures, unreached)
            out.shown += extra
            out.hidden += extra
        unknown = {c: (block_mod.cannot_show if self.course.block is not None else diagnosis.cannot_show)(
            self.course.configurations[c], self._refs[c].n) for c in wrong}
        lines, plain = diagnosis.naming(wrong, matched, bugs, unknown)
        out.named = sorted({b for c in wrong for b in matched.get(c, [])
                            if all(b in matched[w] or b in unknown[w] for w in wrong)})
        out.shown += lines
        out.hidden += lines
        if layer and self._wiring and wired and any(block_mod.about_position(name) for name in out.named):
            note = ("(multi_head_attention is given x with the positional encoding already added: the layer itself "
                    "adds no encoding.)")
            out.shown.append(note)
            out.hidden.append(note)
        if layer and self._wiring and wired and not plain:
            line = ("None of the known wiring mistakes reproduces it. Return the stages as a dict (ASSIGNMENT.md) "
                    "and the grader points at the first one that goes wrong.")
            out.shown.append(line)
            out.hidden.append(line)
        if layer and not self._wiring and self._failed_functions and failures and self.course.form == "functions":
            names = ", ".join(self._failed_functions)
            line = (f"multi_head_attention runs your functions, so it also shows their mistakes: {names} "
                    f"fail{'s' * (len(self._failed_functions) == 1)} {'its' if len(self._failed_functions) == 1 else 'their'} "
                    "own test. Fix that first.")
            out.shown.append(line)
            out.hidden.append(line)
            out.no_pointer = True
        if not plain and wrong:
            factor = self.factor_lines(t, wrong)
            if factor is not None:
                out.shown.append(factor[0])
                out.hidden.append(factor[1])
        if layer and self._wiring:
            out.no_pointer = True
        hints: dict[str, list[str]] = {}
        for c, bad in failures:
            for v in bad:
                for h in v.hints:
                    hints.setdefault(h, [])
                    if c not in hints[h]:
                        hints[h].append(c)
        def hint_lines(found: dict[str, list[str]]) -> list[str]:
            lines = []
            for h, on in found.items():
                everywhere = all(c in on for c in wrong) if wrong else True
                where = "Hint" if everywhere else (f"Hint (on {', '.join(repr(c) for c in on)} only; not on the "
                                                   "other configurations where it is wrong)")
                lines.append(f"{where}: {h}")
            return lines

        out.shown += hint_lines(hints)
        numberless: dict[str, list[str]] = {}  # a hint's numbers (a factor, an index) are values: not in hidden tests
        for h, on in hints.items():
            numberless.setdefault(NUMBER.sub("…", h), [])
            numberless[NUMBER.sub("…", h)] += [c for c in on if c not in numberless[NUMBER.sub("…", h)]]
        out.hidden += hint_lines(numberless)
        return out

    def block_lines(self, out: Explained, failures: list[tuple[str, list[Verdict]]],
                    unreached: dict[str, list[tuple[str, Verdict]]]) -> list[str]:
        """What a failing block's own functions say about it: fix theirs first, or, when they all pass (on its
        configurations too, where their tests do not reach them: ``probe``) and its numbers are wrong, its
        wiring (the residual sums, where the norms go, the final norm) is what is wrong. A crash, NaN or a
        placeholder says so on its own: it says nothing of the wiring."""
        tested = [f for f in CALLEES["block"] if any(t.function == f for t in self.course.tests)]
        failed = [f for f in tested if f in self._failed_any]
        if failed:
            out.no_pointer = True
            return [f"block runs your functions, so it also shows their mistakes: {', '.join(failed)} "
                    f"fail{'s' * (len(failed) == 1)} {'its' if len(failed) == 1 else 'their'} own test. Fix that first."]
        wired = [c for c, bad in failures if c not in unreached and any(v.kind == "wrong" for v in bad)]
        if not tested or not wired:
            return []
        return [f"Every function block calls passes ({', '.join(tested)}), so the wiring in block is wrong: the "
                "residual sums, where each norm goes (pre- or post-norm), the final norm, or what it passes to each "
                "function."]

    def unreached_failures(self, t: Test, cname: str) -> list[tuple[str, Verdict]]:
        """The functions ``t``'s whole function runs that fail on ``cname``, which their own tests do not reach
        (``probe``), in the order it runs them: (function, its first failing verdict)."""
        out = []
        for f in self.callees_of(t.function):
            bad = [v for v in self._probes.get((f, cname), {}).values() if not v.passed]
            if bad:
                out.append((f, bad[0]))
        return out

    def unreached_lines(self, t: Test, unreached: dict[str, list[tuple[str, Verdict]]]) -> list[str]:
        """Each function that goes wrong only where its tests do not reach, named, with what sets that
        configuration apart from the visible ones (no value, index or input)."""
        lines = []
        for c, found in unreached.items():
            stage = [(f, v) for f, v in found if f not in WHOLE]
            f, v = (stage or found)[0]
            where = f"a configuration the visible tests do not reach ({self.unreached_what(f, c)})"
            if stage:
                more = [g for g, _ in stage[1:]]
                also = f" ({', '.join(more)} too)" if more else ""
                lines.append(f"On '{c}', your {f} {failure_words(v)}{also}, although it passes its own test: it goes "
                             f"wrong only on {where}. Fix {f} there, and {t.function} may follow.")
            else:  # only the layer: every function it calls is right there
                lines.append(f"On '{c}', every function multi_head_attention calls passes, but multi_head_attention "
                             f"{failure_words(v)}, although it passes its own test: its wiring goes wrong only on "
                             f"{where}.")
        return lines

    def unreached_what(self, fname: str, cname: str) -> str:
        """What sets configuration ``cname`` apart from the ones ``fname``'s tests reach, in words and the visible
        configurations' own sizes (a hidden configuration's are never said)."""
        seen = [x for t in self.course.tests if t.function == fname for x in t.configurations if x in self._refs]
        conf, n = self.course.configurations[cname], self._refs[cname].n
        if not seen:
            return "no test of it reaches any configuration"
        ns = [self._refs[x].n for x in seen]
        confs = [self.course.configurations[x] for x in seen]
        parts = []
        if n > max(ns):
            parts.append(f"more than {max(ns)} tokens")
        elif n < min(ns):
            parts.append(f"fewer than {min(ns)} tokens")
        if fname in FUNCTIONS:  # the attention's functions: its heads' sizes
            if conf.d_k not in {x.d_k for x in confs}:
                parts.append("a head size d_k none of them has")
            if conf.num_heads not in {x.num_heads for x in confs}:
                parts.append("a number of heads none of them has")
        elif conf.d_model not in {x.d_model for x in confs}:  # a norm or the FFN: the model's width
            parts.append("a d_model none of them has")
        return ", ".join(parts) or "other inputs of the same sizes"

    def wiring(self, t: Test, cname: str) -> list[str]:
        """The known mistakes that reproduce the layer's answers on one configuration, recomputed from the
        layer's own inputs (the engine's trace: the reference's own, or, with a service, the engine's)."""
        answers = self._answers.get((t.function, cname)) or {}
        if not answers:
            return []
        ref = self._refs[cname]
        trace = ref.trace if ref.trace is not None else diagnosis.engine_trace(self.course.configurations[cname],
                                                                               self._seeds[cname])
        return diagnosis.wiring_matches(trace, answers, tolerance_of(self.check_of(cname)))

    def factor_lines(self, t: Test, wrong: list[str]) -> tuple[str, str] | None:
        """When, on every configuration where the test fails, the first wrong stage is the expected one
        times a constant: which (the same c everywhere, or one expression of the sizes)."""
        found: list[tuple[str, str, float]] = []
        for c in wrong:
            tol = tolerance_of(self.check_of(c))
            v = self._verdicts[(t.function, c)]
            stage = next((s for s in self.graded_stages(t) if s in v and not v[s].passed), None)
            answers = self._answers.get((t.function, c)) or {}
            if stage is None or stage not in answers or v[stage].kind != "wrong":
                return None
            got, null = answers[stage]
            f = diagnosis.constant_factor(stage, self._refs[c].arrays[stage], got, null, tol)
            if f is None:
                return None
            found.append((c, stage, f))
        stages = {s for _, s, _ in found}
        what = f"your {found[0][1]}" if len(stages) == 1 else "your values"
        where = "on every configuration where it is wrong" if len(found) > 1 else f"on '{found[0][0]}'"
        cs = [f for _, _, f in found]
        if all(abs(x - cs[0]) <= 1e-6 * abs(cs[0]) for x in cs):
            return (f"{where[0].upper()}{where[1:]}, {what} {'is' if len(stages) == 1 else 'are'} the expected "
                    f"{'one' if len(stages) == 1 else 'ones'} times one constant, c = {cs[0]:.6g}: look for where that "
                    "factor enters (missing, applied twice, or inverted).",
                    f"{where[0].upper()}{where[1:]}, {what} {'is' if len(stages) == 1 else 'are'} the expected "
                    f"{'one' if len(stages) == 1 else 'ones'} times one constant: look for where that factor enters "
                    "(missing, applied twice, or inverted).")
        sizes = [(f, diagnosis.sizes_of(self.course.configurations[c], self._refs[c].n)) for c, _, f in found]
        expr = diagnosis.factor_expression(sizes)
        values = ", ".join(f"{f:.6g} on '{c}'" for c, _, f in found)
        if expr is not None:
            text, e = expr
            reading = diagnosis.factor_reading(e)
            return (f"On every configuration where it is wrong, {what} is the expected one times {text} ({values}): "
                    f"{reading}.",
                    f"On every configuration where it is wrong, {what} is the expected one times {text}: {reading}.")
        return (f"On every configuration where it is wrong, {what} is the expected one times a constant, but a different "
                f"one on each ({values}): a size of the configuration enters where it should not.",
                f"On every configuration where it is wrong, {what} is the expected one times a constant, but a "
                "different one on each: a size of the configuration enters where it should not.")

    # ---------------------------------------------------------- messages

    def test_message(self, t: Test, failures: list[tuple[str, list[Verdict]]], seeds: dict[str, int],
                     explained: Explained, redact: bool) -> str:
        course = self.course
        n = len(t.configurations)
        fn = ALL_FUNCTIONS[t.function]
        stages = [s for s in fn.stages if any(s in self._refs[c].arrays for c in t.configurations)] or fn.stages
        graded = f"graded as {t.stage}" if t.stage else f"graded as {', '.join(stages)}"
        if redact:
            kind = "hidden " if t.hidden else ""
            if not failures:
                return f"Passed on {n} {kind}configuration{'s' * (n > 1)} ({t.function}, {graded})."
            lines = [f"Failed on {len(failures)} of {n} {kind}configuration{'s' * (n > 1)} ({t.function}, {graded})."]
            seen = set()
            for cname, bad in failures:
                for v in bad:
                    if v.kind != "wrong" and v.redacted not in seen:
                        seen.add(v.redacted)
                        lines.append(f"On '{cname}': {v.redacted}.")
            lines += explained.hidden
            lines.append(("Hidden tests" if t.hidden else "This test's results") +
                         " show no values, indices, inputs or printed output.")
            return "\n".join(lines)
        if not failures:
            names = ", ".join(f"'{c}' (seed {seeds[c]})" for c in t.configurations)
            return (f"Passed on {'all ' * (n > 1)}{n} configuration{'s' * (n > 1)} ({t.function}, {graded}): "
                    f"{names}.")
        lines = [f"Failed on {len(failures)} of {n} configuration{'s' * (n > 1)} ({t.function}, {graded}): "
                 + ", ".join(f"'{c}'" for c, _ in failures) + "."]
        for cname, bad in failures[:MAX_SHOWN_FAILURES]:
            c = course.configurations[cname]
            lines.append("")
            lines.append(f"On {describe(c, seeds[cname])}:")
            for v in bad:
                lines.append("  " + v.detail.replace("\n", "\n  "))
            earlier = self.earlier_wrong(t, cname)
            if earlier:
                lines.append(f"  ('{t.stage}' is computed from '{earlier}', which is already wrong here: fix that one "
                             "first, and this one may follow.)")
            nm = self._no_match_message.get((t.function, cname))
            if nm and not explained.no_pointer and not any(v.bugs for v in bad) and any(v.kind == "wrong" for v in bad):
                lines.append("  " + nm)
        if len(failures) > MAX_SHOWN_FAILURES:
            lines.append(f"\n(and {len(failures) - MAX_SHOWN_FAILURES} more configuration(s))")
        if explained.shown:
            lines.append("")
            lines += explained.shown
        if t.function not in WHOLE:
            lines.append("")
            lines.append(f"{t.function} was given the reference's own inputs, so this is about {t.function} alone.")
        return "\n".join(lines)

    def earlier_wrong(self, t: Test, cname: str) -> str | None:
        """With multi_head_attention returning its stages: the first wrong stage before this test's."""
        if not t.stage:
            return None
        v = self._verdicts.get((t.function, cname), {})
        for s in STAGES_OF_CONFIG[:STAGES_OF_CONFIG.index(t.stage)]:
            if s in v and not v[s].passed and v[s].kind in ("wrong", "plain") and "did not return" not in v[s].detail:
                return s
        return None

    def summary(self, runs: dict[str, RunResult], seeds: dict[str, int]) -> str:
        res = self.result
        failed = [x for x in res.tests if not x.passed]
        lines = [f"Score {res.score:g}/{res.max_score:g}. {len(res.tests) - len(failed)} of {len(res.tests)} tests "
                 "passed." + (f" Failed: {', '.join(x.name for x in failed)}." if failed else "")]
        said_total = False  # a line above already says that the whole submission's time ran out
        for k, r in runs.items():
            if r.start.status not in ("ready", "not_run"):
                why = start_detail(r.start, self.course.file)
                lines.append(f"Your file could not be run: {why}" + ("" if why.endswith(("?", ".")) else "."))
                break
            stops = [o for o in r.outcomes.values() if o.status in ("timeout", "crashed", "output", "protocol")]
            if stops:
                o = stops[0]
                if k.startswith("visible"):
                    said_total = said_total or o.out_of_total
                    text = o.detail.removeprefix("your code ")
                    lines.append(f"Your code was stopped: {text}" + ("" if text.endswith(("?", ".")) else "."))
                else:
                    lines.append("Your code was also stopped during the hidden or unpublished tests "
                                 f"({len(stops)} time{'s' * (len(stops) > 1)}).")
        # The budget can also run out between two calls: then no call was stopped, and the rest never started.
        if not said_total and any(o.out_of_total for r in runs.values() for o in r.outcomes.values()):
            limits = self.course.limits
            lines.append(f"The time for the whole submission ran out: {limits.total_seconds:g} s for every call "
                         f"together (each call may take {limits.call_seconds:g} s, but all of them share this). "
                         "The calls after that were not run; each test's message says whether it was.")
        if any(c.seed is None for c in self.course.configurations.values()):
            lines.append("Each configuration's seed is drawn afresh for every submission; a visible test's message "
                         "names its seeds, so you can reproduce it with attention-trace (same tokens, d_model, "
                         "num_heads, causal and seed).")
        return "\n".join(lines)

    def format_error(self, start: Outcome) -> GradeResult:
        res = self.result
        msg = start_detail(start, self.course.file)
        res.format_errors = [msg]
        res.score = 0.0
        for t in self.course.tests:
            res.tests.append(TestResult(t.name, t.function, t.visibility, 0.0, t.points, False,
                                        f"Not run: {msg}" if not t.hidden else "Not run: your file could not be run.",
                                        list(t.configurations), "Not run: your file could not be run."))
        res.message = f"Score 0/{res.max_score:g}. Your submission could not be run: {msg}"
        self.log(f"grader: format error: {msg}")
        return res

    def ungradable(self, reason: str) -> GradeResult:
        self.log(f"grader: NOT GRADABLE: {reason}")
        res = GradeResult(gradable=False, max_score=self.course.max_score, internal_error=reason,
                          message="Your submission could not be graded, through no fault of your code: the "
                                  "autograder could not get the reference numbers, or could not run its sandbox. "
                                  "No score was recorded. Please resubmit later, or tell the course staff if it "
                                  "keeps happening.", extra=self.result.extra, log=self.result.log)
        self.result = res
        return res


SEED_DOMAIN = b"attention-trace-grader seed v1"


def course_secret(course: Course) -> bytes:
    """The course's secret for derived seeds: ATTENTION_GRADER_SECRET, else the file [seeds] secret_file names
    (Ungradable when there is neither: a derived seed without a secret is a seed anyone can compute)."""
    env = os.environ.get("ATTENTION_GRADER_SECRET")
    if env:
        secret = env.encode()
    elif course.secret_file:
        try:
            secret = Path(course.secret_file).read_bytes().strip()
        except OSError as e:
            raise Ungradable(f"the course's seed secret {course.secret_file} cannot be read: {e.strerror}") from None
    else:
        raise Ungradable('the course derives seeds from the student ([seeds] derive = "student") but has no secret: '
                         "set ATTENTION_GRADER_SECRET or [seeds] secret_file")
    if len(secret) < 16:
        raise Ungradable("the course's seed secret is shorter than 16 bytes")
    return secret


def derived_seed(secret: bytes, student: str, configuration: str) -> int:
    """HMAC-SHA256(secret, student, configuration)'s first 4 bytes: a seed in [0, 2³²) that only who holds the
    secret can compute, the same for every grading of that student's work on that configuration."""
    msg = SEED_DOMAIN + b"\0" + student.encode() + b"\0" + configuration.encode()
    return int.from_bytes(hmac.new(secret, msg, hashlib.sha256).digest()[:4], "big")


def start_detail(start: Outcome, file: str) -> str:
    """Why the submission could not be imported, for the student."""
    if start.status == "ready":
        return ""
    if start.status == "missing":
        return (f"there is no {file} in your submission (it has: {start.detail}). Submit a file named {file} that "
                "defines the functions of the assignment.")
    e = start.error or {}
    if start.status == "syntax":
        fr = (e.get("frames") or [{}])[0]
        return (f"{file} has a syntax error on line {fr.get('line', '?')}: {e.get('message', '')}"
                + (f"\n    {fr.get('code')}" if fr.get("code") else ""))
    if start.status == "import":
        tb = _frames(e)
        return (f"{file} raised {e.get('type', 'an error')} while being imported: {e.get('message', '')}"
                + (f"\n{tb}" if tb else ""))
    if start.status == "timeout":
        return f"{start.detail.removeprefix('your code ')}: is there a loop at the top level of {file}?"
    return start.detail or f"{file} could not be run"


def grade(submission: str | Path, course: Course, **kwargs: Any) -> GradeResult:
    """Grade one submission directory with the course configuration."""
    return Grader(course, Path(submission), **kwargs).grade()
