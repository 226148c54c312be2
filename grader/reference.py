"""Where the grader gets its reference numbers and its verdicts: the engine, in this process.

:class:`EngineSource` (the default, a course's ``url = "local"``) traces each
configuration with ``engine.trace`` and checks the student's arrays against it
with ``engine.checking.check``, the very code /check runs, with the course's
``[check]`` tolerance: each stage's verdict and message, the known mistakes
``engine.diagnose`` finds (it recomputes the reference with each known bug
swapped in), and, when none reproduces the numbers, the hints. No HTTP, no web
framework: numpy and the engine only.

:class:`ServiceSource` asks a running attention-trace service instead (a
course's ``url = "https://…"``; any error there makes the submission not
gradable). Both read the same /check document into a :class:`CheckOutcome`
(``outcome_of``), so they grade alike by construction;
``tests/test_grading_core.py`` checks it over every shipped student.

The tolerance rule is /check's (docs/checking.md): ``allclose`` is
``|received − expected| ≤ atol + rtol·|expected| + stage_rtol·max|expected of
the stage|`` and ``rel_error`` is CS231n's ``|r − e| / max(1e-8, |r| + |e|) ≤
threshold``; a value at most −1e9 (or −inf) counts as masked where the
reference masks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import engine
from engine import TraceConfig, checking

from .assignment import Reference, reference_from_engine, reference_from_trace
from .config import Configuration


class SourceError(Exception):
    """The reference or the verdict could not be had: never the student's fault (no grade)."""


class AnswerRefused(SourceError):
    """The service refused the submitted numbers themselves (a 422 at /submission)."""


def tolerance_of(check: Mapping[str, Any]) -> checking.Tolerance:
    """The course's ``[check]`` as /check reads the same fields of a request (defaults filled in)."""
    given = {k: float(check[k]) if k in check else None for k in ("rtol", "atol", "stage_rtol", "threshold")}
    return checking.Tolerance.resolve(check.get("metric"), given["rtol"], given["atol"], given["stage_rtol"],
                                      given["threshold"])


#: float32's unit roundoff, 2⁻²⁴: how far a float32 student's rounding moves each number it reads or computes,
#: relative to the number
FLOAT32_ROUNDOFF = 2.0 ** -24
#: κ of the softmax's float32 allowance κ·u·L (u FLOAT32_ROUNDOFF, L the largest |logit| of the configuration).
#: A float32 softmax rounds each logit s by up to u·|s| on the way in and each s − max by up to u·|s − max|, so
#: every logit moves by at most D = 3·u·L, and a weight w by |Σ_j w·w_j·(δ_i − δ_j)| ≤ 2·D·w·(1 − w) ≤ 1.5·u·L;
#: 8 is a margin of more than 5 over that bound (grader/README.md, "Fair on every seed", has the measurements).
#: next_token_probs' softmax reads logits / T: rounding the logit, T and the quotient moves each by at most 3·u·L
#: (L then the largest |logit / T|), and s − max by 2·u·L more, so D = 5·u·L and |δw| ≤ 2.5·u·L: a margin of 3
SOFTMAX_KAPPA = 8.0


def logit_scale(ref: Reference) -> float:
    """L: the largest |logit| a softmax of the configuration reads: the attention's scaled scores (masked keys left
    out) and, with a language-model head, next_token_probs' own, the last position's logits / temperature."""
    s = np.asarray(ref.get("softmax_input"), dtype=np.float64)
    finite = s[np.isfinite(s)]
    L = float(np.abs(finite).max()) if finite.size else 0.0
    if "next_token_probs" in ref.arrays:
        L = max(L, float(np.abs(ref.arrays["logits"][-1]).max()) / float(ref.get("temperature")))
    return L


def configuration_check(check: Mapping[str, Any], logits: float) -> dict[str, Any]:
    """The course's ``[check]`` on a configuration whose softmax reads logits up to ``logits`` in magnitude.

    A float32 softmax's weights carry an absolute error of up to 1.5·u·L (``SOFTMAX_KAPPA``), and every stage
    after it as much relative to its scale, whatever the course's tolerance. Where κ·u·L exceeds the course's
    ``stage_rtol`` (logits in the hundreds or more: a ``weight_scale`` configuration), that configuration's
    ``atol`` and ``stage_rtol`` are raised to κ·u·L; elsewhere (the seeded scores, below about 40) the course's
    ``[check]`` stands as it is. ``rel_error`` courses are left as they are."""
    tol = tolerance_of(check)
    floor = SOFTMAX_KAPPA * FLOAT32_ROUNDOFF * logits
    if tol.metric != "allclose" or floor <= (tol.stage_rtol or 0.0):
        return dict(check)
    return {"rtol": tol.rtol, "atol": max(tol.atol or 0.0, floor), "stage_rtol": floor}


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


def outcome_of(doc: Mapping[str, Any]) -> CheckOutcome:
    """A /check answer (or ``engine.checking.check``'s result, the same members) as the grader reads it.
    A 1.0.0 service sends no ``hints``, or hints as plain strings; a bug without ``matches`` is the only one."""
    diagnosis = doc.get("diagnosis") or {}
    bug = diagnosis.get("bug")
    hints = [h if isinstance(h, str) else str(h.get("message", "")) for h in diagnosis.get("hints") or []
             if isinstance(h, (str, dict))]
    matches = list(diagnosis.get("matches") or ([bug] if bug else []))
    passed = bool(doc["passed"])
    stages = {sid: StageVerdict(bool(sc["passed"]), sc["message"]) for sid, sc in doc["stages"].items()}
    return CheckOutcome(passed, stages, matches, [h for h in hints if h],
                        "" if passed or matches else str(diagnosis.get("message", "")))


def passes(expected: np.ndarray, mask: np.ndarray | None, got: np.ndarray, null: np.ndarray,
           tol: checking.Tolerance) -> bool:
    """Whether a student's stage (``got``, and where it is ``null``) passes against ``expected`` (``mask``:
    where the reference masks) by /check's rule, ``engine.checking.compare.passes``; another shape never does."""
    expected = np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        return False
    return checking.compare.passes(expected, mask, checking.compare.received_npz(got, null), tol)


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
        return outcome_of(checking.check(t, checking.Submission.of_arrays(answers), tolerance_of(check)))

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
        # numpy's stubs take no None as a fill value: an object array of floats and None is meant
        submission = {sid: (np.where(null, None, got).tolist()  # type: ignore[call-overload]  # see above
                            if null.any() else got.tolist())
                      for sid, (got, null) in answers.items()}
        result = self._call("/check", self.client.check, {**c.request(seed), "submission": submission, **check})
        return outcome_of(result.raw)

    def close(self) -> None:
        if self.own:
            self.client.close()


def source_for(url: str, timeout: float, retries: int) -> EngineSource | ServiceSource:
    """The engine for ``local``; a service's URL otherwise."""
    return EngineSource() if url == "local" else ServiceSource.at(url, timeout, retries)
