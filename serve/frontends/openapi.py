"""What the OpenAPI document says of the data plane's routes, shared by the frontends that
describe their own: the answers every predict-like route may give (``RESPONSES``), a route
as an operation (:func:`operation`), and a frontend's part of the document
(:class:`OpenApiPart`). The process puts the parts together (``serve.process.openapi``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel


@dataclass(frozen=True)
class OpenApiPart:
    """Routes (paths to operations) and the request bodies they refer to."""

    paths: dict[str, Any]
    requests: list[type[BaseModel]] = field(default_factory=list)


RESPONSES = {
    "200": {
        "description": "model, model_version, model_sha256 and the requested outputs "
        "(X-Policy-Version and X-Policy-SHA256 name the version; a model with a result cache "
        "adds X-Result-Cache: hit, miss or bypass)"
    },
    "400": {"description": "malformed JSON or header"},
    "404": {"description": "unknown model or version"},
    "413": {"description": "body larger than max_body_bytes"},
    "422": {"description": "observations do not fit the contract (shape, dtype, bounds)"},
    "429": {"description": "queue full; see Retry-After"},
    "503": {"description": "not ready, or shutting down"},
    "504": {"description": "deadline passed"},
}
REF = "#/components/schemas/{model}"


def operation(
    summary: str,
    params: list[str],
    request: str = "PredictRequest",
    *,
    tag: str = "predict",
    responses: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "post": {
            "tags": [tag],
            "summary": summary,
            "parameters": [
                {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                for p in params
            ],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": REF.format(model=request)}}},
            },
            "responses": responses or RESPONSES,
        }
    }
