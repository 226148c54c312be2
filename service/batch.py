"""Several requests of one endpoint in one: /trace/batch and /check/batch, each item answered on its own.

The batch's request and answer (``BatchRequest``, ``BatchResponse``) are the
same for both endpoints, whose routes (``service/routes/trace.py`` and
``service/routes/check.py``) give :func:`batch_document` their own item model
and answer. A bad item gets its own problem entry and does not fail the rest;
the whole batch's size and work are bounded before any item is answered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

import engine

from . import budget
from .models import Problem, TraceSpec, settings_of
from .problems import ProblemError, engine_problem, problem_document, validation_problem
from .settings import Settings


class BatchRequest(BaseModel):
    """Several requests answered independently, in order."""

    model_config = ConfigDict(extra="forbid", strict=True)

    items: list[dict[str, Any]] = Field(
        min_length=1,
        description="Each item is a request body of the single endpoint. One bad item gets its own problem "
        "entry and does not fail the rest. The number of items and their total size are limited "
        "(see /version: max_batch_items, max_trace_values).",
    )

    @field_validator("items")
    @classmethod
    def _count(cls, v: list[dict[str, Any]], info: ValidationInfo) -> list[dict[str, Any]]:
        limit = settings_of(info).max_batch_items
        if len(v) > limit:
            raise PydanticCustomError(
                "too_many_items", "{count} items is more than the limit of {limit}", {"count": len(v), "limit": limit}
            )
        return v


class BatchItemResult(BaseModel):
    index: int
    status: int = Field(description="What the single endpoint would have answered for this item.")
    result: dict[str, Any] | None = Field(description="The single endpoint's body when status is 200.")
    problem: Problem | None = Field(description="The problem document otherwise.")


class BatchResponse(BaseModel):
    results: list[BatchItemResult] = Field(description="One per item, in the same order.")


#: the batch's models, which openapi.yaml publishes with each batch endpoint's
MODELS: tuple[type[BaseModel], ...] = (BatchRequest, BatchResponse)


def batch_document(path: str, batch: BatchRequest, limits: Settings, model: type[TraceSpec],
                   answer: Callable[[Any], Any]) -> dict[str, Any]:
    """Validate each item of the batch at ``path`` with ``model`` and ``answer`` it on its own, in order.

    The total work is bounded first: a batch whose traces would hold more than
    max_trace_values numbers together is refused whole (ProblemError 422).
    """
    single = path.removesuffix("/batch")
    ctx = {"settings": limits}
    parsed: list[TraceSpec | ProblemError] = []
    for item in batch.items:
        try:
            parsed.append(model.model_validate(item, context=ctx))
        except ValidationError as e:
            parsed.append(validation_problem(e))
    total = sum(p.value_count for p in parsed if not isinstance(p, ProblemError))
    if total > limits.max_trace_values:
        raise ProblemError(422, "Invalid request",
                           f"the batch's traces would hold {total} numbers together, above the limit of "
                           f"{limits.max_trace_values}; split it into smaller batches", kind="validation-error",
                           errors=[{"pointer": "/items", "type": "batch_too_large",
                                    "message": f"{total} numbers in all; the limit is {limits.max_trace_values}"}])
    # ... and so is its CPU: weight generation and the /check comparisons count too (service/budget.py).
    work = budget.cost(single, [p for p in parsed if not isinstance(p, ProblemError)])
    if work > limits.max_request_cost:
        raise ProblemError(422, "Invalid request",
                           f"the batch would cost {work} units of work (numbers computed, weights generated), "
                           f"above the limit of {limits.max_request_cost}; split it into smaller batches or "
                           "share seeds between items", kind="validation-error",
                           errors=[{"pointer": "/items", "type": "batch_too_costly",
                                    "message": f"{work} units in all; the limit is {limits.max_request_cost}"}])
    results = []
    for i, p in enumerate(parsed):
        if not isinstance(p, ProblemError):
            try:
                results.append({"index": i, "status": 200, "result": answer(p), "problem": None})
                continue
            except engine.EngineError as e:
                p = engine_problem(e)
        results.append({"index": i, "status": p.status, "result": None,
                        "problem": problem_document(p, path, f"/items/{i}")})
    return {"results": results}
