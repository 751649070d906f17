"""Problem details (RFC 9457): every failure leaves the gateway as ``application/problem+json``.

Kernel errors keep their type and fields (``error_type``, ``fields``) so a client can rebuild the same
`KernelError` with `KernelError.from_wire`; validation failures list what was wrong and where.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match

from plexus.core import KernelError

__all__ = [
    "PROBLEM_JSON",
    "PROBLEM_RESPONSES",
    "Problem",
    "install_problem_handlers",
    "kernel_status",
    "problem_response",
]

log = logging.getLogger("plexus.gateway")

PROBLEM_JSON = "application/problem+json"

#: HTTP status of a kernel error by its ``error_type``; anything else is the agent's failure (502).
_KERNEL_STATUS: dict[str, int] = {
    "AgentNotFoundError": 404,
    "RunNotFoundError": 404,
    "ScheduleNotFoundError": 404,
    "ForkPointNotFoundError": 404,
    "InvalidForkError": 422,
    "InvalidRunRequest": 422,
    "InvalidScheduleError": 422,
    "ProtocolError": 422,
    "PayloadTooLargeError": 413,
    "SubjectTooLongError": 422,
    "RunStateError": 409,
    "ApprovalRequired": 409,  # handled; the agent now waits for decisions (fields: call_ids, calls)
    "ApprovalPendingError": 409,  # the agent takes no other message until the pending calls are decided
    "NoPendingApprovalError": 409,  # a decision for a call that awaits none (or of a suspension that ended)
    "CancellationError": 409,
    "BudgetExhaustedError": 409,
    "SpawnDenied": 409,
    # A limit that no wait lifts (unlike a rate): 409 until a scheduled run is deleted, not 429.
    "TooManySchedulesError": 409,
    "ReplyTimeoutError": 504,
    "ServiceUnavailableError": 503,
}


_PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "title", "status"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "error_type": {"type": "string", "description": "the KernelError class, for KernelError.from_wire"},
        "fields": {"type": "object", "description": "the KernelError's fields"},
        "errors": {
            "type": "array",
            "items": {"type": "object"},
            "description": "what failed validation, where",
        },
    },
}

_RETRY_AFTER = {
    "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer", "minimum": 1}}
}

#: OpenAPI ``responses`` for every /v1 route: each failure is problem details (RFC 9457).
PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {
        "description": why,
        "content": {PROBLEM_JSON: {"schema": _PROBLEM_SCHEMA}},
        **({"headers": _RETRY_AFTER} if status == 429 else {}),
    }
    for status, why in [
        (401, "missing or unknown bearer token"),
        (404, "no such agent, run, session, memory key or scheduled run"),
        (409, "the run's state does not allow it, or a limit (scheduled runs) is reached"),
        (413, "request body too large"),
        (422, "the request does not match the schema (the body is not JSON, or not UTF-8, included)"),
        (429, "over the caller's rate limit: try again after `Retry-After` seconds"),
        (502, "the agent failed"),
        (503, "the cluster cannot be reached"),
        (504, "the agent did not answer in time"),
    ]
}


def kernel_status(error_type: str) -> int:
    return _KERNEL_STATUS.get(error_type, 502)


class Problem(Exception):
    """Raise to answer with a problem-details body."""

    def __init__(self, status: int, title: str, detail: str = "", **extra: Any) -> None:
        super().__init__(detail or title)
        self.status = status
        self.title = title
        self.detail = detail
        self.extra = extra


def problem_response(
    status: int, title: str, detail: str = "", headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    body: dict[str, Any] = {"type": "about:blank", "title": title, "status": status}
    if detail:
        body["detail"] = detail
    body.update(extra)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _errors(exc: ValidationError | RequestValidationError) -> list[dict[str, Any]]:
    # Only location, message and type: echoing the offending input back could be large or sensitive.
    return [
        {
            "loc": [str(p) for p in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in exc.errors()
    ]


def _routes(routes: Iterable[Any]) -> Iterator[BaseRoute]:
    for route in routes:
        # FastAPI wraps each included router (ours are included without a prefix: their paths are whole).
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _routes(inner.routes)
        elif isinstance(route, BaseRoute):
            yield route


def _allowed_methods(request: Request) -> list[str]:
    methods: set[str] = set()
    for route in _routes(request.app.router.routes):
        if route.matches(request.scope)[0] != Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return sorted(methods)


def install_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(_request: Request, exc: Problem) -> JSONResponse:
        extra = dict(exc.extra)
        challenge = extra.pop("headers_www", None)
        retry_after = extra.pop("headers_retry_after", None)
        headers = {"WWW-Authenticate": str(challenge)} if challenge else {}
        if retry_after:
            headers["Retry-After"] = str(retry_after)
        return problem_response(exc.status, exc.title, exc.detail, headers=headers or None, **extra)

    @app.exception_handler(KernelError)
    async def _kernel(_request: Request, exc: KernelError) -> JSONResponse:
        wire = exc.to_wire()
        return problem_response(
            kernel_status(exc.error_type),
            exc.error_type,
            str(exc),
            error_type=exc.error_type,
            fields=wire.get("fields", {}),
        )

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return problem_response(
            422, "Invalid request", "the request does not match the schema", errors=_errors(exc)
        )

    @app.exception_handler(ValidationError)
    async def _invalid(_request: Request, exc: ValidationError) -> JSONResponse:
        return problem_response(
            422, "Invalid request", "the request does not match the schema", errors=_errors(exc)
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers) if exc.headers else {}
        if exc.status_code == 400 and isinstance(exc.__cause__, ValueError):
            # FastAPI's answer to a body it cannot decode (not UTF-8): a bad body like any other, 422.
            return problem_response(
                422,
                "Invalid request",
                "the body is not JSON in UTF-8",
                errors=[{"loc": ["body"], "msg": str(exc.__cause__), "type": "json_invalid"}],
            )
        if exc.status_code == 405:
            # Starlette names the methods of the path's first route only; we have one route per method.
            headers["Allow"] = ", ".join(_allowed_methods(request))
        return problem_response(exc.status_code, str(exc.detail), headers=headers or None)

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        # NATS unreachable and the like: the gateway is up but cannot serve this now.
        log.exception("unexpected error: %s", exc)
        return problem_response(503, "Service unavailable", f"{type(exc).__name__}: {exc}")
