"""The service's endpoints, one module per family, each in the same pattern.

| module      | paths                                          |
|-------------|------------------------------------------------|
| ``trace``   | POST /trace, /trace/batch, /trace/html          |
| ``check``   | POST /check, /check/batch                       |
| ``explain`` | POST /explain                                   |
| ``export``  | POST /export                                    |
| ``viewer``  | GET /, /static/{path}                           |
| ``meta``    | GET /health, /version, /openapi.yaml            |

Each module holds its Flask blueprint ``bp`` (the routes), its request and
answer models (``MODELS``: what it publishes in openapi.yaml's
``components.schemas``), the documents it answers, and
``openapi_paths(parts)``, its paths of openapi.yaml. They read bodies through
``service.edge`` and build on the shared models of ``service.models``; the
work itself is the engine's. ``create_app`` registers every blueprint, and
``service/openapi.py`` assembles the document from every module.
"""

from __future__ import annotations

from types import ModuleType

from . import check, explain, export, meta, trace, viewer

#: every endpoint family, each a module with ``bp``, ``MODELS`` and ``openapi_paths``
FAMILIES: tuple[ModuleType, ...] = (trace, check, explain, export, viewer, meta)
