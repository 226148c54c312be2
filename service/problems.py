"""RFC 9457 problem details: every error the service returns, in one format."""

from __future__ import annotations

from typing import Any

import orjson
from flask import Flask, Response, current_app, request
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from engine import EngineError

from .settings import CHECK_PATHS

PROBLEM_MIME = "application/problem+json"
TYPE_BASE = "urn:attention-trace:problem:"

class ProblemError(Exception):
    """Raise anywhere in a request to answer with a problem document."""

    def __init__(self, status: int, title: str, detail: str, *, kind: str, errors: list[dict] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail, self.kind = status, title, detail, kind
        self.errors, self.headers = errors, headers or {}


def problem_document(e: ProblemError, instance: str | None, pointer_prefix: str = "") -> dict[str, Any]:
    """The RFC 9457 body for a problem; ``pointer_prefix`` places it inside a batch item."""
    body: dict[str, Any] = {"type": TYPE_BASE + e.kind, "title": e.title, "status": e.status, "detail": e.detail,
                            "instance": instance}
    if e.errors is not None:
        body["errors"] = [{**err, "pointer": pointer_prefix + err["pointer"]} for err in e.errors]
    return body


def problem_response(status: int, title: str, detail: str, *, kind: str, errors: list[dict] | None = None,
                     headers: dict[str, str] | None = None) -> Response:
    err = ProblemError(status, title, detail, kind=kind, errors=errors)
    body = problem_document(err, request.path if request else None)
    resp = current_app.response_class(orjson.dumps(body), status=status, mimetype=PROBLEM_MIME)
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def json_pointer(loc: tuple[int | str, ...]) -> str:
    """pydantic's error location as an RFC 6901 JSON pointer."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in loc)


#: most entries in a 422's `errors`; the rest are counted in `detail`. One entry
#: per offending item let a 3 MB body answer 348 MiB (docs/reliability.md).
MAX_ERRORS = 20
#: longest field name echoed back in a pointer or message
MAX_ECHO = 64


def _short(text: str) -> str:
    return text if len(text) <= MAX_ECHO else text[:MAX_ECHO] + "…"


def validation_problem(exc: ValidationError) -> ProblemError:
    """422 with one entry per problem (at most MAX_ERRORS); malformed JSON is a 400 instead."""
    total = exc.error_count()
    errs = exc.errors(include_url=False, include_input=False, include_context=True)
    if any(e["type"] == "json_invalid" for e in errs):
        first = next(e for e in errs if e["type"] == "json_invalid")
        return ProblemError(400, "Malformed JSON", f"The request body is not valid JSON: {first['msg']}.",
                            kind="malformed-json")
    items = []
    for e in errs[:MAX_ERRORS]:
        loc = tuple(_short(p) if isinstance(p, str) else p for p in e["loc"])
        ctx = e.get("ctx") or {}
        if "pointer" in ctx:
            pointer = ctx["pointer"]
        else:
            pointer = json_pointer(loc)  # the engine's errors carry their own pointer (models.engine_rules)
        message = e["msg"]
        if e["type"] == "extra_forbidden":
            message = f"unknown field {loc[-1]!r}: check the spelling; see the API's list of request fields"
        elif e["type"] == "model_type" and not loc:
            message = "the request body must be a JSON object"
        items.append({"pointer": pointer, "message": message, "type": e["type"]})
        also = ctx.get("also") or []  # the other conflicts found with this one (models.engine_rules)
        items += [{"pointer": a["pointer"], "message": a["message"], "type": a["type"]}
                  for a in also[:max(0, MAX_ERRORS - len(items))]]
        total += len(also)
    return _invalid(items[:MAX_ERRORS], total)


def problem_entry(e: EngineError) -> dict[str, str]:
    """One entry of a 422's ``errors`` for an engine refusal."""
    return {"pointer": e.pointer, "message": e.message, "type": e.code}


def _invalid(items: list[dict[str, str]], total: int) -> ProblemError:
    summary = "; ".join(f"{i['pointer'] or 'body'}: {i['message']}" for i in items[:3])
    if total > 3:
        summary += f"; and {total - 3} more"
    return ProblemError(422, "Invalid request", summary, kind="validation-error", errors=items)


def engine_problem(e: EngineError) -> ProblemError:
    """The 422 for anything the engine refuses (and every problem found with it): the same shape as a
    validation error."""
    return _invalid([problem_entry(x) for x in e.errors[:MAX_ERRORS]], len(e.errors))


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(ProblemError)
    def _problem(e: ProblemError) -> Response:
        return problem_response(e.status, e.title, e.detail, kind=e.kind, errors=e.errors, headers=e.headers)

    @app.errorhandler(EngineError)
    def _engine(e: EngineError) -> Response:
        return _problem(engine_problem(e))

    @app.errorhandler(HTTPException)
    def _http(e: HTTPException) -> Response:
        headers = {}
        if isinstance(e, MethodNotAllowed) and e.valid_methods:
            headers["Allow"] = ", ".join(sorted(e.valid_methods))
        detail = {
            404: f"There is no resource at {request.path}. See /openapi.yaml for the endpoints.",
            405: f"{request.method} is not allowed on {request.path}.",
            413: f"The request body is larger than the limit of "
                 f"{current_app.extensions['attention_trace.settings'].body_limit(request.path)} bytes"
                 + (f" for {request.path}." if request.path in CHECK_PATHS else "."),
        }.get(e.code or 500, e.description or "")
        kind = {400: "bad-request", 404: "not-found", 405: "method-not-allowed",
                413: "payload-too-large"}.get(e.code or 0, "http-error")
        return problem_response(e.code or 500, e.name, detail, kind=kind, headers=headers)

    @app.errorhandler(Exception)
    def _unexpected(e: Exception) -> Response:
        # Never leak a stack trace or internals; the log has the details.
        current_app.logger.exception("unhandled error on %s %s", request.method, request.path)
        return problem_response(500, "Internal Server Error",
                                "The server failed to answer this request. It has been logged.", kind="internal-error")
