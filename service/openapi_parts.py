"""What every endpoint family builds its openapi paths with (``Parts``): the shared responses and headers.

Each route module (``service/routes/``) writes its paths with these; ``service/openapi.py``
makes them once and assembles the document. Kept apart from that module, which imports
the routes, so that the routes import nothing that imports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .settings import Settings

REF = "#/components/schemas/{model}"


@dataclass(frozen=True)
class Parts:
    """What every family's paths are built with: the shared responses and headers, and the default limits
    the descriptions quote."""

    problems: dict[str, Any]  # 400, 413, 415, 422: a request body that cannot be answered
    common: dict[str, Any]  # 404, 405, 500: any path
    headers: dict[str, Any]  # X-Request-ID, on every answer
    limits: Settings

    @staticmethod
    def ref(model: str) -> dict[str, str]:
        """A reference to a model's schema in components.schemas."""
        return {"$ref": REF.format(model=model)}

    def post(
        self,
        op_id: str,
        tag: str,
        summary: str,
        description: str,
        request_model: str,
        answer_model: str,
        example: Any,
        *,
        request_media: dict[str, Any] | None = None,
        answer_media: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A POST path item: a JSON body (and ``request_media``'s other types), a JSON answer (and
        ``answer_media``'s), the problems and the common responses."""
        return {
            "post": {
                "operationId": op_id,
                "tags": [tag],
                "summary": summary,
                "description": description,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": self.ref(request_model)}, **(request_media or {})},
                },
                "responses": {
                    "200": {
                        "description": "OK",
                        "headers": self.headers,
                        "content": {
                            "application/json": {"schema": self.ref(answer_model), "example": example},
                            **(answer_media or {}),
                        },
                    },
                    **self.problems,
                    **self.common,
                },
            }
        }

    def get(
        self, op_id: str, summary: str, description: str, schema: str, example: Any, mime: str = "application/json"
    ) -> dict[str, Any]:
        """A GET path item of the meta tag: one answer of ``mime`` (the model ``schema``, or none)."""
        plain = {"type": "object"} if mime == "application/yaml" else {"type": "string"}  # YAML parses to a mapping
        content = {mime: {"schema": self.ref(schema) if schema else plain, "example": example}}
        return {
            "get": {
                "operationId": op_id,
                "summary": summary,
                "description": description,
                "tags": ["meta"],
                "responses": {"200": {"description": "OK", "headers": self.headers, "content": content}, **self.common},
            }
        }
