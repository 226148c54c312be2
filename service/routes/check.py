"""POST /check and /check/batch: a student's numbers against the reference, stage by stage, and the diagnosis.

The request (``CheckRequest``: the shared ``TraceSpec`` plus the submission
and the tolerance) and the answer's models (``CheckResponse`` and its parts)
live here with the routes and their fragment of openapi.yaml
(:func:`openapi_paths`). The checking itself is the engine's
(``engine.checking``: comparison, diagnosis, hints, messages), which the
grader runs too; :func:`check_document` traces the reference and wraps the
engine's result in the answer's envelope. A submission too large for JSON
comes as an ``application/x-npz`` body (service/npz.py), read into the same
request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from flask import Blueprint, Response, request
from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

from engine import checking
from engine.checking import compare
from engine.checking.hints import HINT_CODES
from engine.layer import ALL_STAGE_IDS, TOKEN_STAGE_IDS, check_stages

from .. import batch, budget, npz, serialize
from ..batch import BatchRequest
from ..edge import bound_json_values, json_response, parse_body, read_json_body, settings
from ..models import AnyBugName, ConfigOut, StageId, TraceSpec, engine_rules
from ..problems import ProblemError, validation_problem
from ..settings import Settings

if TYPE_CHECKING:
    from ..openapi_parts import Parts

bp = Blueprint("check", __name__)


_TOLERANCE_DOC = (
    "By default a value passes when |received − expected| ≤ atol + rtol·|expected| + stage_rtol·max|expected|, "
    f"with rtol {compare.DEFAULT_RTOL:g} and atol {compare.DEFAULT_ATOL:g} (numpy.isclose's defaults) and "
    f"stage_rtol {compare.DEFAULT_STAGE_RTOL:g}, max|expected| being the largest magnitude in the stage: wide "
    "enough for correct float32 work at every allowed size, far below what any known bug changes "
    "(docs/checking.md has the measurements)."
)


class CheckRequest(TraceSpec):
    """A trace request plus a student's numbers for any subset of the stages."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"sentence": "the cat sat", "d_model": 4, "num_heads": 1,
                 "submission": {"weights": [[[0.3, 0.4, 0.3], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4]]]}},
                {"sentence": "the cat sat", "d_model": 4, "num_heads": 1, "metric": "rel_error", "threshold": 1e-3,
                 "submission": {"weights": [[[0.3, 0.4, 0.3], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4]]]}},
            ]
        },
    )

    #: the submitted stages' shapes, found while checking their values (None: ragged)
    _shapes: dict[str, tuple[int, ...] | None] = PrivateAttr(default_factory=dict)
    #: the stages an npz body sent as arrays (service/npz.py), read once
    _arrays: dict[str, compare.Received] = PrivateAttr(default_factory=dict)

    submission: dict[StageId, list[Any]] = Field(
        min_length=1,
        description="A student's values per stage id, as nested arrays in the stage's axes (see /trace). "
        "Masked entries of masked_scores are null; -Infinity or any value ≤ -1e9 there counts as masked too. "
        "NaN, Infinity and -Infinity may be sent as the literals NaN, Infinity and -Infinity (what Python's "
        "json writes) or as the strings \"NaN\", \"Infinity\" and \"-Infinity\" (what Jackson, .NET and "
        "protobuf write): such a value fails its stage, and the answer names where. The tokens and context_tokens "
        "stages are lists of strings.",
    )
    metric: Literal[compare.METRICS] | None = Field(  # type: ignore[valid-type]  # Literal of a run-time tuple
        default=None,
        description="How values are compared: `allclose` (numpy.isclose's rule, plus the stage term "
        "stage_rtol; the default) or `rel_error` (CS231n's |received − expected| / max(1e-8, |received| + "
        "|expected|) ≤ threshold, value by value). " + _TOLERANCE_DOC,
    )
    rtol: float | None = Field(
        default=None, ge=0, le=1,
        description="allclose: relative tolerance. Giving any of rtol, atol or stage_rtol sets the others to "
        "numpy's defaults (rtol 1e-5, atol 1e-8, stage_rtol 0), so rtol and atol alone mean exactly "
        "numpy.isclose's rule; giving none of them means the default tolerance.",
    )
    atol: float | None = Field(default=None, ge=0, le=1e6, description="allclose: absolute tolerance (see rtol).")
    stage_rtol: float | None = Field(
        default=None, ge=0, le=1,
        description="allclose: a tolerance relative to the stage's largest |expected| value, added to atol "
        "(see rtol). float32 rounding errors scale with the stage's magnitude, not with each value's.",
    )
    threshold: float | None = Field(
        default=None, ge=0, le=1,
        description=f"rel_error: the largest relative error allowed (default {compare.DEFAULT_THRESHOLD:g}).",
    )

    @field_validator("submission")
    @classmethod
    def _token_strings(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for sid in sorted(TOKEN_STAGE_IDS & v.keys(), key=ALL_STAGE_IDS.index):
            if not all(isinstance(t, str) for t in v[sid]):
                raise PydanticCustomError("submission_type", "submission.{sid} must be a list of strings", {"sid": sid})
        return v

    @model_validator(mode="after")
    def _stages_exist(self, info: ValidationInfo) -> CheckRequest:
        with engine_rules():
            check_stages(list(self.submission), self.trace_config, explicit_input=self.input is not None,
                         field="submission", keyed=True, cross=self._context is not None)
        arrays = (info.context or {}).get("npz_submission") or {}  # sid -> (values, mask) from an npz body
        # a stack's stages gain a leading layer axis: one level deeper than one layer's
        depth = compare.MAX_STACK_DEPTH if self.trace_config.has_block else compare.MAX_DEPTH
        # Every value's type, and each stage's shape, in one pass over the rows (compare.scan).
        for sid, values in self.submission.items():
            if sid in TOKEN_STAGE_IDS:  # token texts: compared as strings (engine/checking/report.py)
                continue
            if sid in arrays:
                a, mask = arrays[sid]
                if not 1 <= a.ndim <= depth:
                    raise PydanticCustomError(
                        "submission_type", "submission.{sid}: {problem}",
                        {"sid": sid, "pointer": f"/submission/{sid}", "problem": (
                            "a single number, not an array" if a.ndim == 0 else
                            f"{a.ndim} dimensions, deeper than any stage ({depth})")})
                self._arrays[sid] = compare.received_npz(a, mask)
                self._shapes[sid] = a.shape
                continue
            try:
                self._shapes[sid] = compare.scan(values, depth)
            except compare.SubmissionTypeError as e:
                raise PydanticCustomError(
                    "submission_type", "submission.{sid}: {problem}",
                    {"sid": sid, "problem": str(e), "pointer": f"/submission/{sid}"},
                ) from None
        return self

    @model_validator(mode="after")
    def _one_metric(self) -> CheckRequest:
        allclose = [name for name in ("rtol", "atol", "stage_rtol") if getattr(self, name) is not None]
        if self.metric == "rel_error" and allclose:
            raise PydanticCustomError(
                "tolerance_conflict", "{name} belongs to metric \"allclose\"; metric \"rel_error\" takes threshold",
                {"name": allclose[0], "pointer": f"/{allclose[0]}"})
        if self.metric != "rel_error" and self.threshold is not None:
            raise PydanticCustomError(
                "tolerance_conflict", "threshold belongs to metric \"rel_error\"; add \"metric\": \"rel_error\", "
                "or give rtol, atol and stage_rtol for allclose", {"pointer": "/threshold"})
        return self

    @property
    def tolerance(self) -> compare.Tolerance:
        """The tolerance asked for, with defaults filled in (compare.Tolerance.resolve)."""
        return compare.Tolerance.resolve(self.metric, self.rtol, self.atol, self.stage_rtol, self.threshold)

    @property
    def shapes(self) -> dict[str, tuple[int, ...] | None]:
        """Each submitted numeric stage's shape (None when ragged), found during validation."""
        return self._shapes

    @property
    def arrays(self) -> dict[str, compare.Received]:
        """The stages an npz body sent as arrays, already read (service/npz.py)."""
        return self._arrays



# ------------------------------------------------------------------ the answer (schema only)


class Mismatch(BaseModel):
    index: list[int] = Field(description="Index of the first mismatching value, in the stage's axes.")
    expected: float | str | None = Field(description="null: the reference masks this entry.")
    received: float | str | None = Field(
        description="null: null was sent. A non-finite value is written as the string \"NaN\", \"Infinity\" "
        "or \"-Infinity\" (JSON numbers cannot hold them); in the tokens stage, the token.")


class NonFiniteValue(BaseModel):
    index: list[int] = Field(description="Where, in the stage's axes.")
    value: Literal["NaN", "Infinity", "-Infinity"]


class NonFinite(BaseModel):
    count: int = Field(description="How many received values are NaN or ±Infinity (each fails the stage).")
    first: list[NonFiniteValue] = Field(description=f"The first {compare.MAX_NON_FINITE_SHOWN}, row-major.")


class StageCheck(BaseModel):
    step: int
    passed: bool
    shape_ok: bool
    expected_shape: list[int]
    received_shape: list[int] | None = Field(description="null when the submission is a ragged array.")
    n_values: int
    mismatches: int = Field(description="How many values are outside the tolerance, not finite, or null where a "
                                        "number belongs, or a number where the reference masks.")
    max_abs_error: float | None = Field(description="Largest |received − expected| over pairs of finite numbers.")
    max_rel_error: float | None = Field(description="Largest |received − expected| / |expected| where "
                                                    "expected ≠ 0.")
    rel_error: float | None = Field(
        description="CS231n's relative error, the largest |received − expected| / max(1e-8, |received| + "
        "|expected|) over pairs of finite numbers: what metric rel_error compares with its threshold.")
    abs_tolerance: float | None = Field(
        description="allclose: the absolute part of this stage's bound, atol + stage_rtol·max|expected|; "
        "null for rel_error and where nothing was compared.")
    non_finite: NonFinite | None = Field(description="The NaN and ±Infinity received, if any (the stage fails).")
    treated_as_masked: int = Field(
        description="masked_scores: how many entries the reference masks were sent as -Infinity or a value ≤ "
        "-1e9 and counted as masked (0 elsewhere).")
    first_mismatch: Mismatch | None
    message: str


class Hint(BaseModel):
    # the ignore below: Literal of a run-time tuple
    code: Literal[HINT_CODES] = Field(description="What the numbers show, for machines.")  # type: ignore[valid-type]
    message: str = Field(description="The same, written to be shown to a student.")


class Diagnosis(BaseModel):
    bug: AnyBugName | None = Field(description="The first known bug (in the documented order) that reproduces "
                                            "every submitted stage within tolerance; null if none does.")
    summary: str | None
    matches: list[AnyBugName] = Field(description="Every known bug that reproduces the submission (in a stack of "
                                              "blocks, the block's known mistakes too, docs/engine.md).")
    message: str
    hints: list[Hint] = Field(
        description="When no known bug matches: what the student's numbers in the first wrong stage show "
        "(rows that do not sum to 1, a masked diagonal, a permutation or a transpose of the expected values, "
        "a constant factor). Empty otherwise.")


class Tolerance(BaseModel):
    metric: Literal[compare.METRICS]  # type: ignore[valid-type]  # Literal of a run-time tuple
    rtol: float | None = Field(description="allclose only.")
    atol: float | None = Field(description="allclose only.")
    stage_rtol: float | None = Field(description="allclose only: times the stage's largest |expected|.")
    threshold: float | None = Field(description="rel_error only.")
    rule: str = Field(description="The rule each value must meet.")


class CheckResponse(BaseModel):
    schema_version: str
    engine_version: str
    parameters_digest: str
    config: ConfigOut
    tolerance: Tolerance
    passed: bool
    first_wrong_stage: StageId | None = Field(description="The first failing stage in walkthrough order.")
    stages: dict[StageId, StageCheck] = Field(description="One entry per submitted stage, in walkthrough order.")
    diagnosis: Diagnosis
    message: str = Field(description="A summary fit to show a student.")



#: the models whose schemas this module's paths publish in components.schemas
MODELS: tuple[type[BaseModel], ...] = (CheckRequest, CheckResponse, *batch.MODELS)


# ------------------------------------------------------------------ the answer


def check_document(req: CheckRequest) -> dict[str, Any]:
    """The /check answer: the reference traced, the submission checked by the engine (engine.checking),
    in the answer's envelope."""
    t = req.run_trace()
    tol = req.tolerance
    return {
        "schema_version": serialize.SCHEMA_VERSION,
        "engine_version": t.engine_version,
        "parameters_digest": t.parameters_digest,
        "config": serialize.config_document(t),
        "tolerance": tol.document(),
        **checking.check(t, checking.Submission(req.submission, req.shapes, req.arrays), tol),
    }


def check_request_npz(body: bytes, limits: Settings) -> CheckRequest:
    """The /check request an ``application/x-npz`` body holds (service/npz.py), validated as a JSON body
    is; the archive is refused (400, 413, 422) before anything in it is used if it is out of bounds."""
    try:
        meta, arrays = npz.read_submission(body, max_unpacked=limits.max_check_body_bytes,
                                           max_metadata_values=limits.max_check_json_values,
                                           token_stages=TOKEN_STAGE_IDS)
    except npz.NpzBodyError as e:
        if e.status == 422:
            raise ProblemError(422, "Invalid request", f"{e.pointer or 'body'}: {e}", kind="validation-error",
                               errors=[{"pointer": e.pointer or "", "message": str(e), "type": e.type}]) from None
        kind, title = {400: ("malformed-npz", "Malformed npz"),
                       413: ("payload-too-large", "Request Entity Too Large")}[e.status]
        raise ProblemError(e.status, title, f"The npz body: {e}.", kind=kind) from None
    try:
        return CheckRequest.model_validate(meta, context={"settings": limits, "npz_submission": arrays})
    except ValidationError as e:
        raise validation_problem(e) from None


# ------------------------------------------------------------------ the routes


@bp.post("/check")
def post_check() -> Response:
    raw = read_json_body(npz_too=True)
    if request.mimetype == npz.MEDIA_TYPE:  # the stages as exact arrays: any size the trace limit allows
        req = check_request_npz(raw, settings())
    else:
        bound_json_values(raw)
        req = parse_body(CheckRequest, raw)
    budget.refuse_costly_check(req, settings())  # a stack's diagnosis, counted before any work
    return json_response(check_document(req))


@bp.post("/check/batch")
def post_check_batch() -> Response:
    raw = read_json_body()
    bound_json_values(raw)
    items = parse_body(BatchRequest, raw)
    return json_response(batch.batch_document(request.path, items, settings(), CheckRequest, check_document))


# ------------------------------------------------------------------ the contract


def _example() -> dict[str, Any]:
    """A real /check answer for a submission with the first documented bug."""
    from engine import BUG_NAMES

    from .trace import TraceRequest, trace_document

    base: dict[str, Any] = {"sentence": "the cat sat", "d_model": 4, "num_heads": 1}
    buggy = trace_document(TraceRequest(**base, inject_bug=BUG_NAMES[0], stages=["weights"]))
    submission = {"weights": buggy["stages"]["weights"]["values"].tolist()}
    return check_document(CheckRequest(**base, submission=submission))


def openapi_paths(parts: Parts) -> dict[str, Any]:
    """/check and /check/batch: their path items of openapi.yaml (service/openapi.py)."""
    limits = parts.limits
    # /check also takes the submission as an npz archive (service/npz.py, read_submission).
    npz_submission = {"application/x-npz": {
        "schema": {"type": "string", "contentMediaType": "application/x-npz",
                   "description": "The same request as an archive np.load reads (what np.savez or "
                                  "np.savez_compressed writes), for submissions too large for JSON: "
                                  "`metadata.json` is the CheckRequest, in which any submitted numeric stage may "
                                  "be {\"npz\": KEY} and the member KEY.npy holds its array (float64; float32 and "
                                  "integers are read as float64), as the npz answers lay them out. Masked entries "
                                  "of masked_scores: -Infinity or ≤ -1e9, or {\"npz\": KEY, \"mask\": {\"npz\": "
                                  "MASK_KEY}} with a boolean array true where masked. Other fields, and the token "
                                  "stages, stay JSON in metadata.json. Bounds, checked before anything is read: "
                                  f"the body and what its members unpack to at most {limits.max_check_body_bytes} "
                                  f"bytes each, at most {npz.MAX_MEMBERS} members, metadata.json at most "
                                  f"{limits.max_check_json_values} JSON values; every member is referenced by "
                                  "metadata.json. The answer is the same JSON as for the JSON body."}}}
    return {
        "/check": parts.post(
            "check", "check", "Check a student's numbers stage by stage",
            "Recomputes the reference trace for the same request, compares each submitted stage with "
            "`metric` `allclose` (the default: numpy.isclose's rule, rtol 1e-5 and atol 1e-8, plus "
            "`stage_rtol` 1e-4 times the stage's largest |value|, so that correct float32 work passes) or "
            "`rel_error` (CS231n's, against `threshold`), echoed in `tolerance`; names the first wrong stage "
            "in walkthrough order, and diagnoses which known bug (see `inject_bug` and GET /version) "
            "reproduces the submission, or else gives `hints` from the student's numbers. A NaN or infinity "
            "in a submitted stage fails that stage (200, with the indices); in masked_scores, -Infinity or "
            "a value ≤ -1e9 where the reference masks counts as masked. The body may be as large as "
            f"{limits.max_check_body_bytes} bytes with at most {limits.max_check_json_values} JSON values "
            "(413 above either); a submission too large for JSON (every stage of the largest trace is "
            "47 MiB of JSON) goes as an application/x-npz body. The answer summarises the submission, never "
            "repeats it (token texts are cut to 64 characters), so it stays small whatever the body holds. "
            "The response is deterministic and its messages are written to be shown to a student.",
            "CheckRequest", "CheckResponse", _example(), request_media=npz_submission),
        "/check/batch": parts.post(
            "checkBatch", "check", "Several checks in one request",
            "Each item is a /check request body, answered independently and in order.",
            "BatchRequest", "BatchResponse", None),
    }
