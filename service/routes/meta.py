"""GET /health, /version and /openapi.yaml: liveness, what answers here and with which limits, the contract.

Their answers' models (``Health``, ``VersionInfo``) live here with the routes
and their fragment of openapi.yaml (:func:`openapi_paths`). /openapi.yaml
serves the committed file exactly (read once by ``create_app``).
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import TYPE_CHECKING, Any, Literal

from flask import Blueprint, Response, current_app
from pydantic import BaseModel, Field

import engine
from engine import BUGS
from engine.bugs import BLOCK_BUGS, LM_BUGS
from engine.layer import ALL_STAGE_IDS, BLOCK_STAGE_IDS

from .. import serialize
from ..edge import json_response, settings
from ..settings import Settings

if TYPE_CHECKING:
    from ..openapi_parts import Parts

bp = Blueprint("meta", __name__)


class Health(BaseModel):
    status: Literal["ok"]


class VersionInfo(BaseModel):
    service: str
    service_version: str
    schema_version: str
    engine_version: str
    libraries: dict[str, str]
    limits: dict[str, Any]
    stage_ids: list[str]
    bugs: dict[str, str] = Field(description="The known bugs that inject_bug and /check's diagnosis use.")
    block_stage_ids: list[str] = Field(
        description="The stages a stack of Transformer blocks (a request with a block field) adds to stage_ids, in "
        "walkthrough order (which of them a stack computes depends on its norm, norm position and FFN).")
    block_bugs: dict[str, str] = Field(
        description="The known mistakes of a stack of Transformer blocks, each made in every layer: inject_bug takes "
        "them with a block field, and /check's diagnosis of a stack names them after the attention's bugs.")
    lm_bugs: dict[str, str] = Field(
        description="The known mistakes of the language-model head (lm_head): inject_bug takes them on a stack with "
        "lm_head, and /check's diagnosis of a stack with the head names them after the block's mistakes.")



#: the models whose schemas this module's paths publish in components.schemas
MODELS: tuple[type[BaseModel], ...] = (Health, VersionInfo)


def _dist_version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def version_document(limits: Settings) -> dict[str, Any]:
    """GET /version: versions, the limits in force, the stage ids and the known bugs (the attention layer's, then a
    stack of blocks' own, then the language-model head's): each list is engine/bugs.py's, the one /check uses."""
    return {
        "service": "attention-trace",
        "service_version": _dist_version("attention-trace"),
        "schema_version": serialize.SCHEMA_VERSION,
        "engine_version": engine.ENGINE_VERSION,
        "libraries": {
            "python": platform.python_version(),
            # The libraries that make or check the numbers; the web framework and
            # server are not named (no version banners, for the same reason as Server:).
            **{name: _dist_version(name) for name in ("numpy", "pydantic", "orjson", "regex")},
        },
        "limits": limits.limits(),
        "stage_ids": list(ALL_STAGE_IDS),
        "bugs": {name: bug.summary for name, bug in BUGS.items()},
        "block_stage_ids": list(BLOCK_STAGE_IDS),
        "block_bugs": {name: bug.summary for name, bug in BLOCK_BUGS.items()},
        "lm_bugs": {name: bug.summary for name, bug in LM_BUGS.items()},
    }


@bp.get("/health")
def health() -> Response:
    return json_response({"status": "ok"})


@bp.get("/version")
def version() -> Response:
    return json_response(version_document(settings()))


@bp.get("/openapi.yaml")
def openapi() -> Response:
    return current_app.response_class(current_app.extensions["attention_trace.openapi"],
                                      mimetype="application/yaml")


def openapi_paths(parts: Parts) -> dict[str, Any]:
    """/health, /version and /openapi.yaml: their path items of openapi.yaml (service/openapi.py)."""
    return {
        "/health": parts.get("health", "Liveness", "Cheap: touches no engine state.", "Health", {"status": "ok"}),
        "/version": parts.get("version", "Versions and limits",
                              "Engine and schema versions, library versions and the limits in force.",
                              "VersionInfo", None),
        "/openapi.yaml": parts.get("openapi", "This document", "The committed OpenAPI document, as served.",
                                   "", None, mime="application/yaml"),
    }
