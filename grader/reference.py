"""Where the grader gets its reference numbers and its verdicts: the engine, in this process.

:class:`EngineSource` (the default, a course's ``url = "local"``) traces each
configuration with ``engine.trace`` and judges the student's arrays against it
here, with the course's ``[check]`` tolerance; a mistake is named by
``engine.diagnose``, which recomputes the reference with each known bug
swapped in (``engine.recompute_values``). No HTTP, no web framework: numpy
and the engine only.

:class:`ServiceSource` asks a running attention-trace service instead (a
course's ``url = "https://…"``; any error there makes the submission not
gradable). It reads the service's /check answer into the same
:class:`CheckOutcome`.

The tolerance rule is /check's (docs/checking.md): ``allclose`` is
``|received − expected| ≤ atol + rtol·|expected| + stage_rtol·max|expected of
the stage|`` and ``rel_error`` is CS231n's ``|r − e| / max(1e-8, |r| + |e|) ≤
threshold``; a value at most −1e9 (or −inf) counts as masked where the
reference masks. ``tests/test_grading_core.py`` checks, over every shipped
student, that both sources give the same verdicts, messages and mistakes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import engine
from engine import STAGE_INFO, TraceConfig

from .assignment import Reference, reference_from_engine, reference_from_trace
from .config import Configuration

#: numpy.isclose's defaults, what an rtol or atol the course leaves out means when it gives the other
NUMPY_RTOL, NUMPY_ATOL = 1e-5, 1e-8
#: /check's default tolerance: numpy's rtol and atol plus 1e-4 of the stage's largest |expected|
DEFAULT_STAGE_RTOL = 1e-4
DEFAULT_THRESHOLD = 1e-3  # rel_error's, when the course gives none
REL_ERROR_FLOOR = 1e-8
MASK_FILL = -1e9  # where the reference masks, a value at most this counts as masked


class SourceError(Exception):
    """The reference or the verdict could not be had: never the student's fault (no grade)."""


class AnswerRefused(SourceError):
    """The service refused the submitted numbers themselves (a 422 at /submission)."""


@dataclass(frozen=True)
class Tolerance:
    """The course's ``[check]``, with /check's defaults filled in."""

    metric: str = "allclose"
    rtol: float = NUMPY_RTOL
    atol: float = NUMPY_ATOL
    stage_rtol: float = DEFAULT_STAGE_RTOL
    threshold: float = DEFAULT_THRESHOLD

    @classmethod
    def of(cls, check: Mapping[str, Any]) -> Tolerance:
        if check.get("metric") == "rel_error":
            return cls("rel_error", threshold=float(check.get("threshold", DEFAULT_THRESHOLD)))
        given = {k: float(check[k]) for k in ("rtol", "atol", "stage_rtol") if k in check}
        if not given:
            return cls()
        return cls("allclose", given.get("rtol", NUMPY_RTOL), given.get("atol", NUMPY_ATOL), given.get("stage_rtol", 0.0))


@dataclass
class StageVerdict:
    passed: bool
    message: str


@dataclass
class CheckOutcome:
    """What the grader reads of one check: each stage's verdict, the known mistakes that reproduce the
    numbers, the hints, and the diagnosis' message when none does."""

    passed: bool
    stages: dict[str, StageVerdict]
    matches: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    diagnosis_message: str = ""


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def _judge(expected: np.ndarray, exp_mask: np.ndarray, got: np.ndarray, got_null: np.ndarray,
           tol: Tolerance) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """/check's rule, value by value: (failing entries, entries taken as masked, pairs of finite numbers,
    |received − expected| on those pairs)."""
    with np.errstate(all="ignore"):
        filled = exp_mask & ~got_null & (got <= MASK_FILL)
        got_masked = got_null | filled
        non_finite = ~got_masked & ~np.isfinite(got)
        numeric = ~exp_mask & ~got_masked & ~non_finite
        diff = np.where(numeric, np.abs(got - expected), 0.0)
        if tol.metric == "rel_error":
            ratio = np.where(numeric, diff / np.maximum(REL_ERROR_FLOOR, np.abs(got) + np.abs(expected)), 0.0)
            bad_num = ratio > tol.threshold
        else:
            scale = float(np.where(exp_mask, 0.0, np.abs(expected)).max()) if expected.size else 0.0
            bad_num = numeric & (diff > tol.atol + tol.stage_rtol * scale + tol.rtol * np.abs(expected))
        return bad_num | non_finite | (exp_mask != got_masked), got_masked, numeric, diff


def compare_stage(sid: str, expected: np.ndarray, mask: np.ndarray | None, got: np.ndarray, got_null: np.ndarray,
                  tol: Tolerance) -> StageVerdict:
    """One stage against the reference, with /check's message."""
    axes = ", ".join(STAGE_INFO[sid].axes)
    if got.shape != expected.shape:
        return StageVerdict(False, f"the shape is wrong: expected {list(expected.shape)} ({axes}), "
                                   f"got {list(got.shape)}")
    exp_mask = np.zeros(expected.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    bad, got_masked, numeric, diff = _judge(expected, exp_mask, got, got_null, tol)
    n = int(expected.size)
    filled = int((exp_mask & ~got_null & got_masked).sum())
    note = "" if not filled else (f"; {filled} masked entr{'y' if filled == 1 else 'ies'} sent as -inf or a value "
                                  f"≤ -1e9 {'was' if filled == 1 else 'were'} treated as masked")
    if not bad.any():
        largest = float(diff.max()) if numeric.any() else 0.0
        return StageVerdict(True, f"all {n} values match (largest error {_fmt(largest)})" + note)
    first = np.unravel_index(int(np.argmax(bad)), expected.shape)
    e_txt = "null (masked)" if exp_mask[first] else _fmt(float(expected[first]))
    g = float(got[first])
    r_txt = "null" if got_masked[first] else _fmt(g) if math.isfinite(g) else \
        ("NaN" if math.isnan(g) else "Infinity" if g > 0 else "-Infinity")
    return StageVerdict(False, f"{int(bad.sum())} of {n} values are off; the first is at {[int(i) for i in first]} "
                               f"({axes}): expected {e_txt}, got {r_txt}" + note)


class EngineSource:
    """References and verdicts from the engine, in the grader's own process."""

    def __init__(self) -> None:
        self.engine_version = engine.ENGINE_VERSION
        self.bug_summaries = {name: bug.summary for name, bug in engine.BUGS.items()}

    def reference(self, c: Configuration, seed: int) -> Reference:
        config = TraceConfig(d_model=c.d_model, num_heads=c.num_heads, causal=c.causal, seed=seed)
        try:
            t = engine.trace(config, sentence=c.sentence, tokens=None if c.tokens is None else list(c.tokens))
        except engine.EngineError as e:
            raise SourceError(f"the engine refused configuration {c.name!r}: {e.message}") from None
        return reference_from_engine(t)

    def check(self, ref: Reference, c: Configuration, seed: int, answers: dict[str, tuple[np.ndarray, np.ndarray]],
              check: Mapping[str, Any]) -> CheckOutcome:
        t: engine.Trace = ref.trace
        tol = Tolerance.of(check)
        order = [sid for sid in engine.ALL_STAGE_IDS if sid in answers]
        stages = {}
        for sid in order:
            got, null = answers[sid]
            st = t.stages[sid]
            stages[sid] = compare_stage(sid, np.asarray(st.values, dtype=np.float64), st.mask,
                                        np.asarray(got, dtype=np.float64), null, tol)
        first_wrong = next((sid for sid in order if not stages[sid].passed), None)
        if first_wrong is None:
            return CheckOutcome(True, stages, diagnosis_message="No bug: every submitted stage matches the reference.")

        def agrees(values: Mapping[str, Any], sids: list[str]) -> bool:
            for sid in sids:
                got, null = answers[sid]
                want = values[sid]
                if got.shape != want.shape:
                    return False
                mask = values["excluded"] if sid == "masked_scores" else None
                exp_mask = np.zeros(want.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
                if _judge(np.asarray(want, dtype=np.float64), exp_mask, np.asarray(got, dtype=np.float64), null,
                          tol)[0].any():
                    return False
            return True

        matches = engine.diagnose(t, first_wrong, order, agrees)
        info = STAGE_INFO[first_wrong]
        message = "" if matches else ("Your numbers do not match any known bug; compare your step "
                                      f"{info.step} with {t.stages[first_wrong].formula}.")
        return CheckOutcome(False, stages, matches, [], message)

    def close(self) -> None:
        pass


class ServiceSource:
    """References and verdicts from an attention-trace service, through a client (``Client(url)``, or any
    object with its ``trace``, ``check`` and ``version`` methods)."""

    def __init__(self, client: Any, *, own: bool = False) -> None:
        self.client, self.own = client, own
        self._version: dict[str, Any] | None = None

    @classmethod
    def at(cls, url: str, timeout: float, retries: int) -> ServiceSource:
        from attention_trace.client import Client

        return cls(Client(url, timeout=(3.05, timeout), retries=retries), own=True)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from attention_trace.client import ClientError, ProblemError

        try:
            return fn(*args, **kwargs)
        except ProblemError as e:
            pointers = [str(x.get("pointer", "")) for x in (e.errors or []) if isinstance(x, dict)]
            if what == "/check" and e.status == 422 and pointers and all(p.startswith("/submission") for p in pointers):
                raise AnswerRefused(str(e.detail)) from None
            raise SourceError(f"{what} answered {e.status} {e.title}: {e.detail}") from None
        except ClientError as e:
            raise SourceError(f"the attention-trace service failed: {e}") from None

    def _versions(self) -> dict[str, Any]:
        if self._version is None:
            self._version = dict(self._call("/version", self.client.version))
        return self._version

    @property
    def engine_version(self) -> Any:
        return self._versions().get("engine_version")

    @property
    def bug_summaries(self) -> dict[str, str]:
        return dict(self._versions().get("bugs", {}))

    def reference(self, c: Configuration, seed: int) -> Reference:
        return reference_from_trace(self._call("/trace", self.client.trace, c.request(seed), include_parameters=True))

    def check(self, ref: Reference, c: Configuration, seed: int, answers: dict[str, tuple[np.ndarray, np.ndarray]],
              check: Mapping[str, Any]) -> CheckOutcome:
        submission = {sid: (np.where(null, None, got).tolist() if null.any() else got.tolist())
                      for sid, (got, null) in answers.items()}
        result = self._call("/check", self.client.check, {**c.request(seed), "submission": submission, **check})
        raw = result.raw.get("diagnosis", {})
        hints = [h if isinstance(h, str) else str(h.get("message", "")) for h in raw.get("hints") or []
                 if isinstance(h, (str, dict))]
        matches = list(result.diagnosis.matches or ([result.diagnosis.bug] if result.diagnosis.bug else []))
        stages = {sid: StageVerdict(bool(sc.passed), sc.message) for sid, sc in result.stages.items()}
        return CheckOutcome(bool(result.passed), stages, matches, [h for h in hints if h],
                            "" if result.passed or matches else result.diagnosis.message)

    def close(self) -> None:
        if self.own:
            self.client.close()


def source_for(url: str, timeout: float, retries: int) -> EngineSource | ServiceSource:
    """The engine for ``local``; a service's URL otherwise."""
    return EngineSource() if url == "local" else ServiceSource.at(url, timeout, retries)
