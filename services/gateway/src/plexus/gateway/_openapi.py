"""The OpenAPI document as the server reads requests: FastAPI's own, with what it says wrongly fixed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

__all__ = ["install_openapi"]


def _not_null(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` without its ``null`` alternative: an optional parameter is absent, never null on the
    wire (FastAPI documents ``str | None`` as "string or null"; ``Last-Event-ID: null`` gets 422)."""
    options = schema.get("anyOf")
    if not isinstance(options, list) or {"type": "null"} not in options:
        return schema
    rest = [option for option in options if option != {"type": "null"}]
    annotations = {key: value for key, value in schema.items() if key != "anyOf"}
    return {**rest[0], **annotations} if len(rest) == 1 else {**annotations, "anyOf": rest}


def _fix(document: dict[str, Any]) -> dict[str, Any]:
    for path in document.get("paths", {}).values():
        for operation in path.values():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                if "schema" in parameter:
                    parameter["schema"] = _not_null(parameter["schema"])
    return document


def install_openapi(app: FastAPI) -> None:
    """Serve the fixed document at ``/openapi.json`` (built once, on first request)."""
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _fix(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
